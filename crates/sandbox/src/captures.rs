//! `POST /v1/charges/{id}/capture`: Stripe's capture of a hold (a charge
//! made with `capture=false`), whole or in part, the rest released. It
//! takes the shared path in `processing` (key, faults), like a charge; the
//! capture itself is one critical section in the ledger, so of concurrent
//! captures of one hold exactly one is made. `GET /_sandbox/captures` lists
//! the captures made.

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::{Value, json};

use crate::charges::no_such_charge;
use crate::config::SandboxConfig;
use crate::error::ApiError;
use crate::ledger::CaptureRefusal;
use crate::processing::{self, Call, Operation};
use crate::response::StoredResponse;
use crate::server::ConnectionControl;
use crate::state::AppState;

const CAPTURES: Operation = Operation {
    path: "/v1/charges/{id}/capture",
    object: "capture",
    apply: capture,
};

/// The handler.
pub(crate) async fn capture_charge(
    State(state): State<AppState>,
    connection: Option<Extension<ConnectionControl>>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match processing::path_id(path) {
        Ok(id) => processing::serve(state, connection, headers, body, CAPTURES, Some(id)).await,
        Err(error) => error.into_response(),
    }
}

/// Validates and captures (`answer_amount_override` is what is captured,
/// if set), then makes its event, `charge.captured`. Returns the final
/// answer, the charge as it stands after, and whether a capture was
/// recorded; a refusal records nothing, so it is answered even under
/// `drop_after_charge`.
fn capture(state: &AppState, config: &SandboxConfig, call: &Call<'_>) -> (StoredResponse, bool) {
    let Some(id) = call.object_id else {
        // The route always has an id; say so rather than capture nothing.
        tracing::error!("a capture without a charge id");
        return (
            ApiError::internal("The sandbox lost the charge id of this capture.").to_stored(),
            false,
        );
    };
    let mut request = match call.params.capture_request() {
        Ok(request) => request,
        Err(error) => return (error.to_stored(), false),
    };
    if let Some(amount) = config.answer_amount_override {
        request.amount = Some(amount);
    }
    match state
        .ledger
        .capture(id, request, call.key.map(str::to_owned))
    {
        Ok(charge) => {
            tracing::debug!(
                charge = %charge.id,
                amount_captured = charge.amount_captured,
                amount_refunded = charge.amount_refunded,
                idempotency_key = call.key,
                "capture made"
            );
            state
                .webhooks
                .emit(config, call.key, "charge.captured", &charge);
            (StoredResponse::json(StatusCode::OK, &charge), true)
        }
        Err(refusal) => (refusal_error(id, refusal).to_stored(), false),
    }
}

/// Stripe's errors for a capture the charge cannot take.
fn refusal_error(id: &str, refusal: CaptureRefusal) -> ApiError {
    match refusal {
        CaptureRefusal::NoSuchCharge => no_such_charge(id),
        // Stripe has no single code for this; the sandbox names it.
        CaptureRefusal::ChargeFailed => {
            ApiError::invalid_request("This charge failed and cannot be captured")
                .with_code("charge_not_capturable")
        }
        CaptureRefusal::AlreadyCaptured => {
            ApiError::invalid_request(format!("Charge {id} has already been captured."))
                .with_code("charge_already_captured")
        }
        CaptureRefusal::AlreadyRefunded => ApiError::invalid_request(format!(
            "Charge {id} has already been refunded: its hold was released."
        ))
        .with_code("charge_already_refunded"),
        CaptureRefusal::Expired => ApiError::invalid_request(format!(
            "Charge {id} has expired for capture: its hold was released uncaptured."
        ))
        .with_code("charge_expired_for_capture"),
        // Amounts in minor units, the unit of the `amount` parameter.
        CaptureRefusal::TooLarge { requested, held } => ApiError::invalid_request(format!(
            "Amount to capture ({requested}) is greater than the amount of the charge ({held})."
        ))
        .with_code("amount_too_large")
        .with_param("amount"),
        CaptureRefusal::NotRecorded(error) => {
            tracing::error!(%error, "the capture was not recorded");
            ApiError::internal(format!("The capture was not made: {error}"))
        }
    }
}

/// `GET /_sandbox/captures`: every capture made, oldest first (a replay
/// under the same key is not another).
pub(crate) async fn list_captures(State(state): State<AppState>) -> Json<Value> {
    Json(json!({ "data": state.ledger.captures() }))
}
