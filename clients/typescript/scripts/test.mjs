// Compiles the tests (type-checked like the sources) and runs them with
// node's own test runner: a readable report on stdout, and TAP in
// .test-build/results.tap, which `make test`'s summary counts.
import { execFileSync, spawnSync } from "node:child_process";
import { readdirSync, rmSync } from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";

const tsc = createRequire(import.meta.url).resolve("typescript/bin/tsc");
rmSync(".test-build", { recursive: true, force: true });
execFileSync(process.execPath, [tsc, "-p", "tsconfig.test.json"], { stdio: "inherit" });
const dir = join(".test-build", "test");
const files = readdirSync(dir)
  .filter((name) => name.endsWith(".test.js"))
  .map((name) => join(dir, name));
const result = spawnSync(
  process.execPath,
  [
    "--test",
    "--test-reporter=spec",
    "--test-reporter-destination=stdout",
    "--test-reporter=tap",
    `--test-reporter-destination=${join(".test-build", "results.tap")}`,
    ...files,
  ],
  { stdio: "inherit" },
);
process.exit(result.status ?? 1);
