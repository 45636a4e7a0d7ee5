// The coordinator's HTTP API (docs/nats.md, *Endpoints*), one method an endpoint, over
// openapi-fetch typed from the description. Every call may be aborted, asks again
// (with backoff) only on errors that say "not now", and ends in an answer or a
// CapstanError.
import createClient, { type Client } from "openapi-fetch";
import { CapstanError } from "./errors.js";
import type { paths } from "./generated/openapi.js";
import { randomId } from "./ids.js";
import { abortError, type RetryPolicy, sleep, withRetry } from "./retry.js";
import { rollout, type RolloutOptions, type RolloutSummary } from "./rollout.js";
import type {
  Accepted,
  CancelAnswer,
  Command,
  CommandStatus,
  Events,
  Health,
  HostEntry,
  HostKeys,
  HostLog,
  HostStatus,
  Intent,
  LogRecord,
  Verdict,
} from "./types.js";

export interface ClientOptions {
  /** The coordinator, e.g. `http://127.0.0.1:7400` (its default listen address). */
  baseUrl: string;
  /** An API token (`capstan-coordinator token`): `read` for the reads, `submit` to
   * submit and cancel. Leave it out for a coordinator without a tokens file. */
  token?: string | undefined;
  /** How to ask again on a retryable error (`busy`, `nats_unavailable`,
   * `host_unreachable`, a refused connection, …); `false`: never. */
  retry?: RetryPolicy | false | undefined;
  /** A fetch of your own (a proxy agent, instrumentation, tests). */
  fetch?: ((request: Request) => Promise<Response>) | undefined;
}

/** Per call: an `AbortSignal` ends it with code `aborted`. */
export interface CallOptions {
  signal?: AbortSignal | undefined;
}

export interface SubmitOptions extends CallOptions {
  /** A command for a host the coordinator does not know (no registered key) is
   * refused, `host_not_found` (404), by default (`"refuse"`); `"queue"` queues it all
   * the same, for a host being provisioned (`?unknown_host=queue`). */
  unknownHost?: "refuse" | "queue" | undefined;
}

export interface WaitOptions extends CallOptions {
  /** How long to wait for the command to be done, in ms (default 60 000). */
  timeoutMs?: number | undefined;
}

export interface PageOptions extends CallOptions {
  /** Records with a seq after this one (default 0: from the start). */
  since?: number | undefined;
  /** At most this many (the API's page is at most 1000). */
  limit?: number | undefined;
}

export interface LogOptions extends CallOptions {
  /** Records with a seq after this one (default 0). */
  since?: number | undefined;
  /** Keep going after the last record: ask again every `pollMs`, and wait out an
   * outage (retryable errors) instead of ending. Ends only on `signal`. */
  follow?: boolean | undefined;
  /** How often to ask again when following, in ms (default 1000). */
  pollMs?: number | undefined;
  /** Called once when following meets an outage, with its error, and once with
   * `undefined` when the records come again. */
  onOutage?: ((error: CapstanError | undefined) => void) | undefined;
}

/** The most records an events page holds: a shorter page is the end of the log. */
export const MAX_PAGE = 1000;
/** The longest wait the API takes in one request. */
const MAX_SERVER_WAIT_MS = 5 * 60 * 1000;

export class CapstanClient {
  /** The typed openapi-fetch client underneath, for requests this class does not
   * make (its answers are not checked or converted). */
  readonly raw: Client<paths>;
  private readonly retry: RetryPolicy | false | undefined;

  constructor(options: ClientOptions) {
    this.retry = options.retry;
    this.raw = createClient<paths>({
      baseUrl: options.baseUrl.replace(/\/+$/, ""),
      headers: options.token === undefined ? {} : { Authorization: `Bearer ${options.token}` },
      ...(options.fetch === undefined ? {} : { fetch: options.fetch }),
    });
  }

  /**
   * Submits a command (`POST /v1/commands`); the coordinator signs and publishes it to
   * its host. A command without an `id` gets a random one here, before the first try,
   * so that asking again after a lost answer re-sends the same command (answered from
   * the host's log) rather than a second one. Use {@link commandId} for ids that
   * survive a crash of the caller. A command for a host the coordinator does not know
   * ends in `host_not_found` unless `unknownHost: "queue"`.
   */
  async submit(command: Command, options: SubmitOptions = {}): Promise<Accepted> {
    const body: Command = { ...command, id: command.id ?? randomId() };
    const query = options.unknownHost === undefined ? {} : { unknown_host: options.unknownHost };
    return this.call(options, (signal) => this.raw.POST("/v1/commands", { body, params: { query }, signal }));
  }

  /** A command's status now (`GET /v1/commands/{id}`); `command_not_found` when the
   * coordinator never saw the id. */
  async status(id: string, options: CallOptions = {}): Promise<CommandStatus> {
    return this.call(options, (signal) =>
      this.raw.GET("/v1/commands/{id}", { params: { path: { id } }, signal }),
    );
  }

  /**
   * Waits until the command is done and answers its status, whatever the outcome
   * (`succeeded`, `failed`, `rejected`: see {@link run} to turn a failure into an
   * error). Ends with `timeout` (retryable, the command goes on) when `timeoutMs`
   * passes first, `aborted` on the signal: the command is not forgotten either way,
   * ask again with its id.
   */
  async wait(id: string, options: WaitOptions = {}): Promise<CommandStatus> {
    const deadline = Date.now() + (options.timeoutMs ?? 60_000);
    for (;;) {
      const left = deadline - Date.now();
      if (left <= 0) {
        throw new CapstanError({
          code: "timeout",
          message: `command ${id} was not done within the wait's timeout (it goes on: ask again)`,
          retryable: true,
          commandId: id,
        });
      }
      const timeout = `${Math.max(1, Math.min(left, MAX_SERVER_WAIT_MS))}ms`;
      let status: CommandStatus;
      try {
        status = await this.call(options, (signal) =>
          this.raw.GET("/v1/commands/{id}/wait", {
            params: { path: { id }, query: { timeout } },
            signal,
          }),
        );
      } catch (error) {
        if (error instanceof CapstanError && error.code === "aborted" && options.signal) {
          throw abortError(options.signal, id);
        }
        throw error;
      }
      if (status.done) return status;
    }
  }

  /** Submits and waits; a command that does not succeed ends in a CapstanError with
   * its code (the command's own: `hook_failed`, `namespace_not_found`, …), its
   * `retryable` and its status (`error.command`, `error.hookFailures`). */
  async run(command: Command, options: WaitOptions = {}): Promise<CommandStatus> {
    const { id } = await this.submit(command, options);
    const status = await this.wait(id, options);
    if (status.status !== "succeeded") throw CapstanError.fromCommand(status);
    return status;
  }

  /** Asks the command's host to cut it short (`POST /v1/commands/{id}/cancel`); the
   * answer says what was sent (`cancel_id`, null when the command was done). Wait on
   * the command to learn what the cancel did. */
  async cancel(id: string, options: CallOptions = {}): Promise<CancelAnswer> {
    return this.call(options, (signal) =>
      this.raw.POST("/v1/commands/{id}/cancel", { params: { path: { id } }, signal }),
    );
  }

  /** Every host the coordinator knows of, with its liveness and last heartbeat. */
  async hosts(options: CallOptions = {}): Promise<HostEntry[]> {
    const answer = await this.call(options, (signal) => this.raw.GET("/v1/hosts", { signal }));
    return answer.hosts;
  }

  /** The running intent the host rebuilt from its log (asked of the host). */
  async intent(host: string, options: CallOptions = {}): Promise<Intent> {
    return this.call(options, (signal) =>
      this.raw.GET("/v1/hosts/{host}/intent", { params: { path: { host } }, signal }),
    );
  }

  /** The host's status (asked of the host). */
  async hostStatus(host: string, options: CallOptions = {}): Promise<HostStatus> {
    return this.call(options, (signal) =>
      this.raw.GET("/v1/hosts/{host}/status", { params: { path: { host } }, signal }),
    );
  }

  /** One page of the host's records from the central stream, seq after `since`. */
  async events(host: string, options: PageOptions = {}): Promise<Events> {
    return this.call(options, (signal) =>
      this.raw.GET("/v1/hosts/{host}/events", {
        params: { path: { host }, query: page(options) },
        signal,
      }),
    );
  }

  /** One page of the host's own copy of its log (asked of the host). */
  async hostLog(host: string, options: PageOptions = {}): Promise<HostLog> {
    return this.call(options, (signal) =>
      this.raw.GET("/v1/hosts/{host}/log", {
        params: { path: { host }, query: page(options) },
        signal,
      }),
    );
  }

  /**
   * The host's audit log from the central stream, record by record, page after page
   * until a page is short of full (the whole log, never its first page as if it were
   * all); with `follow`, then every new record once, in order, until `signal`.
   */
  async *log(host: string, options: LogOptions = {}): AsyncGenerator<LogRecord, void, undefined> {
    let since = options.since ?? 0;
    let outage = false;
    for (;;) {
      let events: LogRecord[];
      try {
        events = (await this.events(host, { since, ...signalOf(options) })).events;
      } catch (error) {
        if (!options.follow || !(error instanceof CapstanError) || !error.retryable) throw error;
        if (!outage) options.onOutage?.(error);
        outage = true;
        await sleep(options.pollMs ?? 1000, options.signal);
        continue;
      }
      if (outage) options.onOutage?.(undefined);
      outage = false;
      for (const record of events) {
        since = Math.max(since, record.seq);
        yield record;
      }
      if (events.length < MAX_PAGE) {
        if (!options.follow) return;
        await sleep(options.pollMs ?? 1000, options.signal);
      }
    }
  }

  /** The host's log against its published copy, record by record (`capstan verify`). */
  async verify(host: string, options: CallOptions = {}): Promise<Verdict> {
    return this.call(options, (signal) =>
      this.raw.GET("/v1/hosts/{host}/verify", { params: { path: { host } }, signal }),
    );
  }

  /** The keys registered for the host (`key_not_found` when none). */
  async keys(host: string, options: CallOptions = {}): Promise<HostKeys> {
    return this.call(options, (signal) =>
      this.raw.GET("/v1/hosts/{host}/keys", { params: { path: { host } }, signal }),
    );
  }

  /** Registers a host's public key (`capstan-agent host-key`): a key already there
   * changes nothing; a key registered for another host is refused (`key_conflict`),
   * as is a weak one (`invalid_request`). */
  async registerKey(host: string, publicKey: string, options: CallOptions = {}): Promise<HostKeys> {
    return this.call(options, (signal) =>
      this.raw.PUT("/v1/hosts/{host}/keys", {
        params: { path: { host } },
        body: { public_key: publicKey },
        signal,
      }),
    );
  }

  /** Removes one of a host's keys; answers the keys left. */
  async unregisterKey(host: string, key: string, options: CallOptions = {}): Promise<HostKeys> {
    return this.call(options, (signal) =>
      this.raw.DELETE("/v1/hosts/{host}/keys/{key}", { params: { path: { host, key } }, signal }),
    );
  }

  /** `GET /healthz`: `nats_unavailable` when the coordinator has lost NATS. */
  async health(options: CallOptions = {}): Promise<Health> {
    return this.call(options, (signal) => this.raw.GET("/healthz", { signal }));
  }

  /** One command to many hosts (`capstan rollout`): see {@link rollout}. */
  async rollout(template: RolloutTemplate, options: RolloutOptions): Promise<RolloutSummary> {
    return rollout(this, template, options);
  }

  /**
   * One request, asked again on retryable errors: the answer's data, or a
   * CapstanError. `request` gets the signal to pass to fetch.
   */
  private async call<T>(
    options: CallOptions,
    request: (signal: AbortSignal | null) => Promise<{ data?: T; error?: unknown; response: Response }>,
  ): Promise<T> {
    const { signal } = options;
    return withRetry(this.retry, signal, async () => {
      if (signal?.aborted) throw abortError(signal);
      let answer: { data?: T; error?: unknown; response: Response };
      try {
        answer = await request(signal ?? null);
      } catch (error) {
        throw transportError(error, signal);
      }
      const { data, error, response } = answer;
      if (!response.ok) throw CapstanError.fromAnswer(response, error);
      if (data === undefined) {
        throw new CapstanError({
          code: "invalid_answer",
          message: `HTTP ${response.status} without a JSON body`,
          retryable: false,
          status: response.status,
        });
      }
      return data;
    });
  }
}

/** A command for every host of a rollout: everything but `host`. */
export type RolloutTemplate = Command extends infer C ? (C extends Command ? Omit<C, "host"> : never) : never;

function page(options: PageOptions): { since?: number; limit?: number } {
  return {
    ...(options.since === undefined ? {} : { since: options.since }),
    ...(options.limit === undefined ? {} : { limit: options.limit }),
  };
}

function signalOf(options: CallOptions): CallOptions {
  return options.signal === undefined ? {} : { signal: options.signal };
}

/** What a fetch that threw means: the caller's abort, an answer that was not JSON,
 * or a coordinator that could not be reached. */
function transportError(error: unknown, signal: AbortSignal | undefined): CapstanError {
  if (error instanceof CapstanError) return error;
  if (signal?.aborted) return abortError(signal);
  if (error instanceof SyntaxError) {
    return new CapstanError({
      code: "invalid_answer",
      message: `an answer that is not JSON: ${error.message}`,
      retryable: false,
      cause: error,
    });
  }
  const reason =
    error instanceof Error
      ? error.cause instanceof Error
        ? error.cause.message
        : error.message
      : String(error);
  return new CapstanError({
    code: "network_error",
    message: `cannot reach the coordinator: ${reason}`,
    retryable: true,
    cause: error,
  });
}
