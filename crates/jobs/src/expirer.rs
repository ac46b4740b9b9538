//! The expirer: marks holds whose `capture_before` has passed `expired`
//! (by the database's clock, never this host's), in bounded batches, each
//! its own short statement. A hold a capture or cancel has taken is left
//! to that operation's outcome. It then sets the holds gauge.
//!
//! Marking is bookkeeping: whether a capture may still be sent is decided
//! by the capture's own claim against `capture_before` and
//! `HOLD_CAPTURE_MARGIN`, so a hold is never captured late for want of a
//! pass.

use std::sync::Arc;

use payments_domain::charge::ChargeStatus;
use payments_domain::service::HOLDS;
use payments_domain::store::{Store, StoreError};

/// Holds marked expired (a metric name, defined with the others in
/// `payments_app::telemetry`).
pub use payments_app::telemetry::EXPIRED_HOLDS_TOTAL;

/// Holds marked per statement.
const BATCH: u32 = 1000;

/// What one expirer pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ExpireReport {
    /// Holds marked `expired` by this pass.
    pub expired: u64,
    /// Holds by status after it.
    pub holds: Vec<(ChargeStatus, u64)>,
}

/// Marks lapsed holds expired.
#[derive(Debug, Clone)]
pub struct Expirer {
    store: Arc<dyn Store>,
}

impl Expirer {
    pub fn new(store: Arc<dyn Store>) -> Self {
        Self { store }
    }

    /// Marks every lapsed hold, a batch at a time, then counts the holds.
    pub async fn try_run_once(&self) -> Result<ExpireReport, StoreError> {
        let mut report = ExpireReport::default();
        loop {
            let marked = self.store.expire_holds(BATCH).await?;
            metrics::counter!(EXPIRED_HOLDS_TOTAL).increment(marked);
            report.expired += marked;
            if marked < u64::from(BATCH) {
                break;
            }
            tokio::task::yield_now().await;
        }
        report.holds = self.dry_run().await?;
        if report.expired > 0 {
            tracing::info!(
                expired = report.expired,
                "holds lapsed uncaptured; marked expired"
            );
        }
        Ok(report)
    }

    /// Holds by status, changing nothing; sets the gauge.
    pub async fn dry_run(&self) -> Result<Vec<(ChargeStatus, u64)>, StoreError> {
        let holds = self.store.count_holds().await?;
        for status in [
            ChargeStatus::RequiresCapture,
            ChargeStatus::Succeeded,
            ChargeStatus::Canceled,
            ChargeStatus::Expired,
        ] {
            let n: u64 = holds
                .iter()
                .filter(|(s, _)| *s == status)
                .map(|(_, n)| n)
                .sum();
            metrics::gauge!(HOLDS, "status" => status.as_str()).set(n as f64);
        }
        tracing::debug!(?holds, "holds by status");
        Ok(holds)
    }
}
