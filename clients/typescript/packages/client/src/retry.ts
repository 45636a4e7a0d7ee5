// Asking again: which errors, how often, how long in between.
import { setTimeout as delay } from "node:timers/promises";
import { CapstanError } from "./errors.js";

export interface RetryPolicy {
  /** Tries in all, the first included (1: never ask again). Default 5. */
  attempts?: number | undefined;
  /** The first pause, doubled each time, in ms. Default 200. */
  baseDelayMs?: number | undefined;
  /** The longest pause, in ms. Default 5000. */
  maxDelayMs?: number | undefined;
}

const DEFAULTS: { attempts: number; baseDelayMs: number; maxDelayMs: number } = {
  attempts: 5,
  baseDelayMs: 200,
  maxDelayMs: 5000,
};

/**
 * Runs `call` until it succeeds, throws an error that is not retryable, or `attempts`
 * run out; pauses in between with exponential backoff and full jitter, at least what
 * the server asked for (`Retry-After`). Only {@link CapstanError}s with `retryable`
 * are tried again; an abort ends it at once.
 */
export async function withRetry<T>(
  policy: RetryPolicy | false | undefined,
  signal: AbortSignal | undefined,
  call: () => Promise<T>,
): Promise<T> {
  const p: typeof DEFAULTS =
    policy === false
      ? { ...DEFAULTS, attempts: 1 }
      : {
          attempts: policy?.attempts ?? DEFAULTS.attempts,
          baseDelayMs: policy?.baseDelayMs ?? DEFAULTS.baseDelayMs,
          maxDelayMs: policy?.maxDelayMs ?? DEFAULTS.maxDelayMs,
        };
  for (let attempt = 1; ; attempt++) {
    try {
      return await call();
    } catch (error) {
      if (!(error instanceof CapstanError) || !error.retryable || attempt >= p.attempts) throw error;
      const backoff = Math.min(p.maxDelayMs, p.baseDelayMs * 2 ** (attempt - 1));
      const asked = (error.retryAfterSecs ?? 0) * 1000;
      await sleep(Math.max(asked, Math.random() * backoff), signal);
    }
  }
}

/** Resolves after `ms`, or rejects `aborted` when `signal` fires first. */
export async function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  try {
    await delay(ms, undefined, signal === undefined ? {} : { signal });
  } catch (error) {
    throw signal?.aborted ? abortError(signal) : error;
  }
}

/** The error an aborted call ends in. */
export function abortError(signal: AbortSignal, commandId?: string): CapstanError {
  return new CapstanError({
    code: "aborted",
    message:
      commandId === undefined
        ? "aborted"
        : `aborted while waiting for command ${commandId} (it may go on: ask again)`,
    retryable: false,
    cause: signal.reason,
    ...(commandId === undefined ? {} : { commandId }),
  });
}
