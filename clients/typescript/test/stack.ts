// A real capstan stack on loopback for one test, as scripts/fleet-demo.sh builds it:
// nats-server (per-host accounts from `capstan-coordinator nats-config`, or one shared
// account when a sim-fleet is in it), a signing key, API tokens, the coordinator,
// `capstan-agent run` processes and optionally one `capstan-agent sim-fleet`.
// Everything lives in a temp dir and is stopped by close().

import { execFile } from "node:child_process";
import { accessSync, constants } from "node:fs";
import { chmod, mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { Proc, READY_TIMEOUT_MS, waitForLog, waitUntil } from "./processes.js";

export interface AgentOptions {
  host: string;
  /** Two exec hook owners, `net` and `iam`, running the harness's hook script. */
  hooks?: boolean;
}

export interface StackOptions {
  /** Simulated hosts in one `capstan-agent sim-fleet` process. */
  fleet?: number;
  /** Their names are `<prefix>-0001`, …; default `sim`. */
  fleetPrefix?: string;
  /** Individual `capstan-agent run` processes. */
  agents?: AgentOptions[];
  /**
   * How agents authenticate to NATS. `per-host` (the default with agents and no
   * fleet): an account per host, as in production. `shared`: one account for
   * everyone, the only way `sim-fleet` runs (its hosts share one NATS credential and
   * `host_accounts` must stay off: docs/agent.md, *`sim-fleet`*), hence the default
   * with a fleet (and without any host); `per-host` with a fleet is an error.
   */
  accounts?: "per-host" | "shared";
}

/** A hook call as the agent sent it (docs/hooks.md, *The protocol*). */
export interface HookRequest {
  v: number;
  phase: string;
  owner: string;
  host: string;
  command_id: string;
  namespace: string;
  workload: string | null;
  revision: string | null;
  compensating: boolean;
}

export interface Stack {
  /** The coordinator's API, `http://127.0.0.1:PORT`. */
  url: string;
  /** An API token of role `submit`, and one of role `read`. */
  submitToken: string;
  readToken: string;
  /** The stack's temp dir (logs: nats-*.log, coordinator.log, <host>/agent.log, fleet/sim-fleet.log). */
  dir: string;
  fleetHosts: string[];
  agentHosts: string[];
  natsUrl: string;
  accounts: "per-host" | "shared";
  /** Stops nats-server (its store is kept), asserting a clean exit. */
  stopNats(): Promise<void>;
  /** Starts it again on the same port with the same store; resolves once it is ready (at once if it runs). */
  startNats(): Promise<void>;
  /** SIGTERM to `host`'s agent; resolves once it exited 0 (else throws). */
  stopAgent(host: string): Promise<void>;
  /** Starts `host`'s agent again; resolves once it takes commands (at once if it runs). */
  startAgent(host: string): Promise<void>;
  /** Every call the hook script got on `host` (an agent with `hooks: true`), in order. */
  hookCalls(host: string): Promise<HookRequest[]>;
  /**
   * Stops everything (agents and fleet, coordinator, nats-server), removes the dir
   * (kept when CAPSTAN_TS_KEEP_DIR is set), and throws if anything did not exit
   * cleanly, naming it with its log's tail.
   */
  close(): Promise<void>;
}

const run = promisify(execFile);

// test/build/stack.js → the repository's root.
const repoRoot = fileURLToPath(new URL("../../../../", import.meta.url));

/** Where the capstan binaries are: $CAPSTAN_BIN_DIR, $CARGO_TARGET_DIR/debug, target/debug. */
export function binDir(): string {
  const { CAPSTAN_BIN_DIR, CARGO_TARGET_DIR } = process.env;
  if (CAPSTAN_BIN_DIR) return path.resolve(CAPSTAN_BIN_DIR);
  // Relative to the repository, as scripts/fleet-demo.sh (run from there) reads it.
  if (CARGO_TARGET_DIR) return path.resolve(repoRoot, CARGO_TARGET_DIR, "debug");
  return path.join(repoRoot, "target", "debug");
}

function binary(name: string): string {
  const file = path.join(binDir(), name);
  if (!isExecutable(file)) {
    throw new Error(`${file} is missing: build with cargo build --workspace --bins (or set CAPSTAN_BIN_DIR)`);
  }
  return file;
}

function natsServerBinary(): string {
  const configured = process.env.CAPSTAN_NATS_SERVER;
  if (configured) {
    if (!isExecutable(configured))
      throw new Error(`CAPSTAN_NATS_SERVER=${configured} is not an executable file`);
    return configured;
  }
  for (const dir of (process.env.PATH ?? "").split(path.delimiter)) {
    const file = path.join(dir, "nats-server");
    if (dir !== "" && isExecutable(file)) return file;
  }
  throw new Error(
    "nats-server not found: set CAPSTAN_NATS_SERVER (e.g. /var/cache/capstan-ci/nats-server-*/nats-server, built by .ci/nats.sh) or install it on PATH (apt-get install nats-server)",
  );
}

function isExecutable(file: string): boolean {
  try {
    accessSync(file, constants.X_OK);
    return true;
  } catch {
    return false;
  }
}

/** Runs a one-shot command; its stdout, trimmed. */
async function tool(file: string, args: string[]): Promise<string> {
  try {
    const { stdout } = await run(file, args, { timeout: READY_TIMEOUT_MS });
    return stdout.trim();
  } catch (error) {
    // execFile's error says the exit status; the tool's own words are on stderr.
    const stderr = String((error as { stderr?: unknown }).stderr ?? "").trim();
    const reason = error instanceof Error ? error.message.split("\n")[0] : String(error);
    throw new Error(`${path.basename(file)} ${args.join(" ")} failed: ${stderr === "" ? reason : stderr}`);
  }
}

// TOML basic strings take JSON's escapes.
const q = (text: string): string => JSON.stringify(text);

const DNS_LABEL = /^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$/;

/** Starts a stack; see {@link StackOptions}. On any failure everything started is killed. */
export async function startStack(options: StackOptions = {}): Promise<Stack> {
  const stack = new LiveStack(options);
  try {
    await stack.start();
  } catch (error) {
    await stack.abort();
    throw error;
  }
  return stack;
}

interface AgentState {
  host: string;
  dataDir: string;
  config: string;
  log: string;
  proc?: Proc;
}

class LiveStack implements Stack {
  url = "";
  submitToken = "";
  readToken = "";
  dir = "";
  natsUrl = "";
  readonly fleetHosts: string[];
  readonly agentHosts: string[];
  readonly accounts: "per-host" | "shared";

  private natsPort = 0;
  private natsRuns = 0;
  private nats: Proc | undefined;
  private coordinator: Proc | undefined;
  private fleet: Proc | undefined;
  private publicKey = "";
  private readonly agents = new Map<string, AgentState>();
  private closed = false;

  constructor(private readonly options: StackOptions) {
    const fleet = options.fleet ?? 0;
    const prefix = options.fleetPrefix ?? "sim";
    this.fleetHosts = Array.from({ length: fleet }, (_, i) => `${prefix}-${String(i + 1).padStart(4, "0")}`);
    this.agentHosts = (options.agents ?? []).map((a) => a.host);
    this.accounts = options.accounts ?? (fleet === 0 && this.agentHosts.length > 0 ? "per-host" : "shared");
    this.checkOptions();
  }

  private checkOptions(): void {
    if (this.accounts === "per-host" && this.fleetHosts.length > 0) {
      throw new Error(
        'sim-fleet cannot run on per-host accounts (its hosts share one NATS credential): use accounts: "shared"',
      );
    }
    if (this.accounts === "per-host" && this.agentHosts.length === 0) {
      throw new Error(
        "per-host accounts need at least one agent (capstan-coordinator nats-config takes one host or more)",
      );
    }
    const all = [...this.fleetHosts, ...this.agentHosts];
    for (const host of all) {
      if (!DNS_LABEL.test(host)) throw new Error(`host name ${q(host)} is not a DNS label`);
    }
    if (new Set(all).size !== all.length) throw new Error(`host names repeat: ${all.join(", ")}`);
  }

  async start(): Promise<void> {
    this.dir = await mkdtemp(path.join(tmpdir(), "capstan-ts-"));
    await this.writeNatsConfig();
    await this.bootNats();
    await this.startCoordinator();
    for (const agent of this.options.agents ?? []) await this.addAgent(agent);
    if (this.fleetHosts.length > 0) await this.startFleet();
    await this.waitAlive([...this.agentHosts, ...this.fleetHosts]);
  }

  // --- nats-server ---

  private get natsDir(): string {
    return path.join(this.dir, "nats");
  }

  /** Per-host accounts: an account and nkey per host, and the coordinators'. */
  private async writeNatsConfig(): Promise<void> {
    if (this.accounts === "shared") return;
    const args = ["nats-config", "--out", this.natsDir];
    // Small quotas, as the Rust harness's (tests/harness/nats/credentials.rs).
    args.push("--shard-quota", "256M", "--fleet-quota", "2G");
    for (const host of this.agentHosts) args.push("--host", host);
    await tool(binary("capstan-coordinator"), args);
  }

  /**
   * The server's config: the accounts' (per-host) or none, with the server's store
   * bounded by a set limit. Left to itself nats-server takes 75 % of the free disk,
   * and the coordinator's streams reserve about 6 GiB: with under ~10 GB free the
   * coordinator's setup fails (capstan-testsupport's `store_limited_config`).
   */
  private async writeStoreConfig(): Promise<string> {
    const base =
      this.accounts === "per-host" ? await readFile(path.join(this.natsDir, "nats-server.conf"), "utf8") : "";
    const open = "jetstream {\n";
    const limit = "  max_file_store: 1T\n";
    // The server's own block starts a line (an account's is `jetstream { max_file: …`).
    const at = base.startsWith(open) ? 0 : base.indexOf(`\n${open}`) + 1;
    const text =
      at > 0 || base.startsWith(open)
        ? base.slice(0, at + open.length) + limit + base.slice(at + open.length)
        : `${base}\n${open}${limit}}\n`;
    const file = path.join(this.dir, "nats-server.test.conf");
    await writeFile(file, text);
    return file;
  }

  /** Starts nats-server: the first run picks its port, a restart takes it again. */
  private async bootNats(): Promise<void> {
    this.natsRuns += 1;
    const run = this.natsRuns;
    // A log per run: "Server is ready" of an earlier run must not count.
    const log = path.join(this.dir, run === 1 ? "nats.log" : `nats-${run}.log`);
    const args = ["-c", await this.writeStoreConfig()];
    const port = this.natsPort === 0 ? "-1" : String(this.natsPort);
    args.push("-js", "-a", "127.0.0.1", "-p", port, "-sd", path.join(this.dir, "js"), "-l", log);
    // Its own log is `-l`; stdout/stderr only say something when it cannot start.
    const out = log.replace(/\.log$/, ".out");
    const proc = new Proc(`nats-server (run ${run})`, out, natsServerBinary(), args);
    this.nats = proc;
    await waitForLog("nats-server to be ready", log, /Server is ready/, { proc });
    const [, listening] = await waitForLog(
      "its client port",
      log,
      /Listening for client connections on 127\.0\.0\.1:(\d+)/,
      {
        proc,
      },
    );
    this.natsPort = Number(listening);
    this.natsUrl = `nats://127.0.0.1:${this.natsPort}`;
  }

  async stopNats(): Promise<void> {
    const proc = this.nats;
    if (proc === undefined) throw new Error("nats-server is not running");
    this.nats = undefined;
    // SIGINT, not SIGTERM: on SIGTERM nats-server 2.9 (Debian's) exits 1 and 2.15
    // exits 0; both exit 0 on SIGINT (tests/harness/nats.rs, NatsServer::stop).
    await proc.stop("SIGINT");
  }

  async startNats(): Promise<void> {
    if (this.nats !== undefined) return; // Running already (e.g. a `finally` making sure).
    await this.bootNats();
  }

  // --- coordinator ---

  private async startCoordinator(): Promise<void> {
    const coordinator = binary("capstan-coordinator");
    const key = path.join(this.dir, "signing.key");
    this.publicKey = await tool(coordinator, ["keygen", "--out", key]);
    // One after the other: both append to the same tokens file.
    const tokens = path.join(this.dir, "tokens");
    this.submitToken = await tool(coordinator, [
      "token",
      "--role",
      "submit",
      "--name",
      "ts",
      "--append-to",
      tokens,
    ]);
    this.readToken = await tool(coordinator, [
      "token",
      "--role",
      "read",
      "--name",
      "ts-read",
      "--append-to",
      tokens,
    ]);
    const config = path.join(this.dir, "coordinator.toml");
    await writeFile(
      config,
      [
        'listen = "127.0.0.1:0"',
        `signing_key_file = ${q(key)}`,
        `tokens_file = ${q(tokens)}`,
        "[nats]",
        `url = ${q(this.natsUrl)}`,
        ...this.natsAuth("coordinator"),
        "",
      ].join("\n"),
    );
    const log = path.join(this.dir, "coordinator.log");
    const proc = new Proc("capstan-coordinator", log, coordinator, ["run", "--config", config], {
      ...process.env,
      RUST_LOG: "info",
    });
    this.coordinator = proc;
    const [, listen] = await waitForLog(
      "capstan-coordinator ready",
      log,
      /capstan-coordinator ready.*listen=(\S+)/,
      { proc },
    );
    this.url = `http://${listen}`;
    // The first answered request also creates the streams, before any agent comes.
    await waitUntil("the coordinator to answer GET /v1/hosts with 200", async () => {
      const res = await this.api("GET", "/v1/hosts");
      return res.status === 200 ? true : undefined;
    });
  }

  /** The `[nats]` auth lines of `user` (a host, or `coordinator`). */
  private natsAuth(user: string): string[] {
    if (this.accounts === "shared") return [];
    const seed = (name: string) => path.join(this.natsDir, "credentials", `${name}.nk`);
    const lines = [`nkey_seed_file = ${q(seed(user))}`, "host_accounts = true"];
    // A coordinator's second user reaches the hosts (account CAPSTAN_HOSTS).
    if (user === "coordinator") lines.push(`hosts_nkey_seed_file = ${q(seed("coordinator-hosts"))}`);
    return lines;
  }

  /** A request to the coordinator with the submit token; the status and JSON body. */
  private async api(
    method: string,
    route: string,
    body?: unknown,
  ): Promise<{ status: number; body: unknown }> {
    const headers: Record<string, string> = { Authorization: `Bearer ${this.submitToken}` };
    const init: RequestInit = { method, headers };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const res = await fetch(`${this.url}${route}`, init);
    const text = await res.text();
    let parsed: unknown = text;
    try {
      parsed = JSON.parse(text);
    } catch {
      // Not JSON: kept as text for the error message.
    }
    return { status: res.status, body: parsed };
  }

  private async registerKey(host: string, key: string): Promise<void> {
    const res = await this.api("PUT", `/v1/hosts/${host}/keys`, { public_key: key });
    if (res.status !== 200) {
      throw new Error(
        `registering ${host}'s key: PUT /v1/hosts/${host}/keys answered ${res.status} ${JSON.stringify(res.body)}`,
      );
    }
  }

  /** Waits until GET /v1/hosts lists every one of `hosts` alive. */
  private async waitAlive(hosts: string[]): Promise<void> {
    if (hosts.length === 0) return;
    let missing: string[] = hosts;
    await waitUntil(
      `${hosts.join(", ")} alive in GET /v1/hosts`,
      async () => {
        const res = await this.api("GET", "/v1/hosts");
        const listed = (res.body as { hosts?: { host: string; status: string }[] }).hosts ?? [];
        const alive = new Set(listed.filter((h) => h.status === "alive").map((h) => h.host));
        missing = hosts.filter((h) => !alive.has(h));
        return missing.length === 0 ? true : undefined;
      },
      { last: () => `not alive: ${missing.join(", ")}` },
    );
  }

  // --- agents ---

  private async addAgent(options: AgentOptions): Promise<void> {
    const { host } = options;
    const dataDir = path.join(this.dir, host);
    await mkdir(dataDir, { recursive: true });
    const hooks = options.hooks === true ? await this.writeHookScript(dataDir) : undefined;
    const config = path.join(dataDir, "agent.toml");
    await writeFile(config, this.agentConfig(host, dataDir, hooks));
    const agent: AgentState = { host, dataDir, config, log: path.join(dataDir, "agent.log") };
    this.agents.set(host, agent);
    // Registered before the agent first publishes (as the demo does): its first
    // beat and records are then taken, not refused as unverified.
    const key = await tool(binary("capstan-agent"), ["--config", config, "host-key"]);
    await this.registerKey(host, key);
    await this.runAgent(agent);
  }

  private agentConfig(host: string, dataDir: string, hookScript: string | undefined): string {
    const lines = [`host = ${q(host)}`, `data_dir = ${q(dataDir)}`, 'driver = "sim"'];
    if (hookScript !== undefined) lines.push(...hookOwners(hookScript));
    lines.push("[nats]", `url = ${q(this.natsUrl)}`, ...this.natsAuth(host));
    lines.push("[signing]", `public_keys = [${q(this.publicKey)}]`);
    // Several agents on one machine: each serves /metrics on a free port.
    lines.push("[metrics]", 'listen = "127.0.0.1:0"', "");
    return lines.join("\n");
  }

  /** Writes the hook script into `dataDir`; its path. */
  private async writeHookScript(dataDir: string): Promise<string> {
    const script = path.join(dataDir, "ts-hook.cjs");
    await writeFile(script, hookScript(path.join(dataDir, "hook-calls.jsonl")));
    await chmod(script, 0o755);
    return script;
  }

  private async runAgent(agent: AgentState): Promise<void> {
    const proc = new Proc(`capstan-agent run (${agent.host})`, agent.log, binary("capstan-agent"), [
      "--config",
      agent.config,
      "run",
    ]);
    agent.proc = proc;
    await waitForLog(`${agent.host} taking commands`, agent.log, /taking commands/, {
      from: proc.logStart,
      proc,
    });
  }

  private agent(host: string): AgentState {
    const agent = this.agents.get(host);
    if (agent === undefined)
      throw new Error(`${host} is not one of this stack's agents (${this.agentHosts.join(", ")})`);
    return agent;
  }

  async stopAgent(host: string): Promise<void> {
    const agent = this.agent(host);
    const proc = agent.proc;
    if (proc === undefined) throw new Error(`${host}'s agent is not running`);
    delete agent.proc;
    await proc.stop("SIGTERM");
  }

  async startAgent(host: string): Promise<void> {
    const agent = this.agent(host);
    if (agent.proc !== undefined) return; // Running already.
    await this.runAgent(agent);
  }

  async hookCalls(host: string): Promise<HookRequest[]> {
    const file = path.join(this.agent(host).dataDir, "hook-calls.jsonl");
    let text = "";
    try {
      text = await readFile(file, "utf8");
    } catch {
      return []; // No call yet.
    }
    return text
      .split("\n")
      .filter((line) => line !== "")
      .map((line) => JSON.parse(line) as HookRequest);
  }

  // --- sim-fleet ---

  private async startFleet(): Promise<void> {
    const dataDir = path.join(this.dir, "fleet");
    await mkdir(dataDir, { recursive: true });
    const config = path.join(dataDir, "agent.toml");
    // The config every simulated host shares (`host` is not used).
    const lines = [`data_dir = ${q(dataDir)}`, 'driver = "sim"'];
    lines.push("[nats]", `url = ${q(this.natsUrl)}`, "[signing]", `public_keys = [${q(this.publicKey)}]`);
    lines.push("[metrics]", "enabled = false", "");
    await writeFile(config, lines.join("\n"));
    const log = path.join(dataDir, "sim-fleet.log");
    const prefix = this.options.fleetPrefix ?? "sim";
    const args = [
      "--config",
      config,
      "sim-fleet",
      "--hosts",
      String(this.fleetHosts.length),
      "--prefix",
      prefix,
    ];
    const proc = new Proc("capstan-agent sim-fleet", log, binary("capstan-agent"), args);
    this.fleet = proc;
    await waitForLog("sim fleet ready", log, /sim fleet ready/, { proc });
    // `HOST KEY` lines, written before "sim fleet ready".
    const keys = await readFile(path.join(dataDir, "host-keys"), "utf8");
    for (const line of keys.split("\n").filter((l) => l.trim() !== "")) {
      const [host, key] = line.trim().split(/\s+/);
      if (host === undefined || key === undefined) throw new Error(`bad line in host-keys: ${q(line)}`);
      await this.registerKey(host, key);
    }
  }

  // --- stopping ---

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    const failures: string[] = [];
    const stop = async (proc: Proc | undefined, signal: NodeJS.Signals): Promise<void> => {
      try {
        await proc?.stop(signal);
      } catch (error) {
        failures.push(error instanceof Error ? error.message : String(error));
      }
    };
    // The hosts first (their shutdown publishes its last records), then the
    // coordinator, then the server they all talk to.
    const hosts = [...this.agents.values()].map((a) => a.proc);
    await Promise.all([...hosts, this.fleet].map((proc) => stop(proc, "SIGTERM")));
    await stop(this.coordinator, "SIGTERM");
    await stop(this.nats, "SIGINT"); // SIGINT: see stopNats().
    await this.removeDir();
    if (failures.length > 0) {
      throw new Error(`the stack did not stop cleanly:\n\n${failures.join("\n\n")}`);
    }
  }

  /** After a failed start: SIGKILL whatever runs, remove the dir. */
  async abort(): Promise<void> {
    this.closed = true;
    const procs = [...[...this.agents.values()].map((a) => a.proc), this.fleet, this.coordinator, this.nats];
    await Promise.all(procs.map((proc) => proc?.kill()));
    await this.removeDir();
  }

  private async removeDir(): Promise<void> {
    if (this.dir === "") return;
    if (process.env.CAPSTAN_TS_KEEP_DIR) {
      process.stderr.write(`capstan test stack kept in ${this.dir}\n`);
      return;
    }
    await rm(this.dir, { recursive: true, force: true });
  }
}

/**
 * The owners of an agent with hooks (docs/hooks.md, *Configuring owners*): `net` on
 * the namespace phases, `iam` on the workload phases; each grants and revokes.
 */
function hookOwners(script: string): string[] {
  const owner = (name: string, phases: string[]): string[] => [
    "[[hooks]]",
    `name = ${q(name)}`,
    'kind = "exec"',
    `argv = [${q(script)}]`,
    `phases = [${phases.map(q).join(", ")}]`,
  ];
  return [
    ...owner("net", ["after_namespace_prepared", "before_namespace_delete"]),
    ...owner("iam", ["before_workload_start", "before_workload_stop"]),
  ];
}

/**
 * The hook script (docs/hooks.md, *The protocol*): the request on stdin; it fails
 * (exit 1) a preparing phase whose namespace or workload starts with `hookfail`, and
 * otherwise answers `{}`, or for `before_workload_start` a launch env (a `TS_` name:
 * `CAPSTAN_*` names are reserved). Each request is appended to `calls`. Exec hooks
 * get an empty environment but PATH, so the shebang names this very node binary.
 */
function hookScript(calls: string): string {
  return `#!${process.execPath}
'use strict';
const fs = require('node:fs');
const request = JSON.parse(fs.readFileSync(0, 'utf8'));
fs.appendFileSync(${q(calls)}, JSON.stringify(request) + '\\n');
const preparing = request.phase === 'after_namespace_prepared' || request.phase === 'before_workload_start';
const named = [request.namespace, request.workload].some((n) => typeof n === 'string' && n.startsWith('hookfail'));
if (preparing && named) process.exit(1);
const reply = request.phase === 'before_workload_start' ? { env: { TS_GRANT: 'opaque-granted' } } : {};
process.stdout.write(JSON.stringify(reply));
`;
}

/**
 * Runs `body` on a fresh stack and closes it. When `body` fails, its error is the
 * one thrown (a close failure then is only printed); otherwise close()'s is.
 */
export async function withStack<T>(options: StackOptions, body: (stack: Stack) => Promise<T>): Promise<T> {
  const stack = await startStack(options);
  let result: T;
  try {
    result = await body(stack);
  } catch (error) {
    await stack.close().catch((closing: unknown) => {
      process.stderr.write(`closing the stack after the failure: ${String(closing)}\n`);
    });
    throw error;
  }
  await stack.close();
  return result;
}
