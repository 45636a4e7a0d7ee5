// @capstan/client against a live coordinator, nats-server and agents (a sim-fleet of
// 20 hosts and one agent of its own that the tests stop and start). Every answer is
// checked against the OpenAPI description as it arrives (validate.ts).
import assert from "node:assert/strict";
import { generateKeyPairSync } from "node:crypto";
import { after, before, describe, test } from "node:test";
import { CapstanClient, CapstanError, type Command, type LogRecord, commandId } from "@capstan/client";
import { type Stack, startStack } from "./stack.js";
import { validatingFetch } from "./validate.js";

const spec = { driver: "sim" as const, image: "shop/web:1", command: ["serve"] };
const validator = validatingFetch();
let stack: Stack;

function client(
  token: "submit" | "read" | "none" = "submit",
  retry: false | undefined = undefined,
): CapstanClient {
  return new CapstanClient({
    baseUrl: stack.url,
    ...(token === "none" ? {} : { token: token === "submit" ? stack.submitToken : stack.readToken }),
    fetch: validator.fetch,
    ...(retry === undefined ? {} : { retry }),
  });
}

/** The validating fetch, counting the requests it makes. */
function counting(): { fetch: (request: Request) => Promise<Response>; requests: () => number } {
  let n = 0;
  return {
    fetch: (request) => {
      n++;
      return validator.fetch(request);
    },
    requests: () => n,
  };
}

/** Rejects with a CapstanError of `code` (and `status`, when given). */
async function rejectsWith(promise: Promise<unknown>, code: string, status?: number): Promise<CapstanError> {
  try {
    await promise;
  } catch (error) {
    assert.ok(error instanceof CapstanError, `not a CapstanError: ${error}`);
    assert.equal(error.code, code, error.message);
    if (status !== undefined) assert.equal(error.status, status, error.message);
    return error;
  }
  assert.fail(`resolved; expected ${code}`);
}

before(async () => {
  stack = await startStack({ fleet: 20, agents: [{ host: "solo" }] });
});

after(async () => {
  await stack?.close();
  assert.ok(validator.checked() > 0, "no answer was validated against the description");
});

describe("commands", () => {
  test("submit, wait and status: a command runs once, answered from the log when sent again", async () => {
    const c = client();
    const host = stack.fleetHosts[0]!;
    const command: Command = { op: "ensure_namespace", host, namespace: "cmds" };
    const id = commandId(command, { key: "client-test" });
    const accepted = await c.submit({ ...command, id });
    assert.deepEqual(accepted, { id, host });
    const done = await c.wait(id, { timeoutMs: 30_000 });
    assert.equal(done.status, "succeeded");
    assert.equal(done.done, true);
    assert.equal(done.error, null);
    const ready = done.events.filter((e) => e.kind === "namespace_ready");
    assert.equal(ready.length, 1);
    // Sent again under its id: answered, not carried out again.
    await c.submit({ ...command, id });
    const again = await c.wait(id, { timeoutMs: 30_000 });
    assert.equal(again.status, "succeeded");
    const status = await c.status(id);
    assert.equal(status.events.filter((e) => e.kind === "namespace_ready").length, 1);
    assert.equal(status.id, id);
  });

  test("run() turns a failed command into its CapstanError, with retryable", async () => {
    const c = client();
    const host = stack.fleetHosts[1]!;
    const error = await rejectsWith(
      c.run(
        { op: "activate_revision", host, namespace: "absent", workload: "w", revision: "r1" },
        { timeoutMs: 30_000 },
      ),
      "workload_not_found",
    );
    assert.equal(error.retryable, false);
    assert.equal(error.host, host);
    assert.equal(error.command?.status, "failed");
    assert.equal(error.command?.error?.retryable, false, "the answer says it itself");
    assert.equal(error.status, undefined, "a command's failure is not an HTTP error");
  });

  test("a submission without an id gets one before it is sent, and the same one on a retry", async () => {
    const c = client();
    const accepted = await c.submit({
      op: "ensure_namespace",
      host: stack.fleetHosts[2]!,
      namespace: "noid",
    });
    assert.match(accepted.id, /^c-[0-9a-f]{16}$/);
    assert.equal((await c.wait(accepted.id)).status, "succeeded");
  });

  test("cancel of a done command sends nothing", async () => {
    const c = client();
    const command: Command = { op: "ensure_namespace", host: stack.fleetHosts[3]!, namespace: "cancelled" };
    const done = await c.run(command);
    const answer = await c.cancel(done.id);
    assert.equal(answer.cancel_id, null);
    assert.equal(answer.command.status, "succeeded");
  });

  test("an abort mid-wait ends the wait, not the command: it can be asked again", async () => {
    const c = client();
    await stack.stopAgent("solo");
    const command: Command = { op: "ensure_namespace", host: "solo", namespace: "later" };
    const { id } = await c.submit(command);
    const controller = new AbortController();
    const waiting = c.wait(id, { signal: controller.signal, timeoutMs: 60_000 });
    setTimeout(() => controller.abort(new Error("the controller gave up")), 300);
    const error = await rejectsWith(waiting, "aborted");
    assert.equal(error.commandId, id);
    assert.equal((await c.status(id)).status, "pending", "queued for its host, not lost");
    await rejectsWith(c.wait(id, { timeoutMs: 500 }), "timeout");
    await stack.startAgent("solo");
    const done = await c.wait(id, { timeoutMs: 60_000 });
    assert.equal(done.status, "succeeded");
  });
});

describe("hosts and logs", () => {
  test("hosts, intent, status, events, log, hostLog and verify", async () => {
    const c = client("read");
    const submit = client();
    const host = stack.fleetHosts[4]!;
    for (const command of [
      { op: "ensure_namespace", host, namespace: "shop" },
      { op: "prepare_revision", host, namespace: "shop", workload: "web", revision: "r1", spec },
      { op: "activate_revision", host, namespace: "shop", workload: "web", revision: "r1" },
    ] satisfies Command[]) {
      await submit.run(command, { timeoutMs: 30_000 });
    }
    const hosts = await c.hosts();
    for (const h of [...stack.fleetHosts, "solo"]) {
      assert.ok(
        hosts.some((e) => e.host === h),
        `${h} listed`,
      );
    }
    const intent = await c.intent(host);
    assert.equal(intent.workloads["shop/web"]?.intent, "running");
    assert.equal(intent.workloads["shop/web"]?.active_revision, "r1");
    const status = await c.hostStatus(host);
    assert.ok(status);
    // The whole log, from the central stream: seq 1, 2, … with no gap.
    const records: LogRecord[] = [];
    for await (const r of c.log(host)) records.push(r);
    assert.ok(records.length >= 9, `${records.length} records`);
    records.forEach((r, i) => assert.equal(r.seq, i + 1));
    const page = await c.events(host, { since: 2, limit: 3 });
    assert.deepEqual(
      page.events.map((e) => e.seq),
      [3, 4, 5],
    );
    const own = await c.hostLog(host, { since: 0, limit: 1000 });
    assert.equal(own.records.length, records.length);
    const verdict = await c.verify(host);
    assert.equal(verdict.result, "ok");
    assert.equal(verdict.first_difference, null);
    assert.ok(verdict.compared >= records.length);
  });

  test("log with follow yields new records as they come, until aborted", async () => {
    const c = client("read");
    const host = stack.fleetHosts[5]!;
    const controller = new AbortController();
    const seen: LogRecord[] = [];
    const following = (async () => {
      for await (const r of c.log(host, { follow: true, pollMs: 100, signal: controller.signal })) {
        seen.push(r);
        if (r.kind === "command_completed") controller.abort();
      }
    })();
    await client().submit({ op: "ensure_namespace", host, namespace: "followed" });
    await rejectsWith(following, "aborted");
    assert.ok(seen.some((r) => r.kind === "namespace_ready"));
  });

  test("keys: register, list, unregister", async () => {
    const c = client();
    const host = stack.fleetHosts[6]!;
    const before = await c.keys(host);
    // A real ed25519 public key, as `capstan-agent host-key` prints one: 64 hex digits.
    const jwk = generateKeyPairSync("ed25519").publicKey.export({ format: "jwk" });
    const extra = Buffer.from(jwk.x!, "base64url").toString("hex");
    const added = await c.registerKey(host, extra);
    assert.deepEqual(added.public_keys, [...before.public_keys, extra]);
    const left = await c.unregisterKey(host, extra);
    assert.deepEqual(left.public_keys, before.public_keys);
    await rejectsWith(c.unregisterKey(host, extra), "key_not_found", 404);
  });
});

describe("rollout", () => {
  test("one command to 20 hosts of a sim-fleet, with progress", async () => {
    const c = client();
    const progress: number[] = [];
    const summary = await c.rollout(
      { op: "ensure_namespace", namespace: "fleetwide", id: "ts-rollout-1" },
      {
        hosts: stack.fleetHosts,
        concurrency: 8,
        timeoutMs: 60_000,
        onProgress: (p) => progress.push(p.done),
      },
    );
    assert.equal(summary.total, 20);
    assert.equal(
      summary.succeeded,
      20,
      JSON.stringify(summary.results.filter((r) => r.status !== "succeeded")),
    );
    assert.deepEqual(
      progress,
      Array.from({ length: 20 }, (_, i) => i + 1),
    );
    assert.deepEqual(
      summary.results.map((r) => r.id),
      [...stack.fleetHosts].sort().map((h) => `ts-rollout-1.${h}`),
    );
    // A host the API refuses the command for is a result of its own.
    const refused = await c.rollout(
      { op: "ensure_namespace", namespace: "fleetwide", id: "ts-rollout-2" },
      { hosts: [stack.fleetHosts[0]!, "Not_A_Host"] },
    );
    assert.equal(refused.succeeded, 1);
    const bad = refused.results.find((r) => r.host === "Not_A_Host");
    assert.equal(bad?.status, "unsubmitted");
    assert.equal(bad?.error?.code, "invalid_name");
    // "alive": every host alive now, each answered from its log the second time.
    const alive = await c.rollout(
      { op: "ensure_namespace", namespace: "fleetwide", id: "ts-rollout-1" },
      { hosts: "alive" },
    );
    assert.ok(alive.total >= 20);
    assert.equal(alive.succeeded, alive.total);
  });
});

describe("errors: every documented code, as a CapstanError", () => {
  test("401 unauthorized without a token", async () => {
    const error = await rejectsWith(client("none").hosts(), "unauthorized", 401);
    assert.equal(error.retryable, false);
  });

  test("403 forbidden: a read token on a submission", async () => {
    await rejectsWith(
      client("read").submit({ op: "ensure_namespace", host: stack.fleetHosts[0]!, namespace: "nope" }),
      "forbidden",
      403,
    );
  });

  test("404 command_not_found, key_not_found", async () => {
    await rejectsWith(client().status("never-submitted"), "command_not_found", 404);
    await rejectsWith(client().keys("nobody"), "key_not_found", 404);
  });

  test("404 host_not_found: a command for a host nobody registered, unless queued", async () => {
    const c = client();
    const command: Command = {
      op: "ensure_namespace",
      host: "misspelt-host",
      namespace: "n",
      id: "ts-unknown-1",
    };
    const error = await rejectsWith(c.submit(command), "host_not_found", 404);
    assert.equal(error.retryable, false);
    await rejectsWith(c.status("ts-unknown-1"), "command_not_found", 404);
    const queued = await c.submit(command, { unknownHost: "queue" });
    assert.equal(queued.id, "ts-unknown-1");
    assert.equal((await c.status("ts-unknown-1")).status, "pending");
  });

  test("409 id_conflict: an id re-used for other content", async () => {
    const c = client();
    const host = stack.fleetHosts[7]!;
    await c.submit({ op: "ensure_namespace", host, namespace: "first", id: "ts-conflict-1" });
    const error = await rejectsWith(
      c.submit({ op: "ensure_namespace", host, namespace: "second", id: "ts-conflict-1" }),
      "id_conflict",
      409,
    );
    assert.equal(error.retryable, false);
  });

  test("413 too_large", async () => {
    const big = { driver: "sim" as const, command: ["x".repeat(300 * 1024)] };
    await rejectsWith(
      client().submit({
        op: "prepare_revision",
        host: stack.fleetHosts[0]!,
        namespace: "n",
        workload: "w",
        revision: "r",
        spec: big,
      }),
      "too_large",
      413,
    );
  });

  test("415 unsupported_media_type: a body that is not JSON", async () => {
    const c = client();
    const { error, response } = await c.raw.POST("/v1/commands", {
      body: { op: "ensure_namespace", host: "h1", namespace: "n" },
      bodySerializer: (b) => JSON.stringify(b),
      headers: { "Content-Type": "text/plain" },
    });
    const e = CapstanError.fromAnswer(response, error);
    assert.equal(e.code, "unsupported_media_type");
    assert.equal(e.status, 415);
  });

  test("400: invalid_name, invalid_json", async () => {
    await rejectsWith(
      client().submit({ op: "ensure_namespace", host: stack.fleetHosts[0]!, namespace: "Not_A_Label" }),
      "invalid_name",
      400,
    );
    const { error, response } = await client().raw.POST("/v1/commands", {
      body: { op: "ensure_namespace", host: "h1", namespace: "n" },
      bodySerializer: () => "{not json",
    });
    const e = CapstanError.fromAnswer(response, error);
    assert.equal(e.code, "invalid_json");
    assert.equal(e.status, 400);
  });

  test("503 nats_unavailable while NATS is down; answered again once it is back", async () => {
    const once = client("submit", false);
    const patient = new CapstanClient({
      baseUrl: stack.url,
      token: stack.submitToken,
      fetch: validator.fetch,
      retry: { attempts: 60, baseDelayMs: 100, maxDelayMs: 500 },
    });
    await stack.stopNats();
    try {
      const error = await rejectsWith(once.hosts(), "nats_unavailable", 503);
      assert.equal(error.retryable, true);
      await rejectsWith(once.health(), "nats_unavailable", 503);
      // Asked again, with backoff, as many times as the policy says: then the error.
      const counted = counting();
      const thrice = new CapstanClient({
        baseUrl: stack.url,
        token: stack.submitToken,
        fetch: counted.fetch,
        retry: { attempts: 3, baseDelayMs: 10, maxDelayMs: 20 },
      });
      await rejectsWith(thrice.hosts(), "nats_unavailable", 503);
      assert.equal(counted.requests(), 3);
      // A retrying client rides the outage out once NATS is back.
      const later = patient.hosts();
      await stack.startNats();
      assert.ok((await later).length > 0);
    } finally {
      await stack.startNats();
    }
    assert.deepEqual(await patient.health(), { status: "ok", nats: "connected" });
  });

  test("an error that is not retryable is never asked again", async () => {
    const counted = counting();
    const c = new CapstanClient({ baseUrl: stack.url, token: stack.submitToken, fetch: counted.fetch });
    await rejectsWith(c.status("never-submitted-either"), "command_not_found", 404);
    const host = stack.fleetHosts[8]!;
    await c.submit({ op: "ensure_namespace", host, namespace: "one", id: "ts-conflict-2" });
    await rejectsWith(
      c.submit({ op: "ensure_namespace", host, namespace: "two", id: "ts-conflict-2" }),
      "id_conflict",
      409,
    );
    assert.equal(counted.requests(), 3, "one request each");
  });

  test("network_error when the coordinator cannot be reached (retryable)", async () => {
    const gone = new CapstanClient({ baseUrl: "http://127.0.0.1:9", retry: false });
    const error = await rejectsWith(gone.hosts(), "network_error");
    assert.equal(error.retryable, true);
    assert.equal(error.status, undefined);
  });
});
