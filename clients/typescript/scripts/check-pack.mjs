// `npm run pack` (the command README.md gives: `npm pack --workspaces`), install the
// tarballs into an empty project and import them there: what a user installs works
// without this workspace around it.
import { execFileSync } from "node:child_process";
import { mkdtempSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

const root = fileURLToPath(new URL("../", import.meta.url));
const scratch = mkdtempSync(join(tmpdir(), "capstan-pack-"));
const run = (cmd, args, cwd) =>
  execFileSync(cmd, args, { cwd, stdio: ["ignore", "pipe", "inherit"], encoding: "utf8" });
try {
  run("npm", ["run", "pack", "--", "--pack-destination", scratch], root);
  const tarballs = readdirSync(scratch).filter((f) => f.endsWith(".tgz"));
  if (tarballs.length !== 2) throw new Error(`expected 2 tarballs, got ${tarballs.join(", ")}`);
  const app = join(scratch, "app");
  run("mkdir", ["-p", app], scratch);
  writeFileSync(join(app, "package.json"), JSON.stringify({ name: "app", private: true, type: "module" }));
  run(
    "npm",
    ["install", "--no-audit", "--no-fund", "--prefer-offline", ...tarballs.map((t) => join(scratch, t))],
    app,
  );
  writeFileSync(
    join(app, "check.mjs"),
    `import { CapstanClient, CapstanError, commandId } from "@capstan/client";
import { CapstanComputeDriver, capstanName } from "@capstan/compute-driver";
const client = new CapstanClient({ baseUrl: "http://127.0.0.1:7400" });
new CapstanComputeDriver({ client });
const id = commandId({ op: "ensure_namespace", host: "h1", namespace: capstanName("Shop") }, { key: "pack-check" });
if (!/^ensure-namespace\\.[0-9a-f]{32}\\.a0$/.test(id) || typeof CapstanError !== "function") process.exit(1);
console.log("installed tarballs import and work:", tarballs.join(" "));
`.replace('tarballs.join(" ")', JSON.stringify(tarballs.join(" "))),
  );
  process.stdout.write(run("node", ["check.mjs"], app));
} finally {
  rmSync(scratch, { recursive: true, force: true });
}
