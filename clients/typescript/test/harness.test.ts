// The live-test harness itself: a real stack comes up, answers match the spec, hooks
// run, NATS and an agent can be stopped and started, and everything stops cleanly.

import assert from "node:assert/strict";
import { test } from "node:test";
import { startStack, withStack, type Stack } from "./stack.js";
import { validatingFetch } from "./validate.js";

interface Answer {
  status: number;
  body: unknown;
}

interface CommandStatus {
  id: string;
  status: string;
  done: boolean;
  error: { code: string; message: string } | null;
}

interface Hosts {
  hosts: { host: string; status: string }[];
}

/** Requests to the stack's coordinator, every answer validated against the spec. */
function client(stack: Stack) {
  const validating = validatingFetch();
  const call = async (
    method: string,
    path: string,
    body?: unknown,
    token = stack.submitToken,
  ): Promise<Answer> => {
    const headers: Record<string, string> = { Authorization: `Bearer ${token}` };
    const init: RequestInit = { method, headers };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const res = await validating.fetch(`${stack.url}${path}`, init);
    return { status: res.status, body: (await res.json()) as unknown };
  };

  /** Submits `command`; waits (bounded) until it is done; its status. */
  const run = async (command: Record<string, unknown>): Promise<CommandStatus> => {
    const accepted = await call("POST", "/v1/commands", command);
    assert.equal(accepted.status, 202, JSON.stringify(accepted.body));
    const { id } = accepted.body as { id: string };
    const deadline = Date.now() + 60_000;
    for (;;) {
      const answer = await call("GET", `/v1/commands/${id}/wait?timeout=30s`);
      assert.equal(answer.status, 200, JSON.stringify(answer.body));
      const status = answer.body as CommandStatus;
      if (status.done) return status;
      assert.ok(Date.now() < deadline, `command ${id} not done within 60 s: ${JSON.stringify(status)}`);
    }
  };

  /** Polls GET /healthz until it answers `status` (bounded). */
  const health = async (status: number): Promise<void> => {
    const deadline = Date.now() + 60_000;
    let last: Answer | undefined;
    while (Date.now() < deadline) {
      last = await call("GET", "/healthz");
      if (last.status === status) return;
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    assert.fail(`GET /healthz did not answer ${status} within 60 s; last ${JSON.stringify(last)}`);
  };

  return { call, run, health, checked: () => validating.checked() };
}

test("a stack with a sim fleet and an agent with hooks: commands, hooks, NATS and agent restarts, clean close", async () => {
  const agent = "ts-agent";
  const stack = await startStack({ fleet: 3, agents: [{ host: agent, hooks: true }] });
  try {
    const api = client(stack);
    assert.deepEqual(stack.fleetHosts, ["sim-0001", "sim-0002", "sim-0003"]);
    assert.deepEqual(stack.agentHosts, [agent]);

    // Every host is alive; the read token reads too.
    const hosts = await api.call("GET", "/v1/hosts", undefined, stack.readToken);
    assert.equal(hosts.status, 200);
    const alive = (hosts.body as Hosts).hosts.filter((h) => h.status === "alive").map((h) => h.host);
    assert.deepEqual(alive.sort(), [...stack.fleetHosts, agent].sort());
    assert.ok(api.checked() > 0, "the answer was validated");

    // A preparing hook that fails fails the command; a namespace the hook lets through succeeds.
    const refused = await api.run({ op: "ensure_namespace", host: agent, namespace: "hookfail-x" });
    assert.equal(refused.status, "failed", JSON.stringify(refused));
    assert.equal(refused.error?.code, "hook_failed");
    const shop = await api.run({ op: "ensure_namespace", host: agent, namespace: "shop" });
    assert.equal(shop.status, "succeeded", JSON.stringify(shop));
    // The workload hook grants a launch env on activation.
    const spec = { driver: "sim", image: "shop/web:1", command: ["serve"] };
    const base = { host: agent, namespace: "shop", workload: "web", revision: "r1" };
    assert.equal((await api.run({ ...base, op: "prepare_revision", spec })).status, "succeeded");
    assert.equal((await api.run({ ...base, op: "activate_revision" })).status, "succeeded");
    const phases = (await stack.hookCalls(agent)).map((c) => `${c.owner}:${c.phase}:${c.namespace}`);
    assert.deepEqual(phases, [
      "net:after_namespace_prepared:hookfail-x", // failed: it granted nothing, nothing to compensate
      "net:after_namespace_prepared:shop",
      "iam:before_workload_start:shop",
    ]);
    // A simulated host takes commands too.
    const fleet = await api.run({ op: "ensure_namespace", host: "sim-0002", namespace: "shop" });
    assert.equal(fleet.status, "succeeded", JSON.stringify(fleet));

    // Without NATS the coordinator is unhealthy, and healthy again once it is back.
    await api.health(200);
    await stack.stopNats();
    await api.health(503);
    await stack.startNats();
    await api.health(200);

    // The agent stops cleanly and, started again, takes commands.
    await stack.stopAgent(agent);
    await stack.startAgent(agent);
    const again = await api.run({ op: "ensure_namespace", host: agent, namespace: "after-restart" });
    assert.equal(again.status, "succeeded", JSON.stringify(again));
  } catch (error) {
    await stack.close().catch(() => {});
    throw error;
  }
  await stack.close();
});

test("a stack on per-host accounts: the agent is alive and takes commands", async () => {
  await withStack({ agents: [{ host: "ts-h1" }, { host: "ts-h2" }] }, async (stack) => {
    assert.equal(stack.accounts, "per-host");
    const api = client(stack);
    for (const host of stack.agentHosts) {
      const done = await api.run({ op: "ensure_namespace", host, namespace: "shop" });
      assert.equal(done.status, "succeeded", JSON.stringify(done));
    }
    assert.ok(api.checked() >= 4);
  });
});

test("the validating fetch refuses an answer the spec does not describe", async () => {
  await withStack({}, async (stack) => {
    const validating = validatingFetch();
    const auth = { headers: { Authorization: `Bearer ${stack.submitToken}` } };
    await assert.rejects(
      validating.fetch(`${stack.url}/v1/no-such-endpoint`, auth),
      /no operation|does not list/,
    );
    const res = await validating.fetch(`${stack.url}/healthz`);
    assert.equal(res.status, 200);
    assert.deepEqual(await res.json(), { status: "ok", nats: "connected" }); // The body is still the caller's.
    assert.equal(validating.checked(), 1);
  });
});
