/**
 * The real binaries, started by each test on loopback: `payments-sandbox`
 * and `payments-api` (SQLite in a directory of the test's own), from
 * `PAYMENTS_BIN_DIR`, else the workspace's `target/debug` (`make test`
 * builds them first; `cargo build --workspace --bins` does too).
 */
import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { createInterface } from "node:readline";
import type { TestContext } from "node:test";
import { fileURLToPath } from "node:url";

export const JWT_SECRET = "dev-only-secret-do-not-use-in-production";
export const BACKOFFICE_AUDIENCE = "payments-backoffice";

/** The repository: this file runs as `clients/typescript/.test-build/test/harness.js`. */
const workspace = resolve(fileURLToPath(new URL(".", import.meta.url)), "..", "..", "..", "..");

export function binary(name: string): string {
  const dir =
    process.env.PAYMENTS_BIN_DIR ?? join(process.env.CARGO_TARGET_DIR ?? join(workspace, "target"), "debug");
  const path = join(dir, name);
  if (!existsSync(path)) {
    throw new Error(`${path} is missing: run \`cargo build --workspace --bins\` (or set PAYMENTS_BIN_DIR)`);
  }
  return path;
}

export interface Server {
  url: string;
  log(): string;
}

/** Starts `name` and resolves once it prints `... listening on URL`. */
async function start(
  t: TestContext,
  name: string,
  args: string[],
  env: Record<string, string>,
): Promise<Server> {
  const child: ChildProcess = spawn(binary(name), args, {
    env: { PATH: process.env.PATH ?? "", ...env },
    stdio: ["ignore", "pipe", "pipe"],
  });
  t.after(() => {
    child.kill("SIGKILL");
  });
  let log = "";
  child.stderr?.on("data", (chunk: Buffer) => {
    log += chunk.toString();
  });
  const lines = createInterface({ input: child.stdout as NodeJS.ReadableStream });
  const url = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${name} did not start: ${log}`)), 30_000);
    child.on("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`${name} exited (${code}): ${log}`));
    });
    lines.on("line", (line) => {
      log += `${line}\n`;
      const found = /listening on (http:\/\/\S+)/.exec(line);
      if (found?.[1] !== undefined) {
        clearTimeout(timer);
        resolve(found[1]);
      }
    });
  });
  return { url, log: () => log };
}

export interface Stack {
  api: Server;
  sandbox: Server;
  /** A customer's token. */
  token(customer: string): string;
  /** A back-office token: refunds, captures, reads anyone's charges and the events. */
  backOffice(subject: string): string;
  /** `POST /_sandbox/config` (faults: latency, dropped answers, ...). */
  configure(config: Record<string, unknown>): Promise<void>;
  /** What the provider really did: `GET /_sandbox/charges` and friends. */
  atProvider(what: "charges" | "refunds" | "captures"): Promise<unknown[]>;
}

/**
 * A sandbox and an API in front of it, both the test's own, stopped when
 * it ends; `env` is added to the API's environment.
 */
export async function startStack(t: TestContext, env: Record<string, string> = {}): Promise<Stack> {
  const sandbox = await start(t, "payments-sandbox", ["--listen", "127.0.0.1:0"], {});
  const dir = mkdtempSync(join(tmpdir(), "payments-ts-"));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const api = await start(t, "payments-api", [], {
    DATABASE_URL: `sqlite://${join(dir, "payments.db")}`,
    LISTEN_ADDR: "127.0.0.1:0",
    GATEWAY_URL: sandbox.url,
    GATEWAY_SECRET_KEY: "sk_test_sandbox",
    JWT_HS256_SECRET: JWT_SECRET,
    JWT_BACKOFFICE_AUDIENCE: BACKOFFICE_AUDIENCE,
    LOG_FORMAT: "text",
    ...env,
  });
  const mint = (args: string[]) =>
    execFileSync(binary("payments-api"), ["token", ...args], {
      env: { JWT_HS256_SECRET: JWT_SECRET },
      encoding: "utf8",
    }).trim();
  return {
    api,
    sandbox,
    token: (customer) => mint(["--customer", customer]),
    backOffice: (subject) =>
      mint([
        "--subject",
        subject,
        "--audience",
        BACKOFFICE_AUDIENCE,
        ...["refunds:write", "charges:capture", "charges:read_all", "events:read"].flatMap((s) => [
          "--scope",
          s,
        ]),
      ]),
    async configure(config) {
      const response = await fetch(`${sandbox.url}/_sandbox/config`, {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify(config),
      });
      if (!response.ok) throw new Error(`sandbox config: ${response.status} ${await response.text()}`);
    },
    async atProvider(what) {
      const response = await fetch(`${sandbox.url}/_sandbox/${what}`);
      const body = (await response.json()) as unknown;
      if (Array.isArray(body)) return body;
      const data = (body as { data?: unknown }).data;
      if (Array.isArray(data)) return data;
      throw new Error(`unexpected /_sandbox/${what}: ${JSON.stringify(body)}`);
    },
  };
}

export const card = (amount_cents: number, card_token = "tok_visa") => ({
  amount_cents,
  currency: "GBP",
  card_token,
});
