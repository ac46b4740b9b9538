export {
  AttemptTimeout,
  type CallOptions,
  type FetchLike,
  type OperationOptions,
  PaymentsClient,
  type PaymentsClientOptions,
  type Result,
  type ResumeOutcome,
  type RetryInfo,
  type TokenSource,
} from "./client.js";
export { type ClientErrorCode, PaymentsError, type PaymentsErrorCode } from "./errors.js";
export {
  type AsyncStorageLike,
  asyncStorageStore,
  DEFAULT_PREFIX,
  memoryStore,
  type PendingOperation,
  type PendingStore,
  type WebStorageLike,
  webStorageStore,
} from "./store.js";
export type * from "./types.js";
