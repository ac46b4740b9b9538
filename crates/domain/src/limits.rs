//! The per-customer rate of new operations (card testing: a script trying
//! stolen card tokens one after another under one account). Only requests
//! that would start a new operation count, and only they are refused: with
//! a limit set, the service first reads the key's record (no lock), and a
//! key that has one (a replay, a 409, a 422, a takeover) is answered as
//! always and uses none of the customer's budget. Two requests with one new
//! key sent at the same instant may both count; one of them gets the 409.
//! The adapter keeps its counts in memory, per process.

use std::time::Duration;

use crate::charge::CustomerId;

/// Counts answered 429s, by `route` (a metric name, with the others in
/// `payments_api::telemetry`).
pub const RATE_LIMITED_TOTAL: &str = "payments_rate_limited_total";

/// Admits a customer's new operations at its configured rate.
pub trait RateLimit: Send + Sync + std::fmt::Debug {
    /// Counts one operation; `Err` with how long until the next would be
    /// admitted when the customer is over its rate.
    fn admit(&self, customer: &CustomerId) -> Result<(), Duration>;
}
