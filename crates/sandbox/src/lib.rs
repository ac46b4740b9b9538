//! A simulated payment provider speaking a Stripe-compatible subset over
//! HTTP, with fault injection. The payments API uses it in development and in
//! tests; it moves no money.
//!
//! # Layout
//!
//! - [`config`]: [`SandboxConfig`], the fault-injection settings (latency,
//!   error rate, rate-limit rate, hang, drop-after-charge, key retention,
//!   search lag, the status new refunds get, answers with another amount or
//!   currency, nulls in refund lists), how long a hold lasts and whether
//!   its answers say, the accepted secret key, and their validation.
//! - `access`: what every `/v1` request goes through first: recorded with
//!   its `Stripe-Version`, then its secret key checked (401 / 403).
//! - `server`: [`serve`] runs the accept loop on a listener the caller bound,
//!   serving each connection with hyper so a handler can close its own
//!   connection without answering; [`SandboxHandle`] runs it in the
//!   background on a random loopback port for tests.
//! - `routes`: the router: the `/v1` endpoints, the `/_sandbox/*` control
//!   endpoints, `/healthz`, JSON 404/405.
//! - `processing`: the path every `POST /v1/*` endpoint shares (charges,
//!   refunds, captures): authentication, the idempotency decision and the
//!   processing task (latency, faults, the operation) that survives the
//!   client hanging up.
//! - `charges`: `POST /v1/charges` (the charge, or a hold), `GET
//!   /v1/charges` and `GET /v1/charges/{id}`.
//! - `captures`: `POST /v1/charges/{id}/capture` (a hold captured) and
//!   `GET /_sandbox/captures`.
//! - `refunds`: `POST /v1/refunds` (the refund), `GET /v1/refunds`,
//!   `GET /v1/refunds/{id}`, and `POST /_sandbox/refunds/{id}` (settles a
//!   pending refund).
//! - `search`: `GET /v1/charges/search` and its query parser.
//! - `idempotency`: the provider's key store (in flight, or the stored
//!   answer), with a claim that releases the key if it is dropped unfinished.
//! - `params`: form bodies and query strings: parsing, fingerprint,
//!   validation.
//! - `network`: Stripe's test tokens and what each does.
//! - `ledger`: the charges made (whole, for refunds and search), the refunds,
//!   the captures, and the request counters; what a hold can take, and its
//!   lapse.
//! - `journal`: the optional ledger file ([`LedgerFile`]) that keeps the
//!   charges, refunds, captures and answered idempotency keys across
//!   restarts.
//! - `response`, `error`: stored JSON answers and Stripe's error envelope.
//! - `state`: what the handlers share.
//!
//! # HTTP API
//!
//! | Route | Does |
//! | --- | --- |
//! | `POST /v1/charges` | form: `amount`, `currency`, `source`, `description`, `metadata[k]`, `capture` (`true`, the default, or `false`: a hold); `Authorization: Bearer <key>` (any key, or only `secret_key` when set); optional `Idempotency-Key`. Answers Stripe's charge object (with `captured`, `amount_captured`, `amount_refunded`, `refunded`, and `payment_method_details: {"type": "card", "card": {..}}`, whose `capture_before` a hold has, in Unix seconds, unless `send_capture_before` is off) |
//! | `POST /v1/charges/{id}/capture` | form: `amount` (optional, at most the charge's; default: all of it); bearer auth and `Idempotency-Key` as for charges. Captures the hold and releases the rest; answers the charge (`captured: true`, `amount_captured`, what was not captured in `amount_refunded`, no refund object) |
//! | `POST /v1/refunds` | form: `charge` (`ch_...`), `amount` (default: what is left), `reason` (`duplicate`, `fraudulent`, `requested_by_customer`), `metadata[k]`; bearer auth and `Idempotency-Key` as for charges. Answers Stripe's refund object (`re_...`, with the configured `refund_status`: `succeeded` unless set to `pending`, `requires_action`, `failed` or `canceled`). Of a hold not captured: its release, whole (`amount` absent or the charge's), always `succeeded`; the charge is then `refunded`, not `captured` |
//! | `GET /v1/refunds` | query: `charge` (optional), `created[gte]`, `created[gt]`, `created[lte]`, `created[lt]` or `created` (Unix seconds, optional), `limit` (1-100, default 10), `starting_after` (a refund id of the list: the next page); bearer auth. Stripe's list, newest first, `has_more` while older refunds are left. With `nulls_in_refund_lists`, a refund made without metadata shows `metadata` and `status` null |
//! | `GET /v1/refunds/{id}` | bearer auth. The refund as it stands now; 404 `resource_missing` for an unknown id |
//! | `GET /v1/charges` | query: `created[gte]`, `created[gt]`, `created[lte]`, `created[lt]` or `created` (Unix seconds), `limit` (1-100, default 10), `starting_after` (`ch_...`: the page after it); bearer auth. Stripe's list, newest first, with `has_more`; shows a charge at once, whatever `search_lag_ms` |
//! | `GET /v1/charges/{id}` | bearer auth. The charge as it stands now (`captured`, `amount_captured`, `amount_refunded`, `refunded`; a lapsed hold shows released); 404 `resource_missing` (param `id`) for an unknown id. How a replayed answer is re-read before it is adopted |
//! | `GET /v1/charges/search` | query: `query=metadata['KEY']:'VALUE'` (or double quotes), `limit` (1-100, default 10); bearer auth. Stripe's `search_result`, newest first, once the index caught up (`search_lag_ms`) |
//! | `GET`/`POST /_sandbox/config` | read / replace the [`SandboxConfig`] (JSON) |
//! | `GET /_sandbox/charges` | `{"data":[..]}`: every charge made or declined, oldest first, as it stands now (with `captured`, `amount_captured`, `amount_refunded`) |
//! | `GET /_sandbox/captures` | `{"data":[{"charge","amount","idempotency_key","created"}..]}`: every capture made, oldest first (a replay is not another) |
//! | `GET /_sandbox/refunds` | `{"data":[..]}`: every refund made, oldest first, with its status |
//! | `POST /_sandbox/refunds/{id}` | JSON `{"status": "succeeded" \| "failed" \| "canceled", "failure_reason"?: ".."}`: settles a `pending` or `requires_action` refund, as the provider later does (Stripe's test helpers); a failed or canceled one gives its amount back to the charge. 400 when it is final already, 404 when unknown |
//! | `GET /_sandbox/requests` | `{"data":[{"method","path","stripe_version"}..]}`: the last 1,000 `/v1` requests as they arrived (refused ones too), oldest first |
//! | `GET /_sandbox/stats` | `requests`, `in_flight`, `max_in_flight` (of every `POST /v1/*`: charges, refunds, captures), `charges`, `refunds`, `captures` |
//! | `POST /_sandbox/reset` | forget charges, refunds, captures, keys, counters and the request log (not the config); a ledger file is replaced by an empty one |
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
//! `query`. A refund of a hold not captured with another `amount` than the
//! charge's is a 400 with param `amount` (a hold is released whole); of a
//! lapsed hold, `charge_already_refunded`.
//!
//! Capture errors (`invalid_request_error`): 404 `resource_missing` (param
//! `id`) for an unknown charge; 400 `charge_not_capturable` for a failed
//! (declined) charge, `charge_already_captured` for a charge captured
//! (when made, or by an earlier capture), `charge_already_refunded` for a
//! hold released by a refund, `charge_expired_for_capture` for a hold past
//! its `capture_before`, `amount_too_large` (param `amount`) for more than
//! the charge's amount. A refused capture changes nothing and is stored
//! under its key like any final answer. `capture` other than `true` or
//! `false` on a charge is a 400 with param `capture`.
//!
//! # Decisions
//!
//! - Faults apply only to charge, refund and capture requests that are
//!   processed (the `GET` endpoints have none: they move no money). They
//!   are not per route: a test that wants them on captures only sets them
//!   after making its holds (as the refund tests do after their charges). An idempotent
//!   replay, a 409 (key in flight) or a 400 (key reused with other
//!   parameters) answers at once, so a retry after `drop_after_charge` gets
//!   its replay while the fault is still on. A request keeps the config it
//!   arrived with.
//! - Order: the secret key (`secret_key`, `restricted_key`: 401 / 403),
//!   then `rate_limit_rate` (429), both before the idempotency key is
//!   looked at; then `latency_ms`, `hang`, `error_rate`, the charge, refund
//!   or capture, and `drop_after_charge` (only when a charge, succeeded or
//!   declined, a refund or a capture was recorded; a validation error or a
//!   refused refund or capture is answered normally).
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
//!   up to more than the charge, whatever the caller checked first. So are
//!   a capture's check and record: of concurrent captures of one hold,
//!   under different keys, exactly one is made.
//! - Holds follow Stripe's legacy Charges API: a hold (`capture=false`,
//!   approved) is `paid`, `succeeded`, `captured: false`,
//!   `amount_captured: 0`, with `capture_before` = `created` +
//!   `hold_expiry_seconds` (fixed when it is made). One capture of at most
//!   its amount makes it `captured`, `amount_captured` that amount, and
//!   puts the rest in `amount_refunded` (released; no refund object): its
//!   refunds can then add up to what was captured. Reaching
//!   `capture_before` uncaptured, it lapses: worked out when read (nothing
//!   is written, and a restart reads it the same), it shows `refunded`,
//!   `amount_refunded` = `amount`, `captured: false` everywhere it is
//!   read. An idempotent replay still sends the answer as it was first
//!   made.
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
//!   charges, refunds, captures, holds released and the answers stored
//!   under idempotency keys: a
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
mod captures;
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

pub use config::{
    DEFAULT_HOLD_EXPIRY_SECS, DEFAULT_KEY_RETENTION_SECS, InvalidConfig, MAX_HOLD_EXPIRY_SECS,
    RefundStatus, SandboxConfig,
};
pub use journal::{LedgerFile, LedgerFileError};
pub use server::{SandboxHandle, serve, serve_with_ledger};
