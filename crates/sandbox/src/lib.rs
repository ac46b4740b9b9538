//! A simulated payment provider speaking a Stripe-compatible subset over
//! HTTP, with fault injection. The payments API uses it in development and in
//! tests; it moves no money.
//!
//! # Layout
//!
//! - [`config`]: [`SandboxConfig`], the fault-injection settings (latency,
//!   error rate, rate-limit rate, hang, drop-after-charge, key retention,
//!   search lag, the status new refunds get, answers with another amount or
//!   currency, nulls in refund lists), the accepted secret key, and their
//!   validation.
//! - `access`: what every `/v1` request goes through first: recorded with
//!   its `Stripe-Version`, then its secret key checked (401 / 403).
//! - `server`: [`serve`] runs the accept loop on a listener the caller bound,
//!   serving each connection with hyper so a handler can close its own
//!   connection without answering; [`SandboxHandle`] runs it in the
//!   background on a random loopback port for tests.
//! - `routes`: the router: the `/v1` endpoints, the `/_sandbox/*` control
//!   endpoints, `/healthz`, JSON 404/405.
//! - `processing`: the path both `POST /v1/*` endpoints share:
//!   authentication, the idempotency decision and the processing task
//!   (latency, faults, the operation) that survives the client hanging up.
//! - `charges`: `POST /v1/charges` (the charge), `GET /v1/charges` and
//!   `GET /v1/charges/{id}`.
//! - `refunds`: `POST /v1/refunds` (the refund), `GET /v1/refunds`,
//!   `GET /v1/refunds/{id}`, and `POST /_sandbox/refunds/{id}` (settles a
//!   pending refund).
//! - `search`: `GET /v1/charges/search` and its query parser.
//! - `idempotency`: the provider's key store (in flight, or the stored
//!   answer), with a claim that releases the key if it is dropped unfinished.
//! - `params`: form bodies and query strings: parsing, fingerprint,
//!   validation.
//! - `network`: Stripe's test tokens and what each does.
//! - `ledger`: the charges made (whole, for refunds and search), the refunds
//!   and the request counters.
//! - `journal`: the optional ledger file ([`LedgerFile`]) that keeps the
//!   charges, refunds and answered idempotency keys across restarts.
//! - `response`, `error`: stored JSON answers and Stripe's error envelope.
//! - `state`: what the handlers share.
//!
//! # HTTP API
//!
//! | Route | Does |
//! | --- | --- |
//! | `POST /v1/charges` | form: `amount`, `currency`, `source`, `description`, `metadata[k]`; `Authorization: Bearer <key>` (any key, or only `secret_key` when set); optional `Idempotency-Key`. Answers Stripe's charge object (with `amount_refunded`, `refunded`) |
//! | `POST /v1/refunds` | form: `charge` (`ch_...`), `amount` (default: what is left), `reason` (`duplicate`, `fraudulent`, `requested_by_customer`), `metadata[k]`; bearer auth and `Idempotency-Key` as for charges. Answers Stripe's refund object (`re_...`, with the configured `refund_status`: `succeeded` unless set to `pending`, `requires_action`, `failed` or `canceled`) |
//! | `GET /v1/refunds` | query: `charge` (optional), `created[gte]`, `created[gt]`, `created[lte]`, `created[lt]` or `created` (Unix seconds, optional), `limit` (1-100, default 10), `starting_after` (a refund id of the list: the next page); bearer auth. Stripe's list, newest first, `has_more` while older refunds are left. With `nulls_in_refund_lists`, a refund made without metadata shows `metadata` and `status` null |
//! | `GET /v1/refunds/{id}` | bearer auth. The refund as it stands now; 404 `resource_missing` for an unknown id |
//! | `GET /v1/charges` | query: `created[gte]`, `created[gt]`, `created[lte]`, `created[lt]` or `created` (Unix seconds), `limit` (1-100, default 10), `starting_after` (`ch_...`: the page after it); bearer auth. Stripe's list, newest first, with `has_more`; shows a charge at once, whatever `search_lag_ms` |
//! | `GET /v1/charges/{id}` | bearer auth. The charge as it stands now (`amount_refunded`, `refunded`); 404 `resource_missing` for an unknown id. How a replayed answer is re-read before it is adopted |
//! | `GET /v1/charges/search` | query: `query=metadata['KEY']:'VALUE'` (or double quotes), `limit` (1-100, default 10); bearer auth. Stripe's `search_result`, newest first, once the index caught up (`search_lag_ms`) |
//! | `GET`/`POST /_sandbox/config` | read / replace the [`SandboxConfig`] (JSON) |
//! | `GET /_sandbox/charges` | `{"data":[..]}`: every charge made or declined, oldest first |
//! | `GET /_sandbox/refunds` | `{"data":[..]}`: every refund made, oldest first, with its status |
//! | `POST /_sandbox/refunds/{id}` | JSON `{"status": "succeeded" \| "failed" \| "canceled", "failure_reason"?: ".."}`: settles a `pending` or `requires_action` refund, as the provider later does (Stripe's test helpers); a failed or canceled one gives its amount back to the charge. 400 when it is final already, 404 when unknown |
//! | `GET /_sandbox/requests` | `{"data":[{"method","path","stripe_version"}..]}`: the last 1,000 `/v1` requests as they arrived (refused ones too), oldest first |
//! | `GET /_sandbox/stats` | `requests`, `in_flight`, `max_in_flight` (of both `POST /v1/*`), `charges`, `refunds` |
//! | `POST /_sandbox/reset` | forget charges, refunds, keys, counters and the request log (not the config); a ledger file is replaced by an empty one |
//! | `GET /healthz` | `{"status":"ok"}` |
//!
//! Refund errors (400 `invalid_request_error`): `resource_missing` (param
//! `charge`) for an unknown charge; `charge_not_refundable` for a failed
//! (declined) charge, the sandbox's own code since nothing was taken;
//! `charge_already_refunded` once nothing is left; `amount_too_large`
//! (param `amount`) for more than is left, amounts in minor units.
//! `GET /v1/refunds?charge=` with an unknown charge is `resource_missing`
//! too, and so is a `starting_after` that is not a refund of the list, or
//! `GET /v1/charges?starting_after=` with an unknown charge (param
//! `starting_after`). A search query of any other form is a 400 with param
//! `query`.
//!
//! # Decisions
//!
//! - Faults apply only to charge and refund requests that are processed
//!   (the `GET` endpoints have none: they move no money). An idempotent
//!   replay, a 409 (key in flight) or a 400 (key reused with other
//!   parameters) answers at once, so a retry after `drop_after_charge` gets
//!   its replay while the fault is still on. A request keeps the config it
//!   arrived with.
//! - Order: the secret key (`secret_key`, `restricted_key`: 401 / 403),
//!   then `rate_limit_rate` (429), both before the idempotency key is
//!   looked at; then `latency_ms`, `hang`, `error_rate`, the charge or
//!   refund, and `drop_after_charge` (only when a charge, succeeded or
//!   declined, or a refund was recorded; a validation error or a refused
//!   refund is answered normally).
//! - What a retry recovers from, as at Stripe: Stripe saves the status and
//!   body of every request whose processing began, 500s included, and
//!   replays them for 24 h; only what it answers before that (an invalid
//!   key, a rate limit, a request refused as concurrent with the same key)
//!   or a request that never got an answer is processed anew. So
//!   `error_rate`'s 500 is saved and replayed (`Idempotent-Replayed:
//!   true`) to every retry with the key: a re-drive never recovers it.
//!   The faults a re-drive recovers from are `rate_limit_rate` (429, not
//!   saved), `hang` (a timeout; the key is released) and
//!   `drop_after_charge` (the retry gets the saved answer).
//! - A refund's check against its charge (status, what is left) and its
//!   record are one critical section, so concurrent refunds can never add
//!   up to more than the charge, whatever the caller checked first.
//! - A `pending` or `requires_action` refund counts against its charge's
//!   `amount_refunded` (as at Stripe) until it fails or is canceled; a
//!   refund made `failed` or `canceled` refunds nothing. Settling one
//!   changes the refund, never its stored idempotent answer: a retry under
//!   its key replays the `pending` answer, as at Stripe.
//! - Search visibility is worked out at search time from the charge's
//!   creation in milliseconds and the current `search_lag_ms`. Searches scan
//!   the charges newest first; the sandbox does not paginate (`next_page` is
//!   null, `page` is refused).
//! - `hang` releases the idempotency key when the hang begins: nothing was
//!   charged, so a retry with the same key is processed anew (and hangs too
//!   while the fault is on). The hanging request stays in flight until the
//!   client hangs up.
//! - Idempotency keys are scoped per API key, as Stripe scopes them per
//!   account, across endpoints. The parameter fingerprint is SHA-256 over
//!   the endpoint and the raw form pairs (order-insensitive), taken before
//!   validation, so a stored validation error is replayed for the same
//!   parameters like any other answer, and a key first used on another
//!   endpoint is a 400 `idempotency_error`, as at Stripe.
//! - `POST /_sandbox/reset` does not reset `in_flight` (those requests are
//!   real); an attempt in flight across a reset stores no idempotent answer,
//!   though its charge or refund is still recorded.
//! - On shutdown the server stops accepting, gives open connections 2 s to
//!   finish, then closes them.
//! - The ledger is in memory unless a file is given ([`LedgerFile`]:
//!   `--ledger PATH` / `SANDBOX_LEDGER` for the binary, and `make run`'s
//!   in-process sandbox keeps one next to its SQLite database), so tests
//!   stay independent. With a file, a restarted sandbox still knows its
//!   charges, refunds and the answers stored under idempotency keys: a
//!   provider retry after a restart replays, and a refund of an earlier
//!   charge succeeds. The file is JSON Lines, one line per change, written
//!   before the change is made and answered (not fsynced per line: it
//!   survives the process being killed, not a power cut), read back and
//!   rewritten compacted at start through a temporary file renamed over
//!   it. A last line cut short by a crash is dropped with a warning;
//!   anything else unreadable refuses to start, naming the file and line:
//!   delete or move the file to start empty. Locked while in use. The
//!   config, counters and request log are not kept. The `journal` module
//!   has the details.

pub mod config;

mod access;
mod charges;
mod error;
mod idempotency;
mod journal;
mod ledger;
mod network;
mod params;
mod processing;
mod refunds;
mod response;
mod routes;
mod search;
mod server;
mod state;

pub use config::{DEFAULT_KEY_RETENTION_SECS, InvalidConfig, RefundStatus, SandboxConfig};
pub use journal::{LedgerFile, LedgerFileError};
pub use server::{SandboxHandle, serve, serve_with_ledger};
