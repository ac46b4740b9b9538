//! The replay cache behind the domain's [`AnswerCache`] port: `moka`,
//! bounded by bytes (each copy weighs what it holds: key, route, owner,
//! fingerprint, response), each entry expiring after its own lifetime
//! ([`payments_domain::answers::lifetime`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use moka::Expiry;
use moka::sync::Cache;
use payments_domain::answers::AnswerCache;
use payments_domain::idempotency::IdempotencyRecord;

/// What an entry weighs beyond its strings: the record's other fields and
/// the cache's own bookkeeping, roughly.
const ENTRY_OVERHEAD: usize = 256;

#[derive(Clone)]
struct Entry {
    record: Arc<IdempotencyRecord>,
    lifetime: Duration,
}

/// Each entry expires after the lifetime it was inserted with.
struct OwnLifetime;

impl Expiry<String, Entry> for OwnLifetime {
    fn expire_after_create(&self, _: &String, entry: &Entry, _: Instant) -> Option<Duration> {
        Some(entry.lifetime)
    }
}

/// Copies of complete records in memory, at most `bytes` of them.
pub struct MokaAnswers {
    cache: Cache<String, Entry>,
}

impl std::fmt::Debug for MokaAnswers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MokaAnswers")
            .field("entries", &self.cache.entry_count())
            .field("bytes", &self.cache.weighted_size())
            .finish()
    }
}

impl MokaAnswers {
    pub fn new(bytes: u64) -> Self {
        let cache = Cache::builder()
            .max_capacity(bytes)
            .weigher(|key: &String, entry: &Entry| {
                let r = &entry.record;
                let response = r.response.as_ref().map_or(0, |s| {
                    s.body.len() + s.content_type.len() + s.location.as_ref().map_or(0, String::len)
                });
                let bytes = key.len()
                    + r.key.len()
                    + r.route.len()
                    + r.customer_id.len()
                    + r.request_hash.len()
                    + r.charge_id.len()
                    + response
                    + ENTRY_OVERHEAD;
                u32::try_from(bytes).unwrap_or(u32::MAX)
            })
            .expire_after(OwnLifetime)
            .build();
        Self { cache }
    }
}

/// One string per (key, route): a key may hold any byte but NUL.
fn slot(key: &str, route: &str) -> String {
    let mut slot = String::with_capacity(route.len() + 1 + key.len());
    slot.push_str(route);
    slot.push('\0');
    slot.push_str(key);
    slot
}

impl AnswerCache for MokaAnswers {
    fn get(&self, key: &str, route: &str) -> Option<Arc<IdempotencyRecord>> {
        self.cache.get(&slot(key, route)).map(|entry| entry.record)
    }

    fn insert(&self, record: Arc<IdempotencyRecord>, lifetime: Duration) {
        let slot = slot(&record.key, &record.route);
        self.cache.insert(slot, Entry { record, lifetime });
    }
}
