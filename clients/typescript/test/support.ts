/**
 * What the tests share: the service they run against (CMS_URL, started on a fresh database by
 * tests/client/test_typescript_client.py), tokens signed with its test key (CMS_JWT_SECRET),
 * and a fresh user of a fresh company with context memory switched on.
 */

import { createHmac, randomUUID } from "node:crypto";

import { ContextMemoryClient, FLAG_CONTEXT_MEMORY, type ClientOptions } from "context-memory-client";

export const BASE_URL = process.env["CMS_URL"] ?? "";
const SECRET = process.env["CMS_JWT_SECRET"] ?? "";
export const SPACE = "space-ts";

/** Why the tests that need the service are skipped, or false when they run. */
export const NO_SERVICE: string | false =
  BASE_URL && SECRET
    ? false
    : "CMS_URL and CMS_JWT_SECRET are not set (tests/client/test_typescript_client.py sets them)";

/** A token as `python -m app token` makes one (HS256, the service's default issuer and audience). */
export function mintToken(sub: string, company: string, roles: string[] = []): string {
  const now = Math.floor(Date.now() / 1000);
  const claims = {
    sub,
    company_id: company,
    roles,
    iss: "context-memory-dev",
    aud: "context-memory",
    iat: now,
    exp: now + 3600,
  };
  const encode = (part: object): string => Buffer.from(JSON.stringify(part)).toString("base64url");
  const unsigned = `${encode({ alg: "HS256", typ: "JWT" })}.${encode(claims)}`;
  const signature = createHmac("sha256", SECRET).update(unsigned).digest("base64url");
  return `${unsigned}.${signature}`;
}

export interface User {
  company: string;
  token: string;
  client: ContextMemoryClient;
}

/** A user of a company of its own, in which context memory is on for `SPACE`. */
export async function freshUser(options: Omit<ClientOptions, "baseUrl" | "token"> = {}): Promise<User> {
  const company = `ts-${randomUUID().slice(0, 8)}`;
  const operator = new ContextMemoryClient({
    baseUrl: BASE_URL,
    token: mintToken("olga", company, ["operator", "space_admin"]),
  });
  await operator.setFeatureFlag(company, FLAG_CONTEXT_MEMORY, true);
  await operator.updateSpace(SPACE, { context_memory: true });
  const token = mintToken(`user-${randomUUID().slice(0, 8)}`, company);
  return { company, token, client: new ContextMemoryClient({ baseUrl: BASE_URL, token, ...options }) };
}

/** A 503 as the service answers it while its database is unreachable. */
export const UNAVAILABLE = {
  type: "urn:context-memory:problem:unavailable",
  title: "Service unavailable",
  status: 503,
  detail: "The database is unavailable.",
  request_id: "front",
};

/** A 409 as the service answers a turn-save while another with its Idempotency-Key is in flight. */
export const CONFLICT_RETRY = {
  type: "urn:context-memory:problem:conflict-retry",
  title: "Conflict, retry",
  status: 409,
  detail: "A request with this Idempotency-Key is still in progress; retry later.",
  request_id: "front",
  retryable: true,
};

/** A `fetch` that answers `problem` (a 503 unless told) + Retry-After to the first `failures`
 * requests whose path ends in `suffix`, and records the Idempotency-Key of each; everything
 * else goes to the service. */
export function failingFetch(
  suffix: string,
  failures: number,
  retryAfter = "1",
  problem: { status: number } = UNAVAILABLE,
) {
  const keys: (string | null)[] = [];
  const fetch: typeof globalThis.fetch = async (input, init) => {
    const url = new URL(String(input));
    if (url.pathname.endsWith(suffix)) {
      keys.push(new Headers(init?.headers).get("idempotency-key"));
      if (keys.length <= failures) {
        return new Response(JSON.stringify(problem), {
          status: problem.status,
          headers: { "content-type": "application/problem+json", "retry-after": retryAfter },
        });
      }
    }
    return globalThis.fetch(input, init);
  };
  return { fetch, keys };
}
