/**
 * The typed client of the Context Memory Service. The Vercel AI SDK middleware is the
 * `context-memory-client/ai-sdk` entry point, so that this one needs no `ai` installed.
 */

export {
  ContextMemoryClient,
  etag,
  type CallOptions,
  type ClientOptions,
  type IterOptions,
  type PageOptions,
  type Route,
} from "./client.js";
export {
  BadRequest,
  CONFLICT_RETRY_TYPE,
  Conflict,
  Forbidden,
  MemoryClientError,
  NotFound,
  PayloadTooLarge,
  PreconditionFailed,
  PreconditionRequired,
  ProblemError,
  RetryableConflict,
  ServerError,
  ServiceUnavailable,
  TooManyRequests,
  TransportError,
  Unauthorized,
  Unprocessable,
  type ProblemField,
  type ProblemInit,
} from "./errors.js";
export {
  DEFAULT_RETRY_POLICY,
  NO_RETRIES,
  parseRetryAfter,
  retryDelayMs,
  type RetryPolicy,
} from "./retry.js";
export * from "./types.js";
export type { components, operations, paths } from "./generated/openapi.js";
