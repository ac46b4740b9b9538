//! The state every handler shares: the live fault-injection config, the
//! ledger and the idempotency keys (and the ledger file both write to),
//! and the webhooks' events and deliveries.

use std::sync::{Arc, PoisonError, RwLock};

use crate::access::RequestLog;
use crate::config::SandboxConfig;
use crate::idempotency::KeyTable;
use crate::journal::{Journal, JournalError, LedgerFile};
use crate::ledger::Ledger;
use crate::webhooks::Webhooks;

/// Cheap to clone: every field is shared.
#[derive(Debug, Clone)]
pub(crate) struct AppState {
    // A std lock: read once per request, never held across an `.await`.
    config: Arc<RwLock<SandboxConfig>>,
    pub(crate) ledger: Arc<Ledger>,
    pub(crate) keys: Arc<KeyTable>,
    /// The last `/v1` requests, for `GET /_sandbox/requests`.
    pub(crate) requests: Arc<RequestLog>,
    /// The events made and their deliveries (in memory only).
    pub(crate) webhooks: Arc<Webhooks>,
    /// The ledger file, if any.
    journal: Option<Arc<Journal>>,
}

impl AppState {
    /// `config` must already be valid.
    pub(crate) fn new(config: SandboxConfig) -> Self {
        let config = Arc::new(RwLock::new(config));
        Self {
            webhooks: Arc::new(Webhooks::new(Arc::clone(&config))),
            config,
            ledger: Arc::default(),
            keys: Arc::default(),
            requests: Arc::default(),
            journal: None,
        }
    }

    /// The ledger and keys read back from `file`, which every change is
    /// written to from now on. `config` must already be valid.
    pub(crate) fn with_ledger(config: SandboxConfig, file: LedgerFile) -> Self {
        let LedgerFile {
            journal,
            books,
            keys,
        } = file;
        let config = Arc::new(RwLock::new(config));
        Self {
            webhooks: Arc::new(Webhooks::new(Arc::clone(&config))),
            config,
            ledger: Arc::new(Ledger::restored(books, Arc::clone(&journal))),
            keys: Arc::new(KeyTable::restored(keys, Arc::clone(&journal))),
            requests: Arc::default(),
            journal: Some(journal),
        }
    }

    /// Stops the webhooks' deliveries, and flushes and releases the ledger
    /// file, if any: the server stopped.
    pub(crate) fn close(&self) {
        self.webhooks.shutdown();
        if let Some(journal) = &self.journal {
            journal.close();
        }
    }

    /// A snapshot; a request keeps the faults that were set when it arrived.
    pub(crate) fn config(&self) -> SandboxConfig {
        self.config
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Replaces the whole config; `config` must already be valid.
    pub(crate) fn set_config(&self, config: SandboxConfig) {
        *self.config.write().unwrap_or_else(PoisonError::into_inner) = config;
    }

    /// Forgets charges, refunds, captures, disputes, keys, counters, the
    /// request log and the webhooks' events (stopping their pending
    /// deliveries); keeps the config. With a ledger file, it is replaced by
    /// an empty one first (keys and books locked, so nothing is written in
    /// between); if that fails, nothing is forgotten.
    pub(crate) fn reset(&self) -> Result<(), JournalError> {
        self.keys.clear_after(|| self.ledger.reset())?;
        self.requests.clear();
        self.webhooks.reset();
        Ok(())
    }
}
