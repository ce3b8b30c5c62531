/**
 * graphql-js refuses a bad enum value itself (in validation for literals, in
 * variable coercion for variables), with a message but no code. Clients should
 * not parse messages: this gives those refusals the codes Sluice documents
 * (BAD_PRIORITY for a priority class, BAD_USER_INPUT otherwise).
 */
import { GraphQLError } from 'graphql';
import type { Plugin } from 'graphql-yoga';

const ENUM_CODES: Record<string, string> = { Priority: 'BAD_PRIORITY' };

export function codeForInputError(message: string): string | null {
  const m = /does not exist in "(\w+)" enum/.exec(message) ?? /Enum "(\w+)" cannot represent/.exec(message);
  if (m) return ENUM_CODES[m[1]!] ?? 'BAD_USER_INPUT';
  // Variable coercion: an invalid value, a required variable not provided, a non-null one given null.
  if (/^Variable "\$\w+" (got invalid value|of required type .* was not provided|of non-null type .* must not be null)/.test(message)) return 'BAD_USER_INPUT';
  return null;
}

function withCode<E extends Error>(e: E): E | GraphQLError {
  if (!(e instanceof GraphQLError)) return e;
  const error = e;
  if (error.extensions?.code && error.extensions.code !== 'GRAPHQL_VALIDATION_FAILED') return error;
  const code = codeForInputError(error.message);
  if (!code) return error;
  return new GraphQLError(error.message, {
    ...(error.nodes ? { nodes: error.nodes } : {}),
    extensions: { ...error.extensions, code },
  });
}

export function useInputErrorCodes(): Plugin {
  return {
    onValidate() {
      return ({ result, setResult }) => {
        if (result.length > 0) setResult(result.map(withCode));
      };
    },
    onExecute() {
      return {
        onExecuteDone({ result, setResult }) {
          if ('errors' in result && result.errors && !('next' in result)) {
            setResult({ ...result, errors: result.errors.map(withCode) });
          }
        },
      };
    },
  };
}
