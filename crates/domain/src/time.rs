//! Timestamps. Every instant the domain stores is truncated to milliseconds,
//! so what the API returns at creation and what a later read returns (from
//! any backend) are the same bytes.

use chrono::{DateTime, SecondsFormat, SubsecRound, Utc};

/// The current time, truncated to milliseconds.
pub fn now() -> DateTime<Utc> {
    Utc::now().trunc_subsecs(3)
}

/// `now + d`, saturating instead of overflowing on absurd durations.
pub fn after(now: DateTime<Utc>, d: std::time::Duration) -> DateTime<Utc> {
    chrono::Duration::from_std(d)
        .ok()
        .and_then(|d| now.checked_add_signed(d))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// RFC 3339 with millisecond precision and a `Z` suffix, as the API prints it.
pub fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}
