//! Provider webhooks in: each provider event applied once, from the
//! provider's state of its charge read again ([`crate::inbox`]).

use super::reads::no_such;
use super::*;
use crate::inbox::{self, Dispute, InboxState, Local, Plan, ProviderEvent, Recorded};
use crate::store::{Application, Applied};

/// Counts provider events by `outcome`: `applied`, `ignored`, `waiting`,
/// `needs_person`, `duplicate`, `unreadable` (the provider's charge could
/// not be read: answered 503, the provider delivers it again) and
/// `rejected` (a bad signature or body, counted by the API).
pub const PROVIDER_EVENTS_TOTAL: &str = "payments_provider_events_total";
/// Provider events recorded `waiting` or `needs_person` (a gauge, set by
/// `payments-jobs`).
pub const PROVIDER_EVENTS_OPEN: &str = "payments_provider_events_open";

/// How often an application is planned again when the local state moved
/// under it (another event about the same charge applied meanwhile).
const APPLY_ATTEMPTS: usize = 8;

/// What became of a delivered provider event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Received {
    /// Recorded now, in this state.
    Recorded(InboxState),
    /// Recorded before: nothing was done.
    Duplicate,
}

impl Received {
    /// Its `outcome` label.
    pub fn label(self) -> &'static str {
        match self {
            Self::Recorded(state) => state.as_str(),
            Self::Duplicate => "duplicate",
        }
    }
}

/// Why a provider event was not recorded: answered 503, so the provider
/// delivers it again.
#[derive(Debug, thiserror::Error)]
pub enum InboxError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The provider's charge could not be read.
    #[error("the provider's charge could not be read: {0}")]
    Provider(String),
    /// Other applications about the same charge kept moving its state.
    #[error("the charge kept changing under {APPLY_ATTEMPTS} attempts to apply the event")]
    Contended,
}

/// What a pass over waiting provider events did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WaitingReport {
    pub tried: u64,
    /// No longer waiting (applied, or left for a person).
    pub done: u64,
    pub failed: u64,
}

impl ChargeService {
    /// Applies a verified provider event once: a duplicate changes
    /// nothing; otherwise the charge it is about is read from the provider
    /// and the local state brought to it, with the event's record, in one
    /// transaction.
    pub async fn receive_provider_event(
        &self,
        event: &ProviderEvent,
    ) -> Result<Received, InboxError> {
        let received = self.receive(event).await;
        let outcome = match &received {
            Ok(received) => received.label(),
            Err(InboxError::Store(_)) => "store_error",
            Err(_) => "unreadable",
        };
        metrics::counter!(PROVIDER_EVENTS_TOTAL, "outcome" => outcome).increment(1);
        let (id, kind) = (event.id.as_str(), event.event_type.as_str());
        match &received {
            Ok(Received::Recorded(InboxState::NeedsPerson)) => tracing::error!(
                provider_event = id,
                r#type = kind,
                "NEEDS A PERSON: a provider event was applied as far as it could be \
                 (its provider_events row says what is left: docs/operations.md)"
            ),
            Ok(Received::Recorded(InboxState::Waiting)) => tracing::warn!(
                provider_event = id,
                r#type = kind,
                "provider event waiting: it names an operation of ours with no row yet; \
                 the jobs runner applies it again"
            ),
            Ok(received) => tracing::info!(
                provider_event = id,
                r#type = kind,
                outcome = received.label(),
                "provider event"
            ),
            Err(error) => tracing::warn!(
                provider_event = id,
                r#type = kind,
                %error,
                "provider event not applied; answered 503 so the provider delivers it again"
            ),
        }
        received
    }

    async fn receive(&self, event: &ProviderEvent) -> Result<Received, InboxError> {
        let seen = self.store.provider_event(&event.id).await?;
        if seen.is_some_and(|state| !state.is_open()) {
            return Ok(Received::Duplicate);
        }
        let record = |state: InboxState, detail: String| Recorded {
            event_id: event.id.clone(),
            event_type: event.event_type.clone(),
            gateway_charge_id: event.charge.clone(),
            state,
            detail: Some(detail),
        };
        let ignored = |detail: String| record(InboxState::Ignored, detail);
        let Some(charge) = event.charge.as_deref().filter(|_| event.is_handled()) else {
            let detail = "a type or an object this server does not apply".to_owned();
            return self.record_only(ignored(detail)).await;
        };
        let provider = self
            .gateway
            .provider_charge(charge)
            .await
            .map_err(InboxError::Provider)?;
        let Some(provider) = provider else {
            let detail = format!("the provider does not know the charge {charge}");
            return self.record_only(ignored(detail)).await;
        };
        let Some(ours) = provider.operation_id.clone() else {
            let detail =
                format!("the provider's charge {charge} is none of ours (no payments_charge_id)");
            return self.record_only(ignored(detail)).await;
        };
        for _ in 0..APPLY_ATTEMPTS {
            let Some(local) = self.store.inbox_local(&ours).await? else {
                let detail = format!("waiting: our charge {ours} has no row here yet");
                return self.record_only(record(InboxState::Waiting, detail)).await;
            };
            let mut plan = inbox::plan(&local, &provider);
            self.settlements(&local, &provider.id, &mut plan).await;
            let state = plan.state();
            let application = Application {
                record: Recorded {
                    state,
                    detail: plan.detail(),
                    ..record(state, String::new())
                },
                changes: plan.changes,
                keep_for: self.policy.ttl,
            };
            match self.store.apply_provider_event(&application).await? {
                Applied::Applied => return Ok(Received::Recorded(state)),
                Applied::Duplicate => return Ok(Received::Duplicate),
                Applied::Stale => continue,
            }
        }
        Err(InboxError::Contended)
    }

    /// Records an event that changes nothing.
    async fn record_only(&self, record: Recorded) -> Result<Received, InboxError> {
        let state = record.state;
        let application = Application {
            record,
            changes: Vec::new(),
            keep_for: self.policy.ttl,
        };
        Ok(match self.store.apply_provider_event(&application).await? {
            Applied::Duplicate => Received::Duplicate,
            _ => Received::Recorded(state),
        })
    }

    /// The settlements a plan asks for, read from the provider as
    /// reconciliation reads them (by the provider's ids, which the webhook
    /// gave): first in the plan, so a charge is settled before what
    /// follows from it. Nothing is concluded from a provider that does
    /// not show an operation: reconciliation stays the safety net.
    async fn settlements(&self, local: &Local, provider_charge: &str, plan: &mut Plan) {
        let mut settled = Vec::new();
        if plan.settle_charge {
            let expected = Expected::of_charge(&local.charge);
            let lookup = self
                .gateway
                .retrieve_charge(provider_charge, &expected)
                .await;
            let operation = self.with_hold_expiry(Operation::Charge(local.charge.clone()));
            settled.extend(self.settled(&operation, lookup, plan));
        }
        for (refund, provider_id) in std::mem::take(&mut plan.to_settle) {
            let lookup = self
                .gateway
                .retrieve_refund(&provider_id, &Expected::of_refund(&refund))
                .await;
            settled.extend(self.settled(&Operation::Refund(refund), lookup, plan));
        }
        settled.append(&mut plan.changes);
        plan.changes = settled;
    }

    /// The settlement of `operation` by what the provider showed, if final.
    fn settled(
        &self,
        operation: &Operation,
        lookup: Lookup,
        plan: &mut Plan,
    ) -> Option<inbox::Change> {
        match lookup {
            Lookup::Found(ProviderOutcome::Pending { .. }) | Lookup::NotFound => None,
            Lookup::Found(found) => match settle(operation, found) {
                Ok((outcome, answer)) => {
                    let event = NewEvent::answered(operation, &outcome, &answer);
                    Some(inbox::Change::Settle {
                        outcome,
                        answer,
                        event,
                    })
                }
                Err((_, reason)) => {
                    plan.for_person.push(format!(
                        "{} {} does not match the provider's: {reason}",
                        operation.label(),
                        operation.id()
                    ));
                    None
                }
            },
            Lookup::Unknown { reason } => {
                tracing::warn!(
                    operation = operation.id(),
                    %reason,
                    "a provider event's operation could not be settled from the provider; \
                     reconciliation will"
                );
                None
            }
        }
    }

    /// Applies again at most `limit` open provider events (recorded
    /// `waiting` or `needs_person`; least recently tried first): those
    /// whose operation has its row now, or whose conflict is gone (a
    /// refund in flight settled), are applied.
    pub async fn apply_waiting(&self, limit: u32) -> Result<WaitingReport, StoreError> {
        let mut report = WaitingReport::default();
        for recorded in self.store.open_provider_events(limit).await? {
            report.tried += 1;
            let event = ProviderEvent {
                id: recorded.event_id,
                event_type: recorded.event_type,
                charge: recorded.gateway_charge_id,
            };
            match self.receive_provider_event(&event).await {
                Ok(Received::Recorded(state)) if state.is_open() => {}
                Ok(_) => report.done += 1,
                Err(InboxError::Store(e)) => return Err(e),
                Err(_) => report.failed += 1,
            }
        }
        let open = self.store.count_provider_events().await?;
        for state in [InboxState::Waiting, InboxState::NeedsPerson] {
            let n = open
                .iter()
                .find(|(s, _)| *s == state)
                .map_or(0, |(_, n)| *n);
            metrics::gauge!(PROVIDER_EVENTS_OPEN, "state" => state.as_str()).set(n as f64);
        }
        Ok(report)
    }

    /// `GET /api/disputes`: a page of disputes, open ones unless
    /// `status=all` (`disputes:read`).
    pub async fn list_disputes(
        &self,
        actor: &Actor,
        query: &[(String, String)],
    ) -> Result<List<Dispute>, ChargeError> {
        actor.may_read_disputes()?;
        let mut open_only = true;
        let page = list::parse_page_with(query, |name, value| {
            if name != "status" {
                return Ok(false);
            }
            open_only = match value {
                "open" => true,
                "all" => false,
                _ => {
                    return Err(InvalidRequest::param(
                        "status",
                        "status must be open (the default) or all",
                    ));
                }
            };
            Ok(true)
        })?;
        if let Some(cursor) = &page.cursor
            && self.store.dispute(cursor.id()).await?.is_none()
        {
            return Err(no_such(cursor, "dispute").into());
        }
        let rows = self.store.list_disputes(&page, open_only).await?;
        Ok(List::from_rows(rows, &page, "/api/disputes".to_owned()))
    }

    /// A charge's disputes, oldest first (what `GET /api/charges/{id}`
    /// shows of them).
    pub async fn disputes_of(&self, charge: &Charge) -> Result<Vec<Dispute>, StoreError> {
        self.store.disputes_of(&charge.id).await
    }
}
