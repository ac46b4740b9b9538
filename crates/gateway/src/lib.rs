//! # payments-gateway
//!
//! The provider adapter: a reqwest client speaking a Stripe-compatible
//! subset of the provider's API behind the domain's [`Gateway`] port.
//!
//! # Layout
//!
//! - [`HttpGateway`]: builds the form-encoded `POST /v1/charges` and
//!   `POST /v1/refunds` with the derived `Idempotency-Key`, under a timeout;
//!   every call names our operation in `metadata[payments_charge_id]` or
//!   `metadata[payments_refund_id]`, which reconciliation searches by.
//! - `wire`: the provider's JSON shapes, private to this crate.
//! - [`classify`]: every provider answer becomes success, decline (final) or
//!   unknown outcome. Only an answer that proves what happened is final.
#![forbid(unsafe_code)]

use std::time::Duration;

use async_trait::async_trait;
use payments_domain::provider::{
    Doubt, Gateway, Lookup, ProviderChargeRequest, ProviderOutcome, ProviderRefundRequest,
};
use secrecy::{ExposeSecret, SecretString};

/// The provider calls' latency and outcomes, by `outcome` (metric names, with
/// the others in `payments_api::telemetry`).
pub const PROVIDER_REQUEST_DURATION_SECONDS: &str = "payments_provider_request_duration_seconds";
pub const PROVIDER_OUTCOMES_TOTAL: &str = "payments_provider_outcomes_total";

/// The Stripe API version every call pins with `Stripe-Version` (the
/// default of `GATEWAY_STRIPE_VERSION`), so the answers' shapes do not
/// follow the account's default version when someone upgrades it.
pub const DEFAULT_STRIPE_VERSION: &str = "2026-09-30.endive";

mod wire {
    use serde::Deserialize;

    /// A charge or a refund object: its id and status (a refund's
    /// `failure_reason`, a charge's `failure_code`, when it failed) and
    /// metadata.
    #[derive(Debug, Deserialize)]
    pub struct Object {
        pub id: String,
        pub status: String,
        pub failure_reason: Option<String>,
        pub failure_code: Option<String>,
        #[serde(default)]
        pub metadata: std::collections::BTreeMap<String, String>,
    }

    /// A search result or a list.
    #[derive(Debug, Deserialize)]
    pub struct Page {
        pub data: Vec<Object>,
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
    base_url: String,
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
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(
            "stripe-version",
            reqwest::header::HeaderValue::from_static(DEFAULT_STRIPE_VERSION),
        );
        Self::build(base_url, secret_key, timeout, headers)
    }

    /// [`HttpGateway::new`], sending `Stripe-Version: {stripe_version}` on
    /// every call, posts and lookups alike. `None` when `stripe_version`
    /// is no Stripe API version (`YYYY-MM-DD`, optionally `.name`).
    pub fn pinned(
        base_url: &str,
        secret_key: &str,
        timeout: Duration,
        stripe_version: &str,
    ) -> Option<Result<Self, reqwest::Error>> {
        let version = reqwest::header::HeaderValue::from_str(stripe_version)
            .ok()
            .filter(|_| is_stripe_version(stripe_version))?;
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert("stripe-version", version);
        Some(Self::build(base_url, secret_key, timeout, headers))
    }

    fn build(
        base_url: &str,
        secret_key: &str,
        timeout: Duration,
        headers: reqwest::header::HeaderMap,
    ) -> Result<Self, reqwest::Error> {
        let client = reqwest::Client::builder().default_headers(headers);
        let client = client
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(5)))
            .user_agent(concat!("payments/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(Self {
            client,
            base_url: base_url.trim_end_matches('/').to_owned(),
            secret_key: secret_key.into(),
        })
    }
}

/// Whether `version` is spelt as Stripe's API versions are: a date,
/// `YYYY-MM-DD`, then optionally `.` and a lower-case release name
/// (`2024-06-20`, `2026-09-30.endive`).
pub fn is_stripe_version(version: &str) -> bool {
    let (date, name) = match version.split_once('.') {
        Some((date, name)) => (date, Some(name)),
        None => (version, None),
    };
    let date_ok = date.len() == 10
        && date.char_indices().all(|(i, c)| match i {
            4 | 7 => c == '-',
            _ => c.is_ascii_digit(),
        });
    let name_ok = name.is_none_or(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_lowercase()));
    date_ok && name_ok
}

/// A charge's form body: `amount`, lower-case `currency`, `source`,
/// `description`, `metadata[k]` and ours, `metadata[payments_charge_id]`
/// (the domain keeps customers' keys out of the `payments_` prefix).
fn charge_form(request: &ProviderChargeRequest) -> Vec<(String, String)> {
    let mut form = vec![
        ("amount".to_owned(), request.amount_cents.to_string()),
        ("currency".to_owned(), request.currency.to_ascii_lowercase()),
        ("source".to_owned(), request.card_token.clone()),
    ];
    if let Some(d) = &request.description {
        form.push(("description".to_owned(), d.clone()));
    }
    with_metadata(form, &request.metadata, ("charge", &request.charge_id))
}

/// A refund's form body: `charge`, `amount`, `reason`, `metadata[k]` and
/// `metadata[payments_refund_id]`.
fn refund_form(request: &ProviderRefundRequest) -> Vec<(String, String)> {
    let mut form = vec![
        ("charge".to_owned(), request.gateway_charge_id.clone()),
        ("amount".to_owned(), request.amount_cents.to_string()),
    ];
    if let Some(reason) = request.reason {
        form.push(("reason".to_owned(), reason.as_str().to_owned()));
    }
    with_metadata(form, &request.metadata, ("refund", &request.refund_id))
}

fn with_metadata(
    mut form: Vec<(String, String)>,
    metadata: &std::collections::BTreeMap<String, String>,
    (what, id): (&str, &str),
) -> Vec<(String, String)> {
    for (k, v) in metadata {
        form.push((format!("metadata[{k}]"), v.clone()));
    }
    form.push((format!("metadata[payments_{what}_id]"), id.to_owned()));
    form
}

#[async_trait]
impl Gateway for HttpGateway {
    async fn create_charge(&self, request: &ProviderChargeRequest) -> ProviderOutcome {
        let form = charge_form(request);
        self.post("charges", &request.idempotency_key, &form).await
    }

    async fn create_refund(&self, request: &ProviderRefundRequest) -> ProviderOutcome {
        let form = refund_form(request);
        self.post("refunds", &request.idempotency_key, &form).await
    }

    async fn find_charge(&self, charge_id: &str) -> Lookup {
        // Our ids are `ch_` and hex: nothing to escape in the query.
        let query = format!("metadata['payments_charge_id']:'{charge_id}'");
        let url = format!("{}/v1/charges/search", self.base_url);
        self.find(&url, &[("query", &query)], ("charge", charge_id))
            .await
    }

    async fn find_refund(&self, gateway_charge_id: &str, refund_id: &str) -> Lookup {
        let url = format!("{}/v1/refunds", self.base_url);
        let query = [("charge", gateway_charge_id), ("limit", "100")];
        self.find(&url, &query, ("refund", refund_id)).await
    }
}

impl HttpGateway {
    /// A GET of a search or a list, and the object whose
    /// `metadata[payments_{what}_id]` is `id`, judged as a final answer.
    async fn find(&self, url: &str, query: &[(&str, &str)], (what, id): (&str, &str)) -> Lookup {
        let mut url = match reqwest::Url::parse(url) {
            Ok(url) => url,
            Err(e) => {
                return Lookup::Unknown {
                    reason: format!("bad provider URL: {e}"),
                };
            }
        };
        url.query_pairs_mut().extend_pairs(query);
        let sent = self
            .client
            .get(url)
            .bearer_auth(self.secret_key.expose_secret())
            .send()
            .await;
        let page = match sent {
            Ok(response) if response.status().is_success() => response.json::<wire::Page>().await,
            Ok(response) => {
                let reason = format!("provider lookup answered {}", response.status());
                return Lookup::Unknown { reason };
            }
            Err(e) => {
                return Lookup::Unknown {
                    reason: format!("provider lookup failed: {e}"),
                };
            }
        };
        let page = match page {
            Ok(page) => page,
            Err(e) => {
                return Lookup::Unknown {
                    reason: format!("unreadable provider page: {e}"),
                };
            }
        };
        let key = format!("payments_{what}_id");
        let ours = page
            .data
            .into_iter()
            .find(|o| o.metadata.get(&key).map(String::as_str) == Some(id));
        match ours {
            None => Lookup::NotFound,
            Some(object) => match object.status.as_str() {
                "succeeded" => Lookup::Found(ProviderOutcome::Succeeded {
                    provider_id: object.id,
                }),
                "failed" => Lookup::Found(ProviderOutcome::Declined {
                    code: object
                        .failure_code
                        .or(object.failure_reason)
                        .unwrap_or_else(|| "failed".to_owned()),
                    decline_code: None,
                    message: format!("the provider's {} failed", object.id),
                    provider_id: Some(object.id),
                }),
                other => Lookup::Unknown {
                    reason: format!("the provider's {} is {other:?}, not final", object.id),
                },
            },
        }
    }

    /// `POST /v1/{what}` under the provider key, classified, timed and logged.
    async fn post(
        &self,
        what: &'static str,
        key: &str,
        form: &[(String, String)],
    ) -> ProviderOutcome {
        let started = std::time::Instant::now();
        let sent = self
            .client
            .post(format!("{}/v1/{what}", self.base_url))
            .bearer_auth(self.secret_key.expose_secret())
            .header("Idempotency-Key", key)
            .form(form)
            .send()
            .await;
        let outcome = match sent {
            Ok(response) => {
                let status = response.status().as_u16();
                let replayed = response
                    .headers()
                    .get("idempotent-replayed")
                    .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"));
                match response.bytes().await {
                    Ok(body) => replayed_error(classify(status, &body), status, replayed),
                    Err(e) => ProviderOutcome::Unknown {
                        doubt: doubt_of(&e),
                        reason: format!("reading the provider's {status} answer failed: {e}"),
                    },
                }
            }
            Err(e) => ProviderOutcome::Unknown {
                doubt: doubt_of(&e),
                // reqwest's Display says only "error sending request"; its
                // Debug carries the kind and the cause (refused, reset, ...).
                reason: format!("provider call failed: {e:?}"),
            },
        };
        let label = match &outcome {
            ProviderOutcome::Succeeded { .. } => "succeeded",
            ProviderOutcome::Declined { .. } => "declined",
            ProviderOutcome::Rejected { .. } => "rejected",
            ProviderOutcome::Unknown {
                doubt: Doubt::KeyRefused,
                ..
            } => "key_refused",
            ProviderOutcome::Unknown {
                doubt: Doubt::ReplayedError,
                ..
            } => "replayed_error",
            ProviderOutcome::Unknown { .. } => "unknown",
        };
        if let ProviderOutcome::Unknown {
            doubt: Doubt::KeyRefused,
            reason,
        } = &outcome
        {
            tracing::error!(
                provider_key = %key,
                call = what,
                %reason,
                "PROVIDER REFUSED OUR SECRET KEY: GATEWAY_SECRET_KEY is wrong, revoked or lacks \
                 a permission; every provider call fails until it is fixed"
            );
        }
        let elapsed = started.elapsed();
        metrics::histogram!(PROVIDER_REQUEST_DURATION_SECONDS, "outcome" => label, "call" => what)
            .record(elapsed.as_secs_f64());
        metrics::counter!(PROVIDER_OUTCOMES_TOTAL, "outcome" => label, "call" => what).increment(1);
        tracing::info!(
            provider_key = %key,
            call = what,
            elapsed_ms = elapsed.as_millis() as u64,
            outcome = label,
            "provider call"
        );
        outcome
    }
}

/// A 5xx the provider replayed from its idempotency store (Stripe saves a
/// 500 under the key and replays it, `Idempotent-Replayed: true`, for the
/// key's retention): no re-drive under this key can learn more.
fn replayed_error(outcome: ProviderOutcome, status: u16, replayed: bool) -> ProviderOutcome {
    match outcome {
        ProviderOutcome::Unknown { reason, .. } if replayed && status >= 500 => {
            ProviderOutcome::Unknown {
                doubt: Doubt::ReplayedError,
                reason: format!("replayed from the provider's idempotency store: {reason}"),
            }
        }
        other => other,
    }
}

/// Why a call that got no whole answer is in doubt: a timeout, a connection
/// that could not be made, or one lost after the request went out.
fn doubt_of(e: &reqwest::Error) -> Doubt {
    if e.is_timeout() {
        Doubt::Timeout
    } else if e.is_connect() {
        Doubt::Unreachable
    } else {
        Doubt::Dropped
    }
}

/// Classifies one provider answer. Only a 200 charge or refund object that
/// says `succeeded` (or, for a refund, `failed`), a 402 card error and a
/// 400 request error are final; an idempotency conflict (409:
/// our own earlier call is still running there; 400: a parameter mismatch),
/// a rate limit, a 5xx or anything unparseable leaves the outcome unknown,
/// and the call is re-driven later under the same key.
pub fn classify(status: u16, body: &[u8]) -> ProviderOutcome {
    match status {
        200 => match serde_json::from_slice::<wire::Object>(body) {
            Ok(o) if o.status == "succeeded" => ProviderOutcome::Succeeded { provider_id: o.id },
            Ok(o) if o.status == "failed" => ProviderOutcome::Declined {
                code: o.failure_reason.unwrap_or_else(|| "failed".to_owned()),
                decline_code: None,
                message: format!("the provider's {} failed", o.id),
                provider_id: Some(o.id),
            },
            // A refund still `pending` at the provider is settled later,
            // by a re-drive or by reconciliation.
            Ok(o) => ProviderOutcome::Unknown {
                doubt: Doubt::ProviderError,
                reason: format!("provider object {} is {:?}, not final", o.id, o.status),
            },
            Err(e) => ProviderOutcome::Unknown {
                doubt: Doubt::ProviderError,
                reason: format!("unparseable provider object: {e}"),
            },
        },
        402 => declined(serde_json::from_slice::<wire::ErrorEnvelope>(body).ok()),
        // Our secret key refused (invalid, revoked, or a restricted key
        // without the permission): a configuration error, answered before
        // the provider looked at the key, so it says nothing of the call.
        401 | 403 => {
            let detail = serde_json::from_slice::<wire::ErrorEnvelope>(body)
                .ok()
                .and_then(|e| e.error.message)
                .unwrap_or_default();
            ProviderOutcome::Unknown {
                doubt: Doubt::KeyRefused,
                reason: format!("provider refused the secret key ({status}): {detail}"),
            }
        }
        // A request error (an unknown card token, an amount below the
        // provider's minimum) proves nothing was charged, and retrying the
        // same call gets the same answer: final, but not a decline, which
        // would tell the customer their card was refused. An idempotency
        // error is not final: it is about our own earlier call.
        400 => match serde_json::from_slice::<wire::ErrorEnvelope>(body) {
            Ok(e) if e.error.kind.as_deref() == Some("invalid_request_error") => {
                ProviderOutcome::Rejected {
                    code: e
                        .error
                        .code
                        .unwrap_or_else(|| "invalid_request_error".to_owned()),
                    message: e
                        .error
                        .message
                        .unwrap_or_else(|| "the request was invalid".to_owned()),
                }
            }
            _ => ProviderOutcome::Unknown {
                doubt: Doubt::ProviderError,
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
                doubt: Doubt::ProviderError,
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
        provider_id: charge,
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
                provider_id: "ch_1".to_owned()
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
                provider_id: Some("ch_2".to_owned()),
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
    fn a_refused_secret_key_is_its_own_doubt() {
        for status in [401, 403] {
            let refused = classify(
                status,
                br#"{"error":{"type":"invalid_request_error","message":"Invalid API Key provided: sk_test_****1234"}}"#,
            );
            assert!(
                matches!(
                    refused,
                    ProviderOutcome::Unknown {
                        doubt: Doubt::KeyRefused,
                        ref reason,
                    } if reason.contains("Invalid API Key")
                ),
                "{status}: {refused:?}"
            );
        }
    }

    #[test]
    fn only_a_replayed_5xx_is_a_replayed_error() {
        let error = || classify(500, br#"{"error":{"type":"api_error","message":"x"}}"#);
        assert!(matches!(
            replayed_error(error(), 500, true),
            ProviderOutcome::Unknown {
                doubt: Doubt::ReplayedError,
                ..
            }
        ));
        assert!(matches!(
            replayed_error(error(), 500, false),
            ProviderOutcome::Unknown {
                doubt: Doubt::ProviderError,
                ..
            }
        ));
        let replayed_success = classify(200, br#"{"id":"ch_1","status":"succeeded"}"#);
        assert!(matches!(
            replayed_error(replayed_success, 200, true),
            ProviderOutcome::Succeeded { .. }
        ));
    }

    #[test]
    fn stripe_versions_are_checked() {
        for ok in [DEFAULT_STRIPE_VERSION, "2024-06-20", "2025-03-31.basil"] {
            assert!(is_stripe_version(ok), "{ok}");
        }
        for bad in [
            "",
            "latest",
            "2024-6-20",
            "2024-06-20.",
            "2024-06-20.Basil",
            "2024-06-20\n",
        ] {
            assert!(!is_stripe_version(bad), "{bad:?}");
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
            ProviderOutcome::Rejected {
                code: "resource_missing".to_owned(),
                message: "No such token: 'tok_x'".to_owned(),
            }
        );
    }

    #[test]
    fn form_uses_stripe_names() {
        let request = ProviderChargeRequest {
            idempotency_key: "k".to_owned(),
            charge_id: "ch_ours".to_owned(),
            amount_cents: 4900,
            currency: "GBP".to_owned(),
            card_token: "tok_visa".to_owned(),
            description: Some("tea".to_owned()),
            metadata: [("order".to_owned(), "42".to_owned())].into(),
        };
        let form = charge_form(&request);
        let has = |k: &str, v: &str| form.contains(&(k.to_owned(), v.to_owned()));
        assert!(has("currency", "gbp"));
        assert!(has("metadata[order]", "42"));
        assert!(has("metadata[payments_charge_id]", "ch_ours"));
        assert!(has("amount", "4900"));
        let refund = ProviderRefundRequest {
            idempotency_key: "k".to_owned(),
            refund_id: "re_ours".to_owned(),
            gateway_charge_id: "ch_theirs".to_owned(),
            amount_cents: 300,
            reason: Some(payments_domain::refund::RefundReason::Duplicate),
            metadata: Default::default(),
        };
        let form = refund_form(&refund);
        let has = |k: &str, v: &str| form.contains(&(k.to_owned(), v.to_owned()));
        assert!(has("charge", "ch_theirs") && has("amount", "300") && has("reason", "duplicate"));
        assert!(has("metadata[payments_refund_id]", "re_ours"));
    }

    #[test]
    fn a_failed_refund_is_final() {
        let failed = classify(
            200,
            br#"{"id":"re_1","object":"refund","status":"failed","failure_reason":"expired_or_canceled_card"}"#,
        );
        assert!(
            matches!(failed, ProviderOutcome::Declined { ref code, .. } if code == "expired_or_canceled_card")
        );
        let pending = classify(
            200,
            br#"{"id":"re_2","object":"refund","status":"pending"}"#,
        );
        assert!(matches!(pending, ProviderOutcome::Unknown { .. }));
    }
}
