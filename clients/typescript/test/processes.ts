// Child processes of a live test: spawned with their output in a log file, waited on
// by their log lines, stopped by pid with a signal and their exit checked. None may
// outlive the test process.

import { spawn, type ChildProcess } from "node:child_process";
import { closeSync, openSync, readFileSync, statSync } from "node:fs";

/** How long any one readiness wait may take. */
export const READY_TIMEOUT_MS = 60_000;
const POLL_MS = 50;
const TAIL_LINES = 40;

/** How a process ended: its exit code, or the signal that killed it. */
export interface Exit {
  code: number | null;
  signal: NodeJS.Signals | null;
  /** The spawn itself failed (e.g. ENOENT). */
  error?: Error;
}

// Every child still running, killed (SIGKILL) if the test process goes away first.
const live = new Set<ChildProcess>();

function killAll(): void {
  for (const child of live) {
    try {
      child.kill("SIGKILL");
    } catch {
      // Already gone: nothing to do.
    }
  }
  live.clear();
}

let guarded = false;

// Installed on the first spawn. `exit` covers a normal end and process.exit(); the
// signal handlers cover the test runner (or a user) stopping us: they kill the
// children, then re-raise the signal with its default action (they are `once`).
function guardExit(): void {
  if (guarded) return;
  guarded = true;
  process.on("exit", killAll);
  for (const signal of ["SIGINT", "SIGTERM", "SIGHUP"] as const) {
    process.once(signal, () => {
      killAll();
      process.kill(process.pid, signal);
    });
  }
}

/** A spawned process whose stdout and stderr go to `log`. */
export class Proc {
  /** Where this run's output starts in `log` (a restart appends to the same file). */
  readonly logStart: number;
  readonly exited: Promise<Exit>;
  private exitStatus: Exit | undefined;
  private readonly child: ChildProcess;

  constructor(
    readonly name: string,
    readonly log: string,
    command: string,
    args: readonly string[],
    env: NodeJS.ProcessEnv = process.env,
  ) {
    guardExit();
    this.logStart = fileSize(log);
    const fd = openSync(log, "a");
    try {
      this.child = spawn(command, args, { stdio: ["ignore", fd, fd], env });
    } finally {
      // The child has its own copy of the descriptor.
      closeSync(fd);
    }
    live.add(this.child);
    // Not holding the event loop: a test that forgot close() must still end (the
    // exit handler then kills the child). Waiting for the exit refs it again.
    this.child.unref();
    this.exited = new Promise((resolve) => {
      const done = (exit: Exit): void => {
        live.delete(this.child);
        this.exitStatus ??= exit;
        resolve(this.exitStatus);
      };
      this.child.once("exit", (code, signal) => done({ code, signal }));
      this.child.once("error", (error) => done({ code: null, signal: null, error }));
    });
  }

  get pid(): number | undefined {
    return this.child.pid;
  }

  /** The exit status, once it exited. */
  get exit(): Exit | undefined {
    return this.exitStatus;
  }

  /**
   * Sends `signal` and waits for the exit; throws unless it exited 0 or was killed by
   * that very signal (also when it had exited on its own before).
   */
  async stop(signal: NodeJS.Signals = "SIGTERM"): Promise<void> {
    if (this.exitStatus !== undefined) {
      throw new Error(`${this.name} had exited by itself (${describeExit(this.exitStatus)})${this.tail()}`);
    }
    this.child.ref();
    this.child.kill(signal);
    const exit = await this.exitWithin(READY_TIMEOUT_MS);
    if (exit === undefined) {
      await this.kill();
      throw new Error(
        `${this.name} did not exit within ${READY_TIMEOUT_MS / 1000} s of ${signal} (killed)${this.tail()}`,
      );
    }
    if (exit.code === 0 || (exit.code === null && exit.signal === signal)) return;
    throw new Error(`${this.name} stopped with ${signal}: ${describeExit(exit)}${this.tail()}`);
  }

  /** The exit status, or undefined if it did not exit within `ms`. */
  private async exitWithin(ms: number): Promise<Exit | undefined> {
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<undefined>((resolve) => {
      timer = setTimeout(() => resolve(undefined), ms);
    });
    try {
      return await Promise.race([this.exited, timeout]);
    } finally {
      clearTimeout(timer);
    }
  }

  /** SIGKILL, without checking anything (cleanup after a failure). */
  async kill(): Promise<void> {
    if (this.exitStatus !== undefined) return;
    this.child.ref();
    this.child.kill("SIGKILL");
    await this.exited;
  }

  /** This run's output so far. */
  text(): string {
    return readFrom(this.log, this.logStart);
  }

  /** The last lines of this run's output, for an error message. */
  tail(): string {
    return `\n--- last lines of ${this.log}:\n${lastLines(this.text())}`;
  }
}

export function describeExit(exit: Exit): string {
  if (exit.error !== undefined) return `could not start: ${exit.error.message}`;
  if (exit.signal !== null) return `killed by ${exit.signal}`;
  return `exit code ${String(exit.code)}`;
}

/**
 * Waits until `file`, from offset `from`, has a line matching `pattern`; returns the
 * match. Fails early when `proc` exits meanwhile, and after `timeoutMs` naming
 * `what` with the file's tail.
 */
export async function waitForLog(
  what: string,
  file: string,
  pattern: RegExp,
  options: { from?: number; proc?: Proc; timeoutMs?: number } = {},
): Promise<RegExpMatchArray> {
  const deadline = Date.now() + (options.timeoutMs ?? READY_TIMEOUT_MS);
  for (;;) {
    const text = readFrom(file, options.from ?? 0);
    // Complete lines only: a half-written "…:42" could be the start of "…:4222".
    for (const line of text.split("\n").slice(0, -1)) {
      const match = stripAnsi(line).match(pattern);
      if (match !== null) return match;
    }
    const proc = options.proc;
    if (proc?.exit !== undefined) {
      throw new Error(
        `${proc.name} ${describeExit(proc.exit)} while waiting for ${what}` +
          `\n--- last lines of ${file}:\n${lastLines(text)}` +
          (proc.log === file ? "" : proc.tail()),
      );
    }
    if (Date.now() > deadline) {
      throw new Error(`timed out waiting for ${what} in ${file}\n--- its last lines:\n${lastLines(text)}`);
    }
    await sleep(POLL_MS);
  }
}

/**
 * Polls `check` until it returns a value other than `undefined`; after `timeoutMs`
 * throws naming `what` and the last thing `describe` said (or the last error).
 */
export async function waitUntil<T>(
  what: string,
  check: () => Promise<T | undefined>,
  options: { timeoutMs?: number; intervalMs?: number; last?: () => string } = {},
): Promise<T> {
  const deadline = Date.now() + (options.timeoutMs ?? READY_TIMEOUT_MS);
  let lastError = "";
  for (;;) {
    try {
      const value = await check();
      if (value !== undefined) return value;
    } catch (error) {
      lastError = error instanceof Error ? error.message : String(error);
    }
    if (Date.now() > deadline) {
      const last = options.last?.() ?? lastError;
      throw new Error(`timed out waiting for ${what}${last === "" ? "" : `; last: ${last}`}`);
    }
    await sleep(options.intervalMs ?? 100);
  }
}

export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

export function lastLines(text: string, n = TAIL_LINES): string {
  return text.trimEnd().split("\n").slice(-n).join("\n");
}

function fileSize(file: string): number {
  try {
    return statSync(file).size;
  } catch {
    return 0;
  }
}

function readFrom(file: string, from: number): string {
  try {
    return readFileSync(file).subarray(from).toString("utf8");
  } catch {
    return ""; // Not written yet.
  }
}

// A log written to a terminal would carry colours; to a file it should not, but a
// pattern must not depend on it.
function stripAnsi(line: string): string {
  // eslint-disable-next-line no-control-regex
  return line.replace(/\x1b\[[0-9;]*m/g, "");
}
