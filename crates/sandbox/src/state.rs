//! The state every handler shares: the live fault-injection config, the
//! ledger and the idempotency keys.

use std::sync::{Arc, PoisonError, RwLock};

use crate::access::RequestLog;
use crate::config::SandboxConfig;
use crate::idempotency::KeyTable;
use crate::ledger::Ledger;

/// Cheap to clone: every field is shared.
#[derive(Debug, Clone)]
pub(crate) struct AppState {
    // A std lock: read once per request, never held across an `.await`.
    config: Arc<RwLock<SandboxConfig>>,
    pub(crate) ledger: Arc<Ledger>,
    pub(crate) keys: Arc<KeyTable>,
    /// The last `/v1` requests, for `GET /_sandbox/requests`.
    pub(crate) requests: Arc<RequestLog>,
}

impl AppState {
    /// `config` must already be valid.
    pub(crate) fn new(config: SandboxConfig) -> Self {
        Self {
            config: Arc::new(RwLock::new(config)),
            ledger: Arc::default(),
            keys: Arc::default(),
            requests: Arc::default(),
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

    /// Forgets charges, refunds, keys, counters and the request log; keeps
    /// the config.
    pub(crate) fn reset(&self) {
        self.keys.clear();
        self.requests.clear();
        self.ledger.reset();
    }
}
