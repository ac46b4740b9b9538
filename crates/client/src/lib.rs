//! # payments-client
//!
//! A typed async client for the payments API with the correct retry loop.
//! `payments-smoke` (which proves from the outside that a deployed server
//! takes money exactly once) and `payments-load` are built on it, in the
//! `payments-loadtest` crate.
//!
//! ## ONE KEY PER OPERATION, NEVER ONE PER ATTEMPT
//!
//! **Generate the `Idempotency-Key` once, before the first attempt, and send
//! that same key on every retry of that payment.** A retry loop that makes a
//! fresh key per attempt reproduces the double charge this API was built to
//! stop: a mobile client with a 15 s timeout, a provider that took 18 s, a
//! retry under a new key, and the server, seeing a new operation, charged
//! again. Fourteen customers paid twice in one afternoon, each pair 15 to 17
//! seconds apart.
//!
//! A timeout tells the client nothing about the server: the request may never
//! have arrived, may have finished with its answer lost, or may still be
//! running. Only the same key lets the server tell "my retry" from "a second
//! payment"; with it, the retry gets `409 request_in_progress` (wait, retry
//! the same key) or the stored answer (`Idempotent-Replay: true`), never a
//! second charge. A customer who really buys twice is a new operation with a
//! new key.
//!
//! ```no_run
//! # async fn example() -> Result<(), payments_client::ClientError> {
//! use payments_client::{Answer, ChargeRequest, Client};
//!
//! let client = Client::new("https://payments.example.com", "<bearer JWT>")?;
//! let request = ChargeRequest::new(4900, "GBP", "tok_visa");
//! // One call = one operation = one key, however many attempts it takes.
//! let outcome = client.charge(&request).await?;
//! match outcome.answer {
//!     Answer::Done(charge) => println!("charged {} in {} attempt(s)", charge.id, outcome.attempts),
//!     Answer::Declined(decline) => println!("declined: {:?}", decline.decline_code),
//! }
//! # Ok(())
//! # }
//! ```
//!
//! To survive a restart of the caller (an app killed mid-checkout), generate
//! the key with [`IdempotencyKey::generate`], persist it with the order, and
//! call [`Client::charge_with_key`] with it after the restart.
//!
//! ## Layout
//! - [`client`]: [`Client`], its builder, and the retry loop: an internal
//!   `Operation` holds the key and the body bytes and builds every attempt.
//! - [`retry`]: [`RetryPolicy`], capped exponential backoff with full jitter
//!   that never waits less than the server's `Retry-After`.
//! - [`key`]: [`IdempotencyKey`], checked against the server's rules once.
//! - [`model`]: the wire types ([`ChargeRequest`], [`Charge`],
//!   [`RefundRequest`], [`Refund`], [`List`], [`ApiError`]).
//! - [`error`]: [`ClientError`], split by what the caller should do next.
//! - [`webhook`]: the `Payments-Signature` scheme of webhook deliveries:
//!   [`webhook::sign`] for the server, [`webhook::verify`] for a receiver.
//!
//! Tools that judge every single attempt themselves (the smoke checks, the
//! load generator) build it with [`Client::post_charge`] and read it with
//! [`client::exchange`]; a service calls [`Client::charge`].
#![forbid(unsafe_code)]

// README.md's examples are compiled by `cargo test --doc` (which `make test`
// runs), so the README cannot drift from the API again.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

pub mod client;
pub mod error;
pub mod key;
pub mod model;
pub mod retry;
pub mod webhook;

pub use client::{Answer, ChargeOutcome, Client, ClientBuilder, Outcome, RefundOutcome};
pub use error::ClientError;
pub use key::{IdempotencyKey, InvalidKey};
pub use model::{
    ApiError, CaptureRequest, Charge, ChargeQuery, ChargeRequest, ChargeStatus, List, Refund,
    RefundRequest,
};
pub use retry::RetryPolicy;
