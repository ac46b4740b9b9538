/**
 * Where pending operations are kept, so that an app killed mid-payment
 * retries with the same key when it comes back.
 */

/** What an operation's later attempts need: its key and the exact body. */
export interface PendingOperation {
  /** The app's name for the operation (an order id), or one generated. */
  readonly id: string;
  readonly kind: "charge" | "refund" | "capture" | "cancel";
  /** The path every attempt is POSTed to. */
  readonly path: string;
  /** The `Idempotency-Key`: generated once, before the first attempt. */
  readonly key: string;
  /** The body every attempt sends, byte for byte. */
  readonly body: string;
  /** When it was made (ms since the epoch, this device's clock). */
  readonly createdAt: number;
  /** The server's `Idempotency-Key-TTL` (seconds), from the first answer that had it. */
  keyTtlSeconds?: number;
}

/**
 * A place to keep pending operations. Anything with these four methods will
 * do (a database table, a file, the Keychain); `set` must have stored the
 * operation when its promise resolves, since the first attempt follows it.
 */
export interface PendingStore {
  get(id: string): Promise<PendingOperation | undefined>;
  set(operation: PendingOperation): Promise<void>;
  delete(id: string): Promise<void>;
  list(): Promise<PendingOperation[]>;
}

/** The prefix of the adapters' keys, so that `list` finds only ours. */
export const DEFAULT_PREFIX = "payments:pending:";

/** Kept in memory: lost with the process (the default; for servers and tests). */
export function memoryStore(): PendingStore {
  const operations = new Map<string, PendingOperation>();
  return {
    async get(id) {
      return operations.get(id);
    },
    async set(operation) {
      operations.set(operation.id, { ...operation });
    },
    async delete(id) {
      operations.delete(id);
    },
    async list() {
      return [...operations.values()];
    },
  };
}

/** The shape of the Web Storage API (`localStorage`, `sessionStorage`). */
export interface WebStorageLike {
  readonly length: number;
  key(index: number): string | null;
  getItem(key: string): string | null;
  setItem(key: string, value: string): void;
  removeItem(key: string): void;
}

/** Kept in `localStorage` (browsers), or any Web Storage, under `prefix`. */
export function webStorageStore(
  storage: WebStorageLike = globalThis.localStorage,
  prefix = DEFAULT_PREFIX,
): PendingStore {
  return {
    async get(id) {
      return parse(storage.getItem(prefix + id));
    },
    async set(operation) {
      storage.setItem(prefix + operation.id, JSON.stringify(operation));
    },
    async delete(id) {
      storage.removeItem(prefix + id);
    },
    async list() {
      const names: string[] = [];
      for (let i = 0; i < storage.length; i++) {
        const name = storage.key(i);
        if (name?.startsWith(prefix)) names.push(name);
      }
      return present(names.map((name) => parse(storage.getItem(name))));
    },
  };
}

/** The shape of React Native's `AsyncStorage` (`@react-native-async-storage/async-storage`). */
export interface AsyncStorageLike {
  getItem(key: string): Promise<string | null>;
  setItem(key: string, value: string): Promise<void>;
  removeItem(key: string): Promise<void>;
  getAllKeys(): Promise<readonly string[]>;
}

/** Kept in React Native's `AsyncStorage` (or anything of its shape), under `prefix`. */
export function asyncStorageStore(storage: AsyncStorageLike, prefix = DEFAULT_PREFIX): PendingStore {
  return {
    async get(id) {
      return parse(await storage.getItem(prefix + id));
    },
    async set(operation) {
      await storage.setItem(prefix + operation.id, JSON.stringify(operation));
    },
    async delete(id) {
      await storage.removeItem(prefix + id);
    },
    async list() {
      const names = (await storage.getAllKeys()).filter((name) => name.startsWith(prefix));
      const values = await Promise.all(names.map((name) => storage.getItem(name)));
      return present(values.map(parse));
    },
  };
}

const KINDS: readonly PendingOperation["kind"][] = ["charge", "refund", "capture", "cancel"];

/**
 * A stored operation read back, or `undefined` for anything that is not one
 * (another app's value under our prefix, a value cut short): never thrown.
 */
export function parse(raw: string | null | undefined): PendingOperation | undefined {
  if (raw == null) return undefined;
  let value: unknown;
  try {
    value = JSON.parse(raw);
  } catch {
    return undefined;
  }
  if (typeof value !== "object" || value === null) return undefined;
  const v = value as Record<string, unknown>;
  const text = (name: string) => typeof v[name] === "string" && (v[name] as string).length > 0;
  if (!text("id") || !text("path") || !text("key") || typeof v.body !== "string") return undefined;
  if (!KINDS.includes(v.kind as PendingOperation["kind"])) return undefined;
  if (typeof v.createdAt !== "number" || !Number.isFinite(v.createdAt)) return undefined;
  const operation: PendingOperation = {
    id: v.id as string,
    kind: v.kind as PendingOperation["kind"],
    path: v.path as string,
    key: v.key as string,
    body: v.body,
    createdAt: v.createdAt,
  };
  const ttl = v.keyTtlSeconds;
  if (typeof ttl === "number" && Number.isInteger(ttl) && ttl > 0) operation.keyTtlSeconds = ttl;
  return operation;
}

function present(operations: (PendingOperation | undefined)[]): PendingOperation[] {
  return operations.filter((operation): operation is PendingOperation => operation !== undefined);
}
