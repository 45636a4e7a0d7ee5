// The workspace README's ten-line example, run as written: its ```ts block read from
// README.md when the test runs, transpiled (types removed, nothing else changed) and
// run by node against a live coordinator and agent h1, with CAPSTAN_COORDINATOR and
// CAPSTAN_TOKEN set as the README says.
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { readFile, rm, writeFile } from "node:fs/promises";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import ts from "typescript";
import { type Stack, startStack } from "./stack.js";

const run = promisify(execFile);
// test/build/ → the workspace's root, where node finds @capstan/client.
const workspace = fileURLToPath(new URL("../../", import.meta.url));
const script = fileURLToPath(new URL("./readme-example.mjs", import.meta.url));
let stack: Stack;

before(async () => {
  stack = await startStack({ agents: [{ host: "h1" }] });
});

after(async () => {
  await rm(script, { force: true });
  await stack?.close();
});

test("the README's example runs against a live coordinator as written", async () => {
  const readme = await readFile(`${workspace}README.md`, "utf8");
  const blocks = [...readme.matchAll(/```ts\n([\s\S]*?)```/g)].map((m) => m[1] ?? "");
  assert.equal(blocks.length, 1, "the README has one ts example");
  const js = ts.transpileModule(blocks[0] ?? "", {
    compilerOptions: { module: ts.ModuleKind.ESNext, target: ts.ScriptTarget.ES2022 },
  }).outputText;
  await writeFile(script, js);
  const { stdout } = await run(process.execPath, [script], {
    cwd: workspace,
    timeout: 120_000,
    env: { ...process.env, CAPSTAN_COORDINATOR: stack.url, CAPSTAN_TOKEN: stack.submitToken },
  });
  const lines = stdout.trim().split("\n");
  // The hosts, the command's outcome, h1's log (3 records of the one command), the verdict.
  assert.ok(
    lines.some((l) => /^h1 (alive|warming)$/.test(l)),
    stdout,
  );
  assert.match(stdout, /^ensure-namespace\.[0-9a-f]{32}\.a0 succeeded$/m);
  assert.deepEqual(
    lines.filter((l) => /^\d+ /.test(l)),
    ["1 command_received", "2 namespace_ready", "3 command_completed"],
    stdout,
  );
  assert.equal(lines.at(-1), "verify h1: ok", stdout);
});
