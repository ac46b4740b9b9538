//! The client and its retry loop.
//!
//! [`Client::charge`] and [`Client::refund`] make one `Operation`: the
//! `Idempotency-Key` and the body bytes are fixed when the operation is
//! created, before the first attempt, and every attempt is built from the
//! operation. No attempt can make its own key, so no retry can become a
//! second charge or a second refund.

use std::time::{Duration, Instant};

use secrecy::{ExposeSecret, SecretString};

use reqwest::Url;
use reqwest::header::{CONTENT_TYPE, HeaderMap, RETRY_AFTER};

use crate::error::{ClientError, error_chain};
use crate::key::IdempotencyKey;
use serde::de::DeserializeOwned;

use crate::model::{
    ApiError, CaptureRequest, Charge, ChargeQuery, ChargeRequest, List, Refund, RefundRequest,
    snippet,
};
use crate::retry::RetryPolicy;

/// The final answer to one operation: a charge ([`ChargeOutcome`]) or a
/// refund ([`RefundOutcome`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome<T> {
    pub answer: Answer<T>,
    /// The key every attempt sent; keep it with the order.
    pub key: IdempotencyKey,
    /// The final answer was a replay (`Idempotent-Replay: true`): an earlier
    /// attempt of this operation (or an earlier call with this key) did the
    /// work and this attempt got its stored answer.
    pub replayed: bool,
    /// Attempts made, the final one included.
    pub attempts: u32,
}

/// The final answer to a charge.
pub type ChargeOutcome = Outcome<Charge>;
/// The final answer to a refund.
pub type RefundOutcome = Outcome<Refund>;

/// What the server finally said about the operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer<T> {
    /// 201: charged (or refunded).
    Done(T),
    /// 402 `card_declined` (`refund_failed`): final; `decline_code` says
    /// why. Stored and replayed like a success, so retrying this key cannot
    /// turn it into one.
    Declined(ApiError),
}

impl<T> Outcome<T> {
    /// The charge or refund made.
    pub fn done(&self) -> Option<&T> {
        match &self.answer {
            Answer::Done(made) => Some(made),
            Answer::Declined(_) => None,
        }
    }

    pub fn decline(&self) -> Option<&ApiError> {
        match &self.answer {
            Answer::Declined(error) => Some(error),
            Answer::Done(_) => None,
        }
    }
}

impl Outcome<Charge> {
    /// The charge made.
    pub fn charge(&self) -> Option<&Charge> {
        self.done()
    }
}

/// A typed client for the payments API. Cheap to clone (the connection pool
/// is shared).
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    base_url: String,
    charges_url: Url,
    token: SecretString,
    attempt_timeout: Duration,
    retry: RetryPolicy,
}

/// Settings for a [`Client`]; start with [`Client::builder`].
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    base_url: String,
    token: SecretString,
    attempt_timeout: Duration,
    connect_timeout: Duration,
    retry: RetryPolicy,
}

impl ClientBuilder {
    /// How long one attempt may take before it is abandoned and retried
    /// (with the same key). Default 30 s. Any value is safe: a timeout only
    /// says the client stopped waiting, and the retry gets 409 (still
    /// running) or the stored answer, never a second charge.
    pub fn attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = timeout;
        self
    }

    /// How long opening a connection may take. Default 5 s.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Attempts per operation, the first included (at least 1). Default 8.
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.retry.max_attempts = attempts.max(1);
        self
    }

    /// The whole operation, waits included. Default 120 s.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.retry.deadline = deadline;
        self
    }

    /// The first backoff ceiling and its cap. Default 250 ms and 10 s.
    pub fn backoff(mut self, base: Duration, cap: Duration) -> Self {
        self.retry.backoff_base = base;
        self.retry.backoff_cap = cap.max(base);
        self
    }

    pub fn retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self.retry.max_attempts = policy.max_attempts.max(1);
        self
    }

    pub fn build(self) -> Result<Client, ClientError> {
        let invalid = |reason: &str| ClientError::InvalidBaseUrl {
            url: self.base_url.clone(),
            reason: reason.to_owned(),
        };
        let base = Url::parse(&self.base_url).map_err(|e| invalid(&e.to_string()))?;
        if !matches!(base.scheme(), "http" | "https") {
            return Err(invalid("the scheme must be http or https"));
        }
        let mut charges_url = base.clone();
        charges_url.set_query(None);
        charges_url.set_fragment(None);
        charges_url
            .path_segments_mut()
            .map_err(|()| invalid("not a base URL"))?
            .pop_if_empty()
            .extend(["api", "charges"]);
        let http = reqwest::Client::builder()
            .connect_timeout(self.connect_timeout)
            .user_agent(concat!("payments-client/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(ClientError::Setup)?;
        Ok(Client {
            http,
            base_url: self.base_url.trim_end_matches('/').to_owned(),
            charges_url,
            token: self.token,
            attempt_timeout: self.attempt_timeout,
            retry: self.retry,
        })
    }
}

impl Client {
    /// A client with the default timeouts and retry policy.
    pub fn new(base_url: impl Into<String>, token: impl Into<String>) -> Result<Self, ClientError> {
        Self::builder(base_url, token).build()
    }

    pub fn builder(base_url: impl Into<String>, token: impl Into<String>) -> ClientBuilder {
        ClientBuilder {
            base_url: base_url.into(),
            token: SecretString::from(token.into()),
            attempt_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            retry: RetryPolicy::default(),
        }
    }

    /// The same client (its settings and connection pool) acting with
    /// another token: one `Client` per role. An app's holds its customer's
    /// token (charge, read its own); the back office's holds a back-office
    /// token (refund any customer's charge, read and list across customers
    /// with `charges:read_all`). A call the token lacks the scope for is
    /// [`ClientError::Rejected`] with 403 `insufficient_scope`, never
    /// retried.
    pub fn with_token(&self, token: impl Into<String>) -> Self {
        Self {
            token: SecretString::from(token.into()),
            ..self.clone()
        }
    }

    /// The base URL, without a trailing slash.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    pub fn retry_policy(&self) -> RetryPolicy {
        self.retry
    }

    /// Charges once, however many attempts it takes.
    ///
    /// **The key is generated here, ONCE, before the first attempt, and
    /// every retry sends that same key.** Never move key generation into
    /// the retry loop: a fresh key per attempt is a fresh charge per
    /// attempt. That is the incident this API exists to prevent: a 15 s
    /// client timeout, a provider that took 18 s, a retry under a new key,
    /// and fourteen customers charged twice. A timeout says nothing about
    /// the server (the request may never have arrived, may have finished
    /// with its answer lost, or may still be running); only the same key
    /// lets the server tell "my retry" from "a second payment".
    ///
    /// Retries (same key, capped exponential backoff with full jitter, at
    /// least the server's `Retry-After`): timeouts, connection errors,
    /// 409 `request_in_progress`, 429, 503 `gateway_unavailable` and any
    /// 5xx except 500 `request_abandoned`. Final: 201 and 402 (`Ok`), 500
    /// `request_abandoned` ([`ClientError::Abandoned`]) and other 4xx
    /// ([`ClientError::Rejected`]). Out of attempts or time:
    /// [`ClientError::GaveUp`] with the key, to be retried later as is.
    ///
    /// If the payment must survive a restart of the caller (an app killed
    /// mid-checkout), generate and persist the key first and use
    /// [`Client::charge_with_key`].
    pub async fn charge(&self, request: &ChargeRequest) -> Result<ChargeOutcome, ClientError> {
        self.charge_with_key(&IdempotencyKey::generate(), request)
            .await
    }

    /// [`Client::charge`] under a key the caller generated and stored
    /// itself. Use the same key for every retry of this payment, also across
    /// restarts, and a new key for a new payment. The same key with another
    /// body is refused (422 `idempotency_key_reused`).
    pub async fn charge_with_key(
        &self,
        key: &IdempotencyKey,
        request: &ChargeRequest,
    ) -> Result<ChargeOutcome, ClientError> {
        let url = self.charges_url.clone();
        Operation::new(self, url, key.clone(), request)?.run().await
    }

    /// Refunds `charge_id` (all that is left of it, unless the request
    /// names an amount) once, however many attempts it takes: the same
    /// rules as [`Client::charge`], one key for the whole operation. A
    /// refund that does not fit is final: [`ClientError::Rejected`] with
    /// 400 `refund_exceeds_charge` and `refundable_amount_cents`.
    pub async fn refund(
        &self,
        charge_id: &str,
        request: &RefundRequest,
    ) -> Result<RefundOutcome, ClientError> {
        self.refund_with_key(&IdempotencyKey::generate(), charge_id, request)
            .await
    }

    /// [`Client::refund`] under a key the caller generated and stored.
    pub async fn refund_with_key(
        &self,
        key: &IdempotencyKey,
        charge_id: &str,
        request: &RefundRequest,
    ) -> Result<RefundOutcome, ClientError> {
        let url = self.url(&["api", "charges", charge_id, "refunds"]);
        Operation::new(self, url, key.clone(), request)?.run().await
    }

    /// Authorizes `request` as a hold (`"capture": false`): the answer is
    /// the charge `requires_capture`, with its `capture_before`. The same
    /// retry rules and key as [`Client::charge`].
    pub async fn authorize(&self, request: &ChargeRequest) -> Result<ChargeOutcome, ClientError> {
        self.authorize_with_key(&IdempotencyKey::generate(), request)
            .await
    }

    /// [`Client::authorize`] under a key the caller generated and stored.
    pub async fn authorize_with_key(
        &self,
        key: &IdempotencyKey,
        request: &ChargeRequest,
    ) -> Result<ChargeOutcome, ClientError> {
        let request = ChargeRequest {
            capture: Some(false),
            ..request.clone()
        };
        self.charge_with_key(key, &request).await
    }

    /// Captures a hold (all of it, unless the request names less; the rest
    /// is released) once, however many attempts it takes: the back office's
    /// (`charges:capture`). The answer is the charge, `succeeded`. Final
    /// refusals ([`ClientError::Rejected`]): 400 `charge_already_captured`,
    /// `charge_canceled`, `hold_expired`; a 409 `hold_in_use` (another
    /// capture or cancel is pending) is retried.
    pub async fn capture(
        &self,
        charge_id: &str,
        request: &CaptureRequest,
    ) -> Result<ChargeOutcome, ClientError> {
        self.capture_with_key(&IdempotencyKey::generate(), charge_id, request)
            .await
    }

    /// [`Client::capture`] under a key the caller generated and stored.
    pub async fn capture_with_key(
        &self,
        key: &IdempotencyKey,
        charge_id: &str,
        request: &CaptureRequest,
    ) -> Result<ChargeOutcome, ClientError> {
        let url = self.url(&["api", "charges", charge_id, "capture"]);
        Operation::new(self, url, key.clone(), request)?.run().await
    }

    /// Cancels a hold (releases all of it) once: the answer is the charge,
    /// `canceled`. The same rules as [`Client::capture`].
    pub async fn cancel(&self, charge_id: &str) -> Result<ChargeOutcome, ClientError> {
        self.cancel_with_key(&IdempotencyKey::generate(), charge_id)
            .await
    }

    /// [`Client::cancel`] under a key the caller generated and stored.
    pub async fn cancel_with_key(
        &self,
        key: &IdempotencyKey,
        charge_id: &str,
    ) -> Result<ChargeOutcome, ClientError> {
        let url = self.url(&["api", "charges", charge_id, "cancel"]);
        let body = serde_json::Map::new();
        Operation::new(self, url, key.clone(), &body)?.run().await
    }

    /// `GET /api/charges/{id}`: the caller's own charge, `None` on 404. One
    /// attempt (a GET is safe to repeat; the caller decides).
    pub async fn get_charge(&self, id: &str) -> Result<Option<Charge>, ClientError> {
        self.get(self.url(&["api", "charges", id]), &[]).await
    }

    /// `GET /api/refunds/{id}`: the caller's own refund, `None` on 404.
    pub async fn get_refund(&self, id: &str) -> Result<Option<Refund>, ClientError> {
        self.get(self.url(&["api", "refunds", id]), &[]).await
    }

    /// `GET /api/charges`: a page of the caller's charges, newest first.
    /// One attempt.
    pub async fn list_charges(&self, query: &ChargeQuery) -> Result<List<Charge>, ClientError> {
        let url = self.url(&["api", "charges"]);
        let list = self.get(url, &query.pairs()).await?;
        list.ok_or_else(|| ClientError::Unexpected {
            status: 404,
            detail: "GET /api/charges answered 404".to_owned(),
            key: None,
            attempts: 1,
        })
    }

    /// The base URL (its own path kept) with these path segments after
    /// `api/charges`'s place, each percent-encoded.
    fn url(&self, segments: &[&str]) -> Url {
        let mut url = self.charges_url.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop().pop().extend(segments);
        }
        url
    }

    /// One GET of a JSON object; `None` on 404.
    async fn get<T: DeserializeOwned>(
        &self,
        mut url: Url,
        query: &[(String, String)],
    ) -> Result<Option<T>, ClientError> {
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query);
        }
        let exchange = exchange(
            self.http
                .get(url)
                .bearer_auth(self.token.expose_secret())
                .timeout(self.attempt_timeout),
        )
        .await
        .map_err(ClientError::Transport)?;
        match exchange.status {
            200 => serde_json::from_slice(&exchange.body)
                .map(Some)
                .map_err(|e| ClientError::Unexpected {
                    status: 200,
                    detail: format!(
                        "the body is not what was asked for ({e}): {}",
                        snippet(&exchange.body)
                    ),
                    key: None,
                    attempts: 1,
                }),
            404 => Ok(None),
            status @ 400..=499 => Err(ClientError::Rejected {
                status,
                error: Box::new(ApiError::from_response(status, &exchange.body)),
                key: None,
                attempts: 1,
            }),
            status => Err(ClientError::Unexpected {
                status,
                detail: snippet(&exchange.body),
                key: None,
                attempts: 1,
            }),
        }
    }

    /// One `POST /api/charges` attempt, with `key` if given (`None` sends no
    /// `Idempotency-Key` at all). The retry loop builds every attempt here,
    /// and so do tools that judge each attempt themselves (the smoke checks,
    /// the load generator: `payments-loadtest`), sending it with
    /// [`exchange`].
    ///
    /// This is one attempt, not an operation: a service charges with
    /// [`Client::charge`], which sends the same key on every retry.
    pub fn post_charge(
        &self,
        key: Option<&IdempotencyKey>,
        body: Vec<u8>,
        timeout: Duration,
    ) -> reqwest::RequestBuilder {
        self.post_json(self.charges_url.clone(), key, body, timeout)
    }

    /// One `POST /api/charges/{charge_id}/refunds` attempt, for tools that
    /// judge each attempt themselves, like [`Client::post_charge`]; a
    /// service refunds with [`Client::refund`].
    pub fn post_refund(
        &self,
        charge_id: &str,
        key: Option<&IdempotencyKey>,
        body: Vec<u8>,
        timeout: Duration,
    ) -> reqwest::RequestBuilder {
        let url = self.url(&["api", "charges", charge_id, "refunds"]);
        self.post_json(url, key, body, timeout)
    }

    /// One `GET /api/charges` of `query`, for tools that time each request.
    pub fn list_charges_request(
        &self,
        query: &ChargeQuery,
        timeout: Duration,
    ) -> reqwest::RequestBuilder {
        let mut url = self.url(&["api", "charges"]);
        let pairs = query.pairs();
        if !pairs.is_empty() {
            url.query_pairs_mut().extend_pairs(&pairs);
        }
        self.http
            .get(url)
            .bearer_auth(self.token.expose_secret())
            .timeout(timeout)
    }

    /// One `GET /healthz` (liveness: no database, no token), for tools that
    /// measure what the server answers without any work.
    pub fn health_request(&self, timeout: Duration) -> reqwest::RequestBuilder {
        self.http.get(self.url(&["healthz"])).timeout(timeout)
    }

    /// One POST of a JSON body to `url`, with `key` if given.
    fn post_json(
        &self,
        url: Url,
        key: Option<&IdempotencyKey>,
        body: Vec<u8>,
        timeout: Duration,
    ) -> reqwest::RequestBuilder {
        let mut request = self
            .http
            .post(url)
            .bearer_auth(self.token.expose_secret())
            .header(CONTENT_TYPE, "application/json")
            .timeout(timeout)
            .body(body);
        if let Some(key) = key {
            request = request.header("idempotency-key", key.as_str());
        }
        request
    }
}

/// One logical charge or refund. Its URL, key and body bytes are fixed at
/// creation, before the first attempt; [`Operation::attempt`] builds every
/// attempt from them, so all attempts of one operation carry the same key
/// and the same bytes.
#[derive(Debug)]
pub(crate) struct Operation<'c> {
    client: &'c Client,
    url: Url,
    key: IdempotencyKey,
    body: Vec<u8>,
}

impl<'c> Operation<'c> {
    pub(crate) fn new(
        client: &'c Client,
        url: Url,
        key: IdempotencyKey,
        request: &impl serde::Serialize,
    ) -> Result<Self, ClientError> {
        Ok(Self {
            client,
            url,
            key,
            body: serde_json::to_vec(request)?,
        })
    }

    /// The request for the next attempt.
    pub(crate) fn attempt(&self, timeout: Duration) -> reqwest::RequestBuilder {
        self.client.post_json(
            self.url.clone(),
            Some(&self.key),
            self.body.clone(),
            timeout,
        )
    }

    /// Attempts until a final answer, the attempt budget or the deadline.
    pub(crate) async fn run<T: DeserializeOwned>(self) -> Result<Outcome<T>, ClientError> {
        let policy = self.client.retry;
        let started = Instant::now();
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            let remaining = policy.deadline.saturating_sub(started.elapsed());
            let timeout = self
                .client
                .attempt_timeout
                .min(remaining)
                .max(Duration::from_millis(1));
            let (step, replayed) = match exchange(self.attempt(timeout)).await {
                Ok(exchange) => (judge::<T>(&exchange), exchange.replayed),
                Err(e) if e.is_builder() => return Err(ClientError::Transport(e)),
                Err(e) => (
                    Step::Retry {
                        why: describe_transport_error(&e, timeout),
                        retry_after: None,
                    },
                    false,
                ),
            };
            let key = self.key.clone();
            let (why, retry_after) = match step {
                Step::Done(made) => {
                    return Ok(Outcome {
                        answer: Answer::Done(made),
                        key,
                        replayed,
                        attempts,
                    });
                }
                Step::Declined(error) => {
                    return Ok(Outcome {
                        answer: Answer::Declined(error),
                        key,
                        replayed,
                        attempts,
                    });
                }
                Step::Rejected { status, error } => {
                    return Err(ClientError::Rejected {
                        status,
                        error: Box::new(error),
                        key: Some(key),
                        attempts,
                    });
                }
                Step::Abandoned(error) => {
                    return Err(ClientError::Abandoned {
                        error: Box::new(error),
                        key,
                        attempts,
                    });
                }
                Step::Unexpected { status, detail } => {
                    return Err(ClientError::Unexpected {
                        status,
                        detail,
                        key: Some(key),
                        attempts,
                    });
                }
                Step::Retry { why, retry_after } => (why, retry_after),
            };
            let gave_up = |last: String| ClientError::GaveUp {
                key: self.key.clone(),
                attempts,
                elapsed: started.elapsed(),
                last,
            };
            if attempts >= policy.max_attempts {
                return Err(gave_up(why));
            }
            let delay = policy.delay(attempts, retry_after);
            if started.elapsed() + delay >= policy.deadline {
                return Err(gave_up(format!(
                    "{why}; waiting {delay:?} more would pass the {:?} deadline",
                    policy.deadline
                )));
            }
            tracing::info!(
                idempotency_key = %self.key,
                attempt = attempts,
                ?delay,
                %why,
                "operation not final yet; retrying with the same idempotency key"
            );
            tokio::time::sleep(delay).await;
        }
    }
}

/// A response, read in full.
#[derive(Debug, Clone)]
pub struct Exchange {
    pub status: u16,
    /// `Idempotent-Replay: true`.
    pub replayed: bool,
    /// `Retry-After` in seconds (the HTTP-date form is ignored).
    pub retry_after: Option<Duration>,
    pub body: Vec<u8>,
}

/// Sends `request` and reads the whole body (both under its timeout).
pub async fn exchange(request: reqwest::RequestBuilder) -> Result<Exchange, reqwest::Error> {
    let response = request.send().await?;
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response.bytes().await?.to_vec();
    Ok(Exchange {
        status,
        replayed: header_is_true(&headers, "idempotent-replay"),
        retry_after: headers
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs),
        body,
    })
}

fn header_is_true(headers: &HeaderMap, name: &str) -> bool {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
}

/// What one answer means for the operation.
#[derive(Debug)]
enum Step<T> {
    Done(T),
    Declined(ApiError),
    Rejected {
        status: u16,
        error: ApiError,
    },
    Abandoned(ApiError),
    Unexpected {
        status: u16,
        detail: String,
    },
    Retry {
        why: String,
        retry_after: Option<Duration>,
    },
}

/// The code a 500 carries when the server stopped re-driving the provider
/// and handed the charge to reconciliation; it is stored and replayed.
pub const REQUEST_ABANDONED: &str = "request_abandoned";

/// The codes a 502 carries when reconciliation found that the provider
/// never made the operation: stored and replayed, final.
pub const NOT_MADE: [&str; 2] = ["charge_not_made", "refund_not_made"];

/// The code a 400 carries when the provider refused the request itself
/// (an unknown card token, an amount below its minimum): stored and
/// replayed, final like every 4xx; nothing was made.
pub const PROVIDER_REJECTED: &str = "provider_rejected_request";

fn judge<T: DeserializeOwned>(exchange: &Exchange) -> Step<T> {
    let status = exchange.status;
    let body = &exchange.body;
    let retry = || Step::Retry {
        why: format!("{status} {}", ApiError::from_response(status, body).code),
        retry_after: exchange.retry_after,
    };
    match status {
        201 => match serde_json::from_slice::<T>(body) {
            Ok(made) => Step::Done(made),
            Err(e) => Step::Unexpected {
                status,
                detail: format!(
                    "201 Created whose body is not what was made ({e}); it may have \
                     happened, the same key replays it: {}",
                    snippet(body)
                ),
            },
        },
        402 => Step::Declined(ApiError::from_response(status, body)),
        // 409: the first attempt still holds the key. 408/425/429: the
        // request was not processed, or should be sent later.
        408 | 409 | 425 | 429 => retry(),
        500 => {
            let error = ApiError::from_response(status, body);
            if error.code == REQUEST_ABANDONED {
                Step::Abandoned(error)
            } else {
                retry()
            }
        }
        // 502 charge_not_made / refund_not_made: reconciliation found the
        // provider never made it; final (a new operation needs a new key).
        502 if NOT_MADE.contains(&ApiError::from_response(status, body).code.as_str()) => {
            Step::Rejected {
                status,
                error: ApiError::from_response(status, body),
            }
        }
        // 503 gateway_unavailable and any other 5xx (a proxy's 502/504
        // included): the outcome is unknown and the key stays recoverable.
        501..=599 => retry(),
        400..=499 => Step::Rejected {
            status,
            error: ApiError::from_response(status, body),
        },
        _ => Step::Unexpected {
            status,
            detail: snippet(body),
        },
    }
}

fn describe_transport_error(e: &reqwest::Error, timeout: Duration) -> String {
    let what = if e.is_timeout() {
        format!("no answer within {timeout:?}")
    } else if e.is_connect() {
        "could not connect".to_owned()
    } else {
        "the request failed in transit".to_owned()
    };
    format!("{what} ({})", error_chain(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exchange(status: u16, body: &str, retry_after: Option<u64>) -> Exchange {
        Exchange {
            status,
            replayed: false,
            retry_after: retry_after.map(Duration::from_secs),
            body: body.as_bytes().to_vec(),
        }
    }

    const CHARGE: &str = r#"{"id":"ch_1","customer_id":"cus_a","amount_cents":100,"currency":"GBP","status":"succeeded","description":null,"metadata":{},"gateway_charge_id":"gw_1","created_at":"2024-05-01T12:00:00.000Z"}"#;

    #[test]
    fn every_status_is_judged_as_the_contract_says() {
        assert!(matches!(
            judge::<Charge>(&exchange(201, CHARGE, None)),
            Step::Done(_)
        ));
        assert!(matches!(
            judge::<Charge>(&exchange(201, "oops", None)),
            Step::Unexpected { status: 201, .. }
        ));
        assert!(matches!(
            judge::<Charge>(&exchange(402, r#"{"error":{"code":"card_declined","message":"x","decline_code":"generic_decline"}}"#, None)),
            Step::Declined(e) if e.decline_code.as_deref() == Some("generic_decline")
        ));
        assert!(matches!(
            judge::<Charge>(&exchange(409, r#"{"error":{"code":"request_in_progress","message":"x"}}"#, Some(2))),
            Step::Retry { retry_after: Some(d), .. } if d == Duration::from_secs(2)
        ));
        assert!(matches!(
            judge::<Charge>(&exchange(
                503,
                r#"{"error":{"code":"gateway_unavailable","message":"x"}}"#,
                Some(2)
            )),
            Step::Retry { .. }
        ));
        assert!(matches!(
            judge::<Charge>(&exchange(
                500,
                r#"{"error":{"code":"internal_error","message":"x"}}"#,
                None
            )),
            Step::Retry { .. }
        ));
        assert!(matches!(
            judge::<Charge>(&exchange(
                500,
                r#"{"error":{"code":"request_abandoned","message":"x"}}"#,
                None
            )),
            Step::Abandoned(_)
        ));
        for (status, code) in [(502, "charge_not_made"), (400, PROVIDER_REJECTED)] {
            let body = format!(r#"{{"error":{{"code":"{code}","message":"x"}}}}"#);
            assert!(
                matches!(
                    judge::<Charge>(&exchange(status, &body, None)),
                    Step::Rejected { status: s, .. } if s == status
                ),
                "{code} is final"
            );
        }
        assert!(matches!(
            judge::<Charge>(&exchange(502, "<html>", None)),
            Step::Retry { .. }
        ));
        for status in [400, 401, 404, 413, 415, 422] {
            assert!(
                matches!(
                    judge::<Charge>(&exchange(status, r#"{"error":{"code":"c","message":"m"}}"#, None)),
                    Step::Rejected { status: s, .. } if s == status
                ),
                "{status} is final"
            );
        }
        assert!(matches!(
            judge::<Charge>(&exchange(302, "", None)),
            Step::Unexpected { status: 302, .. }
        ));
    }

    #[test]
    fn paths_keep_the_base_path_and_encode_ids() -> Result<(), ClientError> {
        let client = Client::new("http://127.0.0.1:9/base/", "token")?;
        let refunds = client.url(&["api", "charges", "ch 1/x", "refunds"]);
        assert_eq!(
            refunds.as_str(),
            "http://127.0.0.1:9/base/api/charges/ch%201%2Fx/refunds"
        );
        assert_eq!(
            client.charges_url.as_str(),
            "http://127.0.0.1:9/base/api/charges"
        );
        Ok(())
    }

    #[test]
    fn every_attempt_of_an_operation_carries_its_one_key_and_body()
    -> Result<(), Box<dyn std::error::Error>> {
        let client = Client::new("http://127.0.0.1:9/base/", "token")?;
        let request = ChargeRequest::new(100, "GBP", "tok_visa");
        let operation = Operation::new(
            &client,
            client.charges_url.clone(),
            IdempotencyKey::generate(),
            &request,
        )?;
        let other = Operation::new(
            &client,
            client.charges_url.clone(),
            IdempotencyKey::generate(),
            &request,
        )?;
        let built =
            |op: &Operation<'_>| -> Result<(String, Vec<u8>, String), Box<dyn std::error::Error>> {
                let request = op.attempt(Duration::from_secs(1)).build()?;
                let key = request
                    .headers()
                    .get("idempotency-key")
                    .ok_or("no key")?
                    .to_str()?
                    .to_owned();
                let body = request
                    .body()
                    .and_then(|b| b.as_bytes())
                    .ok_or("no body")?
                    .to_vec();
                Ok((key, body, request.url().to_string()))
            };
        let first = built(&operation)?;
        for _ in 0..3 {
            assert_eq!(built(&operation)?, first);
        }
        assert_eq!(first.0, operation.key.as_str());
        assert_eq!(first.2, "http://127.0.0.1:9/base/api/charges");
        let second = built(&other)?;
        assert_ne!(second.0, first.0, "a new operation gets a new key");
        assert_eq!(second.1, first.1);
        Ok(())
    }

    #[test]
    fn the_token_stays_out_of_debug_output() -> Result<(), Box<dyn std::error::Error>> {
        let builder = Client::builder("http://127.0.0.1:9", "tok-secret-123");
        let client = builder.clone().build()?;
        for shown in [format!("{builder:?}"), format!("{client:?}")] {
            assert!(!shown.contains("tok-secret-123"), "{shown}");
        }
        Ok(())
    }
}
