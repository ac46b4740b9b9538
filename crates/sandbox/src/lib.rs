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
//!   its answers say, the accepted secret key, where webhooks go and what
//!   the network does to them, and their validation.
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
//!   `GET /v1/refunds/{id}`, `POST /_sandbox/refunds/{id}` (settles a
//!   pending refund, or fails a succeeded one) and
//!   `POST /_sandbox/charges/{id}/refunds` (a dashboard refund).
//! - `disputes`: Stripe's dispute object and lifecycle, `GET /v1/disputes`,
//!   `GET /v1/disputes/{id}`, and the bank's side in `/_sandbox`.
//! - `webhooks`: the events of what happens at the sandbox, signed and sent
//!   to `webhook_url` in the background with retries and network faults;
//!   their records, in memory.
//! - `search`: `GET /v1/charges/search` and its query parser.
//! - `idempotency`: the provider's key store (in flight, or the stored
//!   answer), with a claim that releases the key if it is dropped unfinished.
//! - `params`: form bodies and query strings: parsing, fingerprint,
//!   validation.
//! - `network`: Stripe's test tokens and what each does.
//! - `ledger`: the charges made (whole, for refunds and search), the refunds,
//!   the captures, the disputes, and the request counters; what a hold can
//!   take, and its lapse.
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
//! | `POST /v1/charges` | form: `amount`, `currency`, `source`, `description`, `metadata[k]`, `capture` (`true`, the default, or `false`: a hold); `Authorization: Bearer <key>` (any key, or only `secret_key` when set); optional `Idempotency-Key`. Answers Stripe's charge object (with `captured`, `amount_captured`, `amount_refunded`, `refunded`, `disputed`, and `payment_method_details: {"type": "card", "card": {..}}`, whose `capture_before` a hold has, in Unix seconds, unless `send_capture_before` is off) |
//! | `POST /v1/charges/{id}/capture` | form: `amount` (optional, at most the charge's; default: all of it); bearer auth and `Idempotency-Key` as for charges. Captures the hold and releases the rest; answers the charge (`captured: true`, `amount_captured`, what was not captured in `amount_refunded`, no refund object) |
//! | `POST /v1/refunds` | form: `charge` (`ch_...`), `amount` (default: what is left), `reason` (`duplicate`, `fraudulent`, `requested_by_customer`), `metadata[k]`; bearer auth and `Idempotency-Key` as for charges. Answers Stripe's refund object (`re_...`, with the configured `refund_status`: `succeeded` unless set to `pending`, `requires_action`, `failed` or `canceled`). Of a hold not captured: its release, whole (`amount` absent or the charge's), always `succeeded`; the charge is then `refunded`, not `captured` |
//! | `GET /v1/refunds` | query: `charge` (optional), `created[gte]`, `created[gt]`, `created[lte]`, `created[lt]` or `created` (Unix seconds, optional), `limit` (1-100, default 10), `starting_after` (a refund id of the list: the next page); bearer auth. Stripe's list, newest first, `has_more` while older refunds are left. With `nulls_in_refund_lists`, a refund made without metadata shows `metadata` and `status` null |
//! | `GET /v1/refunds/{id}` | bearer auth. The refund as it stands now; 404 `resource_missing` for an unknown id |
//! | `GET /v1/charges` | query: `created[gte]`, `created[gt]`, `created[lte]`, `created[lt]` or `created` (Unix seconds), `limit` (1-100, default 10), `starting_after` (`ch_...`: the page after it); bearer auth. Stripe's list, newest first, with `has_more`; shows a charge at once, whatever `search_lag_ms` |
//! | `GET /v1/charges/{id}` | bearer auth. The charge as it stands now (`captured`, `amount_captured`, `amount_refunded`, `refunded`; a lapsed hold shows released); 404 `resource_missing` (param `id`) for an unknown id. How a replayed answer is re-read before it is adopted |
//! | `GET /v1/disputes` | query: `charge` (optional), `created[..]` bounds, `limit` (1-100, default 10), `starting_after` (a dispute id of the list); bearer auth. Stripe's list, newest first, `url: "/v1/disputes"` |
//! | `GET /v1/disputes/{id}` | bearer auth. Stripe's dispute object as it stands (`dp_...`, `status`, `is_charge_refundable`, `evidence_details`); 404 `resource_missing` for an unknown id |
//! | `GET /v1/charges/search` | query: `query=metadata['KEY']:'VALUE'` (or double quotes), `limit` (1-100, default 10); bearer auth. Stripe's `search_result`, newest first, once the index caught up (`search_lag_ms`) |
//! | `GET`/`POST /_sandbox/config` | read / replace the [`SandboxConfig`] (JSON): a field left out goes back to its default, except `webhook_url` and `webhook_secret`, which are kept (where events go is wiring, not a fault; `"webhook_url": null` turns events off) |
//! | `GET /_sandbox/charges` | `{"data":[..]}`: every charge made or declined, oldest first, as it stands now (with `captured`, `amount_captured`, `amount_refunded`) |
//! | `GET /_sandbox/captures` | `{"data":[{"charge","amount","idempotency_key","created"}..]}`: every capture made, oldest first (a replay is not another) |
//! | `GET /_sandbox/refunds` | `{"data":[..]}`: every refund made, oldest first, with its status |
//! | `POST /_sandbox/refunds/{id}` | JSON `{"status": "succeeded" \| "failed" \| "canceled", "failure_reason"?: ".."}`: settles a `pending` or `requires_action` refund, as the provider later does (Stripe's test helpers), or fails a `succeeded` one (Stripe's refund failing days later, e.g. `expired_or_canceled_card`; not a hold's release); a failed or canceled one gives its amount back to the charge. 400 when it is final already (a failed or canceled one), 404 when unknown |
//! | `POST /_sandbox/charges/{id}/refunds` | JSON, all optional: `{"amount": N, "reason": "requested_by_customer" \| "duplicate" \| "fraudulent", "status": "succeeded" \| "pending" \| ..}` (default: the configured `refund_status`): a refund made in the provider's dashboard, through the ledger's same path as `POST /v1/refunds` (same checks, same ledger file) with no metadata and no idempotency key. Answers the refund object; 404 for an unknown charge, 400 as a refund is refused |
//! | `POST /_sandbox/charges/{id}/disputes` | JSON, all optional: `{"amount": N (default: what is left of the charge), "reason": ".." (default `fraudulent`), "inquiry": bool (default false)}`: the bank opens a dispute of a succeeded, captured charge (at most one per charge): `warning_needs_response` (an inquiry, `is_charge_refundable: true`) or `needs_response` (a chargeback, not refundable, due in 7 days); the charge shows `disputed: true`. Answers the dispute |
//! | `POST /_sandbox/disputes/{id}` | JSON `{"status": "..", "is_charge_refundable"?: bool}`: moves a dispute (an inquiry among `warning_*`, escalated to `needs_response` / `under_review`, or closed `warning_closed`; a chargeback between `needs_response` and `under_review`, closed `won` or `lost`; either `prevented`). 400 once closed, or for a move a dispute does not make |
//! | `GET /_sandbox/disputes` | `{"data":[..]}`: every dispute, oldest first, as it stands |
//! | `GET /_sandbox/webhooks` | `{"data":[{"id","type","object_id","created","attempts":[{"status":200} \| {"error":".."} \| {"dropped":true}..],"delivered"}..]}`: every event made (the newest 10,000), oldest first, with each send (`"duplicate": true` on a duplicate's second copy) |
//! | `GET /_sandbox/events/{id}` | the event's JSON, byte for byte as sent; 404 `resource_missing` |
//! | `POST /_sandbox/webhooks/redeliver` | JSON, optional: `{"event_id": "evt_.."}`: sends every event kept (or that one) once more, now, to the current `webhook_url` (one attempt, two with `webhook_duplicate`, never lost or retried), whatever became of it before. Answers `{"data": ["evt_..", ..]}`; 400 without a `webhook_url`, 404 for an unknown event |
//! | `GET /_sandbox/requests` | `{"data":[{"method","path","stripe_version"}..]}`: the last 1,000 `/v1` requests as they arrived (refused ones too), oldest first |
//! | `GET /_sandbox/stats` | `requests`, `in_flight`, `max_in_flight` (of every `POST /v1/*`: charges, refunds, captures), `charges`, `refunds`, `captures`, `disputes` |
//! | `POST /_sandbox/reset` | forget charges, refunds, captures, disputes, keys, counters, the request log and the webhook events, stopping their pending deliveries (not the config); a ledger file is replaced by an empty one |
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
//! lapsed hold, `charge_already_refunded`. A refund of a charge with an
//! open dispute that is not refundable (a chargeback, not an inquiry) is
//! Stripe's 400 `charge_disputed`, nothing refunded.
//!
//! # Webhooks
//!
//! With `webhook_url` set (`--webhook-url` / `SANDBOX_WEBHOOK_URL`, or
//! the run-time config), the sandbox makes Stripe's event objects and
//! `POST`s them there signed (`Stripe-Signature`, with `webhook_secret`),
//! in the background, retrying (200 ms doubling, at most 5 s apart, up to
//! `webhook_max_attempts`), late (`webhook_delay_ms`), shuffled
//! (`webhook_shuffle_ms`), lost (`webhook_drop_rate`, then
//! `webhook_redeliver_ms`) or twice (`webhook_duplicate`) as configured.
//! Events: `charge.succeeded` (a hold too) or `charge.failed` for a charge
//! made; `charge.captured`; `charge.expired` for a hold lapsing (found by
//! a ticker every 500 ms); `charge.refunded` and `refund.created` for any
//! refund made (a hold's release and a dashboard refund included; and
//! `refund.failed` for one made failed); `charge.refund.updated`,
//! `refund.updated` (and `refund.failed`) for a refund settled or failed
//! later; `charge.dispute.created` (and `charge.dispute.funds_withdrawn`
//! for a chargeback), `charge.dispute.updated` (and
//! `charge.dispute.funds_withdrawn` for an inquiry escalated),
//! `charge.dispute.closed` (and `charge.dispute.funds_reinstated` when
//! won). An idempotent replay makes none. The `webhooks` module has the
//! details.
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
//!   charges, refunds (a refund failed after it succeeded too), captures,
//!   holds released, disputes and the answers stored under idempotency
//!   keys: a
//!   provider retry after a restart replays, and a refund of an earlier
//!   charge succeeds. The file is JSON Lines, one line per change, written
//!   before the change is made and answered (not fsynced per line: it
//!   survives the process being killed, not a power cut), read back and
//!   rewritten compacted at start through a temporary file renamed over
//!   it. A last line cut short by a crash is dropped with a warning;
//!   anything else unreadable refuses to start, naming the file and line:
//!   delete or move the file to start empty. Locked while in use. The
//!   config, counters and request log are not kept, nor are the webhook
//!   events and their pending deliveries (in memory only). The `journal`
//!   module has the details.
//! - Webhooks are made only while a `webhook_url` is set, so a load run
//!   without them pays nothing; an event never waits on its delivery, and
//!   a request never waits on an event. The network's faults
//!   (`webhook_drop_rate`, `webhook_duplicate`) are read at each attempt;
//!   everything else about an event's delivery is fixed when it is made.

pub mod config;

mod access;
mod captures;
mod charges;
mod disputes;
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
mod webhooks;

pub use config::{
    DEFAULT_HOLD_EXPIRY_SECS, DEFAULT_KEY_RETENTION_SECS, DEFAULT_WEBHOOK_SECRET, InvalidConfig,
    MAX_HOLD_EXPIRY_SECS, MAX_WEBHOOK_ATTEMPTS, MIN_WEBHOOK_SECRET_CHARS, RefundStatus,
    SandboxConfig,
};
pub use journal::{LedgerFile, LedgerFileError};
pub use server::{SandboxHandle, serve, serve_with_ledger};
