//! Timestamps as the API prints them. Every stored time comes from the
//! database's clock, at millisecond precision, so what the API returns at
//! creation and what a later read returns (from any backend) are the same
//! bytes. The domain never reads the host's clock: `Utc::now` is forbidden
//! here by `clippy.toml`.

use chrono::{DateTime, SecondsFormat, Utc};

/// RFC 3339 with millisecond precision and a `Z` suffix, as the API prints it.
pub fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}
