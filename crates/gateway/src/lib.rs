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
    CreatedWindow, Doubt, Gateway, Lookup, ProviderChargeRequest, ProviderOutcome,
    ProviderRefundRequest,
};
use secrecy::{ExposeSecret, SecretString};

/// The provider calls' latency and outcomes, by `outcome` (metric names, with
/// the others in `payments_api::telemetry`).
pub const PROVIDER_REQUEST_DURATION_SECONDS: &str = "payments_provider_request_duration_seconds";
pub const PROVIDER_OUTCOMES_TOTAL: &str = "payments_provider_outcomes_total";

mod wire {
    use serde::Deserialize;

    /// A charge or a refund object: its id and status (a refund's
    /// `failure_reason`, a charge's `failure_code`, when it failed) and
    /// metadata.
    #[derive(Debug, Deserialize)]
    pub struct Object {
        pub id: String,
        /// What it is: `charge`, `refund` (Stripe names every object).
        #[serde(default)]
        pub object: Option<String>,
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

    /// A page of `GET /v1/charges`, and whether more follow it.
    #[derive(Debug, Deserialize)]
    pub struct ChargeList {
        pub data: Vec<Object>,
        pub has_more: bool,
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
        let client = reqwest::Client::builder()
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

    async fn find_charge_listed(&self, charge_id: &str, created: CreatedWindow) -> Lookup {
        self.list_charges_for(charge_id, created).await
    }

    async fn find_refund(&self, gateway_charge_id: &str, refund_id: &str) -> Lookup {
        let url = format!("{}/v1/refunds", self.base_url);
        let query = [("charge", gateway_charge_id), ("limit", "100")];
        self.find(&url, &query, ("refund", refund_id)).await
    }

    async fn retrieve_refund(&self, gateway_refund_id: &str) -> Lookup {
        // The provider's id goes into the path: only a plain one.
        let plain = |c: char| c.is_ascii_alphanumeric() || c == '_';
        if gateway_refund_id.is_empty() || !gateway_refund_id.chars().all(plain) {
            return Lookup::Unknown {
                reason: format!("not a provider refund id: {gateway_refund_id:?}"),
            };
        }
        let url = format!("{}/v1/refunds/{gateway_refund_id}", self.base_url);
        let sent = self
            .client
            .get(url)
            .bearer_auth(self.secret_key.expose_secret())
            .send()
            .await;
        let response = match sent {
            Ok(response) => response,
            Err(e) => {
                return Lookup::Unknown {
                    reason: format!("provider lookup failed: {e}"),
                };
            }
        };
        let status = response.status();
        if status == reqwest::StatusCode::NOT_FOUND {
            return Lookup::NotFound;
        }
        if !status.is_success() {
            let reason = format!("provider lookup answered {status}");
            return Lookup::Unknown { reason };
        }
        let body = match response.bytes().await {
            Ok(body) => body,
            Err(e) => {
                return Lookup::Unknown {
                    reason: format!("reading the provider's refund failed: {e}"),
                };
            }
        };
        // The object is judged as the answer to the refund's creation is.
        match classify(200, &body) {
            ProviderOutcome::Unknown { reason, .. } => Lookup::Unknown { reason },
            found => Lookup::Found(found),
        }
    }
}

/// The most pages of `GET /v1/charges` one confirmation reads (100,000
/// charges): past it the read is incomplete, and nothing is concluded.
pub const MAX_LIST_PAGES: usize = 1000;

impl HttpGateway {
    /// Our charge in the provider's charge list: every page of the charges
    /// created within `created`, 100 a page, newest first, each page after
    /// the last id of the one before (`starting_after`), until `has_more`
    /// is false. Any failed, unreadable or endless read is `Unknown`.
    async fn list_charges_for(&self, charge_id: &str, created: CreatedWindow) -> Lookup {
        let url = format!("{}/v1/charges", self.base_url);
        let (from, to) = (created.from.to_string(), created.to.to_string());
        let key = "payments_charge_id";
        let mut after: Option<String> = None;
        for _ in 0..MAX_LIST_PAGES {
            let mut query = vec![
                ("created[gte]", from.as_str()),
                ("created[lte]", to.as_str()),
                ("limit", "100"),
            ];
            if let Some(after) = &after {
                query.push(("starting_after", after.as_str()));
            }
            let page = match self.get::<wire::ChargeList>(&url, &query).await {
                Ok(page) => page,
                Err(reason) => return Lookup::Unknown { reason },
            };
            let last = page.data.last().map(|o| o.id.clone());
            let ours = page
                .data
                .into_iter()
                .find(|o| o.metadata.get(key).map(String::as_str) == Some(charge_id));
            if let Some(object) = ours {
                return judged(object);
            }
            if !page.has_more {
                return Lookup::NotFound;
            }
            match last {
                Some(last) if after.as_deref() != Some(last.as_str()) => after = Some(last),
                _ => {
                    return Lookup::Unknown {
                        reason: "the provider's charge list says it has more but gives no \
                                 new page: the read is incomplete"
                            .to_owned(),
                    };
                }
            }
        }
        Lookup::Unknown {
            reason: format!(
                "more than {MAX_LIST_PAGES} pages of charges in the window: the read is \
                 incomplete"
            ),
        }
    }

    /// A GET of `url` with `query`, its 2xx body decoded; `Err` with why not.
    async fn get<T: serde::de::DeserializeOwned>(
        &self,
        url: &str,
        query: &[(&str, &str)],
    ) -> Result<T, String> {
        let mut url = reqwest::Url::parse(url).map_err(|e| format!("bad provider URL: {e}"))?;
        url.query_pairs_mut().extend_pairs(query);
        let response = self
            .client
            .get(url)
            .bearer_auth(self.secret_key.expose_secret())
            .send()
            .await
            .map_err(|e| format!("provider lookup failed: {e}"))?;
        if !response.status().is_success() {
            return Err(format!("provider lookup answered {}", response.status()));
        }
        response
            .json::<T>()
            .await
            .map_err(|e| format!("unreadable provider page: {e}"))
    }

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
                match response.bytes().await {
                    Ok(body) => classify(status, &body),
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
            ProviderOutcome::Pending { .. } => "pending",
            ProviderOutcome::Unknown { .. } => "unknown",
        };
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

/// What a provider charge found by our id says: final when `succeeded`
/// or `failed`, else not yet known.
fn judged(object: wire::Object) -> Lookup {
    match object.status.as_str() {
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
/// says `succeeded` (or, for a refund, `failed` or `canceled`), a 402 card
/// error and a 400 request error are final. A refund object that says
/// `pending` or `requires_action` was accepted and settles later: pending,
/// not in doubt, and not re-driven. An idempotency conflict (409:
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
            // A refund the provider settles later (`requires_action`:
            // until the customer acts) is polled by reconciliation.
            Ok(o)
                if o.object.as_deref() == Some("refund")
                    && matches!(o.status.as_str(), "pending" | "requires_action") =>
            {
                ProviderOutcome::Pending { provider_id: o.id }
            }
            // A canceled refund refunded nothing, for good.
            Ok(o) if o.object.as_deref() == Some("refund") && o.status == "canceled" => {
                ProviderOutcome::Declined {
                    code: o.failure_reason.unwrap_or_else(|| "canceled".to_owned()),
                    decline_code: None,
                    message: format!("the provider's {} was canceled", o.id),
                    provider_id: Some(o.id),
                }
            }
            // Anything else is not final: re-driven, then reconciled.
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
        // Stripe's answer to a key whose first request is still running:
        // the provider may still act on it.
        409 if serde_json::from_slice::<wire::ErrorEnvelope>(body)
            .is_ok_and(|e| e.error.kind.as_deref() == Some("idempotency_error")) =>
        {
            ProviderOutcome::Unknown {
                doubt: Doubt::InFlight,
                reason: format!(
                    "the provider is still processing an earlier call under this key: {}",
                    String::from_utf8_lossy(body)
                ),
            }
        }
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
    fn a_key_still_in_flight_is_its_own_doubt() {
        let in_flight = classify(
            409,
            br#"{"error":{"type":"idempotency_error","message":"another request is in progress"}}"#,
        );
        assert!(
            matches!(
                in_flight,
                ProviderOutcome::Unknown {
                    doubt: Doubt::InFlight,
                    ..
                }
            ),
            "{in_flight:?}"
        );
        // Another 409, or an idempotency error that is not a 409 (a
        // parameter mismatch), is not an in-flight answer.
        for (status, body) in [
            (
                409,
                &br#"{"error":{"type":"api_error","message":"conflict"}}"#[..],
            ),
            (409, b"not json"),
            (
                400,
                br#"{"error":{"type":"idempotency_error","message":"mismatch"}}"#,
            ),
        ] {
            let other = classify(status, body);
            assert!(
                matches!(
                    other,
                    ProviderOutcome::Unknown {
                        doubt: Doubt::ProviderError,
                        ..
                    }
                ),
                "{status}: {other:?}"
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
        let canceled = classify(
            200,
            br#"{"id":"re_3","object":"refund","status":"canceled","failure_reason":null}"#,
        );
        assert_eq!(
            canceled,
            ProviderOutcome::Declined {
                code: "canceled".to_owned(),
                decline_code: None,
                message: "the provider's re_3 was canceled".to_owned(),
                provider_id: Some("re_3".to_owned()),
            }
        );
    }

    #[test]
    fn a_pending_refund_is_accepted_not_in_doubt() {
        for status in ["pending", "requires_action"] {
            let body = format!(r#"{{"id":"re_2","object":"refund","status":"{status}"}}"#);
            assert_eq!(
                classify(200, body.as_bytes()),
                ProviderOutcome::Pending {
                    provider_id: "re_2".to_owned()
                },
                "{status}"
            );
        }
        // A charge is never pending here: in doubt, as before.
        for body in [
            &br#"{"id":"ch_3","object":"charge","status":"pending"}"#[..],
            br#"{"id":"ch_3","object":"charge","status":"canceled"}"#,
            br#"{"id":"re_4","status":"pending"}"#,
        ] {
            assert!(
                matches!(classify(200, body), ProviderOutcome::Unknown { .. }),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }
}
