//! What can go wrong, split by what the caller should do next.

use std::time::Duration;

use crate::key::{IdempotencyKey, InvalidKey};
use crate::model::ApiError;

/// A call that ended without a charge or a decline.
///
/// The variants that leave the outcome open ([`ClientError::GaveUp`],
/// [`ClientError::Abandoned`]) carry the key: retry *that key* later (with
/// [`crate::Client::charge_with_key`]) or look the charge up; never start a
/// new operation with a new key for the same payment.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// A final refusal (400, 401, 404, 413, 415, 422, ...): nothing was
    /// charged. Validation failures are never stored, so the same key may
    /// be retried once the request is fixed; a 422 `idempotency_key_reused`
    /// means this key already belongs to another request.
    #[error("the server refused the charge ({status} {}): {}", .error.code, .error.message)]
    Rejected {
        status: u16,
        error: Box<ApiError>,
        /// The operation's key (`None` for `get_charge`).
        key: Option<IdempotencyKey>,
        attempts: u32,
    },

    /// 500 `request_abandoned`: the server gave up on the provider and marked
    /// the charge for reconciliation. Retrying replays this same answer; a
    /// new key could charge the card a second time.
    #[error(
        "the server abandoned idempotency key {key} ({}): the charge's outcome is unknown and \
         is being reconciled; do not charge again with a new key",
        .error.message
    )]
    Abandoned {
        error: Box<ApiError>,
        key: IdempotencyKey,
        attempts: u32,
    },

    /// No final answer within the attempts or the deadline. The charge may
    /// or may not have happened (or may be happening right now).
    #[error(
        "no final answer after {attempts} attempt(s) in {elapsed:?} (last: {last}); the charge \
         may or may not have happened: retry later with the same idempotency key {key}"
    )]
    GaveUp {
        key: IdempotencyKey,
        attempts: u32,
        elapsed: Duration,
        /// What the last attempt saw.
        last: String,
    },

    /// An answer outside the contract (a 201 whose body is not a charge, a
    /// 3xx, ...). For a 2xx the charge may well have happened: the same key
    /// replays it.
    #[error("unexpected answer {status}: {detail}")]
    Unexpected {
        status: u16,
        detail: String,
        key: Option<IdempotencyKey>,
        attempts: u32,
    },

    #[error(transparent)]
    InvalidKey(#[from] InvalidKey),

    #[error("invalid base URL {url:?}: {reason}")]
    InvalidBaseUrl { url: String, reason: String },

    #[error("could not set up the HTTP client: {0}")]
    Setup(#[source] reqwest::Error),

    #[error("could not encode the request: {0}")]
    Encode(#[from] serde_json::Error),

    /// A single request (`get_charge`) that failed in transit.
    #[error("request failed: {0}")]
    Transport(#[source] reqwest::Error),
}

impl ClientError {
    /// The operation's key, when the error belongs to one.
    pub fn key(&self) -> Option<&IdempotencyKey> {
        match self {
            Self::Abandoned { key, .. } | Self::GaveUp { key, .. } => Some(key),
            Self::Rejected { key, .. } | Self::Unexpected { key, .. } => key.as_ref(),
            _ => None,
        }
    }

    /// True when the money may have moved and nobody knows yet: keep the
    /// key, retry it later or reconcile; never charge again under a new key.
    pub fn outcome_unknown(&self) -> bool {
        matches!(self, Self::GaveUp { .. } | Self::Abandoned { .. })
            || matches!(self, Self::Unexpected { status, .. } if (200..300).contains(status))
    }
}

/// An error and its causes on one line (reqwest's own message is terse).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut chain = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        chain.push_str(": ");
        chain.push_str(&cause.to_string());
        source = cause.source();
    }
    chain
}
