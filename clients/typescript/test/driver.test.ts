// @capstan/compute-driver through the controller's lifecycle, against live agents with
// hook owners (`net` on the namespace phases, `iam` on the workload phases; both refuse
// to grant anything named `hookfail…`).
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { once } from "node:events";
import { fileURLToPath } from "node:url";
import { after, before, test } from "node:test";
import { CapstanClient, CapstanError, type LogRecord } from "@capstan/client";
import { CapstanComputeDriver } from "@capstan/compute-driver";
import { type Stack, startStack } from "./stack.js";
import { validatingFetch } from "./validate.js";

const spec = { driver: "sim" as const, image: "shop/web:1", command: ["serve"] };
const validator = validatingFetch();
let stack: Stack;
let client: CapstanClient;

function driver(options: { timeoutMs?: number; attempts?: number } = {}): CapstanComputeDriver {
  return new CapstanComputeDriver({ client, retryDelayMs: 50, ...options });
}

async function records(host: string): Promise<LogRecord[]> {
  const out: LogRecord[] = [];
  for await (const r of client.log(host)) out.push(r);
  return out;
}

/** How many records of `kind` for `namespace` (and `revision`, when given) `host` has. */
async function count(
  host: string,
  kind: LogRecord["kind"],
  namespace: string,
  revision?: string,
): Promise<number> {
  return (await records(host)).filter(
    (r) =>
      r.kind === kind && r.namespace === namespace && (revision === undefined || r.revision === revision),
  ).length;
}

async function rejection(promise: Promise<unknown>): Promise<CapstanError> {
  try {
    await promise;
  } catch (error) {
    assert.ok(error instanceof CapstanError, `not a CapstanError: ${error}`);
    return error;
  }
  assert.fail("resolved");
}

before(async () => {
  stack = await startStack({
    agents: [
      { host: "cd1", hooks: true },
      { host: "cd2", hooks: true },
    ],
  });
  client = new CapstanClient({ baseUrl: stack.url, token: stack.submitToken, fetch: validator.fetch });
});

after(async () => {
  await stack?.close();
  assert.ok(validator.checked() > 0);
});

test("the lifecycle in order: ensure, prepare (ready, nothing started), activate, retire, delete", async () => {
  const d = driver();
  const hosts = ["cd1", "cd2"];
  const ns = await d.ensureNamespace({ namespace: "Tenant-42", hosts });
  assert.match(ns.names.namespace, /^tenant-42-[0-9a-f]{16}$/);
  const ref = { namespace: "Tenant-42", workload: "web", revision: "r1", hosts };
  const prepared = await d.prepareRevision({ ...ref, spec });
  assert.equal(prepared.ready, true);
  assert.equal(prepared.prepared.length, 2);
  for (const host of hosts) {
    const intent = await client.intent(host);
    const w = intent.workloads[`${ns.names.namespace}/web`];
    assert.equal(w?.revisions["r1"], "prepared");
    assert.equal(w?.active_revision, null, "prepare starts nothing");
  }
  await d.activateRevision(ref);
  for (const host of hosts) {
    const w = (await client.intent(host)).workloads[`${ns.names.namespace}/web`];
    assert.equal(w?.intent, "running");
    assert.equal(w?.active_revision, "r1");
    const grants = (await client.intent(host)).grants;
    assert.ok(JSON.stringify(grants).includes("iam"), "iam granted r1");
  }
  await d.retireRevision(ref);
  await d.deleteNamespace({ namespace: "Tenant-42", hosts });
  for (const host of hosts) {
    const intent = await client.intent(host);
    assert.equal(intent.namespaces[ns.names.namespace], undefined, "namespace deleted");
    const kinds = (await records(host))
      .filter((r) => r.kind === "hook_succeeded")
      .map((r) => `${r.phase}:${r.owner}`);
    assert.deepEqual(kinds, [
      "after_namespace_prepared:net",
      "before_workload_start:iam",
      "before_workload_stop:iam",
      "before_namespace_delete:net",
    ]);
  }
});

test("a hook that refuses: the error names its phase and owner, retried under new ids, then given up", async () => {
  const d = driver({ attempts: 2 });
  const error = await rejection(d.ensureNamespace({ namespace: "hookfail-ns", hosts: ["cd1"] }));
  assert.equal(error.code, "hook_failed");
  assert.equal(error.retryable, true);
  assert.deepEqual(error.hookFailures, [
    { phase: "after_namespace_prepared", owner: "net", code: "hook_failed" },
  ]);
  assert.match(error.commandId!, /\.a1$/, "the second attempt's id");
  assert.doesNotMatch(error.message, /opaque-/, "no hook value in the message");
  // Workload phase: iam refuses before_workload_start.
  await d.ensureNamespace({ namespace: "hooks", hosts: ["cd1"] });
  const ref = { namespace: "hooks", workload: "hookfail-web", revision: "r1", hosts: ["cd1"] };
  assert.equal((await d.prepareRevision({ ...ref, spec })).ready, true);
  const start = await rejection(d.activateRevision(ref));
  assert.equal(start.code, "hook_failed");
  assert.deepEqual(start.hookFailures, [
    { phase: "before_workload_start", owner: "iam", code: "hook_failed" },
  ]);
  const w = (await client.intent("cd1")).workloads["hooks/hookfail-web"];
  assert.notEqual(w?.active_revision, "r1", "nothing started");
});

test("prepare answers not ready for a host whose command failed for good", async () => {
  const d = driver();
  await d.ensureNamespace({ namespace: "prep", hosts: ["cd1"] });
  const wrong = { ...spec, driver: "docker" as const };
  const prepared = await d.prepareRevision({
    namespace: "prep",
    workload: "web",
    revision: "r1",
    spec: wrong,
    hosts: ["cd1"],
  });
  assert.equal(prepared.ready, false);
  assert.equal(prepared.notReady[0]?.host, "cd1");
  assert.equal(prepared.notReady[0]?.error.code, "driver_mismatch");
});

test("an agent offline: timeout (retryable) naming the host; called again once it is back, the same command is answered", async () => {
  const d = driver({ timeoutMs: 1500 });
  await stack.stopAgent("cd2");
  // cd2 first: the error is the first failing host's in the order given, whether or
  // not cd1 (which is up) also ran past the short timeout on a loaded machine.
  const operationKey = "offline-1";
  const error = await rejection(
    d.ensureNamespace({ namespace: "offline", hosts: ["cd2", "cd1"], operationKey }),
  );
  assert.equal(error.code, "timeout");
  assert.equal(error.retryable, true);
  assert.equal(error.host, "cd2");
  assert.match(error.message, /call again with the same operationKey/);
  const id = error.commandId!;
  await stack.startAgent("cd2");
  const done = await driver().ensureNamespace({ namespace: "offline", hosts: ["cd1", "cd2"], operationKey });
  const cd2 = done.hosts.find((h) => h.host === "cd2");
  assert.equal(cd2?.commandId, id, "the same id: queued while the host was down, carried out once");
  assert.equal(await count("cd2", "namespace_ready", "offline"), 1);
});

test("an abort mid-call: aborted with the command's id; calling again finishes it, once", async () => {
  const d = driver();
  await d.ensureNamespace({ namespace: "aborts", hosts: ["cd2"] });
  await d.prepareRevision({ namespace: "aborts", workload: "web", revision: "r1", spec, hosts: ["cd2"] });
  await stack.stopAgent("cd2");
  const controller = new AbortController();
  const operationKey = "aborts-1";
  const call = d.activateRevision({
    namespace: "aborts",
    workload: "web",
    revision: "r1",
    hosts: ["cd2"],
    operationKey,
    signal: controller.signal,
  });
  setTimeout(() => controller.abort(), 300);
  const error = await rejection(call);
  assert.equal(error.code, "aborted");
  assert.equal(error.host, "cd2");
  assert.match(error.commandId!, /^activate-revision\./);
  await stack.startAgent("cd2");
  // The command may have been cancelled (the abort asked for it) or run first: either
  // way, calling again ends with r1 active, started exactly once.
  await driver().activateRevision({
    namespace: "aborts",
    workload: "web",
    revision: "r1",
    hosts: ["cd2"],
    operationKey,
  });
  const w = (await client.intent("cd2")).workloads["aborts/web"];
  assert.equal(w?.active_revision, "r1");
  assert.equal(await count("cd2", "workload_started", "aborts"), 1);
});

test("the controller killed mid-call (SIGKILL) and called again: answered from the log, not repeated", async () => {
  const d = driver();
  await d.ensureNamespace({ namespace: "crash", hosts: ["cd1"] });
  await d.prepareRevision({ namespace: "crash", workload: "web", revision: "r1", spec, hosts: ["cd1"] });
  await d.prepareRevision({ namespace: "crash", workload: "web", revision: "r2", spec, hosts: ["cd1"] });
  await d.activateRevision({ namespace: "crash", workload: "web", revision: "r1", hosts: ["cd1"] });
  // A controller process activates r2 and is killed as soon as its command is sent.
  const child = spawn(process.execPath, [fileURLToPath(new URL("./controller.js", import.meta.url))], {
    env: { ...process.env, CAPSTAN_URL: stack.url, CAPSTAN_TOKEN: stack.submitToken, HOST: "cd1" },
    stdio: ["ignore", "pipe", "inherit"],
  });
  let out = "";
  child.stdout!.setEncoding("utf8");
  await new Promise<void>((resolve, reject) => {
    child.stdout!.on("data", (chunk: string) => {
      out += chunk;
      if (out.includes("submitted ")) resolve();
    });
    child.on("exit", () => reject(new Error(`controller exited before submitting: ${out}`)));
  });
  const exited = once(child, "exit") as Promise<[number | null, NodeJS.Signals | null]>;
  assert.ok(child.kill("SIGKILL"));
  const [code, signal] = await exited;
  assert.equal(code, null);
  assert.equal(signal, "SIGKILL");
  const sent = /submitted (\S+)/.exec(out)![1]!;
  // The controller comes back and calls again, with the same operation key.
  const done = await driver().activateRevision({
    namespace: "crash",
    workload: "web",
    revision: "r2",
    hosts: ["cd1"],
    operationKey: "deploy-2",
  });
  assert.equal(done.hosts[0]?.commandId, sent);
  assert.equal(await count("cd1", "workload_started", "crash", "r2"), 1, "r2 started once");
  // A rollback to r1 is a new operation (another key): carried out, not answered.
  await driver().activateRevision({
    namespace: "crash",
    workload: "web",
    revision: "r1",
    hosts: ["cd1"],
    operationKey: "rollback-3",
  });
  assert.equal((await client.intent("cd1")).workloads["crash/web"]?.active_revision, "r1");
});

test("without an operationKey every call is a new operation: a rollback to r1 runs r1, a namespace deleted and ensured again is ready", async () => {
  const d = driver();
  const hosts = ["cd1"];
  await d.ensureNamespace({ namespace: "rollback", hosts });
  const ref = { namespace: "rollback", workload: "web", hosts };
  await d.prepareRevision({ ...ref, revision: "r1", spec });
  await d.prepareRevision({ ...ref, revision: "r2", spec });
  const first = await d.activateRevision({ ...ref, revision: "r1" });
  await d.activateRevision({ ...ref, revision: "r2" });
  assert.equal((await client.intent("cd1")).workloads["rollback/web"]?.active_revision, "r2");
  // The rollback: the same content as the first activation, and no key.
  const rollback = await d.activateRevision({ ...ref, revision: "r1" });
  assert.notEqual(rollback.hosts[0]?.commandId, first.hosts[0]?.commandId, "not the first call's command");
  assert.equal((await client.intent("cd1")).workloads["rollback/web"]?.active_revision, "r1", "r1 is active");
  assert.equal(await count("cd1", "workload_started", "rollback", "r1"), 2, "r1 started again");
  // A namespace's second life: ensured, deleted, ensured again, all without a key.
  await d.ensureNamespace({ namespace: "again", hosts });
  await d.deleteNamespace({ namespace: "again", hosts });
  await d.ensureNamespace({ namespace: "again", hosts });
  assert.ok((await client.intent("cd1")).namespaces["again"], "the namespace is ready again");
  assert.equal(await count("cd1", "namespace_ready", "again"), 2);
  // An empty key would make every call with the same content one operation: refused.
  await assert.rejects(d.ensureNamespace({ namespace: "again", hosts, operationKey: "" }), RangeError);
});
