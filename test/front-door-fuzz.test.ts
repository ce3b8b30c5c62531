/**
 * 2,000 fuzzed requests at the front door, mixing wrong keys (random strings,
 * well-formed keys with a forged checksum, random keys of the old format),
 * anonymous callers and valid tenant and admin keys: first all from one
 * address, then through a proxy that forwards X-Forwarded-For (TRUST_PROXY=1;
 * the test is the proxy, on 127.0.0.1) for several clients, one of them the
 * attacker. The failed-auth budget is the default (20 a minute), so the
 * attacker is past it almost at once. No valid key may ever be refused (no
 * 401 or 429), every request must get a status the client can read (no
 * socket error, even for bodies refused before they were read), and a
 * tenant's plain query still works afterwards.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { ADMIN_TOKEN, startTestApp, type TestApp } from './helpers/app.ts';

type Who = 'tenant' | 'admin' | 'anonymous' | 'random' | 'forged' | 'old-format';

interface Shot {
  who: Who;
  token: string | null;
  query: string;
  /** Extra body bytes (whitespace after the JSON): large ones are refused before they are read. */
  padding: number;
  /** The forwarded client (phase two), or none. */
  forwardedFor: string | null;
}

const b64url = fc.string({ unit: fc.constantFrom(...'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_'), minLength: 43, maxLength: 43 });

function shots(keys: { tenant: string }, forwarded: readonly string[] | null): fc.Arbitrary<Shot> {
  const who = fc.constantFrom<Who>('tenant', 'admin', 'anonymous', 'random', 'forged', 'old-format', 'random', 'forged');
  return fc
    .record({
      who,
      random: fc.string({ minLength: 1, maxLength: 60, unit: 'grapheme-ascii' }),
      body43: b64url,
      checksum: fc.string({ unit: fc.constantFrom(...'ABCDEFGHabcdefgh012345-_'), minLength: 8, maxLength: 8 }),
      padding: fc.oneof({ weight: 6, arbitrary: fc.constant(0) }, { weight: 1, arbitrary: fc.integer({ min: 70_000, max: 400_000 }) }),
      forwardedFor: forwarded ? fc.constantFrom(...forwarded) : fc.constant(null),
    })
    .map(({ who, random, body43, checksum, padding, forwardedFor }): Shot => {
      const token =
        who === 'tenant' ? keys.tenant
        : who === 'admin' ? ADMIN_TOKEN
        : who === 'anonymous' ? null
        : who === 'random' ? random.replace(/\s/g, 'x')
        : who === 'forged' ? `slc_${body43}_${checksum}`
        : `slc_${body43}`;
      const query = who === 'admin' ? '{ tenants { id } }' : who === 'anonymous' ? '{ __typename }' : '{ me { tenant { id } } }';
      // Valid keys carry big bodies too (within MAX_BODY_BYTES): they must be read and served.
      return { who, token, query, padding, forwardedFor };
    });
}

describe('fuzzing the failed-auth budget (2,000 requests)', () => {
  let t: TestApp;
  let tenant: { id: string; apiKey: string };

  before(async () => {
    // AUTH_FAILURES_PER_MINUTE at its default (20): the attacker is past it within the first second.
    t = await startTestApp({ SLUICE_ROLE: 'api', NODE_ENV: 'production', TRUST_PROXY: '1' });
    tenant = await t.createTenant('fuzz-budget', 'ENTERPRISE');
  });
  after(() => t.stop());

  async function run(samples: Shot[]): Promise<{ byWho: Record<string, Record<string, number>>; failures: string[] }> {
    const byWho: Record<string, Record<string, number>> = {};
    const failures: string[] = [];
    let next = 0;
    const worker = async () => {
      while (next < samples.length) {
        const s = samples[next++]!;
        const headers: Record<string, string> = { 'content-type': 'application/json' };
        if (s.token !== null) headers.authorization = `Bearer ${s.token}`;
        if (s.forwardedFor) headers['x-forwarded-for'] = s.forwardedFor;
        const body = JSON.stringify({ query: s.query }) + ' '.repeat(s.padding);
        let status: number;
        let text: string;
        try {
          const res = await fetch(t.url, { method: 'POST', headers, body });
          status = res.status;
          text = await res.text();
        } catch (err) {
          const e = err as { cause?: { code?: string }; message: string };
          failures.push(`socket error for ${s.who} (${s.padding} bytes of padding): ${e.cause?.code ?? e.message}`);
          continue;
        }
        (byWho[s.who] ??= {})[status] = (byWho[s.who]![status] ?? 0) + 1;
        let parsed: any;
        try {
          parsed = JSON.parse(text);
        } catch {
          failures.push(`unreadable answer for ${s.who}: ${status} ${text.slice(0, 100)}`);
          continue;
        }
        if (status >= 400 && typeof parsed?.errors?.[0]?.extensions?.code !== 'string') failures.push(`uncoded ${status} for ${s.who}`);
        if (s.who === 'tenant' || s.who === 'admin') {
          if (status !== 200 || parsed.errors) failures.push(`valid ${s.who} key refused: ${status} ${text.slice(0, 200)}`);
        } else if (s.who === 'anonymous') {
          if (status !== 200 && status !== 413) failures.push(`anonymous caller got ${status}: ${text.slice(0, 200)}`);
        } else if (![401, 429, 413].includes(status)) {
          failures.push(`wrong key (${s.who}) got ${status}: ${text.slice(0, 200)}`);
        }
      }
    };
    await Promise.all(Array.from({ length: 16 }, worker));
    return { byWho, failures };
  }

  test('1,000 from one address, then 1,000 through a proxy forwarding X-Forwarded-For: no valid key refused, every answer readable', async () => {
    const direct = fc.sample(shots({ tenant: tenant.apiKey }, null), { numRuns: 1000, seed: 33 });
    const proxied = fc.sample(shots({ tenant: tenant.apiKey }, ['203.0.113.66', '198.51.100.10', '198.51.100.11', '2001:db8::7']), { numRuns: 1000, seed: 34 });
    for (const [name, samples] of [['one address', direct], ['through a proxy', proxied]] as const) {
      const { byWho, failures } = await run(samples);
      console.log(JSON.stringify({ fuzzBudget: { phase: name, byWho } }));
      assert.ok(Object.values(byWho.tenant ?? {}).reduce((a, b) => a + b, 0) > 100, 'valid tenant keys were sent');
      assert.ok((byWho.forged?.['429'] ?? 0) + (byWho.random?.['429'] ?? 0) > 0, 'wrong keys went past the budget');
      const kinds = new Map<string, string>();
      for (const f of failures) kinds.set(f.split(':')[0]!, f);
      assert.deepEqual([...kinds.values()], [], `${name}: ${failures.length} bad answers`);
    }
    const after = await t.gql('{ me { tenant { id } } }', {}, tenant.apiKey);
    assert.equal(after.status, 200);
    assert.equal(after.body.data.me.tenant.id, tenant.id);
  });
});
