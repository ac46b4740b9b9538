//! Completed answers kept in memory, so that a replay costs no database
//! round trip (the port; `payments-app` supplies a bounded cache).
//!
//! A complete record never changes until it expires: a copy of it answers
//! a retry exactly as the database would, as long as the copy never
//! outlives the record. Its lifetime is therefore the record's remaining
//! TTL as the database computed it when the record was read
//! ([`IdempotencyRecord::ttl_left`]), minus [`MARGIN`], counted on this
//! host's monotonic clock from before the query was sent: the one place a
//! host clock bounds such a decision, and only by a duration the database
//! measured. After that the key may have been reclaimed, on any replica.
//! Only `complete` records are kept: an abandoned answer can still be
//! replaced by reconciliation, and an in-progress one is not an answer.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::idempotency::{IdempotencyRecord, RecordState};

/// How long before its record expires a copy is dropped.
pub const MARGIN: Duration = Duration::from_secs(60);

/// Copies of complete records by (key, route).
pub trait AnswerCache: Send + Sync + std::fmt::Debug {
    /// The copy held for (key, route), if any.
    fn get(&self, key: &str, route: &str) -> Option<Arc<IdempotencyRecord>>;
    /// Holds `record` for at most `lifetime`.
    fn insert(&self, record: Arc<IdempotencyRecord>, lifetime: Duration);
}

/// How long a copy of `record`, read by a query sent at `sent`, may be
/// kept; `None` when it must not be kept at all.
pub fn lifetime(record: &IdempotencyRecord, sent: Instant) -> Option<Duration> {
    if record.state != RecordState::Complete || record.response.is_none() || record.expired {
        return None;
    }
    record
        .ttl_left
        .checked_sub(MARGIN)?
        .checked_sub(sent.elapsed())
        .filter(|left| !left.is_zero())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::idempotency::{RecordId, StoredResponse};

    fn record(state: RecordState, ttl_left: Duration) -> IdempotencyRecord {
        let now = chrono::DateTime::UNIX_EPOCH;
        IdempotencyRecord {
            id: RecordId(1),
            key: "k".to_owned(),
            route: "POST /api/charges".to_owned(),
            customer_id: "cus_1".to_owned(),
            request_hash: "h".to_owned(),
            state,
            lease: None,
            charge_id: "ch_1".to_owned(),
            refund_id: None,
            response: Some(StoredResponse {
                status: 201,
                body: "{}".to_owned(),
                content_type: "application/json".to_owned(),
                location: None,
            }),
            created_at: now,
            completed_at: Some(now),
            expires_at: now,
            lease_live: false,
            expired: false,
            age: Duration::ZERO,
            ttl_left,
        }
    }

    #[test]
    fn a_copy_lives_the_records_ttl_less_the_margin_and_the_time_since_the_query() {
        let hour = Duration::from_secs(3600);
        let sent = Instant::now();
        let kept = lifetime(&record(RecordState::Complete, hour), sent).expect("kept");
        assert!(kept <= hour - MARGIN, "{kept:?}");
        assert!(kept > hour - MARGIN - Duration::from_secs(5), "{kept:?}");
        let later = Instant::now() - Duration::from_secs(10);
        let kept = lifetime(&record(RecordState::Complete, hour), later).expect("kept");
        assert!(kept <= hour - MARGIN - Duration::from_secs(10), "{kept:?}");
    }

    #[test]
    fn no_copy_of_what_may_change_or_is_about_to_expire() {
        let sent = Instant::now();
        let hour = Duration::from_secs(3600);
        for state in [RecordState::InProgress, RecordState::Abandoned] {
            assert_eq!(lifetime(&record(state, hour), sent), None, "{state:?}");
        }
        assert_eq!(lifetime(&record(RecordState::Complete, MARGIN), sent), None);
        let mut expired = record(RecordState::Complete, hour);
        expired.expired = true;
        assert_eq!(lifetime(&expired, sent), None);
        let mut unanswered = record(RecordState::Complete, hour);
        unanswered.response = None;
        assert_eq!(lifetime(&unanswered, sent), None);
    }
}
