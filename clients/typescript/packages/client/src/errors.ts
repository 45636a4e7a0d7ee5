// One error class for everything a call can end in short of its answer: an error
// answer of the API, a command that failed or was rejected on its host, and what
// happens on this side (a timeout, an abort, an unreachable coordinator).
import type { ApiErrorCode, CommandStatus, ErrorCode } from "./types.js";

/** Codes this client gives when no answer of the API carries one. */
export type ClientCode =
  /** `wait`'s timeout passed before the command was done (it goes on: ask again). */
  | "timeout"
  /** The caller's `AbortSignal` fired. */
  | "aborted"
  /** The coordinator could not be reached (connection refused, reset, DNS). */
  | "network_error"
  /** An answer that is not what the API promises (not JSON, a missing field, an
   * error status without an error body, as a proxy in between may send). */
  | "invalid_answer";

/** Every code a {@link CapstanError} can carry: the API's (docs/nats.md), the
 * protocol's (a command's own failure, docs/protocol.md) and this client's. */
export type CapstanCode = ApiErrorCode | ClientCode;

/** API codes that say "not now": the same request may be answered later. */
const RETRYABLE_API_CODES: ReadonlySet<CapstanCode> = new Set<CapstanCode>([
  "busy",
  "nats_unavailable",
  "nats_error",
  "host_unreachable",
  "host_timeout",
  "network_error",
]);

/**
 * Protocol codes a command may fail with and succeed when sent again under a new id
 * (docs/protocol.md, *Result*; the agent's `ErrorCode::is_retryable`). Used only for
 * answers from agents that do not say `retryable` themselves.
 */
const RETRYABLE_COMMAND_CODES: ReadonlySet<string> = new Set([
  "hook_failed",
  "hook_timeout",
  "hook_invalid_reply",
  "cancelled",
  "interrupted",
  "log_failed",
  "driver_unavailable",
  "rollout_timeout",
  "not_ready",
] satisfies ErrorCode[]);

/** A failed hook call, as the command's records name it: its phase and owner, never
 * anything the hook said. */
export interface HookFailure {
  phase:
    "after_namespace_prepared" | "before_workload_start" | "before_workload_stop" | "before_namespace_delete";
  owner: string;
  /** `hook_failed`, `hook_timeout`, `hook_invalid_reply` or `cancelled`. */
  code: string;
}

export interface CapstanErrorInit {
  code: CapstanCode;
  message: string;
  retryable: boolean;
  /** The HTTP status of the answer, when there was one. */
  status?: number;
  /** The command concerned (a failed command, a wait that timed out or was aborted). */
  commandId?: string;
  /** Its host. */
  host?: string;
  /** The command's status, when the error is its failure or rejection. */
  command?: CommandStatus;
  /** Seconds the server asked to wait before asking again (`Retry-After`). */
  retryAfterSecs?: number;
  cause?: unknown;
}

export class CapstanError extends Error {
  override readonly name = "CapstanError";
  /** The documented code: switch on it. */
  readonly code: CapstanCode;
  /** True when asking again (an HTTP request as it was, a command under a new id) may
   * succeed without anything else changing. */
  readonly retryable: boolean;
  readonly status: number | undefined;
  readonly commandId: string | undefined;
  readonly host: string | undefined;
  readonly command: CommandStatus | undefined;
  readonly retryAfterSecs: number | undefined;

  constructor(init: CapstanErrorInit) {
    super(init.message, init.cause === undefined ? undefined : { cause: init.cause });
    this.code = init.code;
    this.retryable = init.retryable;
    this.status = init.status;
    this.commandId = init.commandId;
    this.host = init.host;
    this.command = init.command;
    this.retryAfterSecs = init.retryAfterSecs;
  }

  /** The hook calls that failed in the command (phase and owner), in log order. */
  get hookFailures(): HookFailure[] {
    return hookFailures(this.command);
  }

  /** An error answer of the API (`{"error":{"code","message"}}`), or what stands in
   * for one when the body is not that shape. */
  static fromAnswer(response: Response, body: unknown): CapstanError {
    const status = response.status;
    const retryAfter = Number(response.headers.get("retry-after") ?? NaN);
    const retryAfterSecs = Number.isFinite(retryAfter) ? retryAfter : undefined;
    const error = (body as { error?: { code?: unknown; message?: unknown } } | undefined)?.error;
    if (error && typeof error.code === "string") {
      const code = error.code as ApiErrorCode;
      return new CapstanError({
        code,
        message: typeof error.message === "string" ? error.message : code,
        retryable: RETRYABLE_API_CODES.has(code),
        status,
        ...(retryAfterSecs === undefined ? {} : { retryAfterSecs }),
      });
    }
    // A proxy's 502/503/504 page: a gateway in between that may come back.
    return new CapstanError({
      code: "invalid_answer",
      message: `HTTP ${status} without an error body`,
      retryable: status === 502 || status === 503 || status === 504,
      status,
    });
  }

  /** A command that ended `failed` or `rejected` on its host. */
  static fromCommand(command: CommandStatus): CapstanError {
    const error = command.error;
    const code = (error?.code ?? "invalid_answer") as CapstanCode;
    const retryable = error?.retryable ?? RETRYABLE_COMMAND_CODES.has(code);
    const hooks = hookFailures(command)
      .map((h) => `${h.phase} ${h.owner}: ${h.code}`)
      .join(", ");
    return new CapstanError({
      code,
      message:
        `command ${command.id} on ${command.host} ${command.status}: ${error?.message ?? "no error given"}` +
        (hooks ? ` (hooks: ${hooks})` : ""),
      retryable,
      commandId: command.id,
      host: command.host,
      command,
    });
  }
}

/** True when `error` is a {@link CapstanError} with one of `codes` (any, without). */
export function isCapstanError(error: unknown, ...codes: CapstanCode[]): error is CapstanError {
  return error instanceof CapstanError && (codes.length === 0 || codes.includes(error.code));
}

function hookFailures(command: CommandStatus | undefined): HookFailure[] {
  return (command?.events ?? [])
    .filter((e) => e.kind === "hook_failed" && e.phase !== undefined && e.owner !== undefined)
    .map((e) => ({ phase: e.phase!, owner: e.owner!, code: e.code ?? "hook_failed" }));
}
