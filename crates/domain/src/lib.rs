//! # payments-domain
//!
//! The core of the payments server: what a charge is, how a retried request
//! is recognised and answered exactly once, and the two ports the core needs
//! from the outside world. It knows no HTTP framework and no HTTP client.
//!
//! # Layout
//!
//! - [`charge`]: the validated charge request (`AmountCents`, `Currency`,
//!   `CustomerId`, `CardToken`) and the recorded [`charge::Charge`].
//! - [`refund`]: the validated refund request and the recorded
//!   [`refund::Refund`].
//! - [`derive`]: ids and provider keys derived from the operation (HMAC
//!   under `PROVIDER_KEY_SECRET`), so a retry after a lost write re-sends
//!   the same provider call.
//! - [`idempotency`]: `IdempotencyKey`, the canonical `RequestFingerprint`,
//!   lease tokens, and the stored record and response of a keyed request.
//! - [`list`]: `GET /api/charges` and refund lists: Stripe's list shape,
//!   filters and keyset cursor pagination.
//! - [`provider`]: the [`provider::Gateway`] port to the payment provider and
//!   the three outcomes every provider answer is classified into.
//! - [`service`]: [`service::ChargeService`], the idempotency state machine
//!   (claim, replay, 409, 422, takeover, finish, 503, abandon), explained in
//!   `docs/architecture.md`.
//! - [`store`]: the [`store::Store`] port; its backends (SQLite,
//!   PostgreSQL, MySQL/MariaDB) are the `payments-store` crate. Time is the
//!   database's.
//! - [`events`]: the event each change writes in its own transaction (the
//!   outbox), its derived id, `GET /api/events`' query.
//! - [`webhook`]: the merchant's endpoints, delivery attempts, their
//!   backoff, and the [`webhook::WebhookSender`] port.
//! - [`inbox`]: provider webhooks in: each provider event applied once,
//!   from the provider's state of its charge re-read, never its snapshot.
//! - [`envelope`]: the JSON error envelope shared by stored and live answers.
#![forbid(unsafe_code)]

pub mod answers;
pub mod charge;
pub mod derive;
pub mod envelope;
pub mod events;
pub mod hold;
pub mod idempotency;
pub mod inbox;
pub mod limits;
pub mod list;
pub mod provider;
pub mod refund;
pub mod scope;
pub mod service;
pub mod store;
pub mod time;
pub mod webhook;
