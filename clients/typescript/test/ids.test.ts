// Pure parts: command ids, identity names, error mapping. No stack.
import assert from "node:assert/strict";
import { test } from "node:test";
import { CapstanError, type Command, type CommandStatus, commandId } from "@capstan/client";
import { capstanName } from "@capstan/compute-driver";

/** The operation key most tests use. */
const K = "deploy-7";
const ID = /^[A-Za-z0-9._:-]{1,128}$/;
const LABEL = /^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$/;

const activate: Command = {
  op: "activate_revision",
  host: "h1",
  namespace: "shop",
  workload: "web",
  revision: "r2",
};

test("the same intent gives the same id; key order, id and issued_at do not count", () => {
  const again = {
    revision: "r2",
    workload: "web",
    namespace: "shop",
    host: "h1",
    op: "activate_revision",
  } as Command;
  const stamped = { ...activate, id: "whatever", issued_at: "2026-12-05T00:00:00Z" };
  assert.equal(commandId(again, { key: K }), commandId(activate, { key: K }));
  assert.equal(commandId(stamped, { key: K }), commandId(activate, { key: K }));
  assert.match(commandId(activate, { key: K }), ID);
  assert.match(commandId(activate, { key: K }), /^activate-revision\.[0-9a-f]{32}\.a0$/);
});

function prepare(env: Record<string, string>): Command {
  const spec = { driver: "sim" as const, env };
  return { op: "prepare_revision", host: "h1", namespace: "shop", workload: "web", revision: "r2", spec };
}

test("other content, another key or another attempt is another id", () => {
  const ids = new Set([
    commandId(activate, { key: K }),
    commandId({ ...activate, revision: "r3" }, { key: K }),
    commandId({ ...activate, host: "h2" }, { key: K }),
    commandId(activate, { key: "deploy-8" }),
    commandId(activate, { key: K, attempt: 1 }),
    commandId(activate, { key: "deploy-8", attempt: 1 }),
    commandId(prepare({ A: "1" }), { key: K }),
    commandId(prepare({ A: "2" }), { key: K }),
  ]);
  assert.equal(ids.size, 8);
  assert.throws(() => commandId(activate, { key: K, attempt: -1 }), RangeError);
});

test("an id needs an operation key: none or an empty one is a RangeError", () => {
  assert.throws(() => commandId(activate, { key: "" }), RangeError);
  // JavaScript callers (and casts) can leave it out: refused too, never keyed by "".
  assert.throws(() => commandId(activate, {} as { key: string }), RangeError);
  assert.throws(() => (commandId as (c: Command) => string)(activate), RangeError);
});

test("non-ASCII content hashes as UTF-8 and still gives a valid id", () => {
  const spec = { driver: "sim" as const, command: ["echo", "grüße \u{1F680} \u0085 \u2028"] };
  const a = commandId(
    {
      op: "prepare_revision",
      host: "h1",
      namespace: "n",
      workload: "w",
      revision: "r",
      spec,
    },
    { key: K },
  );
  const b = commandId(
    {
      op: "prepare_revision",
      host: "h1",
      namespace: "n",
      workload: "w",
      revision: "r",
      spec: { ...spec, command: ["echo", "grusse"] },
    },
    { key: K },
  );
  assert.match(a, ID);
  assert.notEqual(a, b);
});

test("controller identities become DNS labels, distinct and stable", () => {
  assert.equal(capstanName("web"), "web");
  const ids = [
    "Web",
    "web_1",
    "WEB",
    "a".repeat(80),
    "ünïcødé",
    "-",
    "x/y",
    "550e8400-E29B-41d4-a716-446655440000",
  ];
  const names = ids.map(capstanName);
  for (const n of names) assert.match(n, LABEL);
  assert.equal(new Set(names).size, ids.length);
  assert.deepEqual(ids.map(capstanName), names);
  assert.throws(() => capstanName(""), RangeError);
});

test("a failed command's error carries its code, retryable and the hook's phase and owner", () => {
  const status = {
    id: "c-1",
    host: "h1",
    status: "failed",
    done: true,
    error: { code: "hook_failed", message: "before_workload_start hook iam failed" },
    events: [
      {
        seq: 3,
        at: "2026-12-05T00:00:00.000Z",
        kind: "hook_failed",
        prev_hash: "0".repeat(64),
        command_id: "c-1",
        phase: "before_workload_start",
        owner: "iam",
        code: "hook_failed",
      },
    ],
    first_seq: 1,
    last_seq: 4,
  } as CommandStatus;
  const error = CapstanError.fromCommand(status);
  assert.equal(error.code, "hook_failed");
  assert.equal(error.retryable, true, "no retryable in the answer: the protocol's table says hook_failed is");
  assert.deepEqual(error.hookFailures, [
    { phase: "before_workload_start", owner: "iam", code: "hook_failed" },
  ]);
  const said = CapstanError.fromCommand({
    ...status,
    error: { code: "hook_failed", message: "m", retryable: false },
  } as CommandStatus);
  assert.equal(said.retryable, false, "the answer's own retryable wins");
  const final = CapstanError.fromCommand({
    ...status,
    error: { code: "namespace_not_found", message: "m" },
    events: [],
  } as CommandStatus);
  assert.equal(final.retryable, false);
});

test("an error status without an error body is invalid_answer, retryable only for a gateway's", () => {
  const gateway = CapstanError.fromAnswer(new Response("<html>", { status: 502 }), "<html>");
  assert.equal(gateway.code, "invalid_answer");
  assert.equal(gateway.retryable, true);
  const busy = CapstanError.fromAnswer(new Response("", { status: 503, headers: { "Retry-After": "1" } }), {
    error: { code: "busy", message: "too many" },
  });
  assert.equal(busy.code, "busy");
  assert.equal(busy.retryable, true);
  assert.equal(busy.retryAfterSecs, 1);
  assert.equal(busy.status, 503);
});
