import type { ApiErrorCode } from "./types.js";

/**
 * Codes the client gives itself, when no final answer came:
 * - `deadline_exceeded`: the call's deadline passed before a final answer;
 * - `aborted`: the caller's `AbortSignal` fired;
 * - `unauthorized` after a refreshed token was refused too (the server's code);
 * - `operation_expired`: a pending operation older than the server remembers
 *   keys for (less a margin) is never sent again: check the order instead;
 * - `network_error`, `invalid_response`: a read (`getCharge`, lists) that
 *   got no usable answer before its deadline.
 */
export type ClientErrorCode =
  | "deadline_exceeded"
  | "aborted"
  | "operation_expired"
  | "network_error"
  | "invalid_response";

export type PaymentsErrorCode = ApiErrorCode | ClientErrorCode;

export interface PaymentsErrorInit {
  status: number;
  code: PaymentsErrorCode | string;
  message: string;
  retryable: boolean;
  param?: string | undefined;
  declineCode?: string | undefined;
  chargeId?: string | undefined;
  refundId?: string | undefined;
  operationId?: string | undefined;
  idempotencyKey?: string | undefined;
  requestId?: string | undefined;
  body?: unknown;
  cause?: unknown;
}

/**
 * Every failure the client reports. Decide by `code` and `retryable`, never
 * by `message` (for people; it may change).
 *
 * `retryable: true` means the operation is NOT over: its key is kept in the
 * store under `operationId`, and `resumePending()` (or the same call with the
 * same `operationId`) sends it again with the same key. Never start the same
 * payment again with a new key after one of these: it may have been charged.
 *
 * `retryable: false` is a final answer. For `card_declined`,
 * `request_abandoned` and the `*_not_made` codes it is the payment's outcome
 * (stored by the server and replayed to every retry); for a 400, 403, 404,
 * 413 or 415 it is a client bug that nothing was charged for. A 422
 * `idempotency_key_reused` is final and its key is kept: the first use of the
 * key may have charged (report it; check the order).
 */
export class PaymentsError extends Error {
  override readonly name = "PaymentsError";
  /** The HTTP status, or 0 when no answer decided it (deadline, abort, network). */
  readonly status: number;
  readonly code: PaymentsErrorCode | string;
  readonly retryable: boolean;
  /** The request field at fault (`invalid_request`). */
  readonly param: string | undefined;
  /** The provider's reason for a decline (`card_declined`, `*_failed`). */
  readonly declineCode: string | undefined;
  readonly chargeId: string | undefined;
  readonly refundId: string | undefined;
  /** The operation this error ended (kept in the store when `retryable`). */
  readonly operationId: string | undefined;
  readonly idempotencyKey: string | undefined;
  /** The server's `Request-Id`, for support. */
  readonly requestId: string | undefined;
  /** The parsed error body, when there was one. */
  readonly body: unknown;

  constructor(init: PaymentsErrorInit) {
    super(init.message, init.cause === undefined ? undefined : { cause: init.cause });
    this.status = init.status;
    this.code = init.code;
    this.retryable = init.retryable;
    this.param = init.param;
    this.declineCode = init.declineCode;
    this.chargeId = init.chargeId;
    this.refundId = init.refundId;
    this.operationId = init.operationId;
    this.idempotencyKey = init.idempotencyKey;
    this.requestId = init.requestId;
    this.body = init.body;
  }
}
