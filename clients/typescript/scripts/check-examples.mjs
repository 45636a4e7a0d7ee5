// Type-checks every ```ts block of the workspace's README and the packages' READMEs
// against the built packages, under the workspace's strict settings: an example a
// user copies compiles.
import { execFileSync } from "node:child_process";
import { mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";

const root = fileURLToPath(new URL("../", import.meta.url));
const dir = `${root}examples-check/`;
rmSync(dir, { recursive: true, force: true });
mkdirSync(dir);
let n = 0;
for (const [name, file] of [
  ["workspace", "README.md"],
  ["client", "packages/client/README.md"],
  ["compute-driver", "packages/compute-driver/README.md"],
]) {
  const readme = readFileSync(`${root}${file}`, "utf8");
  for (const [, code] of readme.matchAll(/```ts\n([\s\S]*?)```/g)) {
    // Values an example takes from its surroundings.
    const prelude = "declare const token: string;\n";
    writeFileSync(`${dir}${name}-${++n}.ts`, prelude + code);
  }
}
writeFileSync(
  `${dir}tsconfig.json`,
  JSON.stringify({
    extends: "../tsconfig.base.json",
    compilerOptions: { noEmit: true, composite: false, declaration: false, declarationMap: false },
    include: ["*.ts"],
  }),
);
try {
  execFileSync("npx", ["tsc", "-p", dir], { cwd: root, stdio: "inherit" });
  console.log(`${n} README examples type-check`);
} catch {
  console.error("a README example does not type-check (above)");
  process.exitCode = 1;
} finally {
  rmSync(dir, { recursive: true, force: true });
}
