import { PaymentsError, type PaymentsErrorCode } from "./errors.js";
import { backoffMs, classify, retryAfterMs, sleep, type Verdict } from "./retry.js";
import { memoryStore, type PendingOperation, type PendingStore } from "./store.js";
import type {
  CaptureRequest,
  Charge,
  ChargeList,
  ChargeRequest,
  Event,
  EventList,
  ListChargesParams,
  ListEventsParams,
  Refund,
  RefundRequest,
} from "./types.js";

/** The part of `fetch` the client uses: the platform's, or one passed in. */
export type FetchLike = (url: string, init: RequestInit) => Promise<Response>;

/**
 * A bearer token, or a function that gives one. The client calls it with
 * `refresh = true` once after a 401, then sends the same key again.
 */
export type TokenSource = string | ((refresh: boolean) => string | Promise<string>);

/** Told before each wait between attempts (for logs and metrics). */
export interface RetryInfo {
  operationId: string | undefined;
  /** The attempt that failed, from 1. */
  attempt: number;
  /** Its answer's status, if it had one; else `error` says why (timeout, network). */
  status: number | undefined;
  code: string | undefined;
  error: unknown;
  /** What the answer's `Retry-After` asked for, in ms. */
  retryAfterMs: number | undefined;
  /** The wait about to start: never less than `retryAfterMs`. */
  delayMs: number;
}

export interface PaymentsClientOptions {
  /** The server, e.g. `https://payments.example.com`. */
  baseUrl: string;
  token: TokenSource;
  /**
   * Where pending operations are kept across restarts: `webStorageStore()`
   * (browsers), `asyncStorageStore(AsyncStorage)` (React Native), or yours.
   * Default: in memory, lost with the process.
   */
  store?: PendingStore;
  fetch?: FetchLike;
  /** Default `crypto.randomUUID` (React Native: see the README's polyfill). */
  randomUUID?: () => string;
  /** One attempt's timeout: 30 s, longer than the server's own provider timeout (10 s). */
  attemptTimeoutMs?: number;
  /** How long one call keeps retrying before it leaves the operation pending: 2 minutes. */
  deadlineMs?: number;
  /** Backoff: full jitter in [0, min(cap, base * 2^n)]; 500 ms and 10 s. */
  backoffBaseMs?: number;
  backoffCapMs?: number;
  onRetry?: (info: RetryInfo) => void;
  /** For tests: the jitter's random source and the clock (ms). */
  random?: () => number;
  now?: () => number;
}

/** Per call: a deadline of its own and a way to stop. */
export interface CallOptions {
  signal?: AbortSignal;
  deadlineMs?: number;
}

/** Per money-moving call. */
export interface OperationOptions extends CallOptions {
  /**
   * The app's name for this operation, usually the order id. A pending
   * operation under this id is resumed (its key, its body) instead of a new
   * one being started: a double tap, or a call after a restart, pays once.
   */
  operationId?: string;
  /** A key the app generated and saved itself; default one made here, once. */
  idempotencyKey?: string;
}

/** A money-moving call's final success. */
export interface Result<T> {
  data: T;
  /** `Idempotent-Replay: true`: an earlier attempt had done it; nothing was done twice. */
  replayed: boolean;
  status: number;
  operationId: string;
  idempotencyKey: string;
  requestId: string | undefined;
}

/** What `resumePending()` did with one pending operation. */
export type ResumeOutcome =
  | { operation: PendingOperation; result: Result<unknown>; error?: undefined }
  | { operation: PendingOperation; result?: undefined; error: PaymentsError };

/** The server remembers keys for at least an hour: assumed until an answer says. */
const MIN_KEY_TTL_SECONDS = 3600;

interface Answer {
  status: number;
  headers: Headers;
  json: unknown;
}

/** What one kind of call brings to the shared loop (`retrying`). */
interface Loop<T> {
  /** Before each attempt (a pending operation checks it is not too old). */
  before?: () => void;
  send(bearer: string, deadline: number, signal: AbortSignal | undefined): Promise<Answer>;
  /** The result, a throw (final), or `undefined` to retry. */
  settle(answer: Answer, verdict: Verdict): Promise<T | undefined>;
  /** The error to end with: aborted, or the deadline (with the last answer or failure). */
  giveUp(why: "aborted" | "deadline_exceeded", answer: Answer | undefined, failure: unknown): PaymentsError;
}

/**
 * The payments API for apps: every money-moving call makes its
 * `Idempotency-Key` once, keeps it (and its exact body) in the store before
 * the first attempt, and retries with it until a final answer, as the client
 * guide's answer table says.
 */
export class PaymentsClient {
  private readonly baseUrl: string;
  private readonly token: TokenSource;
  private readonly store: PendingStore;
  private readonly fetchFn: FetchLike;
  private readonly randomUUID: () => string;
  private readonly attemptTimeoutMs: number;
  private readonly deadlineMs: number;
  private readonly backoffBaseMs: number;
  private readonly backoffCapMs: number;
  private readonly onRetry: ((info: RetryInfo) => void) | undefined;
  private readonly random: () => number;
  private readonly now: () => number;
  /** Operations being driven by this client: a second call for one joins it. */
  private readonly inflight = new Map<string, Promise<Result<unknown>>>();

  constructor(options: PaymentsClientOptions) {
    this.baseUrl = options.baseUrl.replace(/\/+$/, "");
    this.token = options.token;
    this.store = options.store ?? memoryStore();
    const platformFetch = globalThis.fetch as FetchLike | undefined;
    const fetchFn = options.fetch ?? platformFetch?.bind(globalThis);
    if (fetchFn === undefined) throw new TypeError("no fetch: pass options.fetch");
    this.fetchFn = fetchFn;
    const uuid = options.randomUUID ?? platformRandomUUID();
    if (uuid === undefined) {
      throw new TypeError(
        "no crypto.randomUUID: pass options.randomUUID (React Native: see the package README)",
      );
    }
    this.randomUUID = uuid;
    this.attemptTimeoutMs = options.attemptTimeoutMs ?? 30_000;
    this.deadlineMs = options.deadlineMs ?? 120_000;
    this.backoffBaseMs = options.backoffBaseMs ?? 500;
    this.backoffCapMs = options.backoffCapMs ?? 10_000;
    this.onRetry = options.onRetry;
    this.random = options.random ?? Math.random;
    this.now = options.now ?? Date.now;
  }

  /** `POST /api/charges`: charges (or, with `capture: false`, authorizes) once. */
  charge(body: ChargeRequest, options: OperationOptions = {}): Promise<Result<Charge>> {
    return this.operate("charge", "/api/charges", body, options);
  }

  /** `POST /api/charges/{id}/refunds` (the back office's): by default all that is left. */
  refund(
    chargeId: string,
    body: RefundRequest = {},
    options: OperationOptions = {},
  ): Promise<Result<Refund>> {
    return this.operate("refund", `/api/charges/${segment(chargeId)}/refunds`, body, options);
  }

  /** `POST /api/charges/{id}/capture` (the back office's): a hold, all of it by default. */
  capture(
    chargeId: string,
    body: CaptureRequest = {},
    options: OperationOptions = {},
  ): Promise<Result<Charge>> {
    return this.operate("capture", `/api/charges/${segment(chargeId)}/capture`, body, options);
  }

  /** `POST /api/charges/{id}/cancel` (the back office's): releases a hold. */
  cancel(chargeId: string, options: OperationOptions = {}): Promise<Result<Charge>> {
    return this.operate("cancel", `/api/charges/${segment(chargeId)}/cancel`, {}, options);
  }

  /** `GET /api/charges/{id}`. */
  getCharge(chargeId: string, options: CallOptions = {}): Promise<Charge> {
    return this.read<Charge>(`/api/charges/${segment(chargeId)}`, {}, options);
  }

  /** `GET /api/charges`, newest first, every page: `for await (const charge of ...)`. */
  listCharges(params: ListChargesParams = {}, options: CallOptions = {}): AsyncIterable<Charge> {
    return this.pages<ChargeList, Charge>("/api/charges", params, options);
  }

  /** `GET /api/events` (the back office's), newest first, every page. */
  listEvents(params: ListEventsParams = {}, options: CallOptions = {}): AsyncIterable<Event> {
    return this.pages<EventList, Event>("/api/events", params, options);
  }

  /** The operations a previous run (or a deadline, or an abort) left unfinished. */
  pending(): Promise<PendingOperation[]> {
    return this.store.list();
  }

  /**
   * Forgets a pending operation, e.g. one `operation_expired` after the
   * order was checked. Never do it to start the same payment again.
   */
  forget(operationId: string): Promise<void> {
    return this.store.delete(operationId);
  }

  /** Drives one pending operation to its answer; `undefined` if there is none. */
  async resume(operationId: string, options: CallOptions = {}): Promise<Result<unknown> | undefined> {
    const running = this.inflight.get(operationId);
    if (running !== undefined) return running;
    const operation = await this.store.get(operationId);
    if (operation === undefined) return undefined;
    return this.join(operation, options);
  }

  /**
   * Finishes what a previous run left: each pending operation is sent again
   * with its own key and body, one after another. Call it when the app
   * starts. An operation older than 23/24 of the key TTL the server stated
   * is not sent (`operation_expired`): check the order instead.
   */
  async resumePending(options: CallOptions = {}): Promise<ResumeOutcome[]> {
    const outcomes: ResumeOutcome[] = [];
    for (const operation of await this.store.list()) {
      try {
        const result = await (this.inflight.get(operation.id) ?? this.join(operation, options));
        outcomes.push({ operation, result });
      } catch (error) {
        if (!(error instanceof PaymentsError)) throw error;
        outcomes.push({ operation, error });
      }
    }
    return outcomes;
  }

  private async operate<T>(
    kind: PendingOperation["kind"],
    path: string,
    body: unknown,
    options: OperationOptions,
  ): Promise<Result<T>> {
    const id = options.operationId ?? options.idempotencyKey ?? this.randomUUID();
    const running = this.inflight.get(id);
    if (running !== undefined) return running as Promise<Result<T>>;
    const started = withLock(`payments:${id}`, async () => {
      const saved = await this.store.get(id);
      if (saved !== undefined) return saved;
      const operation: PendingOperation = {
        id,
        kind,
        path,
        key: options.idempotencyKey ?? this.randomUUID(),
        body: JSON.stringify(body),
        createdAt: this.now(),
      };
      await this.store.set(operation); // kept BEFORE the first attempt
      return operation;
    });
    const run = started.then((operation) => {
      if (operation.kind !== kind || operation.path !== path) {
        throw new PaymentsError({
          status: 0,
          code: "invalid_request",
          message: `operation ${id} is a pending ${operation.kind} of ${operation.path}: resume or finish it first`,
          retryable: false,
          operationId: id,
        });
      }
      return this.drive<T>(operation, options);
    });
    return this.track(id, run);
  }

  private join(operation: PendingOperation, options: CallOptions): Promise<Result<unknown>> {
    return this.track(operation.id, this.drive(operation, options));
  }

  private track<T>(id: string, run: Promise<Result<T>>): Promise<Result<T>> {
    this.inflight.set(id, run);
    const done = () => {
      if (this.inflight.get(id) === run) this.inflight.delete(id);
    };
    run.then(done, done);
    return run;
  }

  /** Attempts until a final answer, the deadline or an abort. */
  private drive<T>(operation: PendingOperation, options: CallOptions): Promise<Result<T>> {
    const pending = (code: PaymentsErrorCode, message: string, cause: unknown) =>
      new PaymentsError({
        status: 0,
        code,
        message: `${message}: operation ${operation.id} is kept and resumes with the same key`,
        retryable: true,
        operationId: operation.id,
        idempotencyKey: operation.key,
        cause,
      });
    return this.retrying<Result<T>>(options, operation.id, {
      before: () => this.checkFresh(operation),
      send: (bearer, deadline, signal) =>
        this.attempt("POST", operation.path, bearer, deadline, signal, operation),
      settle: async (answer, verdict) => {
        await this.noteTtl(operation, answer.headers);
        switch (verdict) {
          case "success":
            if (answer.json === undefined) return undefined; // unreadable: the retry gets the replay
            await this.store.delete(operation.id);
            return {
              data: answer.json as T,
              replayed: answer.headers.get("Idempotent-Replay") === "true",
              status: answer.status,
              operationId: operation.id,
              idempotencyKey: operation.key,
              requestId: answer.headers.get("X-Request-Id") ?? undefined,
            };
          case "final":
            await this.store.delete(operation.id);
            throw apiError(answer, false, operation);
          case "final_keep_key":
            throw apiError(answer, false, operation);
          case "reauthenticate":
            // Refused with a fresh token too: the key is kept for after sign-in.
            throw apiError(answer, true, operation);
          case "retry":
            return undefined;
        }
      },
      giveUp: (code, answer, failure) =>
        code === "aborted"
          ? pending("aborted", "aborted", failure)
          : pending(
              "deadline_exceeded",
              "no final answer before the deadline",
              answer === undefined ? failure : apiError(answer, true, operation),
            ),
    });
  }

  /** `GET`s: retried on what a retry can fix, else the error. */
  private read<T>(path: string, query: object, options: CallOptions): Promise<T> {
    const target = path + queryString(query);
    return this.retrying<T>(options, undefined, {
      send: (bearer, deadline, signal) => this.attempt("GET", target, bearer, deadline, signal),
      settle: async (answer, verdict) => {
        if (verdict === "success" && answer.json !== undefined) return answer.json as T;
        if (verdict === "retry" || verdict === "success") return undefined;
        throw apiError(answer, false);
      },
      giveUp: (code, answer, failure) => {
        if (code === "aborted") return readError("aborted", "aborted", failure);
        if (answer !== undefined && answer.json !== undefined) return apiError(answer, true);
        const why = answer === undefined ? "network_error" : "invalid_response";
        return readError(why, `GET ${path}: no answer before the deadline`, failure);
      },
    });
  }

  /**
   * The loop every call shares: an attempt; a 401 once more with a
   * refreshed token; `settle` says what an answer means (a result, a throw,
   * or `undefined` to retry); otherwise a wait of full-jitter backoff, never
   * shorter than `Retry-After`, until the deadline or the signal.
   */
  private async retrying<T>(
    options: CallOptions,
    operationId: string | undefined,
    loop: Loop<T>,
  ): Promise<T> {
    const deadline = this.now() + (options.deadlineMs ?? this.deadlineMs);
    const signal = options.signal;
    let refresh = false;
    let refreshed = false;
    for (let attempt = 1; ; attempt++) {
      loop.before?.();
      if (signal?.aborted) throw loop.giveUp("aborted", undefined, signal.reason);
      let answer: Answer | undefined;
      let failure: unknown;
      try {
        answer = await loop.send(await this.bearer(refresh), deadline, signal);
      } catch (error) {
        if (signal?.aborted) throw loop.giveUp("aborted", undefined, error);
        failure = error;
      }
      refresh = false;
      let asked: number | undefined;
      if (answer !== undefined) {
        const verdict = classify(answer.status, errorCode(answer.json));
        if (verdict === "reauthenticate" && !refreshed) {
          refreshed = refresh = true;
          continue;
        }
        const settled = await loop.settle(answer, verdict);
        if (settled !== undefined) return settled;
        asked = retryAfterMs(answer.headers.get("Retry-After"), this.now());
      }
      const delayMs = Math.max(
        asked ?? 0,
        backoffMs(attempt - 1, this.backoffBaseMs, this.backoffCapMs, this.random),
      );
      if (this.now() + delayMs >= deadline) throw loop.giveUp("deadline_exceeded", answer, failure);
      this.onRetry?.({
        operationId,
        attempt,
        status: answer?.status,
        code: answer === undefined ? undefined : errorCode(answer.json),
        error: failure,
        retryAfterMs: asked,
        delayMs,
      });
      try {
        await sleep(delayMs, signal);
      } catch (error) {
        throw loop.giveUp("aborted", undefined, error);
      }
    }
  }

  private async *pages<Page extends { data: Item[]; has_more: boolean }, Item extends { id: string }>(
    path: string,
    params: object,
    options: CallOptions,
  ): AsyncGenerator<Item, void, undefined> {
    let after: string | undefined;
    for (;;) {
      const query = after === undefined ? params : { ...params, starting_after: after };
      const page = await this.read<Page>(path, query, options);
      yield* page.data;
      const last = page.data.at(-1);
      if (!page.has_more || last === undefined) return;
      after = last.id;
    }
  }

  /** One request, under its own timeout (never past the call's deadline). */
  private async attempt(
    method: "GET" | "POST",
    path: string,
    bearer: string,
    deadline: number,
    signal: AbortSignal | undefined,
    operation?: PendingOperation,
  ): Promise<Answer> {
    const controller = new AbortController();
    const budget = Math.max(1, Math.min(this.attemptTimeoutMs, deadline - this.now()));
    const timer = setTimeout(() => controller.abort(new AttemptTimeout(budget)), budget);
    const forward = () => controller.abort(signal?.reason);
    signal?.addEventListener("abort", forward, { once: true });
    try {
      const headers: Record<string, string> = {
        Authorization: `Bearer ${bearer}`,
        Accept: "application/json",
      };
      if (operation !== undefined) {
        headers["Idempotency-Key"] = operation.key; // the saved key: never a new one here
        headers["Content-Type"] = "application/json";
      }
      const response = await this.fetchFn(this.baseUrl + path, {
        method,
        headers,
        body: operation?.body ?? null,
        signal: controller.signal,
      });
      const text = await response.text(); // still under this attempt's timeout
      return { status: response.status, headers: response.headers, json: parseJson(text) };
    } finally {
      clearTimeout(timer);
      signal?.removeEventListener("abort", forward);
    }
  }

  private async bearer(refresh: boolean): Promise<string> {
    return typeof this.token === "string" ? this.token : this.token(refresh);
  }

  /** Keeps the server's key TTL with the operation, from the first answer that states it. */
  private async noteTtl(operation: PendingOperation, headers: Headers): Promise<void> {
    if (operation.keyTtlSeconds !== undefined) return;
    const value = headers.get("Idempotency-Key-TTL");
    if (value === null || !/^[0-9]{1,10}$/.test(value) || Number(value) === 0) return;
    operation.keyTtlSeconds = Number(value);
    await this.store.set(operation);
  }

  /**
   * After its TTL the server treats a key as new, so a resent operation
   * could be done twice: never send one older than 23/24 of it.
   */
  private checkFresh(operation: PendingOperation): void {
    const ttlMs = (operation.keyTtlSeconds ?? MIN_KEY_TTL_SECONDS) * 1000;
    if (this.now() - operation.createdAt <= (ttlMs * 23) / 24) return;
    throw new PaymentsError({
      status: 0,
      code: "operation_expired",
      message: `operation ${operation.id} began too long ago for the server to remember its key: check the order instead of sending it again`,
      retryable: false,
      operationId: operation.id,
      idempotencyKey: operation.key,
    });
  }
}

/** What an attempt that ran out of time fails with (what `fetch` rejects with). */
export class AttemptTimeout extends Error {
  override readonly name = "TimeoutError";
  constructor(ms: number) {
    super(`no answer within ${ms} ms`);
  }
}

function platformRandomUUID(): (() => string) | undefined {
  const crypto = (globalThis as { crypto?: { randomUUID?: () => string } }).crypto;
  return typeof crypto?.randomUUID === "function" ? () => crypto.randomUUID?.() ?? "" : undefined;
}

/** Holds a lock named `name` across tabs where the platform has Web Locks. */
async function withLock<T>(name: string, fn: () => Promise<T>): Promise<T> {
  const locks = (
    globalThis as {
      navigator?: { locks?: { request(name: string, fn: () => Promise<T>): Promise<T> } };
    }
  ).navigator?.locks;
  return locks === undefined ? fn() : locks.request(name, fn);
}

function segment(id: string): string {
  return encodeURIComponent(id);
}

function queryString(query: object): string {
  const params = new URLSearchParams();
  for (const [name, value] of Object.entries(query)) {
    if (value !== undefined && value !== null) params.append(name, String(value));
  }
  const text = params.toString();
  return text === "" ? "" : `?${text}`;
}

function parseJson(text: string): unknown {
  if (text === "") return undefined;
  try {
    return JSON.parse(text) as unknown;
  } catch {
    return undefined; // not JSON (a proxy's error page): decided by the status
  }
}

interface Envelope {
  code?: unknown;
  message?: unknown;
  param?: unknown;
  decline_code?: unknown;
  charge_id?: unknown;
  refund_id?: unknown;
}

function envelope(json: unknown): Envelope {
  if (typeof json !== "object" || json === null) return {};
  const error = (json as { error?: unknown }).error;
  return typeof error === "object" && error !== null ? (error as Envelope) : {};
}

function text(value: unknown): string | undefined {
  return typeof value === "string" ? value : undefined;
}

function errorCode(json: unknown): string | undefined {
  return text(envelope(json).code);
}

function apiError(answer: Answer, retryable: boolean, operation?: PendingOperation): PaymentsError {
  const error = envelope(answer.json);
  return new PaymentsError({
    status: answer.status,
    code: text(error.code) ?? `http_${answer.status}`,
    message: text(error.message) ?? `HTTP ${answer.status}`,
    retryable,
    param: text(error.param),
    declineCode: text(error.decline_code),
    chargeId: text(error.charge_id),
    refundId: text(error.refund_id),
    operationId: operation?.id,
    idempotencyKey: operation?.key,
    requestId: answer.headers.get("X-Request-Id") ?? undefined,
    body: answer.json,
  });
}

function readError(code: PaymentsErrorCode, message: string, cause: unknown): PaymentsError {
  return new PaymentsError({ status: 0, code, message, retryable: true, cause });
}
