//! The provider's own idempotency store, modelled on Stripe's: a key maps to
//! the fingerprint of the parameters it was first used with and either "in
//! flight" or the final response.
//!
//! Like Stripe, which saves the answer of every request whose processing
//! began, the answers stored are the final ones (success, decline,
//! validation error) and the injected 500 (`error_rate`): a retry with the
//! key gets the same 500 again, marked `Idempotent-Replayed: true`, for the
//! key's retention. A request that ends without an answer (a hang, a
//! cancelled task) drops its [`Claim`], which releases the key so a retry
//! is processed anew. What Stripe answers before its idempotency layer (an
//! invalid API key, 401; a rate limit, 429) never reaches the table.
//!
//! Like Stripe, the sandbox forgets a key once it is older than its key
//! retention (`key_retention_secs`, 24 h by default): a request with a
//! forgotten key is processed anew, and a charge is made again. Tests shorten
//! the retention to prove that the API never re-drives a key that old.
//! A key's age is wall-clock time (Unix milliseconds), so that it can be
//! kept in the ledger file and still age across a restart.
//!
//! With a ledger file, each answer stored is written to it (one line, under
//! the table's lock, so a key's lines are in order); keys in flight are
//! not: a restart ends their requests unanswered, which releases them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::journal::{Journal, Line};
use crate::ledger::unix_now_ms;
use crate::params::Fingerprint;
use crate::response::StoredResponse;

/// Stripe's limit on the length of an idempotency key.
pub(crate) const MAX_KEY_LEN: usize = 255;

/// An idempotency key as the provider scopes it: per API key, the way Stripe
/// scopes keys per account. The API key is kept as its SHA-256, so the
/// ledger file holds no API key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct ScopedKey {
    pub(crate) account: [u8; 32],
    pub(crate) key: String,
}

impl ScopedKey {
    pub(crate) fn new(api_key: &str, key: String) -> Self {
        Self {
            account: Sha256::digest(api_key.as_bytes()).into(),
            key,
        }
    }
}

/// What to do with a request that carries an idempotency key.
#[derive(Debug)]
pub(crate) enum Decision {
    /// First use (or a retry after an abandoned attempt): process it.
    Process(Claim),
    /// Completed before: send the stored answer again.
    Replay(StoredResponse),
    /// Another request with this key is being processed.
    InProgress,
    /// The key was first used with different parameters.
    Mismatch,
}

#[derive(Debug)]
pub(crate) struct Entry {
    fingerprint: Fingerprint,
    state: EntryState,
    /// When the key was first used (Unix milliseconds): it is forgotten
    /// `retention` later.
    first_used_ms: u64,
}

impl Entry {
    /// A completed key read back from the ledger file.
    pub(crate) fn completed(
        fingerprint: Fingerprint,
        first_used_ms: u64,
        response: StoredResponse,
    ) -> Self {
        Self {
            fingerprint,
            state: EntryState::Completed(response),
            first_used_ms,
        }
    }

    /// Its ledger file line; `None` while in flight.
    pub(crate) fn line<'a>(&'a self, key: &'a ScopedKey) -> Option<Line<'a>> {
        match &self.state {
            EntryState::InFlight { .. } => None,
            EntryState::Completed(response) => Some(Line::key(
                key,
                &self.fingerprint,
                self.first_used_ms,
                response,
            )),
        }
    }

    fn expired(&self, retention: Duration) -> bool {
        let age_ms = unix_now_ms().saturating_sub(self.first_used_ms);
        u128::from(age_ms) >= retention.as_millis()
    }
}

/// The keys read back from a ledger file, by scoped key.
pub(crate) type Entries = HashMap<ScopedKey, Entry>;

#[derive(Debug)]
enum EntryState {
    /// `claim` identifies the attempt, so a stale attempt (one that outlived
    /// a reset) can neither complete nor release someone else's entry.
    InFlight {
        claim: u64,
    },
    Completed(StoredResponse),
}

/// All keys. A std mutex: never held across an `.await`.
#[derive(Debug, Default)]
pub(crate) struct KeyTable {
    entries: Mutex<Entries>,
    next_claim: AtomicU64,
    /// The ledger file; `None`: in memory only.
    journal: Option<Arc<Journal>>,
}

impl KeyTable {
    /// The keys read back from a ledger file, which every answer stored is
    /// written to from now on.
    pub(crate) fn restored(entries: Entries, journal: Arc<Journal>) -> Self {
        Self {
            entries: Mutex::new(entries),
            next_claim: AtomicU64::default(),
            journal: Some(journal),
        }
    }

    /// Decides, atomically, what a request with `key` and `fingerprint` gets.
    /// The parameter check comes first, so a mismatch is reported even while
    /// the first request is still in flight. A key first used `retention` ago
    /// or earlier is forgotten: the request is processed as a new one.
    pub(crate) fn begin(
        self: &Arc<Self>,
        key: ScopedKey,
        fingerprint: Fingerprint,
        retention: Duration,
    ) -> Decision {
        let mut entries = self.lock();
        if entries
            .get(&key)
            .is_some_and(|entry| entry.expired(retention))
        {
            entries.remove(&key);
        }
        if let Some(entry) = entries.get(&key) {
            if entry.fingerprint != fingerprint {
                return Decision::Mismatch;
            }
            return match &entry.state {
                EntryState::InFlight { .. } => Decision::InProgress,
                EntryState::Completed(response) => Decision::Replay(response.clone()),
            };
        }
        let claim = self.next_claim.fetch_add(1, Ordering::Relaxed);
        entries.insert(
            key.clone(),
            Entry {
                fingerprint,
                state: EntryState::InFlight { claim },
                first_used_ms: unix_now_ms(),
            },
        );
        Decision::Process(Claim {
            table: Arc::clone(self),
            key,
            claim,
            completed: false,
        })
    }

    /// Runs `first` and, if it succeeds, forgets every key, with the table
    /// locked throughout (so no answer is stored in between). Attempts still
    /// in flight store nothing afterwards.
    pub(crate) fn clear_after<E>(&self, first: impl FnOnce() -> Result<(), E>) -> Result<(), E> {
        let mut entries = self.lock();
        first()?;
        entries.clear();
        Ok(())
    }

    fn lock(&self) -> MutexGuard<'_, Entries> {
        // Critical sections are single map operations; a poisoned map is
        // still consistent.
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `change` on the entry only if it is still this attempt's claim.
    fn with_own_entry(&self, key: &ScopedKey, claim: u64, change: impl FnOnce(&mut Entries)) {
        let mut entries = self.lock();
        let ours = matches!(
            entries.get(key),
            Some(Entry { state: EntryState::InFlight { claim: current }, .. }) if *current == claim
        );
        if ours {
            change(&mut entries);
        }
    }
}

/// The right to process a request under a key. Complete it with the final
/// answer; dropping it uncompleted releases the key.
#[derive(Debug)]
pub(crate) struct Claim {
    table: Arc<KeyTable>,
    key: ScopedKey,
    claim: u64,
    completed: bool,
}

impl Claim {
    /// The key's owner-visible name.
    pub(crate) fn key(&self) -> &str {
        &self.key.key
    }

    /// Stores the final answer for replay, and writes it to the ledger
    /// file. If the file refuses it, the answer is still replayed by this
    /// process, and the error logged: after a restart the key is new.
    pub(crate) fn complete(mut self, response: StoredResponse) {
        self.completed = true;
        let journal = self.table.journal.as_deref();
        self.table.with_own_entry(&self.key, self.claim, |entries| {
            if let Some(entry) = entries.get_mut(&self.key) {
                entry.state = EntryState::Completed(response);
                if let (Some(journal), Some(line)) = (journal, entry.line(&self.key))
                    && let Err(error) = journal.append(&line)
                {
                    tracing::error!(
                        %error,
                        key = %self.key.key,
                        "the answer stored under this idempotency key is not in the ledger \
                         file: after a restart the key is processed as new"
                    );
                }
            }
        });
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        if !self.completed {
            self.table.with_own_entry(&self.key, self.claim, |entries| {
                entries.remove(&self.key);
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use axum::http::StatusCode;

    use super::*;
    use crate::params::FormParams;

    fn key(name: &str) -> ScopedKey {
        ScopedKey::new("sk_test", name.into())
    }

    fn fingerprint(body: &str) -> Fingerprint {
        match FormParams::parse(body.as_bytes()) {
            Ok(params) => params.fingerprint("/v1/charges"),
            Err(error) => panic!("bad test body {body}: {error:?}"),
        }
    }

    const DAY: Duration = Duration::from_secs(86_400);

    fn ok() -> StoredResponse {
        StoredResponse::json(StatusCode::OK, &serde_json::json!({"id": "ch_1"}))
    }

    #[test]
    fn completed_key_replays_and_checks_parameters() {
        let table = Arc::new(KeyTable::default());
        let Decision::Process(claim) = table.begin(key("k"), fingerprint("amount=1"), DAY) else {
            panic!("first use must be processed");
        };
        assert!(matches!(
            table.begin(key("k"), fingerprint("amount=1"), DAY),
            Decision::InProgress
        ));
        assert!(matches!(
            table.begin(key("k"), fingerprint("amount=2"), DAY),
            Decision::Mismatch
        ));
        claim.complete(ok());
        assert!(matches!(
            table.begin(key("k"), fingerprint("amount=1"), DAY),
            Decision::Replay(response) if response == ok()
        ));
        assert!(matches!(
            table.begin(key("k"), fingerprint("amount=2"), DAY),
            Decision::Mismatch
        ));
    }

    #[test]
    fn dropped_claim_releases_the_key() {
        let table = Arc::new(KeyTable::default());
        let first = table.begin(key("k"), fingerprint("amount=1"), DAY);
        drop(first);
        assert!(matches!(
            table.begin(key("k"), fingerprint("amount=2"), DAY),
            Decision::Process(_)
        ));
    }

    #[test]
    fn stale_claim_does_not_touch_a_newer_one() {
        let table = Arc::new(KeyTable::default());
        let Decision::Process(stale) = table.begin(key("k"), fingerprint("amount=1"), DAY) else {
            panic!("first use must be processed");
        };
        assert!(table.clear_after(|| Ok::<(), ()>(())).is_ok());
        let Decision::Process(fresh) = table.begin(key("k"), fingerprint("amount=1"), DAY) else {
            panic!("a cleared key must be processed");
        };
        stale.complete(ok());
        assert!(matches!(
            table.begin(key("k"), fingerprint("amount=1"), DAY),
            Decision::InProgress
        ));
        drop(fresh);
        assert!(matches!(
            table.begin(key("k"), fingerprint("amount=1"), DAY),
            Decision::Process(_)
        ));
    }

    #[test]
    fn keys_older_than_the_retention_are_forgotten() {
        let table = Arc::new(KeyTable::default());
        let Decision::Process(claim) = table.begin(key("k"), fingerprint("amount=1"), DAY) else {
            panic!("first use must be processed");
        };
        claim.complete(ok());
        assert!(matches!(
            table.begin(key("k"), fingerprint("amount=1"), DAY),
            Decision::Replay(_)
        ));
        // Past the retention the key is new again, parameters and all.
        assert!(matches!(
            table.begin(key("k"), fingerprint("amount=2"), Duration::ZERO),
            Decision::Process(_)
        ));
    }

    #[test]
    fn keys_are_scoped_per_api_key() {
        let table = Arc::new(KeyTable::default());
        let _first = table.begin(key("k"), fingerprint("amount=1"), DAY);
        let other = ScopedKey::new("sk_other", "k".into());
        assert!(matches!(
            table.begin(other, fingerprint("amount=2"), DAY),
            Decision::Process(_)
        ));
    }
}
