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

use super::*;

impl ChargeService {
    /// Steps 1 and 2 for any operation: claim the key with the pending
    /// operation, then drive it, or answer from the record someone else has.
    /// `fingerprinted` is what the request's fingerprint is taken over: the
    /// body in its canonical form, with the path's charge for a refund.
    pub(super) async fn start(
        &self,
        actor: &Actor,
        key: &IdempotencyKey,
        route: &'static str,
        fingerprinted: &Value,
        operation: impl FnOnce() -> Operation,
    ) -> Result<Reply, ChargeError> {
        let fingerprint = RequestFingerprint::of(fingerprinted);
        // A replay the cache holds needs no new operation, lease or claim.
        let customer = actor.subject();
        if let Some(answer) = self.replay_cached(key, route, customer, fingerprinted, &fingerprint)
        {
            return answer;
        }
        self.claim_and_drive(actor, key, route, fingerprinted, fingerprint, operation())
            .await
    }

    /// The answer the replay cache holds for (key, route), checked against
    /// the caller and the fingerprint as the stored record would be: no
    /// database, no new operation. `None`: not held.
    pub(super) fn replay_cached(
        &self,
        key: &IdempotencyKey,
        route: &'static str,
        customer: &CustomerId,
        fingerprinted: &Value,
        fingerprint: &RequestFingerprint,
    ) -> Option<Result<Reply, ChargeError>> {
        let record = self.remembered(key, route)?;
        Self::answer(&record, customer, fingerprinted, fingerprint)
    }

    /// Step 1 and what follows, the cache already asked: claim the key with
    /// `operation`, then drive it, or answer from the record someone else
    /// has.
    pub(super) async fn claim_and_drive(
        &self,
        actor: &Actor,
        key: &IdempotencyKey,
        route: &'static str,
        fingerprinted: &Value,
        fingerprint: RequestFingerprint,
        operation: Operation,
    ) -> Result<Reply, ChargeError> {
        let customer = actor.subject();
        let mut claim = Claim {
            key: key.clone(),
            route,
            customer: customer.clone(),
            fingerprint,
            lease: NewLease::new(self.policy.lease),
            ttl: self.policy.ttl,
            operation,
            read_first: true,
            hold_margin: self.policy.hold_capture_margin,
        };
        let sent = std::time::Instant::now();
        let mut generation = 0;
        claim.derive(&self.policy.derivation, generation);
        loop {
            match self.store.claim(&claim).await? {
                // The key was used before, by an operation whose record
                // has expired: this is a new one, of the first generation
                // not made yet.
                ClaimOutcome::GenerationTaken => {
                    generation = self.first_free_generation(&mut claim, generation).await?;
                    tracing::debug!(generation, "a key reused after its record expired");
                }
                ClaimOutcome::Claimed {
                    record_id,
                    operation,
                } => {
                    tracing::debug!(%record_id, operation = operation.id(), "claimed");
                    self.admit(actor, route, record_id, &claim.lease.token, &operation)
                        .await?;
                    return self
                        .drive(
                            record_id,
                            &claim.lease.token,
                            *operation,
                            OnUnknown::ReleaseLease,
                        )
                        .await;
                }
                ClaimOutcome::Existing(record) => {
                    self.remember(&record, sent);
                    return self
                        .resume(&record, customer, fingerprinted, &fingerprint)
                        .await;
                }
                ClaimOutcome::Refused(response) => {
                    match &claim.operation {
                        Operation::Capture(c) => {
                            metrics::counter!(CAPTURES_TOTAL, "action" => c.action.as_str(), "outcome" => "refused").increment(1);
                            tracing::info!(
                                status = response.status,
                                "the hold was captured, canceled or lapsing; refusal stored"
                            );
                        }
                        _ => {
                            metrics::counter!(REFUNDS_TOTAL, "outcome" => "exceeds_charge")
                                .increment(1);
                            tracing::info!(status = response.status, "refund does not fit; stored");
                        }
                    }
                    return Ok(Reply {
                        response,
                        replayed: false,
                    });
                }
                ClaimOutcome::HoldBusy => {
                    let action = claim.operation.label();
                    metrics::counter!(CAPTURES_TOTAL, "action" => action, "outcome" => "busy")
                        .increment(1);
                    tracing::info!("another capture or cancel holds this hold; answered 409");
                    return Err(ChargeError::HoldBusy);
                }
            }
        }
    }

    /// The first generation after `taken` whose operation was not made
    /// (its derived id is no charge or refund yet), the claim derived for it.
    pub(super) async fn first_free_generation(
        &self,
        claim: &mut Claim,
        taken: u32,
    ) -> Result<u32, StoreError> {
        for generation in taken + 1..MAX_GENERATIONS {
            claim.derive(&self.policy.derivation, generation);
            if !self.is_made(&claim.operation).await? {
                return Ok(generation);
            }
        }
        Err(StoreError::Invariant(format!(
            "idempotency key {:?} has {MAX_GENERATIONS} generations on {}",
            claim.key, claim.route
        )))
    }

    /// Whether our charge (or refund) `id` has its row: a refund's id may
    /// be a cancel's, whose provider call is a refund.
    pub(super) async fn is_a_row(&self, kind: OperationKind, id: &str) -> Result<bool, StoreError> {
        Ok(match kind {
            OperationKind::Charge => self.store.charge(id).await?.is_some(),
            OperationKind::Refund if HoldAction::of_id(id).is_some() => {
                self.store.capture(id).await?.is_some()
            }
            OperationKind::Refund => self.store.refund(id).await?.is_some(),
        })
    }

    /// Whether `operation`'s (derived) id has its row.
    async fn is_made(&self, operation: &Operation) -> Result<bool, StoreError> {
        let id = operation.id();
        match operation {
            Operation::Charge(_) => self.is_a_row(OperationKind::Charge, id).await,
            Operation::Refund(_) => self.is_a_row(OperationKind::Refund, id).await,
            Operation::Capture(_) => Ok(self.store.capture(id).await?.is_some()),
        }
    }

    /// Step 2: someone already has this key.
    pub(super) async fn resume(
        &self,
        record: &IdempotencyRecord,
        customer: &CustomerId,
        body: &Value,
        fingerprint: &RequestFingerprint,
    ) -> Result<Reply, ChargeError> {
        match Self::answer(record, customer, body, fingerprint) {
            Some(answer) => answer,
            None => self.take_over(record).await,
        }
    }

    /// Step 2 where the record alone decides: 422 for another body or
    /// customer, the stored answer, or 409 while its lease is live. `None`:
    /// its lease expired, and it is to be taken over.
    fn answer(
        record: &IdempotencyRecord,
        customer: &CustomerId,
        body: &Value,
        fingerprint: &RequestFingerprint,
    ) -> Option<Result<Reply, ChargeError>> {
        // Records written before the fingerprint ignored null optional
        // fields hold the first version: a retry across the upgrade still
        // matches. Each comparison runs in constant time; the first version
        // is hashed only when it differs from the current one (the body has
        // `null` fields), which depends on the caller's own body alone.
        let current = record.matches(customer.as_str(), fingerprint);
        let first = if RequestFingerprint::drops_nulls(body) {
            record.matches(customer.as_str(), &RequestFingerprint::of_v1(body))
        } else {
            current
        };
        if !(current | first) {
            tracing::info!(
                record_id = %record.id,
                "key reused with another body or customer"
            );
            return Some(Err(ChargeError::KeyReused));
        }
        Some(match (record.state, &record.response) {
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
            _ => return None,
        })
    }

    /// An in-progress record whose lease expired (its driver crashed, or
    /// released it on an unknown outcome): take it over and re-drive it, or,
    /// when it was claimed too long ago for the provider to remember its key,
    /// take it over only to abandon it. Both are compare-and-sets with the
    /// age guard in the statement; losing either means another driver has it.
    pub(super) async fn take_over(&self, record: &IdempotencyRecord) -> Result<Reply, ChargeError> {
        // An in-progress record always has a token (release keeps it); one
        // without can match no compare-and-set, so another driver has it.
        let Some(expected) = record.lease.as_ref().map(|l| &l.token) else {
            return Err(ChargeError::InProgress);
        };
        let lease = NewLease::new(self.policy.lease);
        let limit = self.policy.redrive_limit;
        if self
            .store
            .take_over(record.id, expected, &lease, ClaimAge::Under(limit))
            .await?
        {
            metrics::counter!(LEASE_TAKEOVERS_TOTAL).increment(1);
            let operation = self.store.operation(record).await?;
            tracing::info!(record_id = %record.id, operation = operation.id(), "took over expired lease; re-driving");
            self.store.provider_called(&operation).await?;
            return self
                .drive(record.id, &lease.token, operation, OnUnknown::ReleaseLease)
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
            let operation = self.store.operation(record).await?;
            log_abandoned(
                record.id,
                &operation,
                None,
                "past the provider's key retention",
                "claimed longer ago than the provider's key retention allows a re-drive; marked \
                 unknown, reconcile it with the provider",
            );
            metrics::counter!(ABANDONED_TOTAL, "reason" => "key_retention").increment(1);
            return self
                .abandon(
                    record.id,
                    &lease.token,
                    &operation,
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
        operation: Operation,
        on_unknown: OnUnknown,
    ) -> Result<Reply, ChargeError> {
        let outcome = match &operation {
            Operation::Charge(charge) => {
                let request = ProviderChargeRequest::from(charge);
                self.gateway.create_charge(&request).await
            }
            Operation::Refund(refund) => match ProviderRefundRequest::of(refund) {
                Some(request) => self.gateway.create_refund(&request).await,
                // A succeeded charge always has the provider's id.
                None => not_at_provider("refund"),
            },
            Operation::Capture(capture) => match capture.gateway_charge_id.clone() {
                Some(gateway_charge_id) => match capture.action {
                    HoldAction::Capture => {
                        let request = ProviderCaptureRequest {
                            idempotency_key: capture.provider_key.clone(),
                            charge_id: capture.charge_id.clone(),
                            gateway_charge_id,
                            amount_cents: capture.amount_cents,
                            currency: capture.currency.clone(),
                        };
                        self.gateway.capture_charge(&request).await
                    }
                    // Releasing a hold is a refund of the whole uncaptured
                    // charge, under the cancel's own key.
                    HoldAction::Cancel => {
                        let request = ProviderRefundRequest {
                            idempotency_key: capture.provider_key.clone(),
                            refund_id: capture.id.clone(),
                            gateway_charge_id,
                            amount_cents: capture.amount_cents,
                            currency: capture.currency.clone(),
                            reason: None,
                            metadata: Default::default(),
                        };
                        self.gateway.create_refund(&request).await
                    }
                },
                // An authorized hold always has the provider's id.
                None => not_at_provider(capture.action.as_str()),
            },
        };
        let operation = self.with_hold_expiry(operation);
        let (outcome, response) = match settle(&operation, outcome) {
            Ok(settled) => settled,
            // The provider answers this key the same way to every call (an
            // object that does not match the operation, or an error it saved
            // under the key): no re-drive can learn more, so it is abandoned
            // now, for reconciliation (and, for a mismatch, a person).
            Err((doubt @ (Doubt::Mismatch | Doubt::ReplayedError), reason)) => {
                let why = match doubt {
                    Doubt::Mismatch => "provider_mismatch",
                    _ => "replayed_error",
                };
                log_abandoned(
                    record_id,
                    &operation,
                    Some(doubt.as_str()),
                    &reason,
                    "the provider answers this operation's key the same way to every call (an \
                     answer that does not match it, or an error it saved); no re-drive can learn \
                     more, marked unknown for reconciliation",
                );
                metrics::counter!(ABANDONED_TOTAL, "reason" => why).increment(1);
                return self
                    .abandon(record_id, lease_token, &operation, &reason)
                    .await;
            }
            // The provider holds this key's operation with other
            // parameters: the client changed its body after we lost our
            // record of its first request. This request made nothing; its
            // claim is undone so that the first body's retry derives the
            // same operation again and adopts what the provider made.
            Err((Doubt::KeyReused, reason)) => {
                tracing::warn!(
                    %record_id,
                    operation = operation.id(),
                    %reason,
                    "the provider holds this key's operation with other parameters; the claim \
                     is undone and answered 422 (reconcile finds the provider's operation)"
                );
                self.store
                    .forget(record_id, lease_token, &operation)
                    .await?;
                return Err(ChargeError::KeyReused);
            }
            Err((doubt, reason)) => {
                tracing::warn!(%record_id, operation = operation.id(), doubt = doubt.as_str(), %reason, ?on_unknown, "provider outcome unknown");
                if on_unknown == OnUnknown::ReleaseLease {
                    self.store.release(record_id, lease_token).await?;
                }
                if doubt == Doubt::InFlight {
                    // The provider is still working on our key now: its
                    // search lag restarts from this answer. Failing that,
                    // it runs from this call's send, stamped before it,
                    // which GATEWAY_TIMEOUT in the lag covers.
                    if let Err(e) = self.store.provider_called(&operation).await {
                        tracing::warn!(%record_id, operation = operation.id(), error = %e, "stamping the in-flight answer failed");
                    }
                }
                return Err(ChargeError::ProviderUnavailable { doubt, reason });
            }
        };
        let finish = Finish {
            record_id,
            lease_token: lease_token.clone(),
            state: RecordState::Complete,
            event: NewEvent::answered(&operation, &outcome, &response),
            outcome,
            response,
        };
        self.complete(finish).await
    }

    /// A hold's lapse for when the provider does not give one: its
    /// authorization's time (its claim's, by the database's clock) plus
    /// `HOLD_EXPIRY`. The provider's `capture_before` replaces it when its
    /// answer carries one.
    pub(super) fn with_hold_expiry(&self, mut operation: Operation) -> Operation {
        if let Operation::Charge(charge) = &mut operation
            && charge.is_hold()
            && charge.capture_before.is_none()
        {
            let expiry = chrono::Duration::from_std(self.policy.hold_expiry)
                .unwrap_or(chrono::Duration::MAX);
            charge.capture_before = charge.created_at.checked_add_signed(expiry);
        }
        operation
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
        operation: &Operation,
        reason: &str,
    ) -> Result<Reply, ChargeError> {
        tracing::debug!(%record_id, operation = operation.id(), reason, "abandoning");
        let mut envelope = ErrorEnvelope::new(
            ABANDONED,
            "the payment provider's outcome could not be determined; the operation is \
             being reconciled, do not retry it with a new key",
        );
        let outcome = match operation {
            Operation::Charge(charge) => {
                envelope.error.charge_id = Some(charge.id.clone());
                Outcome::Charge(ChargeOutcome {
                    charge_id: charge.id.clone(),
                    status: ChargeStatus::Unknown,
                    gateway_charge_id: None,
                    decline_code: None,
                    capture_before: None,
                })
            }
            Operation::Refund(refund) => {
                envelope.error.charge_id = Some(refund.charge_id.clone());
                envelope.error.refund_id = Some(refund.id.clone());
                Outcome::Refund(refund_outcome(refund, ChargeStatus::Unknown))
            }
            Operation::Capture(capture) => {
                envelope.error.charge_id = Some(capture.charge_id.clone());
                Outcome::Capture(capture_outcome(capture, ChargeStatus::Unknown))
            }
        };
        let finish = Finish {
            record_id,
            lease_token: lease_token.clone(),
            state: RecordState::Abandoned,
            event: NewEvent::of(operation, &outcome),
            outcome,
            response: envelope.stored(500),
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
    pub(super) async fn complete(&self, finish: Finish) -> Result<Reply, ChargeError> {
        let record_id = finish.record_id;
        let operation_id = finish.outcome.id();
        match self.store.finish(&finish).await? {
            FinishOutcome::Finished => {
                match &finish.outcome {
                    Outcome::Refund(refund) => {
                        let outcome = refund.status.as_str();
                        metrics::counter!(REFUNDS_TOTAL, "outcome" => outcome).increment(1);
                    }
                    Outcome::Capture(capture) => {
                        let (action, outcome) = (capture.action.as_str(), capture.status.as_str());
                        metrics::counter!(CAPTURES_TOTAL, "action" => action, "outcome" => outcome)
                            .increment(1);
                    }
                    Outcome::Charge(_) => {}
                }
                tracing::info!(%record_id, operation = operation_id, status = finish.response.status, state = finish.state.as_str(), "finished");
                Ok(Reply {
                    response: finish.response,
                    replayed: false,
                })
            }
            FinishOutcome::Lost => match self.store.record(record_id).await? {
                Some(
                    ref record @ IdempotencyRecord {
                        state,
                        response: Some(ref response),
                        ..
                    },
                ) if state.is_answered() && record.operation_id() == operation_id => {
                    tracing::info!(
                        %record_id,
                        operation = operation_id,
                        "another driver finished this operation first; answering with its response"
                    );
                    Ok(Reply {
                        response: response.clone(),
                        replayed: true,
                    })
                }
                Some(ref record) if record.operation_id() == operation_id => {
                    tracing::info!(
                        %record_id,
                        operation = operation_id,
                        "another driver holds this operation; leaving it to that driver"
                    );
                    Err(ChargeError::InProgress)
                }
                other => {
                    let settled = self
                        .store
                        .settle(&finish.outcome, finish.event.as_ref())
                        .await?;
                    tracing::warn!(
                        %record_id,
                        operation = operation_id,
                        now_holds = ?other.as_ref().map(IdempotencyRecord::operation_id),
                        status = finish.outcome.status().as_str(),
                        settled,
                        "lost the record to another operation; settled this one on its own"
                    );
                    Err(ChargeError::InProgress)
                }
            },
        }
    }
}

/// A final provider answer as the operation's new state and the stored
/// response: a charge's 201 or 402 `card_declined`, a refund's 201 (also
/// when the provider answered it `pending`) or 402 `refund_failed`, a
/// charge's 400 `provider_rejected_request`; `Err` with the doubt and the
/// reason when the outcome is unknown.
pub(super) fn settle(
    operation: &Operation,
    outcome: ProviderOutcome,
) -> Result<(Outcome, StoredResponse), (Doubt, String)> {
    match operation {
        Operation::Charge(charge) => settle_charge(charge, outcome),
        Operation::Refund(refund) => settle_refund(refund, outcome),
        Operation::Capture(capture) => settle_capture(capture, outcome),
    }
}

/// A refusal for an operation on a charge the provider has no id of.
fn not_at_provider(what: &str) -> ProviderOutcome {
    ProviderOutcome::Declined {
        code: "charge_not_at_provider".to_owned(),
        decline_code: None,
        message: format!("the charge has no provider id to {what}"),
        provider_id: None,
    }
}

/// The provider's code for a capture of a hold that lapsed.
pub(super) const HOLD_LAPSED: &str = "charge_expired_for_capture";

/// A capture's or cancel's final answer: 201 with the hold as it leaves
/// it (captured, or canceled); a refusal gives the hold back, answered
/// 400 `hold_expired` when it lapsed at the provider, else 402
/// `capture_failed` (or `cancel_failed`) naming the hold's status.
pub(super) fn settle_capture(
    capture: &Capture,
    outcome: ProviderOutcome,
) -> Result<(Outcome, StoredResponse), (Doubt, String)> {
    let mut capture = capture.clone();
    let final_ = Final::of(outcome)?;
    if final_.status == ChargeStatus::Pending {
        // A release the provider settles later is not a hold released yet.
        let reason = "the provider's release of the hold is pending, not final".to_owned();
        return Err((Doubt::ProviderError, reason));
    }
    capture.status = final_.status;
    capture.gateway_id = final_.provider_id;
    let response = match final_.refusal {
        None => {
            let hold = capture.hold_after(match capture.action {
                HoldAction::Capture => ChargeStatus::Succeeded,
                HoldAction::Cancel => ChargeStatus::Canceled,
            });
            created(hold.to_json(), hold.location())
        }
        Some(Refusal::Declined { code, message } | Refusal::Rejected { code, message }) => {
            let lapsed = code == HOLD_LAPSED;
            capture.failure_code = Some(code);
            if lapsed {
                Capture::refusal(&capture.charge_id, HoldState::Expired)
            } else {
                let mut envelope = ErrorEnvelope::new(
                    format!("{}_failed", capture.action.as_str()),
                    format!(
                        "the payment provider refused the {}: {}; the hold still requires                          capture",
                        capture.action.as_str(),
                        message.trim_end_matches('.')
                    ),
                );
                envelope.error.decline_code = capture.failure_code.clone();
                envelope.error.charge_id = Some(capture.charge_id.clone());
                refused(&envelope)
            }
        }
    };
    let status = capture.status;
    Ok((
        Outcome::Capture(capture_outcome(&capture, status)),
        response,
    ))
}

/// A capture's outcome as its row will record it.
pub(super) fn capture_outcome(capture: &Capture, status: ChargeStatus) -> CaptureOutcome {
    CaptureOutcome {
        capture_id: capture.id.clone(),
        action: capture.action,
        charge_id: capture.charge_id.clone(),
        amount_cents: capture.amount_cents,
        status,
        gateway_id: capture.gateway_id.clone(),
        hold_lapsed: capture.failure_code.as_deref() == Some(HOLD_LAPSED),
        failure_code: capture.failure_code.clone(),
    }
}

pub(super) fn settle_charge(
    charge: &Charge,
    outcome: ProviderOutcome,
) -> Result<(Outcome, StoredResponse), (Doubt, String)> {
    // A card charge is final when the provider answers; one it calls
    // pending is in doubt, re-driven and reconciled like any other.
    if let ProviderOutcome::Pending { provider_id } = &outcome {
        let reason = format!("the provider's charge {provider_id} is pending, not final");
        return Err((Doubt::ProviderError, reason));
    }
    let mut charge = charge.clone();
    let final_ = Final::of(outcome)?;
    charge.status = final_.status;
    charge.gateway_charge_id = final_.provider_id;
    // A success must be what was asked: held for a hold, captured
    // otherwise. The gateway checks this; an answer that slipped past it is
    // still not taken for what was asked.
    if final_.status == ChargeStatus::Succeeded && final_.held.is_some() != charge.is_hold() {
        let shown = if charge.is_hold() {
            "captured"
        } else {
            "held uncaptured"
        };
        let reason = format!("the provider's charge is {shown}, not what the charge asked");
        return Err((Doubt::Mismatch, reason));
    }
    if let Some(capture_before) = final_.held {
        charge.status = ChargeStatus::RequiresCapture;
        charge.capture_before = capture_before
            .and_then(|secs| chrono::DateTime::from_timestamp(secs, 0))
            .or(charge.capture_before);
    }
    let response = match final_.refusal {
        None => created(charge.to_json(), charge.location()),
        Some(Refusal::Declined { code, message }) => {
            charge.decline_code = Some(code);
            let mut envelope = ErrorEnvelope::new("card_declined", message);
            envelope.error.decline_code = charge.decline_code.clone();
            envelope.error.charge_id = Some(charge.id.clone());
            refused(&envelope)
        }
        Some(Refusal::Rejected { code, message }) => {
            charge.decline_code = Some(code.clone());
            rejected(code, &message, &charge.id)
        }
    };
    let outcome = Outcome::Charge(ChargeOutcome {
        charge_id: charge.id,
        status: charge.status,
        gateway_charge_id: charge.gateway_charge_id,
        decline_code: charge.decline_code,
        capture_before: charge.capture_before,
    });
    Ok((outcome, response))
}

pub(super) fn settle_refund(
    refund: &Refund,
    outcome: ProviderOutcome,
) -> Result<(Outcome, StoredResponse), (Doubt, String)> {
    let mut refund = refund.clone();
    let final_ = Final::of(outcome)?;
    refund.status = final_.status;
    refund.gateway_refund_id = final_.provider_id;
    let response = match final_.refusal {
        None => created(refund.to_json(), refund.location()),
        // A refund the provider refuses outright (`charge_already_refunded`)
        // or fails is the same answer to the caller: the refund failed,
        // with the provider's reason. Neither says anything about a card.
        Some(Refusal::Declined { code, message } | Refusal::Rejected { code, message }) => {
            refund.failure_code = Some(code);
            let mut envelope = ErrorEnvelope::new("refund_failed", message);
            envelope.error.decline_code = refund.failure_code.clone();
            envelope.error.charge_id = Some(refund.charge_id.clone());
            envelope.error.refund_id = Some(refund.id.clone());
            refused(&envelope)
        }
    };
    let status = refund.status;
    Ok((Outcome::Refund(refund_outcome(&refund, status)), response))
}

/// A final provider answer, whichever operation it answers: the status, the
/// provider's id, and for a refusal its kind, code and message.
pub(super) struct Final {
    status: ChargeStatus,
    provider_id: Option<String>,
    refusal: Option<Refusal>,
    /// An authorized hold, with the provider's `capture_before` if given.
    held: Option<Option<i64>>,
}

/// Why a final answer is not a success.
pub(super) enum Refusal {
    /// The card was declined or the refund failed: the decline code, else
    /// the error code.
    Declined { code: String, message: String },
    /// The provider refused the request itself: its error code.
    Rejected { code: String, message: String },
}

impl Final {
    /// `Err` with the doubt and the reason when the outcome is unknown.
    fn of(outcome: ProviderOutcome) -> Result<Self, (Doubt, String)> {
        Ok(match outcome {
            ProviderOutcome::Succeeded { provider_id } => Self {
                status: ChargeStatus::Succeeded,
                provider_id: Some(provider_id),
                refusal: None,
                held: None,
            },
            ProviderOutcome::Authorized {
                provider_id,
                capture_before,
            } => Self {
                status: ChargeStatus::Succeeded,
                provider_id: Some(provider_id),
                refusal: None,
                held: Some(capture_before),
            },
            ProviderOutcome::Declined {
                code,
                decline_code,
                message,
                provider_id,
            } => Self {
                status: ChargeStatus::Failed,
                provider_id,
                refusal: Some(Refusal::Declined {
                    code: decline_code.unwrap_or(code),
                    message,
                }),
                held: None,
            },
            ProviderOutcome::Rejected { code, message } => Self {
                status: ChargeStatus::Failed,
                provider_id: None,
                refusal: Some(Refusal::Rejected { code, message }),
                held: None,
            },
            // Accepted: answered 201 `pending`, its amount still reserved.
            ProviderOutcome::Pending { provider_id } => Self {
                status: ChargeStatus::Pending,
                provider_id: Some(provider_id),
                refusal: None,
                held: None,
            },
            ProviderOutcome::Unknown { doubt, reason } => return Err((doubt, reason)),
        })
    }
}

/// A refund's outcome as its row will record it.
pub(super) fn refund_outcome(refund: &Refund, status: ChargeStatus) -> RefundOutcome {
    RefundOutcome {
        refund_id: refund.id.clone(),
        charge_id: refund.charge_id.clone(),
        amount_cents: refund.amount_cents,
        status,
        gateway_refund_id: refund.gateway_refund_id.clone(),
        failure_code: refund.failure_code.clone(),
    }
}

/// 201 with the created object and where to read it back.
pub(super) fn created(body: String, location: String) -> StoredResponse {
    StoredResponse {
        status: 201,
        body,
        content_type: JSON.to_owned(),
        location: Some(location),
    }
}

/// 400 `provider_rejected_request`: the provider refused the charge request
/// itself (its `code`, e.g. `resource_missing`, and its message). Final and
/// stored: the same call would get the same answer, and nothing was made.
/// A 4xx, because what the provider refused is the request the client sent
/// (a card token it does not know): every client already treats a 400 as
/// final, where a 5xx would be retried into replays of the same answer.
pub(super) fn rejected(code: String, message: &str, charge_id: &str) -> StoredResponse {
    let mut envelope = ErrorEnvelope::new(
        PROVIDER_REJECTED,
        format!(
            "the payment provider rejected the request: {}. Nothing was charged; fix the \
             request and send it with a new idempotency key",
            message.trim_end_matches('.')
        ),
    );
    envelope.error.provider_code = Some(code);
    envelope.error.charge_id = Some(charge_id.to_owned());
    envelope.stored(400)
}

/// 402: the provider refused the operation.
pub(super) fn refused(envelope: &ErrorEnvelope) -> StoredResponse {
    envelope.stored(402)
}

/// The one `ABANDONED:` log line (error), whoever abandons: what reconciling
/// the operation by hand needs, in fields of their own (the provider key to
/// search the provider by, the amount and currency to match its object).
/// `what` follows `ABANDONED: ` in the message.
pub fn log_abandoned(
    record_id: RecordId,
    operation: &Operation,
    doubt: Option<&str>,
    reason: &str,
    what: &str,
) {
    let (customer_id, provider_key, amount_cents, currency) = match operation {
        Operation::Charge(c) => (&c.customer_id, &c.provider_key, c.amount_cents, &c.currency),
        Operation::Refund(r) => (&r.customer_id, &r.provider_key, r.amount_cents, &r.currency),
        Operation::Capture(c) => (&c.customer_id, &c.provider_key, c.amount_cents, &c.currency),
    };
    tracing::error!(
        %record_id,
        operation = operation.id(),
        kind = operation.label(),
        customer_id = %customer_id,
        provider_key = %provider_key,
        amount_cents,
        currency = %currency,
        doubt,
        reason,
        "ABANDONED: {what}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::charge::ChargeRequest;
    use serde_json::json;

    /// A pending charge made with `"capture": capture`.
    fn charge(capture: bool) -> Charge {
        let body = json!({"amount_cents": 500, "currency": "GBP", "card_token": "tok_visa",
            "capture": capture});
        let request = ChargeRequest::from_json(&body, 1_000_000).expect("valid");
        let customer = CustomerId::parse("cus_1").expect("valid");
        Charge::pending(&customer, &request)
    }

    fn authorized(capture_before: Option<i64>) -> ProviderOutcome {
        ProviderOutcome::Authorized {
            provider_id: "ch_gw".to_owned(),
            capture_before,
        }
    }

    fn captured() -> ProviderOutcome {
        ProviderOutcome::Succeeded {
            provider_id: "ch_gw".to_owned(),
        }
    }

    /// A hold answered captured, or a charge answered held, is never taken
    /// for what was asked; a hold answered held requires capture until the
    /// provider's `capture_before`.
    #[test]
    fn a_success_must_be_held_exactly_when_a_hold_was_asked() {
        let (hold, plain) = (charge(false), charge(true));
        let doubt = |r: Result<(Outcome, StoredResponse), (Doubt, String)>| r.err().map(|e| e.0);
        assert_eq!(
            doubt(settle_charge(&plain, authorized(None))),
            Some(Doubt::Mismatch)
        );
        assert_eq!(
            doubt(settle_charge(&hold, captured())),
            Some(Doubt::Mismatch)
        );
        assert_eq!(doubt(settle_charge(&plain, captured())), None);
        let Ok((Outcome::Charge(outcome), _)) =
            settle_charge(&hold, authorized(Some(1_800_000_000)))
        else {
            panic!("an authorized hold settles");
        };
        assert_eq!(outcome.status, ChargeStatus::RequiresCapture);
        let lapses = outcome.capture_before.map(|t| t.timestamp());
        assert_eq!(lapses, Some(1_800_000_000));
    }

    /// A 201's body is the event's data as it is (`NewEvent::answered`):
    /// it must be what the event renders of the object after the change,
    /// for a charge, a hold, a capture and a refund.
    #[test]
    fn a_created_answer_shows_the_object_as_its_event_does() {
        let stored = |mut charge: Charge| {
            charge.created_at = chrono::DateTime::from_timestamp(1_800_000_000, 0).expect("a time");
            charge
        };
        let (plain, hold) = (stored(charge(true)), stored(charge(false)));
        let mut cases = vec![
            (
                Operation::Charge(plain.clone()),
                settle_charge(&plain, captured()),
            ),
            (
                Operation::Charge(hold.clone()),
                settle_charge(&hold, authorized(Some(1_800_000_000))),
            ),
        ];
        let mut held = hold.clone();
        (held.status, held.gateway_charge_id) =
            (ChargeStatus::RequiresCapture, Some("ch_gw".into()));
        held.capture_before = chrono::DateTime::from_timestamp(1_800_000_000, 0);
        let office = crate::scope::Scopes::from_names(["charges:capture", "refunds:write"]);
        let actor = crate::scope::Actor::new(
            CustomerId::parse("ops_1").expect("valid"),
            crate::scope::Role::BackOffice,
            office,
            false,
        );
        let body = json!({"amount_cents": 300});
        let request = HoldRequest::from_json(HoldAction::Capture, &body, 1_000_000).expect("valid");
        let capture = Capture::pending(&actor, &held, &request, 300);
        let capture_op = Operation::Capture(capture.clone());
        cases.push((capture_op, settle_capture(&capture, captured())));
        let mut paid = plain.clone();
        (paid.status, paid.gateway_charge_id) = (ChargeStatus::Succeeded, Some("ch_gw".into()));
        let refund_body = json!({"amount_cents": 200});
        let refund_request =
            crate::refund::RefundRequest::from_json(&refund_body, 1_000_000).expect("valid");
        let refund = Refund::pending(&actor, &paid, &refund_request);
        let refunded = ProviderOutcome::Succeeded {
            provider_id: "re_gw".to_owned(),
        };
        cases.push((
            Operation::Refund(refund.clone()),
            settle_refund(&refund, refunded),
        ));
        for (operation, settled) in cases {
            let (outcome, answer) = settled.expect("final");
            assert_eq!(answer.status, 201);
            let rendered = NewEvent::of(&operation, &outcome).expect("an event");
            let answered = NewEvent::answered(&operation, &outcome, &answer).expect("an event");
            assert_eq!(rendered, answered, "{}", operation.label());
        }
    }
}
