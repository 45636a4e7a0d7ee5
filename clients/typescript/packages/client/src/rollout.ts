// One command to many hosts, as `capstan rollout` does: each host gets the command
// under `<id>.<host>`; every submission first, then every wait; a host that cannot be
// reached is a result of its own, never the end of the rollout.
import type { CapstanClient, RolloutTemplate } from "./client.js";
import { CapstanError } from "./errors.js";
import { randomId } from "./ids.js";
import { abortError } from "./retry.js";
import type { Command, CommandStatus } from "./types.js";

export interface RolloutOptions {
  /** The hosts, or `"alive"`: every host `GET /v1/hosts` says is alive now. */
  hosts: readonly string[] | "alive";
  /** Requests in flight at once, submissions and waits alike (default 32; the
   * coordinator answers waits beyond its `max_waits` with `busy`, asked again). */
  concurrency?: number | undefined;
  /** How long to wait for each host's command, in ms (default 60 000). */
  timeoutMs?: number | undefined;
  /** Called as each host's command is done (or could not be followed). */
  onProgress?: ((progress: RolloutProgress) => void) | undefined;
  signal?: AbortSignal | undefined;
}

export interface RolloutProgress {
  done: number;
  total: number;
  /** Done and not `succeeded`. */
  failed: number;
  /** The result that just came. */
  last: RolloutResult;
}

/**
 * One host's result: the command's status; `unsubmitted` when the API refused the
 * command for that host (`invalid_name`, `host_not_found`, …: an error answer, as
 * `capstan rollout` says it); `unknown` with the client's error when it could not be
 * submitted or followed to its end (ask `status(id)` later).
 */
export type RolloutResult =
  | CommandStatus
  | {
      id: string;
      host: string;
      status: "unsubmitted" | "unknown";
      done: false;
      error: { code: CapstanError["code"]; message: string };
    };

export interface RolloutSummary {
  /** The id every host's command is named after (`<id>.<host>`). */
  id: string;
  total: number;
  succeeded: number;
  /** Every host's result, sorted by host. */
  results: RolloutResult[];
}

export async function rollout(
  client: CapstanClient,
  template: RolloutTemplate,
  options: RolloutOptions,
): Promise<RolloutSummary> {
  const signal = options.signal;
  const call = signal === undefined ? {} : { signal };
  const hosts =
    options.hosts === "alive"
      ? (await client.hosts(call)).filter((h) => h.status === "alive").map((h) => h.host)
      : [...new Set(options.hosts)];
  if (hosts.length === 0) throw new RangeError("no hosts to roll out to");
  const base = template.id ?? `rollout-${randomId().slice(2)}`;
  const concurrency = Math.max(1, options.concurrency ?? 32);
  const results: RolloutResult[] = [];
  let failed = 0;

  const submitted = await pool(hosts, concurrency, async (host) => {
    const command = { ...template, host, id: `${base}.${host}` } as Command;
    try {
      await client.submit(command, call);
      return { host, id: command.id!, error: undefined };
    } catch (error) {
      return { host, id: command.id!, error: asError(error) };
    }
  });
  await pool(submitted, concurrency, async ({ host, id, error }) => {
    let result: RolloutResult;
    if (error) {
      result = notFollowed(id, host, error, "submitting");
    } else {
      try {
        result = await client.wait(id, {
          ...call,
          ...(options.timeoutMs === undefined ? {} : { timeoutMs: options.timeoutMs }),
        });
      } catch (e) {
        result = notFollowed(id, host, asError(e), "waiting");
      }
    }
    results.push(result);
    if (result.status !== "succeeded") failed++;
    options.onProgress?.({ done: results.length, total: hosts.length, failed, last: result });
  });
  // Aborted: what was sent goes on, and each id can be asked about later.
  if (signal?.aborted) throw abortError(signal);
  results.sort((a, b) => (a.host < b.host ? -1 : a.host > b.host ? 1 : 0));
  return {
    id: base,
    total: hosts.length,
    succeeded: results.filter((r) => r.status === "succeeded").length,
    results,
  };
}

function notFollowed(
  id: string,
  host: string,
  error: CapstanError,
  when: "submitting" | "waiting",
): RolloutResult {
  // Submitting, an error answer that asking again would not change: the API refused
  // this host's command. Anything else leaves its fate unknown.
  const refused = when === "submitting" && error.status !== undefined && !error.retryable;
  return {
    id,
    host,
    status: refused ? "unsubmitted" : "unknown",
    done: false,
    error: { code: error.code, message: error.message },
  };
}

function asError(error: unknown): CapstanError {
  if (error instanceof CapstanError) return error;
  return new CapstanError({ code: "invalid_answer", message: String(error), retryable: false, cause: error });
}

/** Maps `items` through `work` with at most `limit` in flight; answers in input order. */
async function pool<T, R>(items: readonly T[], limit: number, work: (item: T) => Promise<R>): Promise<R[]> {
  const out: R[] = new Array(items.length);
  let next = 0;
  const worker = async () => {
    while (next < items.length) {
      const i = next++;
      out[i] = await work(items[i]!);
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
  return out;
}
