//! The path every `POST /v1/*` endpoint shares (charges, refunds and
//! captures): authentication, the idempotency decision, and the processing
//! with the configured faults. An endpoint supplies only its own work, an
//! [`Operation`], and, for a route on one object
//! (`/v1/charges/{id}/capture`), that object's id.
//!
//! The processing (latency, faults, the operation, storing the answer) runs
//! in a spawned task that the handler awaits. hyper drops a handler's future
//! when the client disconnects; the spawned task is not dropped with it, so a
//! slow charge, refund or capture still completes and is stored after the
//! caller gave up, as at a real provider. That is what makes a client-side
//! timeout dangerous, and what the payments API must cope with.

use std::time::Duration;

use axum::Extension;
use axum::body::Bytes;
use axum::extract::Path;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use rand::Rng;
use rand::distr::Bernoulli;

use crate::config::SandboxConfig;
use crate::error::ApiError;
use crate::idempotency::{Claim, Decision, MAX_KEY_LEN, ScopedKey};
use crate::params::FormParams;
use crate::response::StoredResponse;
use crate::server::ConnectionControl;
use crate::state::AppState;

/// What one endpoint does once a request got past the key and the faults.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Operation {
    /// The route, hashed into the idempotency fingerprint with the
    /// object's id in place of `{id}`: a key first used on another endpoint,
    /// or on another object's, is a parameter mismatch, as at Stripe.
    pub(crate) path: &'static str,
    /// What it makes, for logs and messages: `charge`, `refund`, `capture`.
    pub(crate) object: &'static str,
    /// Validates the parameters and applies them to the ledger, recording
    /// the idempotency key with what it made, and makes the events of what
    /// it did (sent in the background). Returns the final answer (stored
    /// under the key) and whether something was recorded: only then does
    /// `drop_after_charge` close the connection. The request's config says
    /// how (a refund's `refund_status`, a hold's expiry, the answer
    /// overrides, where webhooks go).
    pub(crate) apply: fn(&AppState, &SandboxConfig, &Call<'_>) -> (StoredResponse, bool),
}

/// What one request asks of its [`Operation`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Call<'a> {
    /// The form parameters, not yet validated.
    pub(crate) params: &'a FormParams,
    /// The `{id}` of a route on one object; `None` on the others.
    pub(crate) object_id: Option<&'a str>,
    /// The idempotency key, recorded with what the request makes.
    pub(crate) key: Option<&'a str>,
}

/// How a processed request ends.
#[derive(Debug)]
enum Outcome {
    /// Send this answer.
    Respond(StoredResponse),
    /// Send a stored answer again, marked as a replay.
    Replay(StoredResponse),
    /// `hang`: never answer.
    Hang,
    /// `drop_after_charge`: the charge or refund is made and stored; close
    /// the connection without answering.
    CloseConnection,
}

/// The body of every `POST /v1/*` handler; `object_id` is the `{id}` of a
/// route on one object. Counts the request as in flight for as long as it
/// runs, including when it is cancelled because the client went away.
pub(crate) async fn serve(
    state: AppState,
    connection: Option<Extension<ConnectionControl>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
    operation: Operation,
    object_id: Option<String>,
) -> Response {
    let _in_flight = state.ledger.begin_request();
    match handle(&state, &headers, body, operation, object_id).await {
        Ok(Outcome::Respond(response)) => response.into_response(),
        Ok(Outcome::Replay(response)) => response.replayed(),
        Ok(Outcome::Hang) => std::future::pending().await,
        Ok(Outcome::CloseConnection) => match connection {
            Some(Extension(connection)) => {
                connection.close_without_response();
                std::future::pending().await
            }
            // Only `server::serve` runs this router, and it always inserts
            // the control; say so rather than answering normally.
            None => {
                tracing::error!("drop_after_charge without connection control");
                ApiError::internal("The sandbox cannot drop this connection.").into_response()
            }
        },
        Err(error) => error.into_response(),
    }
}

async fn handle(
    state: &AppState,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    operation: Operation,
    object_id: Option<String>,
) -> Result<Outcome, ApiError> {
    let api_key = api_key(headers)?;
    let key = idempotency_key(headers)?;
    let body = body.map_err(|rejection| {
        ApiError::invalid_request(format!("The request body could not be read: {rejection}"))
    })?;
    let params = FormParams::parse(&body)?;

    let config = state.config();
    // Stripe's rate limiter answers before the idempotency layer: nothing
    // is done, nothing is saved, and a retry with the key is processed.
    if injected_error(config.rate_limit_rate) {
        tracing::warn!(
            object = operation.object,
            "fault injection: answering 429, nothing done or saved"
        );
        return Err(ApiError::rate_limited());
    }
    let claim = match key {
        None => None,
        Some(key) => match state.keys.begin(
            ScopedKey::new(&api_key, key),
            params.fingerprint(&endpoint(operation.path, object_id.as_deref())),
            config.key_retention(),
        ) {
            Decision::Process(claim) => Some(claim),
            Decision::Replay(response) => return Ok(Outcome::Replay(response)),
            Decision::InProgress => return Err(ApiError::idempotency_in_progress()),
            Decision::Mismatch => return Err(ApiError::idempotency_mismatch()),
        },
    };

    let task = tokio::spawn(process(
        state.clone(),
        config,
        params,
        object_id,
        claim,
        operation,
    ));
    task.await.map_err(|error| {
        // The task panicked; its claim was dropped while unwinding, so the
        // key is free again.
        tracing::error!(%error, object = operation.object, "processing failed");
        ApiError::internal(format!(
            "An error occurred while processing the {}.",
            operation.object
        ))
    })
}

/// The route as the fingerprint hashes it: `path` with `object_id` in
/// place of `{id}`.
fn endpoint(path: &str, object_id: Option<&str>) -> String {
    match object_id {
        Some(id) => path.replace("{id}", id),
        None => path.to_owned(),
    }
}

/// Latency, then the faults in order, then the operation. Owns the claim:
/// any way out that does not complete it releases the key.
async fn process(
    state: AppState,
    config: SandboxConfig,
    params: FormParams,
    object_id: Option<String>,
    claim: Option<Claim>,
    operation: Operation,
) -> Outcome {
    let object = operation.object;
    if config.latency_ms > 0 {
        tokio::time::sleep(Duration::from_millis(config.latency_ms)).await;
    }
    if config.hang {
        tracing::warn!(object, "fault injection: hanging, nothing done");
        return Outcome::Hang;
    }
    if injected_error(config.error_rate) {
        tracing::warn!(
            object,
            "fault injection: answering 500, nothing done; saved under the key"
        );
        // Stripe saves the answer of a request whose processing began, a
        // 500 included, and replays it to every retry with the key.
        let response =
            ApiError::internal("An unexpected error occurred (injected by payments-sandbox).")
                .to_stored();
        if let Some(claim) = claim {
            claim.complete(response.clone());
        }
        return Outcome::Respond(response);
    }
    let call = Call {
        params: &params,
        object_id: object_id.as_deref(),
        key: claim.as_ref().map(Claim::key),
    };
    let (response, recorded) = (operation.apply)(&state, &config, &call);
    if let Some(claim) = claim {
        claim.complete(response.clone());
    }
    if recorded && config.drop_after_charge {
        tracing::warn!(object, "fault injection: recorded, dropping the connection");
        Outcome::CloseConnection
    } else {
        Outcome::Respond(response)
    }
}

/// A draw that comes true with probability `rate`.
pub(crate) fn injected_error(rate: f64) -> bool {
    // The rate was validated; an invalid one injects nothing rather than
    // panicking.
    rate > 0.0 && Bernoulli::new(rate).is_ok_and(|coin| rand::rng().sample(coin))
}

/// The secret key from `Authorization: Bearer <key>`; any non-empty key works.
pub(crate) fn api_key(headers: &HeaderMap) -> Result<String, ApiError> {
    let unauthorized = || {
        ApiError::unauthorized(
            "You did not provide an API key. Provide it in the Authorization header \
             using Bearer auth (e.g. 'Authorization: Bearer sk_test_...').",
        )
    };
    let value = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .ok_or_else(unauthorized)?;
    let (scheme, key) = value.trim().split_once(' ').ok_or_else(unauthorized)?;
    let key = key.trim();
    if !scheme.eq_ignore_ascii_case("bearer") || key.is_empty() {
        return Err(unauthorized());
    }
    Ok(key.to_owned())
}

/// The `{id}` of a route on one object, or Stripe's 400 envelope (not
/// axum's plain-text rejection) when the path does not decode.
pub(crate) fn path_id(path: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    path.map(|Path(id)| id).map_err(|rejection| {
        ApiError::invalid_request(format!("Invalid URL: {}", rejection.body_text()))
            .with_param("id")
    })
}

/// The optional `Idempotency-Key` header: one line, 1-255 visible characters.
fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let mut values = headers.get_all("idempotency-key").iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    let invalid = |message: &str| ApiError::invalid_request(message).with_param("Idempotency-Key");
    if values.next().is_some() {
        return Err(invalid("Send at most one Idempotency-Key header."));
    }
    let key = value
        .to_str()
        .map_err(|_| invalid("Idempotency keys must be visible ASCII characters."))?
        .trim();
    if key.is_empty() {
        return Err(invalid("Idempotency keys cannot be empty."));
    }
    if key.len() > MAX_KEY_LEN {
        return Err(invalid(
            "Keys for idempotent requests can be no longer than 255 characters.",
        ));
    }
    Ok(Some(key.to_owned()))
}
