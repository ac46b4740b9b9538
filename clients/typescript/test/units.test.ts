/** The parts with no server: the answer table, the stores, both builds. */
import "./setup.js";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import * as esm from "@payments/client";
import { memoryStore, PaymentsClient, type PendingOperation, webStorageStore } from "@payments/client";

const packageDir = fileURLToPath(new URL("../..", import.meta.url));

test("the answer table: what is retried, what is final, what keeps the key", async () => {
  // Each status the guide names, answered by a fake server of one answer then a 201.
  const cases: [number, string | undefined, "retried" | "final" | "kept"][] = [
    [408, undefined, "retried"],
    [409, "request_in_progress", "retried"],
    [429, "rate_limited", "retried"],
    [500, "internal_error", "retried"],
    [500, "provider_misconfigured", "retried"],
    [502, undefined, "retried"],
    [503, "gateway_unavailable", "retried"],
    [504, undefined, "retried"],
    [400, "invalid_request", "final"],
    [402, "card_declined", "final"],
    [403, "insufficient_scope", "final"],
    [404, "not_found", "final"],
    [413, "payload_too_large", "final"],
    [415, "unsupported_media_type", "final"],
    [500, "request_abandoned", "final"],
    [502, "charge_not_made", "final"],
    [502, "refund_not_made", "final"],
    [422, "idempotency_key_reused", "kept"],
  ];
  for (const [status, code, expected] of cases) {
    const keys: string[] = [];
    const store = memoryStore();
    const client = new PaymentsClient({
      baseUrl: "http://127.0.0.1:9",
      token: "t",
      store,
      backoffBaseMs: 1,
      fetch: async (_url, init) => {
        keys.push(new Headers(init.headers).get("Idempotency-Key") ?? "");
        if (keys.length > 1) return new Response(JSON.stringify({ id: "ch_1" }), { status: 201 });
        const body =
          code === undefined ? "<html>proxy</html>" : JSON.stringify({ error: { code, message: "m" } });
        return new Response(body, { status, headers: { "Retry-After": "0" } });
      },
    });
    const outcome = await client.charge({ amount_cents: 1, currency: "GBP", card_token: "tok_visa" }).then(
      () => "retried" as const,
      async () => ((await store.list()).length === 1 ? ("kept" as const) : ("final" as const)),
    );
    assert.equal(outcome, expected, `${status} ${code}`);
    if (outcome === "retried") assert.equal(new Set(keys).size, 1, `${status}: one key for every attempt`);
  }
});

test("a network error and an unreadable 201 are retried with the same key", async () => {
  const keys: string[] = [];
  const client = new PaymentsClient({
    baseUrl: "http://127.0.0.1:9",
    token: "t",
    backoffBaseMs: 1,
    fetch: async (_url, init) => {
      keys.push(new Headers(init.headers).get("Idempotency-Key") ?? "");
      if (keys.length === 1) throw new TypeError("fetch failed");
      if (keys.length === 2) return new Response("{trunc", { status: 201 });
      return new Response(JSON.stringify({ id: "ch_1" }), {
        status: 201,
        headers: { "Idempotent-Replay": "true" },
      });
    },
  });
  const paid = await client.charge({ amount_cents: 1, currency: "GBP", card_token: "tok_visa" });
  assert.equal(paid.replayed, true);
  assert.equal(keys.length, 3);
  assert.equal(new Set(keys).size, 1);
});

test("the stores keep operations and skip what is not one", async () => {
  const values = new Map<string, string>();
  const storage = {
    get length() {
      return values.size;
    },
    key: (i: number) => [...values.keys()][i] ?? null,
    getItem: (k: string) => values.get(k) ?? null,
    setItem: (k: string, v: string) => void values.set(k, v),
    removeItem: (k: string) => void values.delete(k),
  };
  const store = webStorageStore(storage);
  const operation: PendingOperation = {
    id: "order-1",
    kind: "charge",
    path: "/api/charges",
    key: "k",
    body: "{}",
    createdAt: 1,
    keyTtlSeconds: 86400,
  };
  await store.set(operation);
  values.set("payments:pending:junk", "{not json");
  values.set("payments:pending:other", JSON.stringify({ id: "x", kind: "transfer" }));
  values.set("unrelated", "1");
  assert.deepEqual(await store.get("order-1"), operation);
  assert.deepEqual(await store.list(), [operation]);
  assert.equal(await store.get("junk"), undefined);
  await store.delete("order-1");
  assert.deepEqual(await store.list(), []);
});

test("the CommonJS build exports what the ES module build does", () => {
  const required = createRequire(import.meta.url)("@payments/client") as Record<string, unknown>;
  assert.deepEqual(Object.keys(required).sort(), Object.keys(esm).sort());
  const webhooks = createRequire(import.meta.url)("@payments/client/webhooks") as Record<string, unknown>;
  assert.equal(typeof webhooks.verifyWebhook, "function");
});

test("the main entry never imports node: modules (browsers, React Native)", () => {
  for (const build of ["esm", "cjs"]) {
    for (const file of ["index", "client", "errors", "retry", "store", "types", "openapi"]) {
      const source = readFileSync(join(packageDir, "dist", build, `${file}.js`), "utf8");
      assert.doesNotMatch(source, /node:/, `${build}/${file}.js`);
    }
  }
});

test("src/openapi.ts is what openapi-typescript makes of openapi.yaml", async () => {
  const dir = mkdtempSync(join(tmpdir(), "payments-ts-types-"));
  try {
    const cli = join(packageDir, "node_modules", "openapi-typescript", "bin", "cli.js");
    const out = join(dir, "openapi.ts");
    await promisify(execFile)(process.execPath, [
      cli,
      join(packageDir, "..", "..", "openapi.yaml"),
      "--output",
      out,
    ]);
    assert.equal(
      readFileSync(out, "utf8"),
      readFileSync(join(packageDir, "src", "openapi.ts"), "utf8"),
      "openapi.yaml changed: run `npm run generate` in clients/typescript",
    );
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
