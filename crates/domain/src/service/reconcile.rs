//! Reconciliation: what the provider's records say of an operation whose
//! outcome is unknown, and the orphans it made with no row here.

use super::*;

impl ChargeService {
    /// Finds orphans: charges and refunds the provider made within the
    /// last `window` (up to `lag` ago, by the database's clock) that name
    /// one of our operations, which has no row here. Money moved with no
    /// record of it: a database that lost its last writes, and a client
    /// that never came back with its key. Each is recorded (and logged
    /// `ORPHAN`) once; it is settled when its operation has a row again
    /// (its client's retry adopted the provider's object). Operations
    /// younger than `lag` are left alone: their client may be retrying.
    /// With `apply` false, nothing is written (a dry run logs what it
    /// would record).
    pub async fn find_orphans(
        &self,
        window: Duration,
        lag: Duration,
        apply: bool,
    ) -> Result<OrphanReport, StoreError> {
        let now = self.store.now().await?.timestamp();
        let seconds = |d: Duration| i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
        let created = CreatedWindow {
            from: now.saturating_sub(seconds(window)),
            to: now.saturating_sub(seconds(lag)),
        };
        let mut report = OrphanReport::default();
        if created.to < created.from {
            return Ok(report);
        }
        for kind in [OperationKind::Charge, OperationKind::Refund] {
            let objects = match self.gateway.list_ours(kind, created).await {
                Ok(objects) => objects,
                Err(reason) => {
                    tracing::warn!(kind = kind.as_str(), %reason, "orphan search: the provider's list could not be read");
                    report.lookup_failed += 1;
                    continue;
                }
            };
            for object in objects {
                report.seen += 1;
                let known = self.is_a_row(kind, &object.operation_id).await?;
                if known || (apply && !self.store.record_orphan(&object).await?) {
                    continue;
                }
                report.new += 1;
                tracing::error!(
                    kind = kind.as_str(),
                    provider_id = %object.provider_id,
                    operation_id = %object.operation_id,
                    amount_cents = object.amount_cents,
                    currency = %object.currency,
                    status = %object.status,
                    provider_created = object.created,
                    dry_run = !apply,
                    "ORPHAN: the provider made this {} for one of our operations, which has no row \
                     here; adopt it (its client retries with its key) or refund it \
                     (docs/operations.md)",
                    kind.as_str()
                );
            }
        }
        if apply {
            report.settled = self.store.settle_orphans().await?;
        }
        let open = self.store.open_orphans(MAX_OPEN_ORPHANS).await?;
        report.open = open.len() as u64;
        for kind in [OperationKind::Charge, OperationKind::Refund] {
            let n = open.iter().filter(|o| o.object.kind == kind).count();
            metrics::gauge!(ORPHANS, "kind" => kind.as_str()).set(n as f64);
        }
        Ok(report)
    }

    /// What the provider's records say of an operation whose outcome is
    /// unknown, looked up by the id its calls carried, or of a refund the
    /// provider answered `pending`, by the provider's id; changes nothing.
    pub async fn reconciliation(&self, unsettled: &Unsettled) -> Decision {
        let lookup = match &unsettled.operation {
            Operation::Charge(charge) => {
                let expected = Expected::of_charge(charge);
                self.gateway.find_charge(&charge.id, &expected).await
            }
            // A refund the provider answered `pending` has its id: polled by
            // it. Not finding an id the provider gave is never "not made".
            Operation::Refund(
                refund @ Refund {
                    status: ChargeStatus::Pending,
                    gateway_refund_id: Some(id),
                    ..
                },
            ) => match self
                .gateway
                .retrieve_refund(id, &Expected::of_refund(refund))
                .await
            {
                Lookup::NotFound => Lookup::Unknown {
                    reason: format!(
                        "the provider does not know its refund {id}, which it answered pending"
                    ),
                },
                found => found,
            },
            Operation::Refund(refund) => match &refund.gateway_charge_id {
                Some(charge) => {
                    let expected = Expected::of_refund(refund);
                    self.gateway
                        .find_refund(charge, &refund.id, &expected)
                        .await
                }
                None => Lookup::NotFound,
            },
            // A capture shows on its charge; a cancel is a refund of it.
            Operation::Capture(capture) => match &capture.gateway_charge_id {
                Some(charge) => {
                    let expected = Expected::of_capture(capture.amount_cents, &capture.currency);
                    match capture.action {
                        HoldAction::Capture => self.gateway.find_capture(charge, &expected).await,
                        HoldAction::Cancel => {
                            self.gateway
                                .find_refund(charge, &capture.id, &expected)
                                .await
                        }
                    }
                }
                None => Lookup::NotFound,
            },
        };
        match lookup {
            Lookup::Found(ProviderOutcome::Pending { .. }) => Decision::Pending,
            Lookup::Found(found) => {
                match settle(&self.with_hold_expiry(unsettled.operation.clone()), found) {
                    Ok((outcome, answer)) => Decision::Settle { outcome, answer },
                    Err((_, reason)) => Decision::LookupFailed(reason),
                }
            }
            Lookup::Unknown { reason } => Decision::LookupFailed(reason),
            Lookup::NotFound => match unsettled.lag_passed {
                None => Decision::NeedsPerson,
                Some(false) => Decision::Lagging,
                Some(true) => self.confirmed_not_made(&unsettled.operation).await,
            },
        }
    }

    /// A charge Search does not show, its lag past, is looked for once more
    /// in the provider's charge list (Search can lag by far more than its
    /// usual minute during an outage), among the charges created from its
    /// first call to when the provider could last have acted on its last
    /// one, with a clock margin each side. Only a whole read that does not
    /// find it concludes "not made". A refund's lookup is already a list.
    pub(super) async fn confirmed_not_made(&self, operation: &Operation) -> Decision {
        let Operation::Charge(charge) = operation else {
            return not_made(operation);
        };
        let margin = chrono::Duration::from_std(PROVIDER_CLOCK_MARGIN).unwrap_or_default();
        let acts_within = chrono::Duration::from_std(self.policy.provider_acts_within)
            .unwrap_or(chrono::Duration::MAX);
        // The last provider call was sent before the charge was last
        // written (made unknown).
        let latest = charge
            .updated_at
            .checked_add_signed(acts_within)
            .and_then(|t| t.checked_add_signed(margin))
            .map_or(i64::MAX, |t| t.timestamp().saturating_add(1));
        let created = CreatedWindow {
            from: charge
                .created_at
                .checked_sub_signed(margin)
                .map_or(0, |t| t.timestamp()),
            to: latest,
        };
        let expected = Expected::of_charge(charge);
        match self
            .gateway
            .find_charge_listed(&charge.id, created, &expected)
            .await
        {
            Lookup::NotFound => not_made(operation),
            Lookup::Found(found) => {
                match settle(&self.with_hold_expiry(operation.clone()), found) {
                    Ok((outcome, answer)) => Decision::Settle { outcome, answer },
                    Err((_, reason)) => Decision::LookupFailed(reason),
                }
            }
            Lookup::Unknown { reason } => Decision::LookupFailed(format!(
                "Search does not show it, and the charge list could not confirm that: {reason}"
            )),
        }
    }

    /// Looks the operation up and, when the provider's records decide it,
    /// settles it and replaces its abandoned answer (kept a TTL from now);
    /// otherwise stamps it as looked at, so the next passes read the others
    /// first. The decision, and whether this caller applied it (false:
    /// another reconciler settled the operation first, or there was nothing
    /// to do).
    pub async fn reconcile(&self, unsettled: &Unsettled) -> Result<(Decision, bool), StoreError> {
        let decision = self.reconciliation(unsettled).await;
        let applied = match &decision {
            Decision::Settle { outcome, answer } => {
                let event = NewEvent::answered(&unsettled.operation, outcome, answer);
                self.store
                    .reconcile(outcome, event.as_ref(), answer, self.policy.ttl)
                    .await?
            }
            _ => {
                self.store.looked_at(&unsettled.operation).await?;
                false
            }
        };
        let operation = unsettled.operation.label();
        let label = decision.label();
        if applied || !matches!(decision, Decision::Settle { .. }) {
            metrics::counter!(RECONCILED_TOTAL, "operation" => operation, "outcome" => label)
                .increment(1);
        }
        match &decision {
            Decision::Settle { .. } if applied => tracing::warn!(
                operation = unsettled.operation.id(),
                outcome = label,
                "RECONCILED: settled from the provider's records; its abandoned answer replaced"
            ),
            Decision::Settle { .. } => tracing::info!(
                operation = unsettled.operation.id(),
                "already settled by another reconciler"
            ),
            Decision::NeedsPerson => tracing::error!(
                operation = unsettled.operation.id(),
                "NEEDS A PERSON: outcome unknown and its provider calls carried no id to find it by"
            ),
            Decision::LookupFailed(reason) => tracing::warn!(
                operation = unsettled.operation.id(),
                %reason,
                "reconciliation lookup failed; left for the next pass"
            ),
            Decision::Lagging => tracing::info!(
                operation = unsettled.operation.id(),
                "not found yet, within the search lag; left for the next pass"
            ),
            Decision::Pending => tracing::info!(
                operation = unsettled.operation.id(),
                "still pending at the provider; left for the next pass"
            ),
        }
        Ok((decision, applied))
    }
}

/// An operation the provider has no record of, its search lag past:
/// nothing moved. Failed, with `charge_not_made`, `refund_not_made` (a
/// refund's reservation is released), `capture_not_made` or
/// `cancel_not_made` (the hold is given back), and the answer 502 saying
/// so: a new request with a new key may be made.
pub(super) fn not_made(operation: &Operation) -> Decision {
    let message = "the payment provider has no record of this operation: nothing was \
                   charged or refunded, and a new request with a new idempotency key may be made";
    let (outcome, mut envelope) = match operation {
        Operation::Charge(charge) => {
            let mut envelope = ErrorEnvelope::new(NOT_MADE[0], message);
            envelope.error.charge_id = Some(charge.id.clone());
            let outcome = Outcome::Charge(ChargeOutcome {
                charge_id: charge.id.clone(),
                status: ChargeStatus::Failed,
                gateway_charge_id: None,
                decline_code: Some(NOT_MADE[0].to_owned()),
                capture_before: None,
            });
            (outcome, envelope)
        }
        Operation::Capture(capture) => {
            let code = match capture.action {
                HoldAction::Capture => NOT_MADE[2],
                HoldAction::Cancel => NOT_MADE[3],
            };
            let mut envelope = ErrorEnvelope::new(code, message);
            envelope.error.charge_id = Some(capture.charge_id.clone());
            let mut outcome = capture_outcome(capture, ChargeStatus::Failed);
            outcome.failure_code = Some(code.to_owned());
            (Outcome::Capture(outcome), envelope)
        }
        Operation::Refund(refund) => {
            let mut envelope = ErrorEnvelope::new(NOT_MADE[1], message);
            envelope.error.refund_id = Some(refund.id.clone());
            let mut outcome = refund_outcome(refund, ChargeStatus::Failed);
            outcome.failure_code = Some(NOT_MADE[1].to_owned());
            (Outcome::Refund(outcome), envelope)
        }
    };
    if let Outcome::Refund(o) = &outcome {
        envelope.error.charge_id = Some(o.charge_id.clone());
    }
    let answer = envelope.stored(502);
    Decision::Settle { outcome, answer }
}
