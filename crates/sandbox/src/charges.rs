//! `POST /v1/charges`: the charge itself (captured at once, or a hold with
//! `capture=false`, captured later through `captures`). Authentication, the
//! idempotency decision and the faults are the shared path in `processing`.
//! `GET /v1/charges`: Stripe's charge list, which (unlike its Search) shows
//! a charge as soon as it is made.

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::{Extension, Json};
use serde_json::{Value, json};

use crate::config::SandboxConfig;
use crate::error::ApiError;
use crate::ledger::{Charge, HoldTerms, NoSuchCharge};
use crate::network::{self, Authorization};
use crate::params::FormParams;
use crate::processing::{self, Call, Operation};
use crate::response::StoredResponse;
use crate::server::ConnectionControl;
use crate::state::AppState;

const CHARGES: Operation = Operation {
    path: "/v1/charges",
    object: "charge",
    apply: charge,
};

/// The handler.
pub(crate) async fn create_charge(
    State(state): State<AppState>,
    connection: Option<Extension<ConnectionControl>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    processing::serve(state, connection, headers, body, CHARGES, None).await
}

/// `GET /v1/charges[?created[gte]=..&created[lte]=..][&limit=N]
/// [&starting_after=ch_..]`: Stripe's list, newest first, paged by
/// `starting_after` and `has_more`. No faults and no search lag.
pub(crate) async fn list_charges(
    State(state): State<AppState>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Result<Json<Value>, ApiError> {
    processing::api_key(&headers)?;
    let request = FormParams::parse_query(query.as_deref())?.charge_list_request()?;
    let after = request.starting_after.as_deref();
    let page = state
        .ledger
        .charge_page(request.created, after, request.limit)
        .map_err(|NoSuchCharge| {
            ApiError::invalid_request(format!("No such charge: '{}'", after.unwrap_or_default()))
                .with_code("resource_missing")
                .with_param("starting_after")
        })?;
    Ok(Json(json!({
        "object": "list",
        "data": page.data,
        "has_more": page.has_more,
        "url": "/v1/charges",
    })))
}

/// `GET /v1/charges/{id}`: the charge as it is now (refunds, capture and a
/// hold's lapse included), as Stripe's retrieve answers it. No faults.
pub(crate) async fn retrieve_charge(
    State(state): State<AppState>,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<Charge>, ApiError> {
    processing::api_key(&headers)?;
    let id = processing::path_id(path)?;
    state
        .ledger
        .charge_by_id(&id)
        .map(Json)
        .ok_or_else(|| no_such_charge(&id))
}

/// 404 `resource_missing` for a charge id in the path that is no charge.
pub(crate) fn no_such_charge(id: &str) -> ApiError {
    ApiError::not_found(format!("No such charge: '{id}'"))
        .with_code("resource_missing")
        .with_param("id")
}

/// Validates, asks the network and records the charge (with the config's
/// answer overrides; a hold on the config's terms), then makes its event:
/// `charge.succeeded` (a hold too, `captured: false`, as at Stripe) or
/// `charge.failed`. Returns the final answer and whether a charge was
/// recorded.
fn charge(state: &AppState, config: &SandboxConfig, call: &Call<'_>) -> (StoredResponse, bool) {
    let key = call.key;
    let mut request = match call.params.charge_request() {
        Ok(request) => request,
        Err(error) => return (error.to_stored(), false),
    };
    if let Some(amount) = config.answer_amount_override {
        request.amount = amount;
    }
    if let Some(currency) = &config.answer_currency_override {
        request.currency = currency.to_ascii_lowercase();
    }
    let Some(authorization) = network::authorize(&request.source) else {
        let error = ApiError::invalid_request(format!("No such token: '{}'", request.source))
            .with_code("resource_missing")
            .with_param("source");
        return (error.to_stored(), false);
    };
    let decline = match authorization {
        Authorization::Approved => None,
        Authorization::Declined(decline) => Some(decline),
    };
    let charge = Charge::new(request, decline, HoldTerms::of(config));
    // Debug: at load one line per charge would cost more than the charge;
    // `GET /_sandbox/charges` lists them all.
    tracing::debug!(
        charge = %charge.id,
        amount = charge.amount,
        currency = %charge.currency,
        status = ?charge.status,
        captured = charge.captured,
        idempotency_key = key,
        "charge made"
    );
    let response = match decline {
        None => StoredResponse::json(StatusCode::OK, &charge),
        Some(decline) => ApiError::card_declined(
            decline.code,
            decline.decline_code,
            decline.message,
            charge.id.clone(),
        )
        .to_stored(),
    };
    // A copy only for the event: a load run without webhooks makes none.
    let made = state.webhooks.on(config).then(|| charge.clone());
    if let Err(error) = state.ledger.record(charge, key.map(str::to_owned)) {
        tracing::error!(%error, "the charge was not recorded");
        let error = ApiError::internal(format!("The charge was not made: {error}"));
        return (error.to_stored(), false);
    }
    if let Some(made) = made {
        let kind = match decline {
            None => "charge.succeeded",
            Some(_) => "charge.failed",
        };
        state.webhooks.emit(config, key, kind, &made);
    }
    (response, true)
}
