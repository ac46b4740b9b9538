//! The idempotency state machine (`docs/design-decisions.md` gives the why).
//!
//! 1. Claim: the record and a pending charge in one transaction; the unique
//!    index on (key, route) decides who is first.
//! 2. Existing key: other owner or body -> 422; complete -> replay; live
//!    lease -> 409; expired lease -> take over (compare-and-set) and re-drive.
//! 3. Provider call with no transaction or pooled connection held, under the
//!    provider key stored on the charge.
//! 4. Finish: charge and record in one transaction, guarded by the lease
//!    token; a loser answers with the stored response only while the record
//!    still holds its own charge, and otherwise settles its own charge row
//!    and answers 409.
//! 5. Unknown outcome: release the lease, answer 503, keep the key recoverable.
//!
//! A record claimed longer ago than the provider's key retention minus a
//! margin is never re-driven: the provider may have forgotten its key, and
//! a re-drive would be a second, real charge. It is abandoned without a
//! provider call. Every such age, lease and expiry is the database's.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::charge::{Charge, ChargeRequest, ChargeStatus, CustomerId, InvalidRequest};
use crate::envelope::ErrorEnvelope;
use crate::idempotency::{
    CHARGES_ROUTE, IdempotencyKey, IdempotencyRecord, JSON, LeaseToken, RecordId, RecordState,
    RequestFingerprint, StoredResponse,
};
use crate::provider::{Gateway, ProviderChargeRequest, ProviderOutcome};
use crate::store::{
    ChargeOutcome, Claim, ClaimAge, ClaimOutcome, Finish, FinishOutcome, NewLease, Store,
    StoreError,
};

/// Counts the expired leases taken over to re-drive a charge (a metric name,
/// with the others in `payments_api::telemetry`).
pub const LEASE_TAKEOVERS_TOTAL: &str = "payments_lease_takeovers_total";
/// Counts the abandoned records, by `reason`: `key_retention` here, `reaper`
/// in `payments-jobs`.
pub const ABANDONED_TOTAL: &str = "payments_abandoned_total";

/// Seconds a client should wait before retrying a 409 or 503.
pub const RETRY_AFTER_SECS: u64 = 2;

/// The numbers the state machine runs on.
#[derive(Debug, Clone)]
pub struct Policy {
    /// How long a claimer owns an in-progress request. Must outlast the
    /// provider timeout, or a live call could be taken over and re-driven.
    pub lease: Duration,
    /// How long a key is remembered (24 h).
    pub ttl: Duration,
    /// The largest amount accepted, in minor units.
    pub max_amount_cents: i64,
    /// The provider's key retention minus the margin: a record claimed
    /// longer ago than this is never re-driven, only abandoned.
    pub redrive_limit: Duration,
}

/// Why a charge request got no stored answer. None of these is stored: the
/// client may fix the request or wait, and retry with the same key.
#[derive(Debug, thiserror::Error)]
pub enum ChargeError {
    #[error(transparent)]
    Invalid(#[from] InvalidRequest),
    /// Same key with another body, or a key first used by another customer.
    #[error("this idempotency key was already used with a different request")]
    KeyReused,
    /// The first attempt still holds its lease.
    #[error("a request with this idempotency key is still in progress")]
    InProgress,
    /// The provider's outcome is unknown; the key stays claimed and the
    /// next retry (or the reaper) re-drives the same provider call.
    #[error("the payment provider's outcome is unknown: {0}")]
    ProviderUnavailable(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What a driver does with its lease when the provider's outcome is unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnUnknown {
    /// End the lease now, so the client's retry takes over at once (the API).
    ReleaseLease,
    /// Keep it until it expires, so the next pass retries (the reaper, which
    /// would otherwise take the same record straight back).
    KeepLease,
}

/// The code of the stored answer of an abandoned request.
pub const ABANDONED: &str = "request_abandoned";

/// A final answer: fresh, or replayed from the record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub response: StoredResponse,
    pub replayed: bool,
}

/// Charges, exactly once per (key, route).
#[derive(Debug, Clone)]
pub struct ChargeService {
    store: Arc<dyn Store>,
    gateway: Arc<dyn Gateway>,
    policy: Policy,
}

impl ChargeService {
    pub fn new(store: Arc<dyn Store>, gateway: Arc<dyn Gateway>, policy: Policy) -> Self {
        Self {
            store,
            gateway,
            policy,
        }
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// `POST /api/charges` with an idempotency key.
    // The key is on the caller's span (the API's request span); repeating it
    // here would print it twice on every line.
    #[tracing::instrument(skip_all, fields(customer = %customer))]
    pub async fn create_charge(
        &self,
        customer: &CustomerId,
        key: &IdempotencyKey,
        body: &Value,
    ) -> Result<Reply, ChargeError> {
        let request = ChargeRequest::from_json(body, self.policy.max_amount_cents)?;
        let fingerprint = RequestFingerprint::of(body);
        let claim = Claim {
            key: key.clone(),
            route: CHARGES_ROUTE,
            customer: customer.clone(),
            fingerprint,
            lease: NewLease::new(self.policy.lease),
            ttl: self.policy.ttl,
            charge: Charge::pending(customer, &request),
        };
        match self.store.claim(&claim).await? {
            ClaimOutcome::Claimed { record_id, charge } => {
                tracing::debug!(%record_id, charge_id = %charge.id, "claimed");
                self.drive(
                    record_id,
                    &claim.lease.token,
                    *charge,
                    OnUnknown::ReleaseLease,
                )
                .await
            }
            ClaimOutcome::Existing(record) => {
                self.resume(*record, customer, body, &fingerprint).await
            }
        }
    }

    /// The owner's charge, or `None` (also for another customer's charge).
    pub async fn charge_for(
        &self,
        customer: &CustomerId,
        charge_id: &str,
    ) -> Result<Option<Charge>, StoreError> {
        Ok(self
            .store
            .charge(charge_id)
            .await?
            .filter(|c| c.customer_id == customer.as_str()))
    }

    /// Step 2: someone already has this key.
    async fn resume(
        &self,
        record: IdempotencyRecord,
        customer: &CustomerId,
        body: &Value,
        fingerprint: &RequestFingerprint,
    ) -> Result<Reply, ChargeError> {
        // Records written before the fingerprint ignored null optional
        // fields hold the first version: a retry across the upgrade still
        // matches. Both are evaluated, in constant time.
        let current = record.matches(customer.as_str(), fingerprint);
        let first = record.matches(customer.as_str(), &RequestFingerprint::of_v1(body));
        if !(current | first) {
            tracing::info!(
                record_id = %record.id,
                "key reused with another body or customer"
            );
            return Err(ChargeError::KeyReused);
        }
        match (record.state, &record.response) {
            (state, Some(response)) if state.is_answered() => {
                tracing::debug!(record_id = %record.id, status = response.status, "replay");
                Ok(Reply {
                    response: response.clone(),
                    replayed: true,
                })
            }
            (state, _) if state.is_answered() => Err(StoreError::Invariant(format!(
                "answered record {} has no stored response",
                record.id
            ))
            .into()),
            _ if record.lease_live => Err(ChargeError::InProgress),
            _ => self.take_over(&record).await,
        }
    }

    /// An in-progress record whose lease expired (its driver crashed, or
    /// released it on an unknown outcome): take it over and re-drive it, or,
    /// when it was claimed too long ago for the provider to remember its key,
    /// take it over only to abandon it. Both are compare-and-sets with the
    /// age guard in the statement; losing either means another driver has it.
    async fn take_over(&self, record: &IdempotencyRecord) -> Result<Reply, ChargeError> {
        // An in-progress record always has a token (release keeps it); one
        // without can match no compare-and-set, so another driver has it.
        let Some(expected) = record.lease.as_ref().map(|l| &l.token) else {
            return Err(ChargeError::InProgress);
        };
        let lease = NewLease::new(self.policy.lease);
        let limit = self.policy.redrive_limit;
        let load = || async {
            self.store.charge(&record.charge_id).await?.ok_or_else(|| {
                StoreError::Invariant(format!(
                    "charge {} of a record is missing",
                    record.charge_id
                ))
            })
        };
        if self
            .store
            .take_over(record.id, expected, &lease, ClaimAge::Under(limit))
            .await?
        {
            metrics::counter!(LEASE_TAKEOVERS_TOTAL).increment(1);
            let charge = load().await?;
            tracing::info!(record_id = %record.id, charge_id = %charge.id, "took over expired lease; re-driving");
            return self
                .drive(record.id, &lease.token, charge, OnUnknown::ReleaseLease)
                .await;
        }
        // Only a record the database already measured as that old is worth
        // the second attempt; the statement checks the age again.
        if record.age >= limit
            && self
                .store
                .take_over(record.id, expected, &lease, ClaimAge::AtLeast(limit))
                .await?
        {
            let charge = load().await?;
            tracing::error!(
                record_id = %record.id,
                charge_id = %charge.id,
                provider_key = %charge.provider_key,
                "ABANDONED: claimed longer ago than the provider's key retention allows a \
                 re-drive; charge marked unknown, reconcile it with the provider"
            );
            metrics::counter!(ABANDONED_TOTAL, "reason" => "key_retention").increment(1);
            return self
                .abandon(
                    record.id,
                    &lease.token,
                    &charge,
                    "past the provider's key retention",
                )
                .await;
        }
        // Another retry or the reaper took it first.
        Err(ChargeError::InProgress)
    }

    /// Steps 3-5: call the provider with no database resource held, then
    /// finish under the lease; on an unknown outcome, `on_unknown` says
    /// whether the lease ends now. Used by the API and by the reaper.
    pub async fn drive(
        &self,
        record_id: RecordId,
        lease_token: &LeaseToken,
        charge: Charge,
        on_unknown: OnUnknown,
    ) -> Result<Reply, ChargeError> {
        let outcome = self
            .gateway
            .create_charge(&ProviderChargeRequest::from(&charge))
            .await;
        let (outcome, response) = match settle(&charge, outcome) {
            Ok(settled) => settled,
            Err(reason) => {
                tracing::warn!(%record_id, charge_id = %charge.id, %reason, ?on_unknown, "provider outcome unknown");
                if on_unknown == OnUnknown::ReleaseLease {
                    self.store.release(record_id, lease_token).await?;
                }
                return Err(ChargeError::ProviderUnavailable(reason));
            }
        };
        let finish = Finish {
            record_id,
            lease_token: lease_token.clone(),
            state: RecordState::Complete,
            outcome,
            response,
        };
        self.complete(finish).await
    }

    /// Gives up on a request whose provider outcome is unknown: the record
    /// becomes `abandoned` with the answer `500 request_abandoned` (replayed
    /// to the client, never reclaimed nor pruned) and the charge `unknown`,
    /// for reconciliation against the provider's records. Under the lease,
    /// like any finish.
    pub async fn abandon(
        &self,
        record_id: RecordId,
        lease_token: &LeaseToken,
        charge: &Charge,
        reason: &str,
    ) -> Result<Reply, ChargeError> {
        tracing::debug!(%record_id, charge_id = %charge.id, reason, "abandoning");
        let mut envelope = ErrorEnvelope::new(
            ABANDONED,
            "the payment provider's outcome could not be determined; the charge is \
             being reconciled, do not retry it with a new key",
        );
        envelope.error.charge_id = Some(charge.id.clone());
        let finish = Finish {
            record_id,
            lease_token: lease_token.clone(),
            state: RecordState::Abandoned,
            outcome: ChargeOutcome {
                charge_id: charge.id.clone(),
                status: ChargeStatus::Unknown,
                gateway_charge_id: None,
                decline_code: None,
            },
            response: StoredResponse {
                status: 500,
                body: envelope.to_json(),
                content_type: JSON.to_owned(),
                location: None,
            },
        };
        self.complete(finish).await
    }

    /// Step 4: the guarded finish. A loser answers from the record only
    /// while it still holds the loser's own charge (another driver of the
    /// same operation finished it). Otherwise the record has moved on, to a
    /// new operation after a TTL reclaim, possibly another customer's: the
    /// loser settles its own charge row with the outcome it holds (the
    /// money moved or it did not) and answers 409, never that operation's
    /// response.
    async fn complete(&self, finish: Finish) -> Result<Reply, ChargeError> {
        let record_id = finish.record_id;
        let charge_id = &finish.outcome.charge_id;
        match self.store.finish(&finish).await? {
            FinishOutcome::Finished => {
                tracing::info!(%record_id, %charge_id, status = finish.response.status, state = finish.state.as_str(), "finished");
                Ok(Reply {
                    response: finish.response,
                    replayed: false,
                })
            }
            FinishOutcome::Lost => match self.store.record(record_id).await? {
                Some(IdempotencyRecord {
                    state,
                    response: Some(response),
                    charge_id: ref held,
                    ..
                }) if state.is_answered() && held == charge_id => {
                    tracing::info!(
                        %record_id,
                        %charge_id,
                        "another driver finished this operation first; answering with its response"
                    );
                    Ok(Reply {
                        response,
                        replayed: true,
                    })
                }
                Some(IdempotencyRecord {
                    charge_id: ref held,
                    ..
                }) if held == charge_id => {
                    tracing::info!(
                        %record_id,
                        %charge_id,
                        "another driver holds this operation; leaving it to that driver"
                    );
                    Err(ChargeError::InProgress)
                }
                other => {
                    let settled = self.store.settle_charge(&finish.outcome).await?;
                    tracing::warn!(
                        %record_id,
                        %charge_id,
                        now_holds = ?other.as_ref().map(|r| r.charge_id.as_str()),
                        status = finish.outcome.status.as_str(),
                        settled,
                        "lost the record to another operation; settled this charge on its own"
                    );
                    Err(ChargeError::InProgress)
                }
            },
        }
    }

    /// `POST /api/charges` without a key, in `IDEMPOTENCY_KEY_MODE=optional`
    /// (rollout): served with no protection at all. A retry of this request
    /// is a second charge; an unknown outcome leaves the charge `unknown`
    /// for reconciliation, since no retry can resolve it.
    #[tracing::instrument(skip_all, fields(customer = %customer))]
    pub async fn create_unprotected_charge(
        &self,
        customer: &CustomerId,
        body: &Value,
    ) -> Result<Reply, ChargeError> {
        let request = ChargeRequest::from_json(body, self.policy.max_amount_cents)?;
        let charge = Charge::pending(customer, &request);
        tracing::warn!(charge_id = %charge.id, "charge without an Idempotency-Key: a retry would charge again");
        let charge = self.store.insert_charge(&charge).await?;
        let outcome = self
            .gateway
            .create_charge(&ProviderChargeRequest::from(&charge))
            .await;
        match settle(&charge, outcome) {
            Ok((outcome, response)) => {
                self.store.settle_charge(&outcome).await?;
                Ok(Reply {
                    response,
                    replayed: false,
                })
            }
            Err(reason) => {
                tracing::error!(charge_id = %charge.id, %reason, "keyless charge outcome unknown; marked unknown for reconciliation");
                self.store
                    .settle_charge(&ChargeOutcome {
                        charge_id: charge.id.clone(),
                        status: ChargeStatus::Unknown,
                        gateway_charge_id: None,
                        decline_code: None,
                    })
                    .await?;
                Err(ChargeError::ProviderUnavailable(reason))
            }
        }
    }
}

/// A final provider answer as the charge's new state and the stored
/// response (201 with the charge, or 402 `card_declined`); `Err` with the
/// reason when the outcome is unknown.
fn settle(
    charge: &Charge,
    outcome: ProviderOutcome,
) -> Result<(ChargeOutcome, StoredResponse), String> {
    let mut charge = charge.clone();
    let response = match outcome {
        ProviderOutcome::Succeeded { provider_charge_id } => {
            charge.status = ChargeStatus::Succeeded;
            charge.gateway_charge_id = Some(provider_charge_id);
            StoredResponse {
                status: 201,
                body: charge.to_json(),
                content_type: JSON.to_owned(),
                location: Some(charge.location()),
            }
        }
        ProviderOutcome::Declined {
            code,
            decline_code,
            message,
            provider_charge_id,
        } => {
            charge.status = ChargeStatus::Failed;
            charge.gateway_charge_id = provider_charge_id;
            charge.decline_code = decline_code.or(Some(code));
            let mut envelope = ErrorEnvelope::new("card_declined", message);
            envelope.error.decline_code = charge.decline_code.clone();
            envelope.error.charge_id = Some(charge.id.clone());
            StoredResponse {
                status: 402,
                body: envelope.to_json(),
                content_type: JSON.to_owned(),
                location: None,
            }
        }
        ProviderOutcome::Unknown { reason } => return Err(reason),
    };
    let outcome = ChargeOutcome {
        charge_id: charge.id,
        status: charge.status,
        gateway_charge_id: charge.gateway_charge_id,
        decline_code: charge.decline_code,
    };
    Ok((outcome, response))
}
