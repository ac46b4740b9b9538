//! The per-customer rate of new operations (card testing: a script trying
//! stolen card tokens one after another under one account). Only new
//! operations count, and only they are refused: the budget is taken by the
//! attempt whose claim created the key's record, after the claim, so one
//! operation costs one unit however many attempts race for its key. The
//! others found the record and are answered from it (a replay, a 409, a
//! 422, a takeover), using none of the budget. A claim over the rate is
//! undone under its lease before the provider is called, and answered 429.
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
