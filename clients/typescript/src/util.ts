/** Small helpers: an abortable sleep and a retry that a stop ends at once. */

/** Sleep `ms`, rejecting with `signal.reason` the moment `signal` aborts. */
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

export interface RetryOptions {
  attempts: number;
  baseDelayMs: number;
  maxDelayMs?: number;
  /** A stop ends the backoff at once (rejecting with its reason) and starts no further attempt. */
  signal?: AbortSignal | undefined;
  retryIf: (error: unknown) => boolean;
}

export async function retry<T>(fn: () => Promise<T>, options: RetryOptions): Promise<T> {
  let delay = options.baseDelayMs;
  for (let attempt = 1; ; attempt += 1) {
    if (options.signal?.aborted) throw options.signal.reason;
    try {
      return await fn();
    } catch (error) {
      if (attempt >= options.attempts || !options.retryIf(error)) throw error;
    }
    await sleep(delay, options.signal);
    delay = Math.min(options.maxDelayMs ?? 10_000, delay * 2);
  }
}

export function shortText(value: unknown, limit = 2000): string {
  let text: string;
  if (typeof value === "string") text = value;
  else {
    try {
      text = JSON.stringify(value) ?? String(value);
    } catch {
      text = String(value);
    }
  }
  return text.length <= limit ? text : `${text.slice(0, limit)}…`;
}
