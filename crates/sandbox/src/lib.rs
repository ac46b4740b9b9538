//! A simulated payment provider speaking a Stripe-compatible subset over
//! HTTP, with fault injection. The payments API uses it in development and in
//! tests; it moves no money.
//!
//! # Layout
//!
//! - [`config`]: [`SandboxConfig`], the fault-injection settings (latency,
//!   error rate, hang, drop-after-charge) and their validation.
//! - `server`: [`serve`] runs the accept loop on a listener the caller bound,
//!   serving each connection with hyper so a handler can close its own
//!   connection without answering; [`SandboxHandle`] runs it in the
//!   background on a random loopback port for tests.
//! - `routes`: the router: `POST /v1/charges`, the `/_sandbox/*` control
//!   endpoints, `/healthz`, JSON 404/405.
//! - `charges`: `POST /v1/charges`: authentication, the idempotency decision
//!   and the processing task (latency, faults, the charge) that survives the
//!   client hanging up.
//! - `idempotency`: the provider's key store (in flight, or the stored
//!   answer), with a claim that releases the key if it is dropped unfinished.
//! - `params`: the form body: parsing, fingerprint, validation.
//! - `network`: Stripe's test tokens and what each does.
//! - `ledger`: the charges made and the request counters.
//! - `response`, `error`: stored JSON answers and Stripe's error envelope.
//! - `state`: what the handlers share.
//!
//! # HTTP API
//!
//! | Route | Does |
//! | --- | --- |
//! | `POST /v1/charges` | form: `amount`, `currency`, `source`, `description`, `metadata[k]`; `Authorization: Bearer <any>`; optional `Idempotency-Key` |
//! | `GET`/`POST /_sandbox/config` | read / replace the [`SandboxConfig`] (JSON) |
//! | `GET /_sandbox/charges` | `{"data":[..]}`: every charge made or declined, oldest first |
//! | `GET /_sandbox/stats` | `requests`, `in_flight`, `max_in_flight`, `charges` |
//! | `POST /_sandbox/reset` | forget charges, keys and counters (not the config) |
//! | `GET /healthz` | `{"status":"ok"}` |
//!
//! # Decisions
//!
//! - Faults apply only to requests that are processed. An idempotent replay,
//!   a 409 (key in flight) or a 400 (key reused with other parameters)
//!   answers at once, so a retry after `drop_after_charge` gets its replay
//!   while the fault is still on. A request keeps the config it arrived with.
//! - Order: `latency_ms`, then `hang`, then `error_rate`, then the charge,
//!   then `drop_after_charge` (only when a charge, succeeded or declined,
//!   was recorded; a validation error is answered normally).
//! - `hang` releases the idempotency key when the hang begins: nothing was
//!   charged, so a retry with the same key is processed anew (and hangs too
//!   while the fault is on). The hanging request stays in flight until the
//!   client hangs up.
//! - Idempotency keys are scoped per API key, as Stripe scopes them per
//!   account. The parameter fingerprint is SHA-256 over the raw form pairs
//!   (order-insensitive), taken before validation, so a stored validation
//!   error is replayed for the same parameters like any other answer.
//! - `POST /_sandbox/reset` does not reset `in_flight` (those requests are
//!   real); an attempt in flight across a reset stores no idempotent answer,
//!   though its charge is still recorded.
//! - On shutdown the server stops accepting, gives open connections 2 s to
//!   finish, then closes them.

pub mod config;

mod charges;
mod error;
mod idempotency;
mod ledger;
mod network;
mod params;
mod response;
mod routes;
mod server;
mod state;

pub use config::{DEFAULT_KEY_RETENTION_SECS, InvalidConfig, SandboxConfig};
pub use server::{SandboxHandle, serve};
