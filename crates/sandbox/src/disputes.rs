//! Stripe's disputes: a cardholder's bank taking a charge back, or asking
//! about it first (an inquiry). The sandbox's control endpoints play the
//! bank: `POST /_sandbox/charges/{id}/disputes` opens one,
//! `POST /_sandbox/disputes/{id}` moves it, `GET /_sandbox/disputes` lists
//! them all; `GET /v1/disputes` and `GET /v1/disputes/{id}` are Stripe's
//! reads, behind the secret key like every `/v1` route.
//!
//! # Lifecycle
//!
//! An inquiry opens `warning_needs_response` (`is_charge_refundable: true`,
//! no `evidence_details.due_by`); a chargeback `needs_response`
//! (`is_charge_refundable: false`, due 7 days later), its funds withdrawn.
//! An inquiry moves among the `warning_*` statuses, closes
//! `warning_closed`, or escalates to a chargeback (`needs_response` or
//! `under_review`: no longer refundable, due 7 days from then, funds
//! withdrawn); a chargeback moves between `needs_response` and
//! `under_review` (evidence submitted: `has_evidence`, `submission_count`)
//! and closes `won` (funds reinstated) or `lost`. Either can close
//! `prevented`. A closed dispute never changes again. A charge has at most
//! one dispute, as at Stripe, and stays `disputed: true` once it had one.
//!
//! While a dispute is open and its charge not refundable, a refund of the
//! charge is refused `charge_disputed` (the ledger's check). Disputes are
//! written to the ledger file, when there is one, like refunds.

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, RawQuery, State};
use axum::http::HeaderMap;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Value, json};

use crate::charges::no_such_charge;
use crate::error::ApiError;
use crate::ledger::{Charge, Known, ListRefusal, Metadata, one_of};
use crate::params::FormParams;
use crate::processing;
use crate::state::AppState;

/// How long the merchant has to respond to a chargeback: 7 days.
const EVIDENCE_WINDOW_SECS: u64 = 7 * 24 * 60 * 60;

/// Stripe's dispute reasons.
pub(crate) const DISPUTE_REASONS: [&str; 15] = [
    "bank_cannot_process",
    "check_returned",
    "credit_not_processed",
    "customer_initiated",
    "debit_not_authorized",
    "duplicate",
    "fraudulent",
    "general",
    "incorrect_account_details",
    "insufficient_funds",
    "noncompliant",
    "product_not_received",
    "product_unacceptable",
    "subscription_canceled",
    "unrecognized",
];

/// A dispute's status, as Stripe names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum DisputeStatus {
    WarningNeedsResponse,
    WarningUnderReview,
    WarningClosed,
    NeedsResponse,
    UnderReview,
    Won,
    Lost,
    Prevented,
}

impl DisputeStatus {
    /// Settled for good.
    pub(crate) fn is_closed(self) -> bool {
        matches!(
            self,
            Self::WarningClosed | Self::Won | Self::Lost | Self::Prevented
        )
    }

    /// An inquiry's status (`warning_*`), before any chargeback.
    pub(crate) fn is_inquiry(self) -> bool {
        matches!(
            self,
            Self::WarningNeedsResponse | Self::WarningUnderReview | Self::WarningClosed
        )
    }

    fn is_under_review(self) -> bool {
        matches!(self, Self::WarningUnderReview | Self::UnderReview)
    }

    /// As spelled on the wire.
    fn name(self) -> String {
        serde_json::to_value(self)
            .ok()
            .and_then(|value| value.as_str().map(str::to_owned))
            .unwrap_or_else(|| format!("{self:?}"))
    }
}

fn dispute_object() -> Known {
    "dispute"
}

fn dispute_reason<'de, D: Deserializer<'de>>(d: D) -> Result<Known, D::Error> {
    use serde::de::Error as _;
    one_of(d, DISPUTE_REASONS)?.ok_or_else(|| D::Error::custom("a dispute has a reason"))
}

/// Stripe's `evidence_details`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct EvidenceDetails {
    /// Unix seconds; null for an inquiry.
    due_by: Option<u64>,
    has_evidence: bool,
    past_due: bool,
    submission_count: u32,
}

/// Stripe's dispute object. Read back from the ledger file as it is
/// written there: the wire object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Dispute {
    pub(crate) id: String,
    #[serde(skip_deserializing, default = "dispute_object")]
    object: Known,
    pub(crate) amount: u64,
    /// Always empty: the sandbox keeps no balance.
    #[serde(skip_deserializing)]
    balance_transactions: [(); 0],
    /// The disputed charge's id.
    pub(crate) charge: String,
    /// Unix seconds.
    pub(crate) created: u64,
    currency: String,
    evidence_details: EvidenceDetails,
    is_charge_refundable: bool,
    livemode: bool,
    metadata: Metadata,
    #[serde(deserialize_with = "dispute_reason")]
    reason: Known,
    pub(crate) status: DisputeStatus,
}

/// A dispute to open, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DisputeRequest {
    /// Minor units; `None`: what is left of the charge.
    pub(crate) amount: Option<u64>,
    pub(crate) reason: Known,
    /// An inquiry (`warning_needs_response`) rather than a chargeback.
    pub(crate) inquiry: bool,
}

/// A change of a dispute asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DisputeChange {
    pub(crate) status: DisputeStatus,
    pub(crate) is_charge_refundable: Option<bool>,
}

/// Why a dispute was not opened or changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DisputeRefusal {
    NoSuchCharge,
    /// Failed, or a hold never captured: no money to take back.
    NotCaptured,
    /// The charge has this dispute already.
    AlreadyDisputed(String),
    /// Refunded whole: nothing left to dispute, and no amount given.
    NothingLeft,
    /// More than the charge captured.
    TooLarge {
        requested: u64,
        captured: u64,
    },
    NoSuchDispute,
    /// Closed with this status.
    Closed(DisputeStatus),
    /// A dispute does not move from `from` to `to`.
    Transition {
        from: DisputeStatus,
        to: DisputeStatus,
    },
    /// The change changes nothing.
    Unchanged(DisputeStatus),
    /// The ledger file could not be written: nothing changed.
    NotRecorded(String),
}

impl Dispute {
    /// A new dispute of `amount` of `charge` (checked by the ledger).
    pub(crate) fn open(
        id: String,
        charge: &Charge,
        amount: u64,
        reason: Known,
        inquiry: bool,
        created: u64,
    ) -> Self {
        Self {
            id,
            object: dispute_object(),
            amount,
            balance_transactions: [],
            charge: charge.id.clone(),
            created,
            currency: charge.currency.clone(),
            evidence_details: EvidenceDetails {
                due_by: (!inquiry).then(|| created.saturating_add(EVIDENCE_WINDOW_SECS)),
                has_evidence: false,
                past_due: false,
                submission_count: 0,
            },
            is_charge_refundable: inquiry,
            livemode: false,
            metadata: Metadata::default(),
            reason,
            status: if inquiry {
                DisputeStatus::WarningNeedsResponse
            } else {
                DisputeStatus::NeedsResponse
            },
        }
    }

    /// Open, and its charge not refundable: a refund is refused.
    pub(crate) fn blocks_refunds(&self) -> bool {
        !self.status.is_closed() && !self.is_charge_refundable
    }

    /// The dispute after `change` at `now` (Unix seconds), or why it
    /// cannot move so (see the module's lifecycle).
    pub(crate) fn changed(&self, change: DisputeChange, now: u64) -> Result<Self, DisputeRefusal> {
        use DisputeStatus as S;
        let (from, to) = (self.status, change.status);
        if from.is_closed() {
            return Err(DisputeRefusal::Closed(from));
        }
        let allowed = match to {
            S::WarningNeedsResponse | S::WarningUnderReview | S::WarningClosed => from.is_inquiry(),
            S::NeedsResponse | S::UnderReview | S::Prevented => true,
            S::Won | S::Lost => !from.is_inquiry(),
        };
        if !allowed {
            return Err(DisputeRefusal::Transition { from, to });
        }
        let mut next = self.clone();
        next.status = to;
        if from.is_inquiry() && matches!(to, S::NeedsResponse | S::UnderReview) {
            // Escalated to a chargeback: the funds go, the clock starts.
            next.is_charge_refundable = false;
            next.evidence_details
                .due_by
                .get_or_insert(now.saturating_add(EVIDENCE_WINDOW_SECS));
        }
        if to.is_under_review() && !from.is_under_review() {
            next.evidence_details.has_evidence = true;
            next.evidence_details.submission_count =
                next.evidence_details.submission_count.saturating_add(1);
        }
        if let Some(refundable) = change.is_charge_refundable {
            next.is_charge_refundable = refundable;
        }
        if next == *self {
            return Err(DisputeRefusal::Unchanged(from));
        }
        Ok(next)
    }

    /// The events its change from `before` makes, in order.
    pub(crate) fn change_events(&self, before: &Dispute) -> Vec<&'static str> {
        use DisputeStatus as S;
        let mut events = Vec::new();
        if self.status.is_closed() {
            events.push("charge.dispute.closed");
            if self.status == S::Won {
                events.push("charge.dispute.funds_reinstated");
            }
        } else {
            events.push("charge.dispute.updated");
            if before.status.is_inquiry() && !self.status.is_inquiry() {
                events.push("charge.dispute.funds_withdrawn");
            }
        }
        events
    }

    /// The events its opening makes, in order.
    pub(crate) fn open_events(&self) -> Vec<&'static str> {
        let mut events = vec!["charge.dispute.created"];
        if !self.status.is_inquiry() {
            events.push("charge.dispute.funds_withdrawn");
        }
        events
    }
}

/// The body of `POST /_sandbox/charges/{id}/disputes`; every field
/// optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct OpenBody {
    amount: Option<u64>,
    reason: Option<String>,
    #[serde(default)]
    inquiry: bool,
}

/// The body of `POST /_sandbox/disputes/{id}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ChangeBody {
    status: DisputeStatus,
    #[serde(default)]
    is_charge_refundable: Option<bool>,
}

/// A JSON body of a control endpoint; an empty one is `T::default()` when
/// `empty` gives one.
pub(crate) fn json_body<T: serde::de::DeserializeOwned>(
    body: Result<Bytes, BytesRejection>,
    empty: Option<T>,
    what: &str,
) -> Result<T, ApiError> {
    let body = body.map_err(|rejection| {
        ApiError::invalid_request(format!("The request body could not be read: {rejection}"))
    })?;
    if body.iter().all(u8::is_ascii_whitespace)
        && let Some(empty) = empty
    {
        return Ok(empty);
    }
    serde_json::from_slice(&body)
        .map_err(|error| ApiError::invalid_request(format!("Invalid {what}: {error}")))
}

/// `POST /_sandbox/charges/{id}/disputes` with `{"amount"?: N, "reason"?:
/// "fraudulent", "inquiry"?: false}`: the card's bank opens a dispute of
/// the charge (a succeeded, captured one). `amount` defaults to what is
/// left of it (not refunded), `reason` to `fraudulent`. Answers the
/// dispute; emits `charge.dispute.created` and, for a chargeback,
/// `charge.dispute.funds_withdrawn`.
pub(crate) async fn open_dispute(
    State(state): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Dispute>, ApiError> {
    let charge_id = processing::path_id(path)?;
    let body: OpenBody = json_body(body, Some(OpenBody::default()), "dispute")?;
    if body.amount == Some(0) {
        return Err(
            ApiError::invalid_request("A dispute's amount must be at least 1.")
                .with_param("amount"),
        );
    }
    let reason = match body.reason.as_deref() {
        None => "fraudulent",
        Some(reason) => DISPUTE_REASONS
            .into_iter()
            .find(|known| *known == reason)
            .ok_or_else(|| {
                ApiError::invalid_request(format!(
                    "Invalid reason: must be one of {}; got {reason}",
                    DISPUTE_REASONS.join(", ")
                ))
                .with_param("reason")
            })?,
    };
    let request = DisputeRequest {
        amount: body.amount,
        reason,
        inquiry: body.inquiry,
    };
    let config = state.config();
    let (dispute, charge) = state
        .ledger
        .open_dispute(&charge_id, request)
        .map_err(|refusal| refusal_error(&charge_id, refusal))?;
    tracing::info!(dispute = %dispute.id, charge = %charge.id, status = ?dispute.status, "dispute opened");
    for kind in dispute.open_events() {
        state.webhooks.emit(&config, None, kind, &dispute);
    }
    Ok(Json(dispute))
}

/// `POST /_sandbox/disputes/{id}` with `{"status": "..",
/// "is_charge_refundable"?: bool}`: the bank moves the dispute. A closing
/// status emits `charge.dispute.closed` (and `won`,
/// `charge.dispute.funds_reinstated`); any other change
/// `charge.dispute.updated` (and an inquiry's escalation,
/// `charge.dispute.funds_withdrawn`).
pub(crate) async fn change_dispute(
    State(state): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Dispute>, ApiError> {
    let id = processing::path_id(path)?;
    let body: ChangeBody =
        json_body(body, None, "dispute change").map_err(|error| error.with_param("status"))?;
    let config = state.config();
    let (before, changed) = state
        .ledger
        .change_dispute(
            &id,
            DisputeChange {
                status: body.status,
                is_charge_refundable: body.is_charge_refundable,
            },
        )
        .map_err(|refusal| refusal_error(&id, refusal))?;
    tracing::info!(dispute = %changed.id, status = ?changed.status, "dispute changed");
    for kind in changed.change_events(&before) {
        state.webhooks.emit(&config, None, kind, &changed);
    }
    Ok(Json(changed))
}

/// `GET /_sandbox/disputes`: every dispute, oldest first, as it stands.
pub(crate) async fn list_all(State(state): State<AppState>) -> Json<Value> {
    Json(json!({ "data": state.ledger.disputes() }))
}

/// `GET /v1/disputes/{id}`: Stripe's dispute as it stands now.
pub(crate) async fn retrieve_dispute(
    State(state): State<AppState>,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<Dispute>, ApiError> {
    processing::api_key(&headers)?;
    let id = processing::path_id(path)?;
    state
        .ledger
        .dispute_by_id(&id)
        .map(Json)
        .ok_or_else(|| no_such_dispute(&id))
}

/// `GET /v1/disputes[?charge=ch_..][&created[gte]=..][&limit=N]
/// [&starting_after=dp_..]`: Stripe's list, newest first, a page at a
/// time.
pub(crate) async fn list_disputes(
    State(state): State<AppState>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Result<Json<Value>, ApiError> {
    processing::api_key(&headers)?;
    let request = FormParams::parse_query(query.as_deref())?.dispute_list_request()?;
    let page = state
        .ledger
        .dispute_page(
            request.charge.as_deref(),
            request.created,
            request.limit,
            request.starting_after.as_deref(),
        )
        .map_err(|refusal| match refusal {
            ListRefusal::NoSuchCharge => ApiError::invalid_request(format!(
                "No such charge: '{}'",
                request.charge.as_deref().unwrap_or_default()
            ))
            .with_code("resource_missing")
            .with_param("charge"),
            ListRefusal::NotInList => ApiError::invalid_request(format!(
                "No such dispute: '{}'",
                request.starting_after.as_deref().unwrap_or_default()
            ))
            .with_code("resource_missing")
            .with_param("starting_after"),
        })?;
    Ok(Json(json!({
        "object": "list",
        "data": page.data,
        "has_more": page.has_more,
        "url": "/v1/disputes",
    })))
}

fn no_such_dispute(id: &str) -> ApiError {
    ApiError::not_found(format!("No such dispute: '{id}'"))
        .with_code("resource_missing")
        .with_param("id")
}

/// The errors of the control endpoints; `id` is the charge's or the
/// dispute's, as in the path.
fn refusal_error(id: &str, refusal: DisputeRefusal) -> ApiError {
    match refusal {
        DisputeRefusal::NoSuchCharge => no_such_charge(id),
        DisputeRefusal::NoSuchDispute => no_such_dispute(id),
        // The sandbox's own codes: a bank, not an API, refuses these.
        DisputeRefusal::NotCaptured => ApiError::invalid_request(format!(
            "Charge {id} did not succeed or was never captured: there is nothing to dispute."
        ))
        .with_code("charge_not_disputable"),
        DisputeRefusal::AlreadyDisputed(dispute) => ApiError::invalid_request(format!(
            "Charge {id} has a dispute already ({dispute}); a charge has at most one."
        ))
        .with_code("charge_already_disputed"),
        DisputeRefusal::NothingLeft => ApiError::invalid_request(format!(
            "Charge {id} has been refunded whole: send an amount to dispute it anyway."
        ))
        .with_code("charge_already_refunded"),
        DisputeRefusal::TooLarge {
            requested,
            captured,
        } => ApiError::invalid_request(format!(
            "Dispute amount ({requested}) is greater than the amount captured ({captured})."
        ))
        .with_code("amount_too_large")
        .with_param("amount"),
        DisputeRefusal::Closed(status) => ApiError::invalid_request(format!(
            "Dispute {id} is closed ({}) and cannot change.",
            status.name()
        ))
        .with_param("status"),
        DisputeRefusal::Transition { from, to } => ApiError::invalid_request(format!(
            "Dispute {id} cannot move from {} to {}: an inquiry (warning_*) closes as \
             warning_closed or prevented, or escalates to needs_response or under_review; a \
             chargeback closes as won, lost or prevented.",
            from.name(),
            to.name()
        ))
        .with_param("status"),
        DisputeRefusal::Unchanged(status) => ApiError::invalid_request(format!(
            "Dispute {id} is {} already; nothing changed.",
            status.name()
        ))
        .with_param("status"),
        DisputeRefusal::NotRecorded(error) => {
            tracing::error!(%error, "the dispute was not recorded");
            ApiError::internal(format!("The dispute was not changed: {error}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dispute(inquiry: bool) -> Dispute {
        Dispute {
            id: "dp_1".into(),
            object: dispute_object(),
            amount: 1000,
            balance_transactions: [],
            charge: "ch_1".into(),
            created: 1_700_000_000,
            currency: "gbp".into(),
            evidence_details: EvidenceDetails {
                due_by: (!inquiry).then_some(1_700_604_800),
                has_evidence: false,
                past_due: false,
                submission_count: 0,
            },
            is_charge_refundable: inquiry,
            livemode: false,
            metadata: Metadata::default(),
            reason: "fraudulent",
            status: if inquiry {
                DisputeStatus::WarningNeedsResponse
            } else {
                DisputeStatus::NeedsResponse
            },
        }
    }

    fn to(status: DisputeStatus) -> DisputeChange {
        DisputeChange {
            status,
            is_charge_refundable: None,
        }
    }

    #[test]
    fn an_inquiry_escalates_to_a_chargeback_that_closes() -> Result<(), DisputeRefusal> {
        use DisputeStatus as S;
        let inquiry = dispute(true);
        assert!(!inquiry.blocks_refunds());
        assert_eq!(
            inquiry.changed(to(S::Won), 5).err(),
            Some(DisputeRefusal::Transition {
                from: S::WarningNeedsResponse,
                to: S::Won
            })
        );
        let escalated = inquiry.changed(to(S::NeedsResponse), 100)?;
        assert!(escalated.blocks_refunds());
        assert_eq!(
            escalated.evidence_details.due_by,
            Some(100 + EVIDENCE_WINDOW_SECS)
        );
        assert_eq!(
            escalated.change_events(&inquiry),
            ["charge.dispute.updated", "charge.dispute.funds_withdrawn"]
        );
        let reviewed = escalated.changed(to(S::UnderReview), 200)?;
        assert_eq!(reviewed.evidence_details.submission_count, 1);
        assert!(reviewed.evidence_details.has_evidence);
        let won = reviewed.changed(to(S::Won), 300)?;
        assert!(!won.blocks_refunds());
        assert_eq!(
            won.change_events(&reviewed),
            ["charge.dispute.closed", "charge.dispute.funds_reinstated"]
        );
        assert_eq!(
            won.changed(to(S::Lost), 400).err(),
            Some(DisputeRefusal::Closed(S::Won))
        );
        Ok(())
    }

    #[test]
    fn a_chargeback_never_turns_back_into_an_inquiry() -> Result<(), DisputeRefusal> {
        use DisputeStatus as S;
        let chargeback = dispute(false);
        assert_eq!(
            chargeback.open_events(),
            ["charge.dispute.created", "charge.dispute.funds_withdrawn"]
        );
        assert_eq!(dispute(true).open_events(), ["charge.dispute.created"]);
        for status in [S::WarningClosed, S::WarningNeedsResponse] {
            assert!(chargeback.changed(to(status), 1).is_err(), "{status:?}");
        }
        assert_eq!(
            chargeback.changed(to(S::NeedsResponse), 1).err(),
            Some(DisputeRefusal::Unchanged(S::NeedsResponse))
        );
        let refundable = chargeback.changed(
            DisputeChange {
                status: S::NeedsResponse,
                is_charge_refundable: Some(true),
            },
            1,
        )?;
        assert!(!refundable.blocks_refunds());
        let lost = chargeback.changed(to(S::Lost), 1)?;
        assert_eq!(lost.change_events(&chargeback), ["charge.dispute.closed"]);
        Ok(())
    }

    #[test]
    fn a_dispute_reads_back_as_written() -> Result<(), serde_json::Error> {
        let written = dispute(false);
        let wire = serde_json::to_value(&written)?;
        assert_eq!(wire["object"], "dispute");
        assert_eq!(wire["balance_transactions"], json!([]));
        assert_eq!(wire["evidence_details"]["due_by"], 1_700_604_800);
        assert_eq!(serde_json::from_value::<Dispute>(wire.clone())?, written);
        let mut unknown = wire;
        unknown["reason"] = json!("bored");
        assert!(serde_json::from_value::<Dispute>(unknown).is_err());
        Ok(())
    }
}
