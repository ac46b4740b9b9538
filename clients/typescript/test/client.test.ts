/**
 * The client against the real `payments-api` and `payments-sandbox`, each
 * test with its own pair (its own SQLite database, its own provider).
 * Counts are taken at the provider: what was really charged.
 */
import "./setup.js";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { randomUUID } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import {
  type FetchLike,
  memoryStore,
  PaymentsClient,
  PaymentsError,
  type PendingOperation,
  type RetryInfo,
} from "@payments/client";
import { verifyWebhook, WebhookVerificationError } from "@payments/client/webhooks";
import { card, startStack } from "./harness.js";

const run = promisify(execFile);

/** A fetch that records each attempt's status, or the error it threw. */
function recording(): { fetch: FetchLike; seen: (number | string)[] } {
  const seen: (number | string)[] = [];
  return {
    seen,
    fetch: async (url, init) => {
      try {
        const response = await fetch(url, init);
        seen.push(response.status);
        return response;
      } catch (error) {
        seen.push(error instanceof Error ? error.name : String(error));
        throw error;
      }
    },
  };
}

/** The promise's rejection, which must be a PaymentsError. */
async function failure(promise: Promise<unknown>): Promise<PaymentsError> {
  try {
    await promise;
  } catch (error) {
    assert.ok(error instanceof PaymentsError, `not a PaymentsError: ${String(error)}`);
    return error;
  }
  assert.fail("expected a PaymentsError");
}

test("a charge: 201 once, nothing left pending", async (t) => {
  const stack = await startStack(t);
  const client = new PaymentsClient({ baseUrl: stack.api.url, token: stack.token("cus_ts") });
  const paid = await client.charge(card(4900), { operationId: "order-1" });
  assert.equal(paid.status, 201);
  assert.equal(paid.replayed, false);
  assert.equal(paid.data.status, "succeeded");
  assert.equal(paid.data.amount_cents, 4900);
  assert.equal(paid.operationId, "order-1");
  assert.deepEqual(await client.pending(), []);
  assert.equal((await stack.atProvider("charges")).length, 1);
});

test("a replay: the same key answers the first charge, replayed, and charges once", async (t) => {
  const stack = await startStack(t);
  const client = new PaymentsClient({ baseUrl: stack.api.url, token: stack.token("cus_ts") });
  const key = randomUUID();
  const first = await client.charge(card(1200), { idempotencyKey: key });
  const again = await client.charge(card(1200), { idempotencyKey: key });
  assert.equal(first.replayed, false);
  assert.equal(again.replayed, true);
  assert.equal(again.data.id, first.data.id);
  assert.equal(again.idempotencyKey, key);
  assert.equal((await stack.atProvider("charges")).length, 1);
});

test("the same key with another body: a final 422, the key kept", async (t) => {
  const stack = await startStack(t);
  const store = memoryStore();
  const client = new PaymentsClient({ baseUrl: stack.api.url, token: stack.token("cus_ts"), store });
  const key = randomUUID();
  await client.charge(card(1200), { idempotencyKey: key, operationId: "first" });
  const error = await failure(client.charge(card(9900), { idempotencyKey: key, operationId: "second" }));
  assert.equal(error.status, 422);
  assert.equal(error.code, "idempotency_key_reused");
  assert.equal(error.retryable, false);
  assert.deepEqual(
    (await client.pending()).map((op) => op.id),
    ["second"],
    "a 422's key is kept: the first use of it may have charged",
  );
  assert.equal((await stack.atProvider("charges")).length, 1);
});

test("a refund is the back office's: a customer's is a final 403, the back office's a 201", async (t) => {
  const stack = await startStack(t);
  const customer = new PaymentsClient({ baseUrl: stack.api.url, token: stack.token("cus_ts") });
  const office = new PaymentsClient({ baseUrl: stack.api.url, token: stack.backOffice("ops_ts") });
  const paid = await customer.charge(card(5000));
  const refused = await failure(customer.refund(paid.data.id, { amount_cents: 1000 }));
  assert.equal(refused.status, 403);
  assert.equal(refused.code, "insufficient_scope");
  assert.equal(refused.retryable, false);
  assert.deepEqual(await customer.pending(), []);
  const refunded = await office.refund(paid.data.id, { amount_cents: 1000 });
  assert.equal(refunded.status, 201);
  assert.equal(refunded.data.amount_cents, 1000);
  assert.equal(refunded.data.status, "succeeded");
  assert.equal((await stack.atProvider("refunds")).length, 1);
  assert.equal((await office.getCharge(paid.data.id)).amount_refunded, 1000);
});

test("the provider's answer dropped: 503, then 201 with the same key, one charge", async (t) => {
  const stack = await startStack(t);
  await stack.configure({ drop_after_charge: true });
  const { fetch, seen } = recording();
  const client = new PaymentsClient({
    baseUrl: stack.api.url,
    token: stack.token("cus_ts"),
    fetch,
    backoffBaseMs: 50,
  });
  const paid = await client.charge(card(2500));
  assert.equal(paid.status, 201);
  assert.deepEqual(seen, [503, 201]);
  assert.equal((await stack.atProvider("charges")).length, 1);
});

test("a provider slower than the client's timeout: retried with the same key until 201, one charge", async (t) => {
  const stack = await startStack(t);
  await stack.configure({ latency_ms: 2500 });
  const { fetch, seen } = recording();
  const client = new PaymentsClient({
    baseUrl: stack.api.url,
    token: stack.token("cus_ts"),
    fetch,
    attemptTimeoutMs: 800,
    backoffBaseMs: 100,
    backoffCapMs: 300,
  });
  const paid = await client.charge(card(3100));
  assert.equal(paid.status, 201);
  assert.equal(seen[0], "TimeoutError", `the first attempt timed out: ${seen}`);
  assert.equal(seen.at(-1), 201);
  assert.ok(seen.includes(409), `a retry found the first attempt in flight: ${seen}`);
  assert.equal((await stack.atProvider("charges")).length, 1);
});

test("a 429 is honoured: the retry waits its Retry-After, with the same key", async (t) => {
  const stack = await startStack(t, { RATE_LIMIT_PER_MINUTE: "20", RATE_LIMIT_BURST: "1" });
  const retries: RetryInfo[] = [];
  const client = new PaymentsClient({
    baseUrl: stack.api.url,
    token: stack.token("cus_ts"),
    backoffBaseMs: 10,
    onRetry: (info) => retries.push(info),
  });
  await client.charge(card(1000));
  const second = await client.charge(card(1100));
  assert.equal(second.status, 201);
  const limited = retries.find((r) => r.status === 429);
  assert.ok(limited, `a 429 was retried: ${JSON.stringify(retries)}`);
  assert.equal(limited.code, "rate_limited");
  assert.ok((limited.retryAfterMs ?? 0) >= 1000, `Retry-After read: ${limited.retryAfterMs}`);
  assert.ok(limited.delayMs >= (limited.retryAfterMs ?? 0), "never sooner than Retry-After");
  assert.equal((await stack.atProvider("charges")).length, 2);
});

test("a 401: the token is refreshed once and the same key sent again", async (t) => {
  const stack = await startStack(t);
  const asked: boolean[] = [];
  const good = stack.token("cus_ts");
  const { fetch, seen } = recording();
  const client = new PaymentsClient({
    baseUrl: stack.api.url,
    fetch,
    token: (refresh) => {
      asked.push(refresh);
      return refresh ? good : "expired-token";
    },
  });
  const paid = await client.charge(card(1500));
  assert.equal(paid.status, 201);
  assert.deepEqual(asked, [false, true]);
  assert.deepEqual(seen, [401, 201]);
  const stale = new PaymentsClient({ baseUrl: stack.api.url, token: "expired-token" });
  const error = await failure(stale.charge(card(1500), { operationId: "after-sign-in" }));
  assert.equal(error.status, 401);
  assert.equal(error.retryable, true, "kept for after the user signs in");
  assert.deepEqual(
    (await stale.pending()).map((op) => op.id),
    ["after-sign-in"],
  );
  assert.equal((await stack.atProvider("charges")).length, 1);
});

test("a decline is final: 402 card_declined, the key forgotten, another card is a new payment", async (t) => {
  const stack = await startStack(t);
  const { fetch, seen } = recording();
  const client = new PaymentsClient({ baseUrl: stack.api.url, token: stack.token("cus_ts"), fetch });
  const declined = await failure(client.charge(card(700, "tok_chargeDeclined"), { operationId: "o" }));
  assert.equal(declined.status, 402);
  assert.equal(declined.code, "card_declined");
  assert.equal(typeof declined.declineCode, "string");
  assert.equal(declined.retryable, false);
  assert.deepEqual(seen, [402], "never retried");
  assert.deepEqual(await client.pending(), []);
  const paid = await client.charge(card(700), { operationId: "o" });
  assert.notEqual(paid.idempotencyKey, declined.idempotencyKey);
});

test("an abort or a deadline keeps the operation; resuming it charges once", async (t) => {
  const stack = await startStack(t);
  await stack.configure({ latency_ms: 2000 });
  const client = new PaymentsClient({
    baseUrl: stack.api.url,
    token: stack.token("cus_ts"),
    backoffBaseMs: 50,
    backoffCapMs: 200,
  });
  const controller = new AbortController();
  setTimeout(() => controller.abort(), 300);
  const aborted = await failure(
    client.charge(card(4200), { operationId: "aborted", signal: controller.signal }),
  );
  assert.equal(aborted.code, "aborted");
  assert.equal(aborted.retryable, true);
  assert.equal(aborted.operationId, "aborted");
  const late = await failure(client.charge(card(4300), { operationId: "late", deadlineMs: 500 }));
  assert.equal(late.code, "deadline_exceeded");
  assert.equal(late.retryable, true);
  const kept = await client.pending();
  assert.deepEqual(kept.map((op) => op.id).sort(), ["aborted", "late"]);

  const outcomes = await client.resumePending();
  assert.equal(outcomes.length, 2);
  for (const outcome of outcomes) {
    assert.equal(outcome.error, undefined, String(outcome.error));
    assert.equal(outcome.result?.status, 201);
    assert.equal(outcome.result?.idempotencyKey, outcome.operation.key);
  }
  assert.deepEqual(await client.pending(), []);
  assert.equal((await stack.atProvider("charges")).length, 2);
});

test("a double tap: two calls for one order share its key and charge once", async (t) => {
  const stack = await startStack(t);
  await stack.configure({ latency_ms: 300 });
  const client = new PaymentsClient({ baseUrl: stack.api.url, token: stack.token("cus_ts") });
  const [one, two] = await Promise.all([
    client.charge(card(2000), { operationId: "order-7" }),
    client.charge(card(2000), { operationId: "order-7" }),
  ]);
  assert.equal(one.data.id, two.data.id);
  assert.equal((await stack.atProvider("charges")).length, 1);
});

test("an operation older than the key's TTL (less a margin) is never sent again", async (t) => {
  const stack = await startStack(t);
  const store = memoryStore();
  const hour = 3600 * 1000;
  const old: PendingOperation = {
    id: "from-yesterday",
    kind: "charge",
    path: "/api/charges",
    key: randomUUID(),
    body: JSON.stringify(card(999)),
    createdAt: Date.now() - 2 * hour,
  };
  await store.set(old);
  const within: PendingOperation = {
    ...old,
    id: "stated-ttl",
    key: randomUUID(),
    keyTtlSeconds: 86400,
  };
  await store.set(within);
  const { fetch, seen } = recording();
  const client = new PaymentsClient({ baseUrl: stack.api.url, token: stack.token("cus_ts"), store, fetch });
  const outcomes = await client.resumePending();
  const expired = outcomes.find((o) => o.operation.id === "from-yesterday");
  assert.equal(expired?.error?.code, "operation_expired", "2 h old, no TTL stated: 1 h assumed");
  assert.equal(expired?.error?.retryable, false);
  const resumed = outcomes.find((o) => o.operation.id === "stated-ttl");
  assert.equal(resumed?.result?.status, 201, "2 h old within a stated 24 h");
  assert.deepEqual(seen, [201], "the expired one was never sent");
  assert.deepEqual(
    (await client.pending()).map((op) => op.id),
    ["from-yesterday"],
  );
  assert.equal((await stack.atProvider("charges")).length, 1);
});

test("an app killed mid-payment: the next process resumes with the same key, one charge", async (t) => {
  const stack = await startStack(t);
  const token = stack.token("cus_ts");
  const dir = mkdtempSync(join(tmpdir(), "payments-ts-app-"));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const file = join(dir, "storage.json");
  const app = fileURLToPath(new URL("./fixtures/app.js", import.meta.url));
  await run(process.execPath, [app, "pay", stack.api.url, token, file, "order-9"]);
  assert.equal((await stack.atProvider("charges")).length, 1, "the first attempt charged");

  const { stdout } = await run(process.execPath, [app, "resume", stack.api.url, token, file]);
  const resumed = JSON.parse(stdout) as {
    outcomes: { id: string; key: string; replayed?: boolean; charge?: { status: string } }[];
    left: number;
  };
  assert.equal(resumed.outcomes.length, 1);
  const [outcome] = resumed.outcomes;
  assert.equal(outcome?.id, "order-9");
  assert.equal(outcome?.replayed, true, "the server's stored answer to the first attempt");
  assert.equal(outcome?.charge?.status, "succeeded");
  assert.equal(resumed.left, 0);
  assert.equal((await stack.atProvider("charges")).length, 1);
});

test("holds: authorize, capture part, cancel another", async (t) => {
  const stack = await startStack(t);
  const customer = new PaymentsClient({ baseUrl: stack.api.url, token: stack.token("cus_ts") });
  const office = new PaymentsClient({ baseUrl: stack.api.url, token: stack.backOffice("ops_ts") });
  const hold = await customer.charge({ ...card(10000), capture: false });
  assert.equal(hold.data.status, "requires_capture");
  const captured = await office.capture(hold.data.id, { amount_cents: 6000 });
  assert.equal(captured.data.status, "succeeded");
  assert.equal(captured.data.amount_captured, 6000);
  assert.equal(captured.data.amount_released, 4000);
  const other = await customer.charge({ ...card(3000), capture: false });
  const canceled = await office.cancel(other.data.id);
  assert.equal(canceled.data.status, "canceled");
  const refused = await failure(customer.capture(other.data.id));
  assert.equal(refused.status, 403);
  assert.equal((await stack.atProvider("captures")).length, 1);
});

test("reads: a charge, every page of the list, the events", async (t) => {
  const stack = await startStack(t);
  const client = new PaymentsClient({ baseUrl: stack.api.url, token: stack.token("cus_ts") });
  const made: string[] = [];
  for (const amount of [100, 200, 300, 400, 500]) {
    made.push((await client.charge(card(amount))).data.id);
  }
  const listed: string[] = [];
  for await (const charge of client.listCharges({ limit: 2 })) listed.push(charge.id);
  assert.deepEqual(listed, [...made].reverse(), "newest first, across three pages");
  assert.equal((await client.getCharge(made[0] ?? "")).amount_cents, 100);
  const missing = await failure(client.getCharge("ch_0000000000000000000000000000dead"));
  assert.equal(missing.status, 404);
  assert.equal(missing.retryable, false);

  const office = new PaymentsClient({ baseUrl: stack.api.url, token: stack.backOffice("ops_ts") });
  const events: string[] = [];
  for await (const event of office.listEvents({ type: "charge.succeeded", limit: 2 })) {
    const object = event.data.object as { id: string };
    events.push(object.id);
  }
  assert.deepEqual(events.sort(), [...made].sort());
  const forbidden = await failure(client.listEvents()[Symbol.asyncIterator]().next());
  assert.equal(forbidden.status, 403);
});

test("verifyWebhook accepts a real delivery and refuses it changed, stale or under another secret", async (t) => {
  const secret = "whsec_ts_0123456789abcdef0123456789";
  const deliveries: { header: string | undefined; body: Buffer }[] = [];
  const receiver = createServer((request, response) => {
    const chunks: Buffer[] = [];
    request.on("data", (chunk: Buffer) => chunks.push(chunk));
    request.on("end", () => {
      const header = request.headers["payments-signature"];
      deliveries.push({ header: Array.isArray(header) ? header[0] : header, body: Buffer.concat(chunks) });
      response.writeHead(200).end();
    });
  });
  await new Promise<void>((resolve) => receiver.listen(0, "127.0.0.1", resolve));
  t.after(() => receiver.close());
  const { port } = receiver.address() as AddressInfo;
  const stack = await startStack(t, {
    WEBHOOK_ENDPOINTS: JSON.stringify([{ url: `http://127.0.0.1:${port}/hooks`, secret }]),
    WITH_JOBS: "true",
    DELIVER_EVERY: "200ms",
  });
  const client = new PaymentsClient({ baseUrl: stack.api.url, token: stack.token("cus_ts") });
  const paid = await client.charge(card(2600));
  const until = Date.now() + 20_000;
  while (deliveries.length === 0 && Date.now() < until) {
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  const [delivery] = deliveries;
  assert.ok(delivery, `a delivery arrived\n${stack.api.log()}`);

  const event = verifyWebhook(secret, delivery.header, delivery.body);
  assert.equal(event.type, "charge.succeeded");
  assert.equal((event.data.object as { id: string }).id, paid.data.id);
  assert.equal(verifyWebhook(["whsec_old", secret], delivery.header, delivery.body).id, event.id);

  const refused = (why: string, f: () => unknown) =>
    assert.throws(f, (error) => error instanceof WebhookVerificationError && error.reason === why);
  const tampered = Buffer.from(delivery.body.toString().replace("2600", "2700"));
  refused("mismatch", () => verifyWebhook(secret, delivery.header, tampered));
  refused("mismatch", () => verifyWebhook("whsec_another", delivery.header, delivery.body));
  refused("stale", () =>
    verifyWebhook(secret, delivery.header, delivery.body, { now: Math.floor(Date.now() / 1000) + 600 }),
  );
  refused("malformed", () => verifyWebhook(secret, undefined, delivery.body));
  refused("malformed", () =>
    verifyWebhook(secret, [delivery.header ?? "", delivery.header ?? ""], delivery.body),
  );
  assert.equal(verifyWebhook(secret, [delivery.header ?? ""], delivery.body).id, event.id);
  refused("malformed", () => verifyWebhook(secret, "t=1,t=2,v1=00", delivery.body));
});
