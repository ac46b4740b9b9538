//! # payments-gateway
//!
//! The provider adapter: a reqwest client speaking a Stripe-compatible
//! subset of the provider's API behind the domain's [`Gateway`] port.
//!
//! # Layout
//!
//! - [`HttpGateway`]: builds the form-encoded `POST /v1/charges` with the
//!   derived `Idempotency-Key`, under a timeout.
//! - `wire`: the provider's JSON shapes, private to this crate.
//! - [`classify`]: every provider answer becomes success, decline (final) or
//!   unknown outcome. Only an answer that proves what happened is final.
#![forbid(unsafe_code)]

use std::time::Duration;

use async_trait::async_trait;
use payments_domain::provider::{Gateway, ProviderChargeRequest, ProviderOutcome};
use secrecy::{ExposeSecret, SecretString};

/// The provider calls' latency and outcomes, by `outcome` (metric names, with
/// the others in `payments_api::telemetry`).
pub const PROVIDER_REQUEST_DURATION_SECONDS: &str = "payments_provider_request_duration_seconds";
pub const PROVIDER_OUTCOMES_TOTAL: &str = "payments_provider_outcomes_total";

mod wire {
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    pub struct Charge {
        pub id: String,
        pub status: String,
    }

    #[derive(Debug, Deserialize)]
    pub struct ErrorEnvelope {
        pub error: Error,
    }

    #[derive(Debug, Deserialize)]
    pub struct Error {
        #[serde(rename = "type")]
        pub kind: Option<String>,
        pub code: Option<String>,
        pub decline_code: Option<String>,
        pub message: Option<String>,
        pub charge: Option<String>,
    }
}

/// The provider over HTTP.
#[derive(Debug, Clone)]
pub struct HttpGateway {
    client: reqwest::Client,
    charges_url: String,
    secret_key: SecretString,
}

impl HttpGateway {
    /// `base_url` is the provider's root (`https://api.stripe.com`), `timeout`
    /// bounds the whole call; the lease must outlast it.
    pub fn new(
        base_url: &str,
        secret_key: &str,
        timeout: Duration,
    ) -> Result<Self, reqwest::Error> {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(5)))
            .user_agent(concat!("payments/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(Self {
            client,
            charges_url: format!("{}/v1/charges", base_url.trim_end_matches('/')),
            secret_key: secret_key.into(),
        })
    }
}

/// The form body: `amount`, lower-case `currency`, `source`, `description`,
/// `metadata[k]`.
fn form(request: &ProviderChargeRequest) -> Vec<(String, String)> {
    let mut form = vec![
        ("amount".to_owned(), request.amount_cents.to_string()),
        ("currency".to_owned(), request.currency.to_ascii_lowercase()),
        ("source".to_owned(), request.card_token.clone()),
    ];
    if let Some(d) = &request.description {
        form.push(("description".to_owned(), d.clone()));
    }
    for (k, v) in &request.metadata {
        form.push((format!("metadata[{k}]"), v.clone()));
    }
    form
}

#[async_trait]
impl Gateway for HttpGateway {
    async fn create_charge(&self, request: &ProviderChargeRequest) -> ProviderOutcome {
        let started = std::time::Instant::now();
        let sent = self
            .client
            .post(&self.charges_url)
            .bearer_auth(self.secret_key.expose_secret())
            .header("Idempotency-Key", &request.idempotency_key)
            .form(&form(request))
            .send()
            .await;
        let outcome = match sent {
            Ok(response) => {
                let status = response.status().as_u16();
                match response.bytes().await {
                    Ok(body) => classify(status, &body),
                    Err(e) => ProviderOutcome::Unknown {
                        reason: format!("reading the provider's {status} answer failed: {e}"),
                    },
                }
            }
            Err(e) if e.is_timeout() => ProviderOutcome::Unknown {
                reason: format!("provider timed out: {e}"),
            },
            Err(e) => ProviderOutcome::Unknown {
                reason: format!("provider unreachable: {e}"),
            },
        };
        let label = match &outcome {
            ProviderOutcome::Succeeded { .. } => "succeeded",
            ProviderOutcome::Declined { .. } => "declined",
            ProviderOutcome::Unknown { .. } => "unknown",
        };
        let elapsed = started.elapsed();
        metrics::histogram!(PROVIDER_REQUEST_DURATION_SECONDS, "outcome" => label)
            .record(elapsed.as_secs_f64());
        metrics::counter!(PROVIDER_OUTCOMES_TOTAL, "outcome" => label).increment(1);
        tracing::info!(
            provider_key = %request.idempotency_key,
            elapsed_ms = elapsed.as_millis() as u64,
            outcome = label,
            "provider call"
        );
        outcome
    }
}

/// Classifies one provider answer. Only a 200 charge object that says
/// `succeeded` and a 402 card error are final; an idempotency conflict (409:
/// our own earlier call is still running there; 400: a parameter mismatch),
/// a rate limit, a 5xx or anything unparseable leaves the outcome unknown,
/// and the call is re-driven later under the same key.
pub fn classify(status: u16, body: &[u8]) -> ProviderOutcome {
    match status {
        200 => match serde_json::from_slice::<wire::Charge>(body) {
            Ok(c) if c.status == "succeeded" => ProviderOutcome::Succeeded {
                provider_charge_id: c.id,
            },
            Ok(c) => ProviderOutcome::Unknown {
                reason: format!("provider charge {} is {:?}, not final", c.id, c.status),
            },
            Err(e) => ProviderOutcome::Unknown {
                reason: format!("unparseable provider charge: {e}"),
            },
        },
        402 => declined(serde_json::from_slice::<wire::ErrorEnvelope>(body).ok()),
        // A request error (an unknown card token, an amount below the
        // provider's minimum) proves nothing was charged, and retrying the
        // same call gets the same answer: final, like a decline. An
        // idempotency error is not: it is about our own earlier call.
        400 => match serde_json::from_slice::<wire::ErrorEnvelope>(body) {
            Ok(e) if e.error.kind.as_deref() == Some("invalid_request_error") => declined(Some(e)),
            _ => ProviderOutcome::Unknown {
                reason: format!("provider answered 400: {}", String::from_utf8_lossy(body)),
            },
        },
        _ => {
            let detail = serde_json::from_slice::<wire::ErrorEnvelope>(body)
                .ok()
                .map(|e| {
                    format!(
                        "{}: {}",
                        e.error.kind.unwrap_or_default(),
                        e.error.message.unwrap_or_default()
                    )
                })
                .unwrap_or_default();
            ProviderOutcome::Unknown {
                reason: format!("provider answered {status} {detail}"),
            }
        }
    }
}

/// A final refusal: the provider's code, decline code and message.
fn declined(envelope: Option<wire::ErrorEnvelope>) -> ProviderOutcome {
    let error = envelope.map(|e| e.error);
    let (code, decline_code, message, charge) = match error {
        Some(e) => (e.code, e.decline_code, e.message, e.charge),
        None => (None, None, None, None),
    };
    ProviderOutcome::Declined {
        code: code.unwrap_or_else(|| "card_declined".to_owned()),
        decline_code,
        message: message.unwrap_or_else(|| "Your card was declined.".to_owned()),
        provider_charge_id: charge,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_every_kind_of_answer() {
        assert_eq!(
            classify(200, br#"{"id":"ch_1","status":"succeeded"}"#),
            ProviderOutcome::Succeeded {
                provider_charge_id: "ch_1".to_owned()
            }
        );
        let declined = classify(
            402,
            br#"{"error":{"type":"card_error","code":"card_declined","decline_code":"insufficient_funds","message":"no","charge":"ch_2"}}"#,
        );
        assert_eq!(
            declined,
            ProviderOutcome::Declined {
                code: "card_declined".to_owned(),
                decline_code: Some("insufficient_funds".to_owned()),
                message: "no".to_owned(),
                provider_charge_id: Some("ch_2".to_owned()),
            }
        );
        for (status, body) in [
            (200, &b"not json"[..]),
            (200, br#"{"id":"ch_3","status":"pending"}"#),
            (
                409,
                br#"{"error":{"type":"idempotency_error","message":"in progress"}}"#,
            ),
            (
                400,
                br#"{"error":{"type":"idempotency_error","message":"mismatch"}}"#,
            ),
            (429, b""),
            (500, b"oops"),
            (503, b""),
        ] {
            assert!(
                matches!(classify(status, body), ProviderOutcome::Unknown { .. }),
                "{status}"
            );
        }
    }

    #[test]
    fn request_errors_are_final() {
        let unknown_token = classify(
            400,
            br#"{"error":{"type":"invalid_request_error","code":"resource_missing","param":"source","message":"No such token: 'tok_x'"}}"#,
        );
        assert_eq!(
            unknown_token,
            ProviderOutcome::Declined {
                code: "resource_missing".to_owned(),
                decline_code: None,
                message: "No such token: 'tok_x'".to_owned(),
                provider_charge_id: None,
            }
        );
    }

    #[test]
    fn form_uses_stripe_names() {
        let request = ProviderChargeRequest {
            idempotency_key: "k".to_owned(),
            amount_cents: 4900,
            currency: "GBP".to_owned(),
            card_token: "tok_visa".to_owned(),
            description: Some("tea".to_owned()),
            metadata: [("order".to_owned(), "42".to_owned())].into(),
        };
        let form = form(&request);
        assert!(form.contains(&("currency".to_owned(), "gbp".to_owned())));
        assert!(form.contains(&("metadata[order]".to_owned(), "42".to_owned())));
        assert!(form.contains(&("amount".to_owned(), "4900".to_owned())));
    }
}
