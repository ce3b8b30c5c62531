/**
 * Deterministic fake answers for the catalog's APIs: the same params always
 * give the same data (a hash of the input, no randomness, no clock), with the
 * field names PROVIDER.md lists. An API with no generator here answers an
 * echo of its params, so a catalog entry added elsewhere still works.
 */
import { hashString } from './random.ts';

export type DataResult = { ok: true; data: unknown } | { ok: false; error: string };

const DISPOSABLE = new Set([
  'mailinator.com',
  'guerrillamail.com',
  '10minutemail.com',
  'yopmail.com',
  'tempmail.com',
  'trashmail.com',
  'sharklasers.com',
  'getnada.com',
  'dispostable.com',
  'throwawaymail.com',
]);

const FREE = new Set([
  'gmail.com',
  'googlemail.com',
  'yahoo.com',
  'outlook.com',
  'hotmail.com',
  'live.com',
  'aol.com',
  'icloud.com',
  'proton.me',
  'protonmail.com',
  'gmx.com',
  'mail.com',
  'yandex.com',
  'zoho.com',
]);

const TYPOS: Readonly<Record<string, string>> = {
  'gmial.com': 'gmail.com',
  'gmai.com': 'gmail.com',
  'gmail.co': 'gmail.com',
  'gnail.com': 'gmail.com',
  'yaho.com': 'yahoo.com',
  'yahooo.com': 'yahoo.com',
  'hotmial.com': 'hotmail.com',
  'hotmal.com': 'hotmail.com',
  'outlok.com': 'outlook.com',
  'iclod.com': 'icloud.com',
};

const ROLES = new Set([
  'admin',
  'info',
  'support',
  'sales',
  'contact',
  'noreply',
  'no-reply',
  'postmaster',
  'webmaster',
  'billing',
  'hello',
  'team',
  'office',
  'abuse',
  'help',
  'marketing',
]);

/** Domains that resolve but accept no mail (RFC 2606 reserved names and the like). */
const NO_MX = new Set(['example.com', 'example.org', 'example.net', 'localhost']);
const NO_MX_SUFFIX = ['.invalid', '.test', '.example', '.localhost', '.local'];

const EMAIL = /^[a-z0-9.!#$%&'*+/=?^_`{|}~-]+@[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)+$/i;
const DOMAIN = /^(?=.{1,253}$)[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)+$/i;

function str(v: unknown): string {
  return typeof v === 'string' ? v.trim() : v === undefined || v === null ? '' : String(v).trim();
}

export function emailValidator(params: Record<string, unknown>): DataResult {
  const email = str(params.email);
  const at = email.lastIndexOf('@');
  const username = at > 0 ? email.slice(0, at) : email;
  const domain = at > 0 ? email.slice(at + 1).toLowerCase() : '';
  const isRegexValid = EMAIL.test(email);
  const typoFix = TYPOS[domain];
  const hasTypo = typoFix !== undefined;
  const isMxValid = isRegexValid && !NO_MX.has(domain) && !NO_MX_SUFFIX.some((s) => domain.endsWith(s)) && !hasTypo;
  const isDisposable = DISPOSABLE.has(domain);
  const isFreeEmail = FREE.has(domain);
  const isRoleAccount = ROLES.has(username.toLowerCase());
  const isValid = isRegexValid && isMxValid;
  const isCompanyEmail = isValid && !isFreeEmail && !isDisposable;
  let riskScore = isRegexValid ? 10 : 100;
  if (isRegexValid) {
    if (isDisposable) riskScore += 70;
    if (!isMxValid) riskScore += 60;
    if (hasTypo) riskScore += 30;
    if (isRoleAccount) riskScore += 15;
    if (isFreeEmail) riskScore += 5;
    riskScore = Math.min(100, riskScore);
  }
  const riskLevel = riskScore < 30 ? 'low' : riskScore < 70 ? 'medium' : 'high';
  return {
    ok: true,
    data: {
      email,
      domain,
      username,
      isRegexValid,
      hasTypo,
      isMxValid,
      isValid,
      isFreeEmail,
      isCompanyEmail,
      isDisposable,
      isRoleAccount,
      suggestedCorrection: hasTypo ? `${username}@${typoFix}` : null,
      riskScore,
      riskLevel,
    },
  };
}

/** Units of each currency per US dollar (a fixed, plausible snapshot). */
const PER_USD: Readonly<Record<string, number>> = {
  USD: 1,
  EUR: 0.92,
  GBP: 0.79,
  JPY: 151.2,
  CHF: 0.88,
  CAD: 1.36,
  AUD: 1.52,
  NZD: 1.66,
  CNY: 7.23,
  INR: 83.4,
  SEK: 10.6,
  NOK: 10.8,
  DKK: 6.87,
  PLN: 3.98,
  MXN: 16.9,
  BRL: 5.05,
  ZAR: 18.7,
  SGD: 1.35,
  HKD: 7.82,
  KRW: 1345,
};

function perUsd(code: string): number {
  const known = PER_USD[code];
  if (known !== undefined) return known;
  // An unlisted code gets a stable made-up rate between 0.1 and 100.
  return Number((0.1 * Math.pow(1000, (hashString(code) % 10_000) / 10_000)).toFixed(4));
}

export function exchangeRate(params: Record<string, unknown>): DataResult {
  const currency1 = str(params.currency1).toUpperCase();
  const currency2 = str(params.currency2).toUpperCase();
  for (const [name, code] of [
    ['currency1', currency1],
    ['currency2', currency2],
  ] as const) {
    if (!/^[A-Z]{3}$/.test(code)) return { ok: false, error: `Invalid currency code for ${name}: "${code}"` };
  }
  const rate = perUsd(currency2) / perUsd(currency1);
  return { ok: true, data: { currency1, currency2, exchangeRate: Number(rate.toPrecision(6)) } };
}

export function dnsLookup(params: Record<string, unknown>): DataResult {
  const domain = str(params.domain).toLowerCase().replace(/\.$/, '');
  if (!DOMAIN.test(domain)) return { ok: false, error: `Invalid domain: "${domain}"` };
  const h = hashString(domain);
  const h2 = hashString(`${domain}#6`);
  const octet = (n: number) => (n % 254) + 1;
  const a = `${octet(h >>> 24)}.${octet(h >>> 16)}.${octet(h >>> 8)}.${octet(h)}`;
  const aaaa = `2001:db8:${(h >>> 16).toString(16)}:${(h & 0xffff).toString(16)}::${(h2 & 0xffff).toString(16)}`;
  const noMail = NO_MX.has(domain) || NO_MX_SUFFIX.some((s) => domain.endsWith(s));
  const labels = domain.split('.');
  const isSubdomain = labels.length > 2;
  return {
    ok: true,
    data: {
      domain,
      records: {
        A: [a],
        AAAA: [aaaa],
        MX: noMail
          ? []
          : [
              { exchange: `mx1.${domain}`, priority: 10 },
              { exchange: `mx2.${domain}`, priority: 20 },
            ],
        TXT: noMail ? ['v=spf1 -all'] : [`v=spf1 include:_spf.${domain} ~all`],
        CNAME: isSubdomain ? [`${labels.slice(1).join('.')}`] : [],
        NS: [`ns${(h % 4) + 1}.dns-host.net`, `ns${(h % 4) + 5}.dns-host.net`],
      },
    },
  };
}

const GENERATORS: Readonly<Record<string, (params: Record<string, unknown>) => DataResult>> = {
  emailvalidator: emailValidator,
  exchangerate: exchangeRate,
  dnslookup: dnsLookup,
};

/** The answer of `api` for `params` (required params are checked by the engine before this). */
export function generateData(api: string, params: Record<string, unknown>): DataResult {
  const gen = GENERATORS[api];
  return gen ? gen(params) : { ok: true, data: { api, params } };
}
