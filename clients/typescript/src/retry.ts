/**
 * The answer table of the client guide, once: what each answer to an
 * idempotent POST means for the operation.
 */

/** Codes of final 5xx answers: the operation's outcome, stored and replayed. */
const FINAL_SERVER_CODES: ReadonlySet<string> = new Set([
  "request_abandoned",
  "charge_not_made",
  "refund_not_made",
  "capture_not_made",
  "cancel_not_made",
]);

export type Verdict =
  /** A 2xx: the operation's answer. */
  | "success"
  /** Final, not a success; the key is forgotten. */
  | "final"
  /** Final, and the key is kept: 422 (the first use of the key may have charged). */
  | "final_keep_key"
  /** Ask the token provider for a fresh token, then the same key again. */
  | "reauthenticate"
  /** The same key again, after backoff and never before `Retry-After`. */
  | "retry";

/** What to do with an answer of `status` whose envelope had `code`. */
export function classify(status: number, code: string | undefined): Verdict {
  if (status >= 200 && status < 300) return "success";
  if (status === 401) return "reauthenticate";
  if (status === 422) return "final_keep_key";
  if (status === 408 || status === 409 || status === 429) return "retry";
  if (status >= 500) return code !== undefined && FINAL_SERVER_CODES.has(code) ? "final" : "retry";
  return "final";
}

/** `Retry-After` in milliseconds (seconds or an HTTP date), or `undefined`. */
export function retryAfterMs(value: string | null, now: number): number | undefined {
  if (value === null || value.trim() === "") return undefined;
  const seconds = Number(value);
  if (Number.isFinite(seconds)) return seconds >= 0 ? seconds * 1000 : undefined;
  const date = Date.parse(value);
  return Number.isNaN(date) ? undefined : Math.max(0, date - now);
}

/** Capped exponential backoff with full jitter: uniform in [0, min(cap, base * 2^retry)]. */
export function backoffMs(retry: number, baseMs: number, capMs: number, random: () => number): number {
  return random() * Math.min(capMs, baseMs * 2 ** Math.min(retry, 30));
}

/** Resolves after `ms`, or rejects with the signal's reason when it aborts first. */
export function sleep(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason);
      return;
    }
    const onAbort = () => {
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
