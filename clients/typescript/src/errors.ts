/**
 * The client's errors: every error answer (RFC 9457 problem+json) becomes a `ProblemError`
 * subclass chosen by its status; a request that never got an answer, after its retries, is a
 * `TransportError`. The classes mirror the Python client's, name for name.
 */

import type { components } from "./generated/openapi.js";

/** One invalid input named by a 422 (`errors[]` of the problem document). */
export type ProblemField = components["schemas"]["ProblemField"];

/** Base of everything this client throws (a caller's own abort stays an `AbortError`). */
export class MemoryClientError extends Error {
  override name = "MemoryClientError";
}

/** What a problem document and its answer say. */
export interface ProblemInit {
  status: number;
  title: string;
  detail: string;
  type: string;
  requestId: string | null;
  errors: readonly ProblemField[];
  retryAfterSeconds: number | null;
  /** The problem's `retryable` member (every 409 has one); null or left out when it has none. */
  retryable?: boolean | null;
}

/**
 * An error answer from the service. `requestId` is the id to quote when reporting it (the
 * `request_id` member, else the `X-Request-ID` header); `retryAfterSeconds` is the server's
 * `Retry-After` when it sent one. `retryable` says whether the same request, sent again later,
 * can succeed as it is: the problem's `retryable` member where the service sends one (on every
 * 409), otherwise true for a 429, a 503 or a `RetryableConflict` only.
 */
export class ProblemError extends MemoryClientError {
  override name = "ProblemError";
  readonly status: number;
  readonly title: string;
  readonly detail: string;
  /** `urn:context-memory:problem:<slug>`, or `about:blank` for an answer without one. */
  readonly type: string;
  readonly requestId: string | null;
  readonly errors: readonly ProblemField[];
  readonly retryAfterSeconds: number | null;
  readonly retryable: boolean;
  /** What `retryable` is when the problem does not say. */
  protected static readonly retryableByDefault: boolean = false;

  constructor(init: ProblemInit) {
    const id = init.requestId ? ` [${init.requestId}]` : "";
    super(`${init.status} ${init.title}: ${init.detail}${id}`);
    this.status = init.status;
    this.title = init.title;
    this.detail = init.detail;
    this.type = init.type;
    this.requestId = init.requestId;
    this.errors = init.errors;
    this.retryAfterSeconds = init.retryAfterSeconds;
    this.retryable =
      init.retryable ?? (this.constructor as typeof ProblemError).retryableByDefault;
  }
}

/** 400: the request could not be read. */
export class BadRequest extends ProblemError {
  override name = "BadRequest";
}
/** 401: no token, or one the service does not accept. */
export class Unauthorized extends ProblemError {
  override name = "Unauthorized";
}
/** 403: a valid token without the role the route needs. */
export class Forbidden extends ProblemError {
  override name = "Forbidden";
}
/** 404: the thing does not exist, or the caller may not see it. */
export class NotFound extends ProblemError {
  override name = "NotFound";
}
/**
 * 409: the request conflicts with the current state (memory off, a job that is not dead, a quota
 * reached, ...); `retryable` is false unless it is a `RetryableConflict`.
 */
export class Conflict extends ProblemError {
  override name = "Conflict";
}
/**
 * 409 `conflict-retry`: the request met a concurrent one (its `Idempotency-Key` in flight, a race
 * it lost) and nothing of it was written; the same request after `retryAfterSeconds` can succeed.
 * The client retries it like a 503 where the call is safe to repeat.
 */
export class RetryableConflict extends Conflict {
  override name = "RetryableConflict";
  protected static override readonly retryableByDefault: boolean = true;
}

/** The `type` of a retryable conflict. */
export const CONFLICT_RETRY_TYPE = "urn:context-memory:problem:conflict-retry";
/** 412: `If-Match` does not name the current version (read it again, then write). */
export class PreconditionFailed extends ProblemError {
  override name = "PreconditionFailed";
}
/** 413: the body is over the service's size limit. */
export class PayloadTooLarge extends ProblemError {
  override name = "PayloadTooLarge";
}
/** 422: invalid input; `errors` names each field. */
export class Unprocessable extends ProblemError {
  override name = "Unprocessable";
}
/** 428: a write that needs `If-Match` (or `If-None-Match: *`) came without it. */
export class PreconditionRequired extends ProblemError {
  override name = "PreconditionRequired";
}
/** 429: slow down; `retryAfterSeconds` says for how long. */
export class TooManyRequests extends ProblemError {
  override name = "TooManyRequests";
  protected static override readonly retryableByDefault: boolean = true;
}
/** A 5xx other than 503. */
export class ServerError extends ProblemError {
  override name = "ServerError";
}
/** 503: the service (usually its database) is unavailable for now. */
export class ServiceUnavailable extends ServerError {
  override name = "ServiceUnavailable";
  protected static override readonly retryableByDefault: boolean = true;
}

/** No answer: the connection failed or an attempt timed out, after the retries allowed. */
export class TransportError extends MemoryClientError {
  override name = "TransportError";
  constructor(message: string, options?: { cause: unknown }) {
    super(message, options);
  }
}

const BY_STATUS: ReadonlyMap<number, new (init: ProblemInit) => ProblemError> = new Map([
  [400, BadRequest],
  [401, Unauthorized],
  [403, Forbidden],
  [404, NotFound],
  [409, Conflict],
  [412, PreconditionFailed],
  [413, PayloadTooLarge],
  [422, Unprocessable],
  [428, PreconditionRequired],
  [429, TooManyRequests],
  [503, ServiceUnavailable],
]);

/** The typed error of an error answer, problem+json or not (the body is read here). */
export async function problemFromResponse(
  response: Response,
  retryAfterSeconds: number | null,
): Promise<ProblemError> {
  const text = await response.text().catch(() => "");
  const body = parseObject(text);
  const status = response.status;
  const type = stringOr(body["type"], "about:blank");
  const Class =
    status === 409 && type === CONFLICT_RETRY_TYPE
      ? RetryableConflict
      : (BY_STATUS.get(status) ?? (status >= 500 ? ServerError : ProblemError));
  return new Class({
    status,
    title: stringOr(body["title"], response.statusText || "Error"),
    detail: stringOr(body["detail"], text.slice(0, 500)),
    type,
    requestId: stringOr(body["request_id"], response.headers.get("x-request-id") ?? "") || null,
    errors: Array.isArray(body["errors"]) ? body["errors"].filter(isProblemField) : [],
    retryAfterSeconds,
    retryable: typeof body["retryable"] === "boolean" ? body["retryable"] : null,
  });
}

function parseObject(text: string): Record<string, unknown> {
  try {
    const parsed: unknown = JSON.parse(text);
    return typeof parsed === "object" && parsed !== null && !Array.isArray(parsed)
      ? (parsed as Record<string, unknown>)
      : {};
  } catch {
    return {};
  }
}

function stringOr(value: unknown, fallback: string): string {
  return typeof value === "string" && value !== "" ? value : fallback;
}

function isProblemField(value: unknown): value is ProblemField {
  if (typeof value !== "object" || value === null) return false;
  const field = value as Record<string, unknown>;
  return typeof field["field"] === "string" && typeof field["message"] === "string";
}
