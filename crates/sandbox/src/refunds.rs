//! `POST /v1/refunds`, `GET /v1/refunds` and `GET /v1/refunds/{id}`:
//! Stripe's refunds of the sandbox's own charges. Creating one takes the
//! shared path in `processing` (key, faults); the refund itself is one
//! critical section in the ledger. A refund of a hold not captured
//! releases it (whole, at once: a `succeeded` refund of its amount).
//! `POST /_sandbox/refunds/{id}` settles a pending one, as Stripe's test
//! helpers do, or fails a succeeded one, as a card closed since does days
//! later. `POST /_sandbox/charges/{id}/refunds` is a refund made in the
//! provider's dashboard: the ledger's same path, without metadata or key.
//!
//! Events: a refund made is `charge.refunded` (the charge as it stands
//! after) then `refund.created` (and `refund.failed` if made failed); a
//! refund's status changing later is `charge.refund.updated` then
//! `refund.updated` (and `refund.failed` if it failed).

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::charges;
use crate::config::{RefundStatus, SandboxConfig};
use crate::disputes::json_body;
use crate::error::ApiError;
use crate::ledger::{ListRefusal, Refund, RefundRefusal, Refunded, SettleRefusal};
use crate::params::{FormParams, REFUND_REASONS, RefundRequest};
use crate::processing::{self, Call, Operation};
use crate::response::StoredResponse;
use crate::server::ConnectionControl;
use crate::state::AppState;

const REFUNDS: Operation = Operation {
    path: "/v1/refunds",
    object: "refund",
    apply: refund,
};

/// `POST /v1/refunds`.
pub(crate) async fn create_refund(
    State(state): State<AppState>,
    connection: Option<Extension<ConnectionControl>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    processing::serve(state, connection, headers, body, REFUNDS, None).await
}

/// Validates and refunds, with the configured `refund_status` and the
/// config's answer overrides (a hold not captured is released instead:
/// whole, `succeeded`), then makes its events. Returns the final answer and
/// whether a refund was recorded; a refusal records nothing, so it is
/// answered even under `drop_after_charge`.
fn refund(state: &AppState, config: &SandboxConfig, call: &Call<'_>) -> (StoredResponse, bool) {
    let key = call.key;
    let mut request = match call.params.refund_request() {
        Ok(request) => request,
        Err(error) => return (error.to_stored(), false),
    };
    if let Some(amount) = config.answer_amount_override {
        request.amount = Some(amount);
    }
    if let Some(currency) = &config.answer_currency_override {
        request.currency = Some(currency.to_ascii_lowercase());
    }
    let charge = request.charge.clone();
    match state
        .ledger
        .refund(request, key.map(str::to_owned), config.refund_status)
    {
        Ok(made) => {
            let refund = &made.refund;
            tracing::debug!(
                refund = %refund.id,
                charge = %refund.charge,
                amount = refund.amount,
                status = ?refund.status,
                idempotency_key = key,
                "refund recorded"
            );
            emit_made(state, config, key, &made);
            (StoredResponse::json(StatusCode::OK, refund), true)
        }
        Err(refusal) => (refusal_error(&charge, refusal).to_stored(), false),
    }
}

/// The events of a refund made: `charge.refunded`, `refund.created`, and
/// `refund.failed` for one made failed.
fn emit_made(state: &AppState, config: &SandboxConfig, key: Option<&str>, made: &Refunded) {
    let webhooks = &state.webhooks;
    webhooks.emit(config, key, "charge.refunded", &made.charge);
    webhooks.emit(config, key, "refund.created", &made.refund);
    if made.refund.status == RefundStatus::Failed {
        webhooks.emit(config, key, "refund.failed", &made.refund);
    }
}

/// Stripe's errors for a refund the charge cannot take.
fn refusal_error(charge: &str, refusal: RefundRefusal) -> ApiError {
    match refusal {
        RefundRefusal::NoSuchCharge => no_such_charge(charge),
        // Stripe has no single code for this; the sandbox names it.
        RefundRefusal::ChargeFailed => ApiError::invalid_request(format!(
            "Charge {charge} failed, so there is nothing to refund."
        ))
        .with_code("charge_not_refundable")
        .with_param("charge"),
        RefundRefusal::AlreadyRefunded => {
            ApiError::invalid_request(format!("Charge {charge} has already been refunded."))
                .with_code("charge_already_refunded")
                .with_param("charge")
        }
        // Amounts in minor units, the unit of the `amount` parameter.
        RefundRefusal::TooLarge {
            requested,
            unrefunded,
        } => ApiError::invalid_request(format!(
            "Refund amount ({requested}) is greater than unrefunded amount on charge \
             ({unrefunded})"
        ))
        .with_code("amount_too_large")
        .with_param("amount"),
        // Stripe releases an uncaptured charge whole; no code of its own.
        RefundRefusal::PartialRelease { requested, held } => ApiError::invalid_request(format!(
            "Charge {charge} is an uncaptured hold of {held}: a refund releases it whole, so \
             leave out amount or send {held} (got {requested})."
        ))
        .with_param("amount"),
        // Stripe's code and message for a charge taken back by its bank.
        RefundRefusal::Disputed => ApiError::invalid_request(format!(
            "Charge {charge} has been charged back; the refund cannot be made."
        ))
        .with_code("charge_disputed"),
        RefundRefusal::NotRecorded(error) => {
            tracing::error!(%error, "the refund was not recorded");
            ApiError::internal(format!("The refund was not made: {error}"))
        }
    }
}

fn no_such_charge(charge: &str) -> ApiError {
    ApiError::invalid_request(format!("No such charge: '{charge}'"))
        .with_code("resource_missing")
        .with_param("charge")
}

/// `GET /v1/refunds[?charge=ch_..][&limit=N][&starting_after=re_..]`:
/// Stripe's list, newest first, a page at a time. No faults: they model
/// what happens to money-moving requests.
pub(crate) async fn list_refunds(
    State(state): State<AppState>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Result<Json<Value>, ApiError> {
    processing::api_key(&headers)?;
    let request = FormParams::parse_query(query.as_deref())?.refund_list_request()?;
    let page = state
        .ledger
        .refund_page(
            request.charge.as_deref(),
            request.created,
            request.limit,
            request.starting_after.as_deref(),
        )
        .map_err(|refusal| match refusal {
            ListRefusal::NoSuchCharge => {
                no_such_charge(request.charge.as_deref().unwrap_or_default())
            }
            ListRefusal::NotInList => ApiError::invalid_request(format!(
                "No such refund: '{}'",
                request.starting_after.as_deref().unwrap_or_default()
            ))
            .with_code("resource_missing")
            .with_param("starting_after"),
        })?;
    let mut data = json!(page.data);
    if state.config().nulls_in_refund_lists
        && let Some(refunds) = data.as_array_mut()
    {
        for refund in refunds {
            if refund["metadata"] == json!({}) {
                refund["metadata"] = Value::Null;
                refund["status"] = Value::Null;
            }
        }
    }
    Ok(Json(json!({
        "object": "list",
        "data": data,
        "has_more": page.has_more,
        "url": "/v1/refunds",
    })))
}

/// `GET /v1/refunds/{id}`: Stripe's refund as it stands now (a pending one
/// shows its final status once settled). No faults, like the list.
pub(crate) async fn retrieve_refund(
    State(state): State<AppState>,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<Refund>, ApiError> {
    processing::api_key(&headers)?;
    let id = processing::path_id(path)?;
    state
        .ledger
        .refund_by_id(&id)
        .map(Json)
        .ok_or_else(|| no_such_refund(&id))
}

fn no_such_refund(id: &str) -> ApiError {
    ApiError::not_found(format!("No such refund: '{id}'"))
        .with_code("resource_missing")
        .with_param("id")
}

/// The body of `POST /_sandbox/refunds/{id}`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Settlement {
    /// `succeeded`, `failed` or `canceled`.
    status: RefundStatus,
    /// A failed refund's `failure_reason` (default `unknown`).
    #[serde(default)]
    failure_reason: Option<String>,
}

/// `POST /_sandbox/refunds/{id}` with `{"status": "succeeded" | "failed" |
/// "canceled", "failure_reason"?: ".."}`: settles a `pending` or
/// `requires_action` refund as the provider later would (Stripe's test
/// helpers), or fails a `succeeded` one (Stripe's refund that fails days
/// later, e.g. `expired_or_canceled_card`; not a hold's release). A failed
/// or canceled refund gives its amount back to the charge (`refunded`
/// false again). The refund's idempotent answer is left as it was. Emits
/// `charge.refund.updated`, `refund.updated` and, for a failure,
/// `refund.failed`.
pub(crate) async fn settle_refund(
    State(state): State<AppState>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Refund>, ApiError> {
    let body = body.map_err(|rejection| {
        ApiError::invalid_request(format!("The request body could not be read: {rejection}"))
    })?;
    let settlement: Settlement = serde_json::from_slice(&body).map_err(|error| {
        ApiError::invalid_request(format!("Invalid refund settlement: {error}"))
            .with_param("status")
    })?;
    if settlement.failure_reason.is_some() && settlement.status != RefundStatus::Failed {
        return Err(
            ApiError::invalid_request("failure_reason is only for a refund that failed")
                .with_param("failure_reason"),
        );
    }
    let settled = state
        .ledger
        .settle_refund(&id, settlement.status, settlement.failure_reason)
        .map_err(|refusal| match refusal {
            SettleRefusal::NoSuchRefund => no_such_refund(&id),
            SettleRefusal::AlreadyFinal(status) => ApiError::invalid_request(format!(
                "Refund {id} is already {}.",
                status_name(status)
            ))
            .with_param("status"),
            SettleRefusal::Release => ApiError::invalid_request(format!(
                "Refund {id} released a hold that was never captured: nothing went back to a \
                 card, so it cannot fail."
            ))
            .with_param("status"),
            SettleRefusal::NotFinal(status) => ApiError::invalid_request(format!(
                "A refund is settled as succeeded, failed or canceled, not {}.",
                status_name(status)
            ))
            .with_param("status"),
            SettleRefusal::NotRecorded(error) => {
                ApiError::internal(format!("The refund was not settled: {error}"))
            }
        })?;
    tracing::info!(refund = %settled.id, status = ?settled.status, "refund settled");
    let config = state.config();
    let webhooks = &state.webhooks;
    webhooks.emit(&config, None, "charge.refund.updated", &settled);
    webhooks.emit(&config, None, "refund.updated", &settled);
    if settled.status == RefundStatus::Failed {
        webhooks.emit(&config, None, "refund.failed", &settled);
    }
    Ok(Json(settled))
}

/// The body of `POST /_sandbox/charges/{id}/refunds`; every field
/// optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct DashboardRefund {
    /// Minor units; default: what is left.
    amount: Option<u64>,
    /// One of Stripe's [`REFUND_REASONS`].
    reason: Option<String>,
    /// Default: the config's `refund_status`, as for any new refund.
    status: Option<RefundStatus>,
}

/// `POST /_sandbox/charges/{id}/refunds` with `{"amount"?: N, "reason"?:
/// "requested_by_customer" | "duplicate" | "fraudulent", "status"?:
/// "succeeded" | "pending" | ..}`: a refund made in the provider's
/// dashboard, through the ledger's same path as `POST /v1/refunds` (the
/// same checks, the same ledger file lines) but with no metadata and no
/// idempotency key, so the payments API cannot tell it for one of its own.
/// No faults. Answers the refund; emits the events of a refund made.
pub(crate) async fn dashboard_refund(
    State(state): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Refund>, ApiError> {
    let charge = processing::path_id(path)?;
    let body: DashboardRefund = json_body(body, Some(DashboardRefund::default()), "refund")?;
    if body.amount == Some(0) {
        return Err(
            ApiError::invalid_request("This value must be greater than or equal to 1.")
                .with_code("parameter_invalid_integer")
                .with_param("amount"),
        );
    }
    let reason = match body.reason.as_deref() {
        None => None,
        Some(reason) => Some(
            REFUND_REASONS
                .into_iter()
                .find(|known| *known == reason)
                .ok_or_else(|| {
                    ApiError::invalid_request(format!(
                        "Invalid reason: must be one of {}; got {reason}",
                        REFUND_REASONS.join(", ")
                    ))
                    .with_code("parameter_invalid_string")
                    .with_param("reason")
                })?,
        ),
    };
    let config = state.config();
    let request = RefundRequest {
        charge: charge.clone(),
        amount: body.amount,
        reason,
        metadata: Default::default(),
        currency: None,
    };
    let made = state
        .ledger
        .refund(request, None, body.status.unwrap_or(config.refund_status))
        .map_err(|refusal| match refusal {
            RefundRefusal::NoSuchCharge => charges::no_such_charge(&charge),
            refusal => refusal_error(&charge, refusal),
        })?;
    tracing::info!(
        refund = %made.refund.id,
        charge = %charge,
        amount = made.refund.amount,
        status = ?made.refund.status,
        "dashboard refund made"
    );
    emit_made(&state, &config, None, &made);
    Ok(Json(made.refund))
}

/// A status as it is spelled on the wire.
fn status_name(status: RefundStatus) -> String {
    serde_json::to_value(status)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| format!("{status:?}"))
}
