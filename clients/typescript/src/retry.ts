/**
 * When to try a request again and how long to wait first: the server's `Retry-After` when it
 * sent one, else exponential backoff with full jitter under a ceiling. The rules are the Python
 * client's (docs/client.md, "Retry rules"); times here are in milliseconds.
 */

/** How a request that is safe to repeat is retried. */
export interface RetryPolicy {
  /** Tries in all, the first included (1: never retry). */
  readonly maxAttempts: number;
  /** Backoff before attempt n+1 is random in [0, min(backoffMaxMs, backoffBaseMs * 2^(n-1))]. */
  readonly backoffBaseMs: number;
  readonly backoffMaxMs: number;
  /** A longer `Retry-After` is cut to this. */
  readonly maxRetryAfterMs: number;
  /** Up to this fraction of a `Retry-After` is added, so that clients do not come back at once. */
  readonly jitter: number;
  /**
   * Answers that are retried (connection errors, attempt timeouts and a 409 whose problem says
   * `"retryable": true`, a `conflict-retry`, always are).
   */
  readonly retryStatuses: readonly number[];
}

export const DEFAULT_RETRY_POLICY: RetryPolicy = Object.freeze({
  maxAttempts: 4,
  backoffBaseMs: 250,
  backoffMaxMs: 8_000,
  maxRetryAfterMs: 30_000,
  jitter: 0.1,
  retryStatuses: Object.freeze([429, 503]),
});

/** Try once; every failure is thrown at once. */
export const NO_RETRIES: RetryPolicy = Object.freeze({ ...DEFAULT_RETRY_POLICY, maxAttempts: 1 });

/** Milliseconds to wait after failed attempt number `attempt` (1-based). */
export function retryDelayMs(
  policy: RetryPolicy,
  attempt: number,
  retryAfterSeconds: number | null,
  random: () => number = Math.random,
): number {
  if (retryAfterSeconds !== null) {
    const wait = Math.min(Math.max(retryAfterSeconds * 1000, 0), policy.maxRetryAfterMs);
    return wait + random() * wait * policy.jitter;
  }
  const ceiling = Math.min(policy.backoffMaxMs, policy.backoffBaseMs * 2 ** (attempt - 1));
  return random() * ceiling;
}

/** `Retry-After` in seconds (delta-seconds or an HTTP date), or null if absent or unreadable. */
export function parseRetryAfter(value: string | null, now: number = Date.now()): number | null {
  const text = value?.trim();
  if (!text) return null;
  if (/^\d+$/.test(text)) return Number(text);
  const when = Date.parse(text);
  return Number.isNaN(when) ? null : Math.max(0, (when - now) / 1000);
}

/** Resolves after `ms`, or rejects with the signal's reason as soon as it aborts. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason);
      return;
    }
    const onAbort = (): void => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}
