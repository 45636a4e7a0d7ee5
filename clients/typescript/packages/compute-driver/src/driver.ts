// The controller's compute driver, on capstan: each call becomes one capstan command
// per host the caller names, under an id made from what the call means (its content,
// the caller's operation key, the attempt), so that a controller that crashed mid-call
// and calls again with the same key is answered from the hosts' logs rather than doing
// anything twice. A call without a key is its own operation: its ids are drawn fresh
// for it (retries within the call keep them), so it is never answered with what an
// earlier call with the same content did.
import {
  type CapstanClient,
  CapstanError,
  type Command,
  type CommandStatus,
  commandId,
  type HookFailure,
  randomId,
  sleep,
  type Spec,
} from "@capstan/client";
import { capstanName } from "./names.js";

export interface ComputeDriverOptions {
  client: CapstanClient;
  /** How long to wait for each host's command, in ms (default 120 000). A host that
   * does not finish by then ends the call with `timeout` (retryable): the command
   * stays queued for the host, and calling again picks it up by its id. */
  timeoutMs?: number | undefined;
  /** Tries of a command that fails retryably (a hook failed, it was cancelled or
   * interrupted, not ready in time), each under a new id; default 3. */
  attempts?: number | undefined;
  /** The pause before the second try, doubled each time, in ms (default 500). */
  retryDelayMs?: number | undefined;
  /** On an abort, ask each host to cut its command short (`cancel_command`) before
   * giving up waiting; default true. */
  cancelOnAbort?: boolean | undefined;
}

/** What every call takes. */
export interface Target {
  /** The hosts to act on (capstan host names). */
  hosts: readonly string[];
  /** The controller's durable name for this operation (a deployment or operation
   * id), non-empty. Same key, same content: the same operation, answered from the
   * hosts' logs if it was already carried out — what makes a call repeated after a
   * crash of the controller safe. A new operation needs a new key (a rollback that
   * activates a revision activated before is not the earlier activation). Without
   * one, the call is a new operation every time: its commands get ids of their own
   * (random, kept across the call's retries), so it is always carried out, and a call
   * repeated after a crash sends new commands (the hosts converge to the same state,
   * and a host's earlier command, still queued, runs too). */
  operationKey?: string | undefined;
  signal?: AbortSignal | undefined;
}

export interface NamespaceRef extends Target {
  /** The controller's namespace (tenant) id. */
  namespace: string;
}

export interface RevisionRef extends NamespaceRef {
  workload: string;
  revision: string;
}

export interface PrepareInput extends RevisionRef {
  spec: Spec;
}

/** One host's part of a call. */
export interface HostResult {
  host: string;
  /** The command that did it (ask `client.status(commandId)` for its records). */
  commandId: string;
  status: CommandStatus;
}

export interface Prepared {
  /** True when every host staged the revision: it may be activated. */
  ready: boolean;
  /** The capstan names the call used. */
  names: { namespace: string; workload: string; revision: string };
  /** Hosts that staged it. */
  prepared: HostResult[];
  /** Hosts that could not (a final failure of the command: `image_not_found`,
   * `invalid_spec`, a retryable failure that persisted, …), with the error. */
  notReady: { host: string; error: CapstanError }[];
}

export interface Done {
  names: { namespace: string; workload?: string; revision?: string };
  hosts: HostResult[];
}

/**
 * The controller's compute driver: `ensureNamespace` → `prepareRevision` (readiness,
 * nothing started) → `activateRevision` (after the controller committed it) →
 * `retireRevision` → `deleteNamespace`. Every call acts on each named host at once
 * and settles them all before it ends; then it resolves, or rejects with the first
 * failing host's CapstanError (in the order the hosts were given), whose `code` is the
 * command's own (`hook_failed`, `namespace_not_empty`, …), `retryable` whether calling
 * again may succeed, and `hookFailures` the hook phase and owner that refused.
 */
export class CapstanComputeDriver {
  private readonly client: CapstanClient;
  private readonly timeoutMs: number;
  private readonly attempts: number;
  private readonly retryDelayMs: number;
  private readonly cancelOnAbort: boolean;

  constructor(options: ComputeDriverOptions) {
    this.client = options.client;
    this.timeoutMs = options.timeoutMs ?? 120_000;
    this.attempts = Math.max(1, options.attempts ?? 3);
    this.retryDelayMs = options.retryDelayMs ?? 500;
    this.cancelOnAbort = options.cancelOnAbort ?? true;
  }

  /** Prepares the tenant on each host (network, slice, …) and runs its
   * `after_namespace_prepared` hooks. Idempotent: a ready namespace is left as it is. */
  async ensureNamespace(input: NamespaceRef): Promise<Done> {
    const namespace = capstanName(input.namespace);
    const hosts = await this.onEach(input, (host) => ({ op: "ensure_namespace", host, namespace }));
    return { names: { namespace }, hosts };
  }

  /** Stages the revision on each host without starting it, and says whether it may be
   * activated. */
  async prepareRevision(input: PrepareInput): Promise<Prepared> {
    const names = revisionNames(input);
    const settled = await this.settle(input, (host) => ({
      op: "prepare_revision",
      host,
      ...names,
      spec: input.spec,
    }));
    const prepared: HostResult[] = [];
    const notReady: Prepared["notReady"] = [];
    for (const [host, outcome] of settled) {
      if (outcome instanceof CapstanError) {
        // A failure of the command is an answer (not ready); not knowing is not.
        if (outcome.command === undefined) throw outcome;
        notReady.push({ host, error: outcome });
      } else prepared.push(outcome);
    }
    return { ready: notReady.length === 0, names, prepared, notReady };
  }

  /** Activates the committed revision on each host: its `before_workload_start` hooks,
   * the launch environment, then the start (and the predecessor's stop). */
  async activateRevision(input: RevisionRef): Promise<Done> {
    const names = revisionNames(input);
    const hosts = await this.onEach(input, (host) => ({ op: "activate_revision", host, ...names }));
    return { names, hosts };
  }

  /** Retires the revision on each host: `before_workload_stop` hooks (reverse
   * order), then it is stopped and removed — that revision only, never a newer one. */
  async retireRevision(input: RevisionRef): Promise<Done> {
    const names = revisionNames(input);
    const hosts = await this.onEach(input, (host) => ({ op: "retire_revision", host, ...names }));
    return { names, hosts };
  }

  /** Deletes the (empty) namespace on each host after its `before_namespace_delete`
   * hooks. */
  async deleteNamespace(input: NamespaceRef): Promise<Done> {
    const namespace = capstanName(input.namespace);
    const hosts = await this.onEach(input, (host) => ({ op: "delete_namespace", host, namespace }));
    return { names: { namespace }, hosts };
  }

  /** Runs the command on every host; every host's result, or the first failure. */
  private async onEach(target: Target, command: (host: string) => Command): Promise<HostResult[]> {
    const settled = await this.settle(target, command);
    const failed = settled.filter((s): s is [string, CapstanError] => s[1] instanceof CapstanError);
    const first = failed[0];
    if (first) {
      const [, error] = first;
      if (failed.length > 1)
        error.message += ` (and ${failed.length - 1} more of ${settled.length} hosts failed)`;
      throw error;
    }
    return settled.map(([, r]) => r as HostResult);
  }

  /** Each host's result or error, in the order given; never rejects but on abort. */
  private async settle(
    target: Target,
    command: (host: string) => Command,
  ): Promise<[string, HostResult | CapstanError][]> {
    if (target.hosts.length === 0) throw new RangeError("no hosts named");
    const key = operationKey(target);
    const settled = await Promise.all(
      [...new Set(target.hosts)].map(async (host): Promise<[string, HostResult | CapstanError]> => {
        try {
          return [host, await this.carryOut(command(host), key, target)];
        } catch (error) {
          if (!(error instanceof CapstanError)) throw error;
          return [host, error];
        }
      }),
    );
    const aborted = settled.find(([, r]) => r instanceof CapstanError && r.code === "aborted");
    if (aborted) throw aborted[1];
    return settled;
  }

  /** One command on one host: attempt 0 under its id; a retryable failure again under
   * the next attempt's id. After a crash of the caller the same walk (the same
   * operation key) is answered from the host's log, attempt by attempt, up to where
   * it stopped. */
  private async carryOut(command: Command, key: OperationKey, target: Target): Promise<HostResult> {
    for (let attempt = 0; ; attempt++) {
      const id = commandId(command, { key: key.key, attempt });
      const status = await this.submitAndWait({ ...command, id }, key, target.signal);
      if (status.status === "succeeded") return { host: command.host, commandId: id, status };
      const error = CapstanError.fromCommand(status);
      if (!error.retryable || attempt + 1 >= this.attempts) throw error;
      try {
        await sleep(this.retryDelayMs * 2 ** attempt, target.signal);
      } catch (cause) {
        throw new CapstanError({
          code: "aborted",
          message: `aborted before retrying after command ${id}`,
          retryable: false,
          commandId: id,
          cause,
        });
      }
    }
  }

  private async submitAndWait(
    command: Command & { id: string },
    key: OperationKey,
    signal?: AbortSignal,
  ): Promise<CommandStatus> {
    const call = signal === undefined ? {} : { signal };
    try {
      await this.client.submit(command, call);
      return await this.client.wait(command.id, { ...call, timeoutMs: this.timeoutMs });
    } catch (error) {
      if (!(error instanceof CapstanError)) throw error;
      if (error.code === "aborted") {
        if (this.cancelOnAbort) await this.cancelQuietly(command.id);
        throw new CapstanError({
          code: "aborted",
          message: `aborted: command ${command.id} on ${command.host} was ${this.cancelOnAbort ? "asked to stop" : "left running"}; ${key.again}`,
          retryable: false,
          commandId: command.id,
          host: command.host,
          cause: error,
        });
      }
      if (error.code === "timeout") throw await this.timedOut(command, key, error);
      throw error;
    }
  }

  /** Best effort: the cancel is itself a command, answered from the log if asked again. */
  private async cancelQuietly(id: string): Promise<void> {
    try {
      await this.client.cancel(id, { signal: AbortSignal.timeout(5_000) });
    } catch {
      // The command then ends on its own; calling again learns how.
    }
  }

  /** A timeout, said with what the coordinator knows of the host. */
  private async timedOut(
    command: Command & { id: string },
    key: OperationKey,
    error: CapstanError,
  ): Promise<CapstanError> {
    let liveness = "";
    try {
      const entry = (await this.client.hosts({ signal: AbortSignal.timeout(5_000) })).find(
        (h) => h.host === command.host,
      );
      liveness = entry ? ` (the host is ${entry.status})` : " (the coordinator does not know the host)";
    } catch {
      // Said without it.
    }
    return new CapstanError({
      code: "timeout",
      message: `command ${command.id} on ${command.host} was not done within ${this.timeoutMs} ms${liveness}; it stays queued for the host: ${key.again}`,
      retryable: true,
      commandId: command.id,
      host: command.host,
      cause: error,
    });
  }
}

/** The key a call's ids are made with, and what to do to learn how a command it
 * could not follow ended. */
interface OperationKey {
  key: string;
  again: string;
}

/** The caller's operation key, or one of the call's own: a call without a key never
 * shares an id with another call, so it is never answered with another's outcome. */
function operationKey(target: Target): OperationKey {
  const given = target.operationKey;
  if (given === undefined) {
    return {
      key: `call:${randomId()}`,
      again:
        "follow it with client.wait(commandId) (a call without an operationKey is a new operation every time: calling again sends new commands)",
    };
  }
  if (given === "") {
    throw new RangeError(
      "operationKey cannot be empty: leave it out (a new operation every call) or pass the controller's durable id for the operation",
    );
  }
  return { key: given, again: "call again with the same operationKey to learn its outcome" };
}

function revisionNames(input: RevisionRef): { namespace: string; workload: string; revision: string } {
  return {
    namespace: capstanName(input.namespace),
    workload: capstanName(input.workload),
    revision: capstanName(input.revision),
  };
}

export type { HookFailure };
