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
//! - `checked`, `judge`: a final answer or a found object counts only if it
//!   shows what the operation asked for (amount, currency; a charge that
//!   succeeded paid and captured). Anything else is unknown, loudly
//!   ([`PROVIDER_MISMATCH_TOTAL`], an error log line), for a person.
//! - Lookups read Stripe's pages as documented: a refund list is followed
//!   page by page (`starting_after`, `has_more`) up to a bound, fields Stripe
//!   documents as nullable may be null, and an unreadable page names the
//!   field. "Not found" is concluded only from a complete, readable read.
//! - [`webhook`]: [`webhook::HttpWebhookSender`], the domain's
//!   `WebhookSender` port: one signed POST per attempt, no redirects, and a
//!   guard against requests to private and metadata addresses.
#![forbid(unsafe_code)]

mod snapshot;
pub mod webhook;

use std::time::Duration;

use async_trait::async_trait;
use payments_domain::provider::{
    CreatedWindow, Doubt, Expected, Gateway, Lookup, OperationKind, ProviderCaptureRequest,
    ProviderCharge, ProviderChargeRequest, ProviderObject, ProviderOutcome, ProviderRefundRequest,
};
use secrecy::{ExposeSecret, SecretString};
use serde::de::DeserializeOwned;

/// The provider calls' latency and outcomes, by `outcome` (metric names, with
/// the others in `payments_api::telemetry`).
pub const PROVIDER_REQUEST_DURATION_SECONDS: &str = "payments_provider_request_duration_seconds";
pub const PROVIDER_OUTCOMES_TOTAL: &str = "payments_provider_outcomes_total";
/// Provider objects that do not show what the operation asked for (amount,
/// currency, paid, captured), by `call`: `charges`, `refunds` (the answer to
/// our POST), `find_charge`, `find_refund` (reconciliation's lookups).
pub const PROVIDER_MISMATCH_TOTAL: &str = "payments_provider_mismatch_total";

/// Stripe's largest list page.
const REFUND_PAGE_SIZE: u8 = 100;
/// The most pages of `GET /v1/charges` one confirmation reads (100,000
/// charges): past it the read is incomplete, and nothing is concluded.
pub const MAX_LIST_PAGES: u32 = 1000;
/// The most pages of one charge's refunds a lookup reads (10,000 refunds at
/// Stripe's page size). A refund not among them is unknown, never "not
/// found": its reservation stays held, and a person looks.
const MAX_REFUND_PAGES: u32 = 100;

/// The Stripe API version every call pins with `Stripe-Version` (the
/// default of `GATEWAY_STRIPE_VERSION`), so the answers' shapes do not
/// follow the account's default version when someone upgrades it.
pub const DEFAULT_STRIPE_VERSION: &str = "2026-09-30.endive";

mod wire {
    use serde::{Deserialize, Deserializer};

    /// A charge or a refund object: its id and status (a refund's
    /// `failure_reason`, a charge's `failure_code`, when it failed), and
    /// what it is for (amount, currency; a charge's `paid` and `captured`),
    /// which is checked against what was asked. (Its metadata, which says
    /// whose it is, is read from the page: `names`.)
    ///
    /// Stripe documents a refund's `status` as nullable: null reads as
    /// empty, which is not final. The checked fields are optional here so
    /// that a missing one is a mismatch, not an unreadable object.
    #[derive(Debug, Deserialize)]
    pub struct Object {
        pub id: String,
        /// What it is: `charge`, `refund` (Stripe names every object).
        #[serde(default)]
        pub object: Option<String>,
        #[serde(default, deserialize_with = "null_as_default")]
        pub status: String,
        pub failure_reason: Option<String>,
        pub failure_code: Option<String>,
        pub amount: Option<i64>,
        pub currency: Option<String>,
        pub paid: Option<bool>,
        pub captured: Option<bool>,
        /// Whose it is (`metadata[payments_charge_id]`); null or missing
        /// reads as null.
        #[serde(default)]
        pub metadata: serde_json::Value,
        /// A charge's refunds and dispute, read when a replayed answer is
        /// adopted (the replay is the first answer, not the charge now).
        pub amount_refunded: Option<i64>,
        pub disputed: Option<bool>,
        /// A charge's: what was captured (a hold: 0 until its capture), and
        /// whether it was released uncaptured (`refunded`).
        pub amount_captured: Option<i64>,
        pub refunded: Option<bool>,
        /// A held card charge's `payment_method_details.card.capture_before`.
        #[serde(default)]
        pub payment_method_details: Option<PaymentMethodDetails>,
        /// Unix seconds, the provider's clock.
        pub created: Option<i64>,
    }

    /// Stripe's `payment_method_details`: only a card's `capture_before`
    /// (Unix seconds) is read.
    #[derive(Debug, Default, Deserialize)]
    pub struct PaymentMethodDetails {
        #[serde(default)]
        pub card: Option<Card>,
    }

    #[derive(Debug, Default, Deserialize)]
    pub struct Card {
        #[serde(default)]
        pub capture_before: Option<i64>,
    }

    impl Object {
        /// When a held charge lapses, if the provider says.
        pub fn capture_before(&self) -> Option<i64> {
            self.payment_method_details
                .as_ref()?
                .card
                .as_ref()?
                .capture_before
        }
    }

    /// A search result or a list. Its objects are read one by one
    /// (`HttpGateway::page`), so that one the adapter cannot read does not
    /// hide the others.
    #[derive(Debug, Deserialize)]
    pub struct Page {
        pub data: Vec<serde_json::Value>,
        pub has_more: bool,
    }

    /// A nullable field: null reads as its default.
    fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
    where
        D: Deserializer<'de>,
        T: Default + Deserialize<'de>,
    {
        Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
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
    /// How a charge's refund list is read: page size, most pages.
    refund_paging: (u8, u32),
}

// Which object a call makes or finds: the domain's kind, with the names
// the provider's API and our metrics give it.
use payments_domain::provider::OperationKind as Kind;

trait Calls {
    /// As in `metadata[payments_{name}_id]` and in messages.
    fn name(self) -> &'static str;
    /// The POST's path below `/v1/`, and its `call` label.
    fn call(self) -> &'static str;
    /// The lookup's `call` label.
    fn lookup(self) -> &'static str;
}

impl Calls for Kind {
    fn name(self) -> &'static str {
        self.as_str()
    }

    fn call(self) -> &'static str {
        match self {
            Self::Charge => "charges",
            Self::Refund => "refunds",
        }
    }

    fn lookup(self) -> &'static str {
        match self {
            Self::Charge => "find_charge",
            Self::Refund => "find_refund",
        }
    }
}

/// What one page of a search or a list held for us.
#[derive(Debug)]
struct Found {
    /// The object whose metadata names our id, read.
    ours: Option<wire::Object>,
    has_more: bool,
    /// The page's last object's id: the next page starts after it.
    last_id: Option<String>,
    /// Why some object could not be told apart from ours (its metadata is
    /// unreadable): the page cannot prove ours is absent.
    unreadable: Option<String>,
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
            refund_paging: (REFUND_PAGE_SIZE, MAX_REFUND_PAGES),
        })
    }

    /// Whether the provider answers at all: one GET of its root, without
    /// the secret key. Any HTTP answer (Stripe's root is a 404) means it
    /// can be reached; the error says why not (connection refused, a name
    /// that does not resolve, TLS, a timeout), with its causes.
    pub async fn reachable(&self) -> Result<(), String> {
        match self.client.get(format!("{}/", self.base_url)).send().await {
            Ok(_) => Ok(()),
            Err(e) => {
                let mut why = e.to_string();
                let mut source = std::error::Error::source(&e);
                while let Some(cause) = source {
                    why.push_str(&format!(": {cause}"));
                    source = cause.source();
                }
                Err(why)
            }
        }
    }

    /// Reads a charge's refund list `page_size` (1 to 100) at a time, at
    /// most `max_pages` pages (by default Stripe's 100, and 100 pages), so a
    /// test can reach the bound with a few refunds.
    pub fn with_refund_paging(mut self, page_size: u8, max_pages: u32) -> Self {
        self.refund_paging = (page_size.clamp(1, REFUND_PAGE_SIZE), max_pages);
        self
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
    if !request.capture {
        form.push(("capture".to_owned(), "false".to_owned()));
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
        let expected = Expected {
            amount_cents: request.amount_cents,
            currency: request.currency.clone(),
            hold: !request.capture,
        };
        let ours = (Kind::Charge, request.charge_id.as_str());
        self.post(ours, &request.idempotency_key, &form, &expected)
            .await
    }

    async fn create_refund(&self, request: &ProviderRefundRequest) -> ProviderOutcome {
        let form = refund_form(request);
        let expected = Expected {
            amount_cents: request.amount_cents,
            currency: request.currency.clone(),
            hold: false,
        };
        let ours = (Kind::Refund, request.refund_id.as_str());
        self.post(ours, &request.idempotency_key, &form, &expected)
            .await
    }

    async fn find_charge(&self, charge_id: &str, expected: &Expected) -> Lookup {
        // Our ids are `ch_` and hex: nothing to escape in the query.
        let query = format!("metadata['payments_charge_id']:'{charge_id}'");
        let url = format!("{}/v1/charges/search", self.base_url);
        self.find(
            &url,
            &[("query", &query)],
            (Kind::Charge, charge_id),
            expected,
        )
        .await
    }

    /// Every page of the charge's refunds, newest first, until ours or the
    /// last page; `NotFound` only from a complete read of the list.
    async fn find_refund(
        &self,
        gateway_charge_id: &str,
        refund_id: &str,
        expected: &Expected,
    ) -> Lookup {
        let url = format!("{}/v1/refunds", self.base_url);
        let (page_size, max_pages) = self.refund_paging;
        let query = [("charge", gateway_charge_id)];
        let what = format!("the provider's refund list of {gateway_charge_id}");
        let ours = (Kind::Refund, refund_id);
        self.paged(&url, &query, (page_size, max_pages), ours, expected, &what)
            .await
    }

    /// Every page of the charges created within `created`, newest first,
    /// until ours or the last page (Stripe's Search may lag; its list does
    /// not).
    async fn find_charge_listed(
        &self,
        charge_id: &str,
        created: CreatedWindow,
        expected: &Expected,
    ) -> Lookup {
        let url = format!("{}/v1/charges", self.base_url);
        let (from, to) = (created.from.to_string(), created.to.to_string());
        let query = [
            ("created[gte]", from.as_str()),
            ("created[lte]", to.as_str()),
        ];
        let what = format!("the provider's charges created from {from} to {to}");
        let ours = (Kind::Charge, charge_id);
        let paging = (REFUND_PAGE_SIZE, MAX_LIST_PAGES);
        self.paged(&url, &query, paging, ours, expected, &what)
            .await
    }

    /// `POST /v1/charges/{id}/capture` with `amount`, under the capture's
    /// key. A replayed 200 is the capture made by an earlier call under
    /// our key: a captured charge stays captured, so it is taken as it is.
    async fn capture_charge(&self, request: &ProviderCaptureRequest) -> ProviderOutcome {
        const CALL: &str = "capture";
        let started = std::time::Instant::now();
        let id = &request.gateway_charge_id;
        let key = &request.idempotency_key;
        let outcome = if !is_plain_id(id) {
            ProviderOutcome::Unknown {
                doubt: Doubt::Mismatch,
                reason: format!("not a provider charge id: {id:?}"),
            }
        } else {
            let url = format!("{}/v1/charges/{id}/capture", self.base_url);
            let form = [("amount".to_owned(), request.amount_cents.to_string())];
            match self.send(&url, key, &form).await {
                Ok((status, replayed, body)) => {
                    replayed_error(captured(status, &body, request), status, replayed)
                }
                Err(unknown) => unknown,
            }
        };
        self.observed(CALL, key, started, outcome)
    }

    async fn find_capture(&self, gateway_charge_id: &str, expected: &Expected) -> Lookup {
        let body = match self.get_object(Kind::Charge, gateway_charge_id).await {
            Ok(Some(body)) => body,
            Ok(None) => {
                return Lookup::Unknown {
                    reason: format!(
                        "the provider does not know the charge {gateway_charge_id} held"
                    ),
                };
            }
            Err(reason) => return Lookup::Unknown { reason },
        };
        let object = match decode::<wire::Object>(&body) {
            Ok(object) => object,
            Err(e) => {
                return Lookup::Unknown {
                    reason: format!("unreadable charge {e}"),
                };
            }
        };
        match (object.captured, object.refunded) {
            (Some(true), _) => match capture_mismatch(&object, expected) {
                None => Lookup::Found(ProviderOutcome::Succeeded {
                    provider_id: object.id,
                }),
                Some(reason) => Lookup::Unknown {
                    reason: mismatched("find_capture", reason),
                },
            },
            (Some(false), Some(true)) => Lookup::Found(ProviderOutcome::Rejected {
                code: HOLD_LAPSED.to_owned(),
                message: format!(
                    "the provider's charge {} was released uncaptured",
                    object.id
                ),
            }),
            (Some(false), _) => Lookup::NotFound,
            (None, _) => Lookup::Unknown {
                reason: format!(
                    "the provider's charge {} does not say whether it is captured",
                    object.id
                ),
            },
        }
    }

    async fn provider_charge(
        &self,
        gateway_charge_id: &str,
    ) -> Result<Option<ProviderCharge>, String> {
        self.snapshot(gateway_charge_id).await
    }

    async fn retrieve_charge(&self, gateway_charge_id: &str, expected: &Expected) -> Lookup {
        self.retrieve(Kind::Charge, gateway_charge_id, expected, None)
            .await
    }

    async fn retrieve_refund(&self, gateway_refund_id: &str, expected: &Expected) -> Lookup {
        self.retrieve(Kind::Refund, gateway_refund_id, expected, None)
            .await
    }

    /// Every page of the charges (or refunds) created within `created`,
    /// newest first; those whose metadata names one of our operations.
    /// `Err` unless the whole list was read: an object whose metadata
    /// cannot be read could be ours.
    async fn list_ours(
        &self,
        kind: OperationKind,
        created: CreatedWindow,
    ) -> Result<Vec<ProviderObject>, String> {
        let url = format!("{}/v1/{}", self.base_url, kind.call());
        let (from, to) = (created.from.to_string(), created.to.to_string());
        let query = [
            ("created[gte]", from.as_str()),
            ("created[lte]", to.as_str()),
        ];
        let what = format!(
            "the provider's {}s created from {from} to {to}",
            kind.name()
        );
        let key = format!("payments_{}_id", kind.name());
        self.every_page(&url, &query, &what, |object| {
            let Some(operation_id) = names(&object, &key)?.map(str::to_owned) else {
                return Ok(None);
            };
            let object = decode_value::<wire::Object>(object).map_err(|e| format!(": {e}"))?;
            Ok(Some(ProviderObject {
                kind,
                provider_id: object.id,
                operation_id,
                amount_cents: object.amount.unwrap_or_default(),
                currency: object.currency.unwrap_or_default().to_ascii_uppercase(),
                status: object.status,
                created: object.created.unwrap_or_default(),
            }))
        })
        .await
    }
}

impl HttpGateway {
    /// Every object of the list `GET {url}?{query}`, page after page
    /// (newest first, [`REFUND_PAGE_SIZE`] a page), each read by `read`
    /// (`None`: not wanted; `Err`: the field it could not read). `Err`
    /// unless the whole list was read (`what` names it): an object that
    /// cannot be read could be the one that matters.
    pub(crate) async fn every_page<T>(
        &self,
        url: &str,
        query: &[(&str, &str)],
        what: &str,
        mut read: impl FnMut(serde_json::Value) -> Result<Option<T>, String>,
    ) -> Result<Vec<T>, String> {
        let limit = REFUND_PAGE_SIZE.to_string();
        let mut all = Vec::new();
        let mut cursor: Option<String> = None;
        for _ in 0..MAX_LIST_PAGES {
            let mut page_query = query.to_vec();
            page_query.push(("limit", limit.as_str()));
            if let Some(after) = &cursor {
                page_query.push(("starting_after", after.as_str()));
            }
            let page = self.fetch_page(url, &page_query).await?;
            let last = page
                .data
                .last()
                .and_then(|o| o.get("id"))
                .and_then(serde_json::Value::as_str)
                .map(str::to_owned);
            for (i, object) in page.data.into_iter().enumerate() {
                if let Some(item) =
                    read(object).map_err(|e| format!("unreadable {what}: data[{i}]{e}"))?
                {
                    all.push(item);
                }
            }
            if !page.has_more {
                return Ok(all);
            }
            match last {
                Some(last) if cursor.as_deref() != Some(last.as_str()) => cursor = Some(last),
                _ => {
                    return Err(format!(
                        "{what}: the list says it has more but gives no new page"
                    ));
                }
            }
        }
        Err(format!(
            "{what}: more than {} pages; the list was not read to its end",
            MAX_LIST_PAGES
        ))
    }
}

impl HttpGateway {
    /// The provider's charge or refund `id` as it is now (Stripe's
    /// `GET /v1/charges/{id}`, `GET /v1/refunds/{id}`), judged and checked
    /// as the answer to its creation is (and, given `ours`, that its
    /// metadata names our operation). `NotFound` when the provider does not
    /// know the id.
    async fn retrieve(
        &self,
        kind: Kind,
        id: &str,
        expected: &Expected,
        ours: Option<&str>,
    ) -> Lookup {
        let body = match self.get_object(kind, id).await {
            Ok(Some(body)) => body,
            Ok(None) => return Lookup::NotFound,
            Err(reason) => return Lookup::Unknown { reason },
        };
        match checked(200, &body, (kind, kind.lookup()), expected, ours) {
            ProviderOutcome::Unknown { reason, .. } => Lookup::Unknown { reason },
            found => {
                if let Ok(object) = decode::<wire::Object>(&body) {
                    let refunded = object.amount_refunded.unwrap_or(0);
                    if refunded > 0 || object.disputed == Some(true) {
                        tracing::warn!(
                            provider_id = %object.id,
                            amount_refunded = refunded,
                            disputed = object.disputed.unwrap_or(false),
                            "the provider's {} was refunded or disputed since it was made; \
                             reconcile its refunds and disputes",
                            kind.name()
                        );
                    }
                }
                Lookup::Found(found)
            }
        }
    }

    /// The provider's charge or refund `id` as it is now (`GET`), unread;
    /// `None` when the provider does not know it.
    async fn get_object(&self, kind: Kind, id: &str) -> Result<Option<Vec<u8>>, String> {
        // The provider's id goes into the path: only a plain one.
        if !is_plain_id(id) {
            return Err(format!("not a provider {} id: {id:?}", kind.name()));
        }
        let url = format!("{}/v1/{}s/{id}", self.base_url, kind.name());
        let sent = self
            .client
            .get(url)
            .bearer_auth(self.secret_key.expose_secret())
            .send()
            .await;
        let response = sent.map_err(|e| format!("provider lookup failed: {e}"))?;
        let status = response.status();
        if status == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !status.is_success() {
            return Err(format!("provider lookup answered {status}"));
        }
        let body = response.bytes().await;
        body.map(|body| Some(body.to_vec()))
            .map_err(|e| format!("reading the provider's {} failed: {e}", kind.name()))
    }

    /// Every page of a list (`query` plus `limit` and `starting_after`),
    /// newest first, until ours or the last page, at most `max_pages` of
    /// `page_size`. `NotFound` only from a complete, readable read of the
    /// whole list; a failed page, an unreadable object that could be ours, a
    /// `has_more` with no new page, or the bound is `Unknown`.
    async fn paged(
        &self,
        url: &str,
        query: &[(&str, &str)],
        (page_size, max_pages): (u8, u32),
        ours: (Kind, &str),
        expected: &Expected,
        what: &str,
    ) -> Lookup {
        let limit = page_size.to_string();
        let mut cursor: Option<String> = None;
        // An object whose metadata could not be read may be ours: it only
        // stops "not found", and ours may still be on a later page.
        let mut unreadable: Option<String> = None;
        for _ in 0..max_pages {
            let mut page_query = query.to_vec();
            page_query.push(("limit", limit.as_str()));
            if let Some(after) = &cursor {
                page_query.push(("starting_after", after.as_str()));
            }
            let found = match self.page(url, &page_query, ours).await {
                Ok(found) => found,
                Err(reason) => return Lookup::Unknown { reason },
            };
            if let Some(object) = found.ours {
                return judge(ours.0, object, expected);
            }
            unreadable = unreadable.or(found.unreadable);
            if !found.has_more {
                return match unreadable {
                    Some(reason) => Lookup::Unknown { reason },
                    None => Lookup::NotFound,
                };
            }
            match found.last_id {
                Some(last) if cursor.as_deref() != Some(last.as_str()) => cursor = Some(last),
                _ => {
                    return Lookup::Unknown {
                        reason: format!(
                            "{what} says it has more but gives no new page: the read is \
                             incomplete; not concluding it was not made"
                        ),
                    };
                }
            }
        }
        Lookup::Unknown {
            reason: format!(
                "{} is not among the newest {} of {what} ({max_pages} pages read) and there are \
                 more; not concluding it was not made",
                ours.1,
                u64::from(page_size) * u64::from(max_pages)
            ),
        }
    }

    /// A GET of a search (one page: its query names our id), and the object
    /// whose `metadata[payments_{kind}_id]` is `id`, judged as a final answer.
    async fn find(
        &self,
        url: &str,
        query: &[(&str, &str)],
        ours: (Kind, &str),
        expected: &Expected,
    ) -> Lookup {
        match self.page(url, query, ours).await {
            Ok(Found {
                ours: Some(object), ..
            }) => judge(ours.0, object, expected),
            Ok(Found {
                unreadable: Some(reason),
                ..
            }) => Lookup::Unknown { reason },
            Ok(_) => Lookup::NotFound,
            Err(reason) => Lookup::Unknown { reason },
        }
    }

    /// One GET of a search or a list page, read: our object (whose
    /// `metadata[payments_{kind}_id]` is `id`), `has_more` and the last id.
    /// `Err` when the page cannot be had or read (the reason names the
    /// field). Each object is read on its own: one with nulls or fields the
    /// adapter does not know is skipped unless it is ours; one whose
    /// metadata cannot be read makes the page unable to prove ours absent.
    async fn page(
        &self,
        url: &str,
        query: &[(&str, &str)],
        (kind, id): (Kind, &str),
    ) -> Result<Found, String> {
        let page = self.fetch_page(url, query).await?;
        let key = format!("payments_{}_id", kind.name());
        let mut found = Found {
            ours: None,
            has_more: page.has_more,
            last_id: page
                .data
                .last()
                .and_then(|o| o.get("id"))
                .and_then(serde_json::Value::as_str)
                .map(str::to_owned),
            unreadable: None,
        };
        for (i, object) in page.data.into_iter().enumerate() {
            match names(&object, &key) {
                Ok(Some(named)) if named == id => {
                    let object = decode_value::<wire::Object>(object).map_err(|e| {
                        format!("unreadable provider {} data[{i}]: {e}", kind.name())
                    })?;
                    found.ours = Some(object);
                    return Ok(found);
                }
                Ok(_) => {}
                Err(e) => {
                    found.unreadable.get_or_insert_with(|| {
                        format!(
                            "unreadable provider page at data[{i}]{e}; cannot tell it from ours"
                        )
                    });
                }
            }
        }
        Ok(found)
    }

    /// One page of a search or a list, read.
    async fn fetch_page(&self, url: &str, query: &[(&str, &str)]) -> Result<wire::Page, String> {
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
        let body = response
            .bytes()
            .await
            .map_err(|e| format!("reading the provider's page failed: {e}"))?;
        decode(&body).map_err(|e| format!("unreadable provider page: {e}"))
    }

    /// A final answer the provider replayed from its idempotency record
    /// (`Idempotent-Replayed: true`): the first answer, as it was then. It
    /// is the same operation (the first check read our id in its metadata,
    /// and its amount and currency), made by an earlier call under our
    /// key, typically before the database lost our rows of it; it is
    /// adopted only as the provider's object reads now, re-read by its id.
    async fn adopt(
        &self,
        kind: Kind,
        replayed: ProviderOutcome,
        expected: &Expected,
        ours: &str,
    ) -> ProviderOutcome {
        let provider_id = match &replayed {
            ProviderOutcome::Succeeded { provider_id }
            | ProviderOutcome::Authorized { provider_id, .. }
            | ProviderOutcome::Pending { provider_id } => provider_id.clone(),
            ProviderOutcome::Declined {
                provider_id: Some(provider_id),
                ..
            } => provider_id.clone(),
            _ => return replayed,
        };
        match self
            .retrieve(kind, &provider_id, expected, Some(ours))
            .await
        {
            Lookup::Found(now) => {
                tracing::info!(
                    operation = ours,
                    %provider_id,
                    "adopting the provider's {} made under our key by an earlier call",
                    kind.name()
                );
                now
            }
            Lookup::NotFound => ProviderOutcome::Unknown {
                doubt: Doubt::ProviderError,
                reason: format!(
                    "the provider replayed its {} {provider_id} but does not know it when re-read",
                    kind.name()
                ),
            },
            Lookup::Unknown { reason } => ProviderOutcome::Unknown {
                doubt: Doubt::ProviderError,
                reason: format!("re-reading the replayed {provider_id}: {reason}"),
            },
        }
    }

    /// `POST /v1/{what}` under the provider key, classified, timed and logged.
    async fn post(
        &self,
        (kind, ours): (Kind, &str),
        key: &str,
        form: &[(String, String)],
        expected: &Expected,
    ) -> ProviderOutcome {
        let what = kind.call();
        let started = std::time::Instant::now();
        let url = format!("{}/v1/{what}", self.base_url);
        let outcome = match self.send(&url, key, form).await {
            Ok((status, replayed, body)) => {
                let outcome = checked(status, &body, (kind, what), expected, Some(ours));
                match replayed_error(outcome, status, replayed) {
                    outcome if replayed && status == 200 => {
                        self.adopt(kind, outcome, expected, ours).await
                    }
                    outcome => outcome,
                }
            }
            Err(unknown) => unknown,
        };
        self.observed(what, key, started, outcome)
    }

    /// One POST of `form` to `url` under the provider key: the status,
    /// whether the provider replayed it, and the body; `Err` with the
    /// unknown outcome when no whole answer arrived.
    async fn send(
        &self,
        url: &str,
        key: &str,
        form: &[(String, String)],
    ) -> Result<(u16, bool, Vec<u8>), ProviderOutcome> {
        let sent = self
            .client
            .post(url)
            .bearer_auth(self.secret_key.expose_secret())
            .header("Idempotency-Key", key)
            .form(form)
            .send()
            .await;
        match sent {
            Ok(response) => {
                let status = response.status().as_u16();
                let replayed = response
                    .headers()
                    .get("idempotent-replayed")
                    .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"));
                match response.bytes().await {
                    Ok(body) => Ok((status, replayed, body.to_vec())),
                    Err(e) => Err(ProviderOutcome::Unknown {
                        doubt: doubt_of(&e),
                        reason: format!("reading the provider's {status} answer failed: {e}"),
                    }),
                }
            }
            Err(e) => Err(ProviderOutcome::Unknown {
                doubt: doubt_of(&e),
                // reqwest's Display says only "error sending request"; its
                // Debug carries the kind and the cause (refused, reset, ...).
                reason: format!("provider call failed: {e:?}"),
            }),
        }
    }

    /// A provider call's outcome, timed, counted and logged (`what`: the
    /// call's label).
    fn observed(
        &self,
        what: &'static str,
        key: &str,
        started: std::time::Instant,
        outcome: ProviderOutcome,
    ) -> ProviderOutcome {
        let label = match &outcome {
            ProviderOutcome::Succeeded { .. } => "succeeded",
            ProviderOutcome::Authorized { .. } => "authorized",
            ProviderOutcome::Declined { .. } => "declined",
            ProviderOutcome::Rejected { .. } => "rejected",
            ProviderOutcome::Pending { .. } => "pending",
            ProviderOutcome::Unknown {
                doubt: Doubt::KeyRefused,
                ..
            } => "key_refused",
            ProviderOutcome::Unknown {
                doubt: Doubt::ReplayedError,
                ..
            } => "replayed_error",
            ProviderOutcome::Unknown {
                doubt: Doubt::KeyReused,
                ..
            } => "key_reused",
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

/// The value of `metadata[key]` an object names, if any; `Err` (the path
/// below the object, and what is wrong) when its metadata cannot be read.
/// Null metadata (Stripe documents a refund's as nullable) names nothing.
fn names<'a>(object: &'a serde_json::Value, key: &str) -> Result<Option<&'a str>, String> {
    use serde_json::Value;
    let Value::Object(fields) = object else {
        return Err(": not an object".to_owned());
    };
    named_in(fields.get("metadata").unwrap_or(&Value::Null), key)
}

/// The value of `key` in a metadata object (null names nothing).
fn named_in<'a>(metadata: &'a serde_json::Value, key: &str) -> Result<Option<&'a str>, String> {
    use serde_json::Value;
    match metadata {
        Value::Null => Ok(None),
        Value::Object(metadata) => match metadata.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(named)) => Ok(Some(named)),
            Some(_) => Err(format!(".metadata.{key}: not a string")),
        },
        _ => Err(".metadata: neither an object nor null".to_owned()),
    }
}

/// JSON read into `T`; an error names the field (`data[3].status: invalid
/// type: ...`).
fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, String> {
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    let value = serde_path_to_error::deserialize(&mut deserializer).map_err(path_error)?;
    deserializer.end().map_err(|e| e.to_string())?;
    Ok(value)
}

/// The same from an already parsed value.
fn decode_value<T: DeserializeOwned>(value: serde_json::Value) -> Result<T, String> {
    serde_path_to_error::deserialize(value).map_err(path_error)
}

fn path_error(e: serde_path_to_error::Error<serde_json::Error>) -> String {
    format!("at {}: {}", e.path(), e.inner())
}

/// Why `object` is not the one our operation asked for, if it is not: its
/// amount or currency differ, or (a charge that succeeded) it is not paid
/// or not captured. A field the provider left out matches nothing.
fn mismatch(
    kind: Kind,
    object: &wire::Object,
    expected: &Expected,
    ours: Option<&str>,
) -> Option<String> {
    let mut wrong = Vec::new();
    if let Some(ours) = ours {
        let key = format!("payments_{}_id", kind.name());
        let named = named_in(&object.metadata, &key);
        if named.as_ref().ok().copied().flatten() != Some(ours) {
            wrong.push(format!(
                "metadata[{key}] {} (ours {ours})",
                named.map_or_else(|e| e, |n| n.unwrap_or("none").to_owned())
            ));
        }
    }
    if object.amount != Some(expected.amount_cents) {
        wrong.push(format!(
            "amount {} (asked {})",
            shown(&object.amount),
            expected.amount_cents
        ));
    }
    let currency = object.currency.as_deref();
    if !currency.is_some_and(|c| c.eq_ignore_ascii_case(&expected.currency)) {
        wrong.push(format!(
            "currency {} (asked {})",
            shown(&currency),
            expected.currency.to_ascii_lowercase()
        ));
    }
    if kind == Kind::Charge && object.status == "succeeded" {
        if object.paid != Some(true) {
            wrong.push(format!("paid {}", shown(&object.paid)));
        }
        // A hold is approved uncaptured; any other charge is captured.
        if object.captured != Some(!expected.hold) {
            wrong.push(format!("captured {}", shown(&object.captured)));
        }
    }
    (!wrong.is_empty()).then(|| {
        format!(
            "the provider's {} {} ({}) shows {}",
            kind.name(),
            object.id,
            if object.status.is_empty() {
                "no status"
            } else {
                object.status.as_str()
            },
            wrong.join(", ")
        )
    })
}

fn shown<T: std::fmt::Display>(value: &Option<T>) -> String {
    value
        .as_ref()
        .map_or_else(|| "none".to_owned(), ToString::to_string)
}

/// Counts and logs a mismatch, loudly: nobody but a person can settle it.
fn mismatched(call: &'static str, reason: String) -> String {
    metrics::counter!(PROVIDER_MISMATCH_TOTAL, "call" => call).increment(1);
    tracing::error!(
        call,
        %reason,
        "PROVIDER MISMATCH: the provider's object does not show what the operation asked \
         for; its outcome stays unknown for a person"
    );
    format!("mismatch: {reason}")
}

/// Classifies one answer to our POST (as [`classify`]), reading a 200's
/// object once: a final answer counts only if its object shows what was
/// asked; one that does not is unknown (`Doubt::Mismatch`), counted and
/// logged. Answers without an object (402, 400, 5xx) and unknown outcomes
/// pass as classified.
fn checked(
    status: u16,
    body: &[u8],
    (kind, call): (Kind, &'static str),
    expected: &Expected,
    ours: Option<&str>,
) -> ProviderOutcome {
    if status != 200 {
        return classify(status, body);
    }
    let object = match decode::<wire::Object>(body) {
        Ok(object) => object,
        Err(e) => return unparseable(&e),
    };
    let wrong = mismatch(kind, &object, expected, ours);
    match (held(of_object_held(object, expected)), wrong) {
        (outcome @ ProviderOutcome::Unknown { .. }, _) | (outcome, None) => outcome,
        (_, Some(reason)) => ProviderOutcome::Unknown {
            doubt: Doubt::Mismatch,
            reason: mismatched(call, reason),
        },
    }
}

/// An object read with whether it is a hold asked for: `(outcome, Some(
/// capture_before))` for a held charge's success.
fn of_object_held(
    object: wire::Object,
    expected: &Expected,
) -> (ProviderOutcome, Option<Option<i64>>) {
    let held = expected.hold.then(|| object.capture_before());
    (of_object(object), held)
}

/// A success of a charge asked to be held is its authorization.
fn held((outcome, held): (ProviderOutcome, Option<Option<i64>>)) -> ProviderOutcome {
    match (outcome, held) {
        (ProviderOutcome::Succeeded { provider_id }, Some(capture_before)) => {
            ProviderOutcome::Authorized {
                provider_id,
                capture_before,
            }
        }
        (outcome, _) => outcome,
    }
}

/// The provider's code for a capture of a hold that lapsed (also what
/// `find_capture` says of a hold released uncaptured).
const HOLD_LAPSED: &str = "charge_expired_for_capture";

/// Whether `id` is plain enough to go into a path.
fn is_plain_id(id: &str) -> bool {
    !id.is_empty() && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The answer to a capture: a 200's charge must be the one held (its
/// metadata names our charge), in its currency, captured with
/// `amount_captured` the amount asked; other answers as [`classify`].
fn captured(status: u16, body: &[u8], request: &ProviderCaptureRequest) -> ProviderOutcome {
    if status != 200 {
        return classify(status, body);
    }
    let object = match decode::<wire::Object>(body) {
        Ok(object) => object,
        Err(e) => return unparseable(&e),
    };
    let expected = Expected::of_capture(request.amount_cents, &request.currency);
    let mut wrong = Vec::new();
    let named = named_in(&object.metadata, "payments_charge_id");
    if named.as_ref().ok().copied().flatten() != Some(request.charge_id.as_str()) {
        wrong.push(format!(
            "metadata[payments_charge_id] not ours ({})",
            request.charge_id
        ));
    }
    if object.id != request.gateway_charge_id {
        wrong.push(format!(
            "id {} (asked {})",
            object.id, request.gateway_charge_id
        ));
    }
    let wrong = wrong
        .into_iter()
        .chain(capture_mismatch(&object, &expected))
        .collect::<Vec<_>>();
    if wrong.is_empty() {
        ProviderOutcome::Succeeded {
            provider_id: object.id,
        }
    } else {
        ProviderOutcome::Unknown {
            doubt: Doubt::Mismatch,
            reason: mismatched("capture", wrong.join(", ")),
        }
    }
}

/// Why a captured charge does not show the capture `expected` (its
/// currency, `captured`, `amount_captured`), if it does not.
fn capture_mismatch(object: &wire::Object, expected: &Expected) -> Option<String> {
    let mut wrong = Vec::new();
    let currency = object.currency.as_deref();
    if !currency.is_some_and(|c| c.eq_ignore_ascii_case(&expected.currency)) {
        wrong.push(format!("currency {}", shown(&currency)));
    }
    if object.captured != Some(true) {
        wrong.push(format!("captured {}", shown(&object.captured)));
    }
    if object.amount_captured != Some(expected.amount_cents) {
        wrong.push(format!(
            "amount_captured {} (asked {})",
            shown(&object.amount_captured),
            expected.amount_cents
        ));
    }
    (!wrong.is_empty()).then(|| {
        format!(
            "the provider's charge {} shows {}",
            object.id,
            wrong.join(", ")
        )
    })
}

/// A found object as a lookup's answer: unknown (loudly) unless it shows
/// what was asked; then final if its status is.
fn judge(kind: Kind, object: wire::Object, expected: &Expected) -> Lookup {
    if let Some(reason) = mismatch(kind, &object, expected, None) {
        return Lookup::Unknown {
            reason: mismatched(kind.lookup(), reason),
        };
    }
    let capture_before = object.capture_before();
    match object.status.as_str() {
        "succeeded" if expected.hold => Lookup::Found(ProviderOutcome::Authorized {
            provider_id: object.id,
            capture_before,
        }),
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
        "" => Lookup::Unknown {
            reason: format!(
                "the provider's {} has no status (null), not final",
                object.id
            ),
        },
        other => Lookup::Unknown {
            reason: format!("the provider's {} is {other:?}, not final", object.id),
        },
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
/// says `succeeded` (or, for a refund, `failed` or `canceled`), a 402 card
/// error and a 400 request error are final. A refund object that says
/// `pending` or `requires_action` was accepted and settles later: pending,
/// not in doubt, and not re-driven. An idempotency conflict (409:
/// our own earlier call is still running there; 400: a parameter mismatch),
/// a rate limit, a 5xx or anything unparseable leaves the outcome unknown,
/// and the call is re-driven later under the same key.
pub fn classify(status: u16, body: &[u8]) -> ProviderOutcome {
    match status {
        200 => match decode::<wire::Object>(body) {
            Ok(object) => of_object(object),
            Err(e) => unparseable(&e),
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
            // The key is the provider's record of another operation: the
            // same derived key with other parameters, which only a client
            // that changed its body after we lost our record of its first
            // request can cause.
            Ok(e) if e.error.kind.as_deref() == Some("idempotency_error") => {
                ProviderOutcome::Unknown {
                    doubt: Doubt::KeyReused,
                    reason: format!(
                        "the provider holds this key's operation with other parameters: {}",
                        String::from_utf8_lossy(body)
                    ),
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

/// What a 200's charge or refund object says: final when it `succeeded`
/// or `failed` (a refund also when `canceled`), pending for a refund the
/// provider settles later, else not final.
fn of_object(o: wire::Object) -> ProviderOutcome {
    match o {
        o if o.status == "succeeded" => ProviderOutcome::Succeeded { provider_id: o.id },
        o if o.status == "failed" => ProviderOutcome::Declined {
            code: o.failure_reason.unwrap_or_else(|| "failed".to_owned()),
            decline_code: None,
            message: format!("the provider's {} failed", o.id),
            provider_id: Some(o.id),
        },
        // A refund the provider settles later (`requires_action`:
        // until the customer acts) is polled by reconciliation.
        o if o.object.as_deref() == Some("refund")
            && matches!(o.status.as_str(), "pending" | "requires_action") =>
        {
            ProviderOutcome::Pending { provider_id: o.id }
        }
        // A canceled refund refunded nothing, for good.
        o if o.object.as_deref() == Some("refund") && o.status == "canceled" => {
            ProviderOutcome::Declined {
                code: o.failure_reason.unwrap_or_else(|| "canceled".to_owned()),
                decline_code: None,
                message: format!("the provider's {} was canceled", o.id),
                provider_id: Some(o.id),
            }
        }
        // Anything else is not final: re-driven, then reconciled.
        o => ProviderOutcome::Unknown {
            doubt: Doubt::ProviderError,
            reason: format!("provider object {} is {:?}, not final", o.id, o.status),
        },
    }
}

/// A 200 whose object cannot be read (the reason names the field).
fn unparseable(e: &str) -> ProviderOutcome {
    ProviderOutcome::Unknown {
        doubt: Doubt::ProviderError,
        reason: format!("unparseable provider object {e}"),
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
            capture: true,
        };
        // Only a hold says `capture`: false.
        let held = charge_form(&ProviderChargeRequest {
            capture: false,
            ..request.clone()
        });
        assert!(held.contains(&("capture".to_owned(), "false".to_owned())));
        let form = charge_form(&request);
        assert!(!form.iter().any(|(k, _)| k == "capture"));
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
            currency: "GBP".to_owned(),
            reason: Some(payments_domain::refund::RefundReason::Duplicate),
            metadata: Default::default(),
        };
        let form = refund_form(&refund);
        let has = |k: &str, v: &str| form.contains(&(k.to_owned(), v.to_owned()));
        assert!(has("charge", "ch_theirs") && has("amount", "300") && has("reason", "duplicate"));
        assert!(has("metadata[payments_refund_id]", "re_ours"));
    }

    const CHARGES: (Kind, &str) = (Kind::Charge, "charges");
    const REFUNDS: (Kind, &str) = (Kind::Refund, "refunds");

    /// Issue 24: our POST's answer must name our operation in its metadata
    /// (a replay of another operation's key is never taken for ours), and
    /// a 400 `idempotency_error` (the key's operation has other
    /// parameters) is its own doubt, answered 422.
    #[test]
    fn an_answer_for_another_operation_is_a_mismatch_and_a_reused_key_is_named() {
        let body = |metadata: &str| {
            format!(
                r#"{{"id":"ch_1","object":"charge","status":"succeeded","amount":4900,
                "currency":"gbp","paid":true,"captured":true,"metadata":{metadata}}}"#
            )
        };
        let ours = |metadata: &str| {
            checked(
                200,
                body(metadata).as_bytes(),
                CHARGES,
                &gbp(4900),
                Some("ch_ours"),
            )
        };
        assert!(matches!(
            ours(r#"{"payments_charge_id":"ch_ours"}"#),
            ProviderOutcome::Succeeded { .. }
        ));
        for other in [
            r#"{"payments_charge_id":"ch_other"}"#,
            "{}",
            "null",
            r#"{"payments_charge_id":7}"#,
        ] {
            assert!(
                matches!(
                    ours(other),
                    ProviderOutcome::Unknown {
                        doubt: Doubt::Mismatch,
                        ..
                    }
                ),
                "{other}"
            );
        }
        let reused = br#"{"error":{"type":"idempotency_error","message":"Keys for idempotent requests can only be used with the same parameters they were first used with."}}"#;
        assert!(matches!(
            classify(400, reused),
            ProviderOutcome::Unknown {
                doubt: Doubt::KeyReused,
                ..
            }
        ));
    }

    fn gbp(amount_cents: i64) -> Expected {
        Expected {
            amount_cents,
            currency: "GBP".to_owned(),
            hold: false,
        }
    }

    /// Issue 23: a 200 counts only if it shows what was asked: amount,
    /// currency, and for a charge that succeeded, paid and captured.
    #[test]
    fn a_success_for_another_amount_currency_or_capture_is_a_mismatch() {
        let charge = |fields: &str| {
            let body =
                format!(r#"{{"id":"ch_1","object":"charge","status":"succeeded",{fields}}}"#);
            checked(200, body.as_bytes(), CHARGES, &gbp(4900), None)
        };
        let ok = r#""amount":4900,"currency":"gbp","paid":true,"captured":true"#;
        assert_eq!(
            charge(ok),
            ProviderOutcome::Succeeded {
                provider_id: "ch_1".to_owned()
            }
        );
        for (fields, shown) in [
            (
                r#""amount":100,"currency":"usd","paid":true,"captured":true"#,
                "amount 100 (asked 4900), currency usd (asked gbp)",
            ),
            (
                r#""amount":4900,"currency":"gbp","paid":true,"captured":false"#,
                "captured false",
            ),
            (
                r#""amount":4900,"currency":"gbp","paid":false,"captured":true"#,
                "paid false",
            ),
            (
                r#""amount":4900,"currency":"gbp""#,
                "paid none, captured none",
            ),
            (
                r#""currency":"gbp","paid":true,"captured":true"#,
                "amount none (asked 4900)",
            ),
        ] {
            match charge(fields) {
                ProviderOutcome::Unknown {
                    doubt: Doubt::Mismatch,
                    reason,
                } => assert!(reason.contains(shown), "{fields}: {reason}"),
                other => panic!("{fields}: {other:?}"),
            }
        }
        // A refund: amount and currency (the charge's).
        let refund = |body: &str| checked(200, body.as_bytes(), REFUNDS, &gbp(400), None);
        assert!(matches!(
            refund(r#"{"id":"re_1","status":"succeeded","amount":400,"currency":"gbp"}"#),
            ProviderOutcome::Succeeded { .. }
        ));
        assert!(matches!(
            refund(r#"{"id":"re_1","status":"succeeded","amount":300,"currency":"gbp"}"#),
            ProviderOutcome::Unknown {
                doubt: Doubt::Mismatch,
                ..
            }
        ));
        // A failed refund for another amount is not a decline to trust.
        assert!(matches!(
            refund(r#"{"id":"re_1","status":"failed","amount":300,"currency":"gbp"}"#),
            ProviderOutcome::Unknown {
                doubt: Doubt::Mismatch,
                ..
            }
        ));
        // Answers without an object pass as classified.
        let declined = br#"{"error":{"type":"card_error","code":"card_declined"}}"#;
        assert!(matches!(
            checked(402, declined, CHARGES, &gbp(4900), None),
            ProviderOutcome::Declined { .. }
        ));
    }

    /// Issue 23: what a lookup finds is judged the same way, and a null
    /// status is not final.
    #[test]
    fn a_found_object_is_judged_against_what_was_asked() -> Result<(), String> {
        let object = |json: serde_json::Value| decode_value::<wire::Object>(json);
        let ours = object(serde_json::json!({
            "id": "re_1", "status": "succeeded", "amount": 400, "currency": "gbp",
            "metadata": null
        }))?;
        assert!(matches!(
            judge(Kind::Refund, ours, &gbp(400)),
            Lookup::Found(ProviderOutcome::Succeeded { .. })
        ));
        let other = object(serde_json::json!({
            "id": "re_1", "status": "succeeded", "amount": 400, "currency": "eur"
        }))?;
        assert!(matches!(
            judge(Kind::Refund, other, &gbp(400)),
            Lookup::Unknown { reason } if reason.contains("currency eur (asked gbp)")
        ));
        let null_status = object(serde_json::json!({
            "id": "re_1", "status": null, "amount": 400, "currency": "gbp"
        }))?;
        assert!(matches!(
            judge(Kind::Refund, null_status, &gbp(400)),
            Lookup::Unknown { reason } if reason.contains("no status")
        ));
        Ok(())
    }

    /// Issue 23: a decode error names the field; null metadata names
    /// nothing, unreadable metadata is an error naming where.
    #[test]
    fn decode_errors_name_the_field() {
        let page = decode::<wire::Page>(br#"{"data":[],"has_more":null}"#);
        assert!(
            page.as_ref().is_err_and(|e| e.contains("has_more")),
            "{page:?}"
        );
        let object = decode_value::<wire::Object>(serde_json::json!({"id": "re_1", "status": 7}));
        assert!(
            object.as_ref().is_err_and(|e| e.starts_with("at status:")),
            "{object:?}"
        );
        let key = "payments_refund_id";
        let of = |json: serde_json::Value| names(&json, key).map(|n| n.map(str::to_owned));
        assert_eq!(of(serde_json::json!({"metadata": null})), Ok(None));
        assert_eq!(of(serde_json::json!({"id": "re_1"})), Ok(None));
        assert_eq!(
            of(serde_json::json!({"metadata": {key: "re_ours"}})),
            Ok(Some("re_ours".to_owned()))
        );
        assert_eq!(
            of(serde_json::json!({"metadata": {key: 5}})),
            Err(".metadata.payments_refund_id: not a string".to_owned())
        );
        assert!(of(serde_json::json!({"metadata": "x"})).is_err());
        assert!(of(serde_json::json!(null)).is_err());
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
        // Another 409 is not an in-flight answer (nor is a 400
        // idempotency error, a parameter mismatch: `Doubt::KeyReused`).
        for (status, body) in [
            (
                409,
                &br#"{"error":{"type":"api_error","message":"conflict"}}"#[..],
            ),
            (409, b"not json"),
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
