//! Charges: the request a customer sends, validated once at the edge, and the
//! charge row we record before, during and after the provider call.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{Map, Value};

use crate::time;

/// A request that fails validation: answered 400 `invalid_request` with
/// `param`, never stored, so the same key can be retried with a fixed body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct InvalidRequest {
    pub param: Option<String>,
    pub message: String,
}

impl InvalidRequest {
    pub(crate) fn param(param: &str, message: impl Into<String>) -> Self {
        Self {
            param: Some(param.to_owned()),
            message: message.into(),
        }
    }

    pub fn body(message: impl Into<String>) -> Self {
        Self {
            param: None,
            message: message.into(),
        }
    }
}

/// The customer a request acts for: the JWT `sub`. 1-255 bytes, no
/// control characters, and no whitespace at either end: `cus_a ` is not a
/// second spelling of `cus_a` (a database that pads trailing spaces, as
/// MySQL's `PAD SPACE` collations do, would compare the two equal).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CustomerId(String);

impl CustomerId {
    /// What [`CustomerId::parse`] refuses, said once for every refusal.
    pub const RULE: &str = "a customer id is 1-255 bytes, without control characters and \
        without whitespace at its start or end";

    pub fn parse(s: &str) -> Result<Self, InvalidRequest> {
        let padded = s.starts_with(char::is_whitespace) || s.ends_with(char::is_whitespace);
        if s.is_empty() || s.len() > 255 || s.chars().any(char::is_control) || padded {
            return Err(InvalidRequest::body(Self::RULE));
        }
        Ok(Self(s.to_owned()))
    }

    /// A customer id [`CustomerId::parse`] may refuse, for tests of what a
    /// store does with one (that it still compares ids exactly): never
    /// for an id from outside.
    #[doc(hidden)]
    pub fn unvalidated_for_tests(s: &str) -> Self {
        Self(s.to_owned())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for CustomerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The longest object id the tables hold (`VARCHAR(64)`).
const MAX_OBJECT_ID: usize = 64;

/// Whether `id` has the shape of an object id this server makes: 1-64
/// letters, digits and `_` (ours are a prefix, `ch_` or `re_`, and 32 hex
/// digits). An id of another shape cannot exist, so it is answered without
/// a query: no database sees bytes it cannot hold (PostgreSQL refuses NUL
/// in text).
pub(crate) fn is_object_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_OBJECT_ID
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Whether `id` can be a charge's id: `ch_` and an object id's characters.
pub fn is_charge_id(id: &str) -> bool {
    id.starts_with("ch_") && is_object_id(id)
}

/// Whether `id` can be a refund's id: `re_` and an object id's characters.
pub fn is_refund_id(id: &str) -> bool {
    id.starts_with("re_") && is_object_id(id)
}

/// A positive amount in the currency's minor unit, at most the configured maximum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AmountCents(i64);

impl AmountCents {
    pub fn parse(value: &Value, max: i64) -> Result<Self, InvalidRequest> {
        let n = value.as_i64().ok_or_else(|| {
            InvalidRequest::param(
                "amount_cents",
                "amount_cents must be an integer number of minor units",
            )
        })?;
        if n <= 0 {
            return Err(InvalidRequest::param(
                "amount_cents",
                "amount_cents must be greater than 0",
            ));
        }
        if n > max {
            return Err(InvalidRequest::param(
                "amount_cents",
                format!("amount_cents must be at most {max}"),
            ));
        }
        Ok(Self(n))
    }

    pub fn get(self) -> i64 {
        self.0
    }
}

/// An ISO 4217 currency that has minor units (so not XAU, XXX and friends),
/// held as its upper-case code. It is accepted in either case, as Stripe's
/// API takes it: `gbp`, `GBP` and `Gbp` are one currency, stored and
/// answered as `GBP`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Currency(iso_currency::Currency);

impl Currency {
    /// What [`Currency::parse`] expects, said in every refusal of a code.
    pub const RULE: &str = "currency must be a three-letter ISO 4217 code such as GBP or gbp";

    pub fn parse(code: &str) -> Result<Self, InvalidRequest> {
        if code.len() != 3 || !code.bytes().all(|b| b.is_ascii_alphabetic()) {
            return Err(Self::refused(&Value::from(code)));
        }
        let canonical = code.to_ascii_uppercase();
        let currency = iso_currency::Currency::from_code(&canonical)
            .ok_or_else(|| Self::refused(&Value::from(code)))?;
        if currency.exponent().is_none() {
            return Err(InvalidRequest::param(
                "currency",
                format!("{canonical} is not a currency that can be charged"),
            ));
        }
        Ok(Self(currency))
    }

    /// The body's `currency`, which must be a string.
    fn from_json(value: &Value) -> Result<Self, InvalidRequest> {
        value
            .as_str()
            .map_or_else(|| Err(Self::refused(value)), Self::parse)
    }

    /// The refusal of `got` (as JSON), naming the expected form.
    fn refused(got: &Value) -> InvalidRequest {
        InvalidRequest::param("currency", format!("{}, got {got}", Self::RULE))
    }

    pub fn code(self) -> &'static str {
        self.0.code()
    }

    /// The smallest charge the provider accepts in this currency, in minor
    /// units, where it publishes one (Stripe's table of minimum charge
    /// amounts). Elsewhere the provider's minimum is a converted amount
    /// this server cannot know, and a charge below it gets the provider's
    /// own refusal (400 `provider_rejected_request`).
    pub fn minimum_charge(self) -> Option<i64> {
        MINIMUM_CHARGE
            .iter()
            .find(|(code, _)| *code == self.code())
            .map(|(_, minimum)| *minimum)
    }
}

/// Stripe's minimum charge amounts, in minor units (USD 0.50, GBP 0.30,
/// JPY 50, HUF 175.00, ...).
const MINIMUM_CHARGE: [(&str, i64); 24] = [
    ("AED", 200),
    ("AUD", 50),
    ("BGN", 100),
    ("BRL", 50),
    ("CAD", 50),
    ("CHF", 50),
    ("CZK", 1500),
    ("DKK", 250),
    ("EUR", 50),
    ("GBP", 30),
    ("HKD", 400),
    ("HUF", 17500),
    ("INR", 50),
    ("JPY", 50),
    ("MXN", 1000),
    ("MYR", 200),
    ("NOK", 300),
    ("NZD", 50),
    ("PLN", 200),
    ("RON", 200),
    ("SEK", 300),
    ("SGD", 50),
    ("THB", 1000),
    ("USD", 50),
];

/// The provider's card token (`tok_visa`). 1-255 of `[A-Za-z0-9_]`.
#[derive(Clone, PartialEq, Eq)]
pub struct CardToken(String);

impl CardToken {
    pub fn parse(s: &str) -> Result<Self, InvalidRequest> {
        if s.is_empty()
            || s.len() > 255
            || !s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        {
            return Err(InvalidRequest::param(
                "card_token",
                "card_token must be 1-255 characters of letters, digits and '_'",
            ));
        }
        Ok(Self(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Card tokens stay out of logs.
impl fmt::Debug for CardToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CardToken(..)")
    }
}

/// Limits from Stripe's API, so whatever we accept the provider accepts.
const MAX_DESCRIPTION: usize = 1000;
/// Stripe allows 50; one is ours (`payments_charge_id`, `payments_refund_id`).
const MAX_METADATA_KEYS: usize = 49;
/// The prefix of the metadata keys this server sends to the provider.
pub const RESERVED_METADATA_PREFIX: &str = "payments_";
pub(crate) const MAX_METADATA_KEY: usize = 40;
/// PostgreSQL text cannot hold U+0000 and other backends would store it
/// silently; the provider's form encoding would pass it on. Refused alike
/// everywhere.
pub(crate) const NUL_REFUSED: &str = "text must not contain the NUL character (\\u0000)";
pub(crate) const MAX_METADATA_VALUE: usize = 500;

/// A valid `POST /api/charges` body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChargeRequest {
    pub amount: AmountCents,
    pub currency: Currency,
    pub card_token: CardToken,
    pub description: Option<String>,
    pub metadata: BTreeMap<String, String>,
    /// False for a hold (`"capture": false`): authorized now, captured or
    /// released later.
    pub capture: bool,
}

impl ChargeRequest {
    /// Validates a parsed JSON body. Unknown fields are refused so a typo
    /// (`ammount_cents`) never becomes a silently different charge.
    pub fn from_json(body: &Value, max_amount_cents: i64) -> Result<Self, InvalidRequest> {
        let object = body
            .as_object()
            .ok_or_else(|| InvalidRequest::body("the request body must be a JSON object"))?;
        const FIELDS: [&str; 6] = [
            "amount_cents",
            "currency",
            "card_token",
            "description",
            "metadata",
            "capture",
        ];
        if let Some(unknown) = object.keys().find(|k| !FIELDS.contains(&k.as_str())) {
            return Err(InvalidRequest::param(
                unknown,
                format!("unknown field {unknown:?}"),
            ));
        }
        let amount = AmountCents::parse(required(object, "amount_cents")?, max_amount_cents)?;
        let currency = Currency::from_json(required(object, "currency")?)?;
        let card_token = CardToken::parse(required_str(object, "card_token")?)?;
        let description = match object.get("description") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if s.contains('\0') => {
                return Err(InvalidRequest::param("description", NUL_REFUSED));
            }
            Some(Value::String(s)) if s.chars().count() <= MAX_DESCRIPTION => Some(s.clone()),
            Some(_) => {
                return Err(InvalidRequest::param(
                    "description",
                    format!("description must be a string of at most {MAX_DESCRIPTION} characters"),
                ));
            }
        };
        let metadata = match object.get("metadata") {
            None | Some(Value::Null) => BTreeMap::new(),
            Some(Value::Object(m)) => metadata(m)?,
            Some(_) => {
                return Err(InvalidRequest::param(
                    "metadata",
                    "metadata must be an object of string values",
                ));
            }
        };
        let capture = match object.get("capture") {
            None | Some(Value::Null) => true,
            Some(Value::Bool(capture)) => *capture,
            Some(_) => {
                return Err(InvalidRequest::param(
                    "capture",
                    "capture must be true (charge now) or false (authorize a hold to capture later)",
                ));
            }
        };
        // Checked last, so a request with another bad field is told about
        // that field first.
        if let Some(minimum) = currency.minimum_charge()
            && amount.get() < minimum
        {
            return Err(InvalidRequest::param(
                "amount_cents",
                format!(
                    "amount_cents must be at least {minimum} for {}: the payment provider's \
                     smallest charge in that currency",
                    currency.code()
                ),
            ));
        }
        Ok(Self {
            amount,
            currency,
            card_token,
            description,
            metadata,
            capture,
        })
    }

    /// What this request's fingerprint is taken over: `body`, the body it
    /// was parsed from, with its currency in the canonical form, so `gbp`
    /// and `GBP` under one key are one request (a replay, not a 422). Until
    /// lower case was accepted every valid body had the canonical form, so
    /// the fingerprints stored before still match; such a body is used as
    /// it is.
    pub fn fingerprinted<'a>(&self, body: &'a Value) -> Cow<'a, Value> {
        let canonical = self.currency.code();
        match body {
            Value::Object(fields)
                if fields.get("currency").and_then(Value::as_str) != Some(canonical) =>
            {
                let mut fields = fields.clone();
                fields.insert("currency".to_owned(), Value::from(canonical));
                Cow::Owned(Value::Object(fields))
            }
            _ => Cow::Borrowed(body),
        }
    }
}

fn required<'a>(object: &'a Map<String, Value>, name: &str) -> Result<&'a Value, InvalidRequest> {
    object
        .get(name)
        .ok_or_else(|| InvalidRequest::param(name, format!("{name} is required")))
}

fn required_str<'a>(object: &'a Map<String, Value>, name: &str) -> Result<&'a str, InvalidRequest> {
    required(object, name)?
        .as_str()
        .ok_or_else(|| InvalidRequest::param(name, format!("{name} must be a string")))
}

pub(crate) fn metadata(m: &Map<String, Value>) -> Result<BTreeMap<String, String>, InvalidRequest> {
    if m.len() > MAX_METADATA_KEYS {
        return Err(InvalidRequest::param(
            "metadata",
            format!("metadata may have at most {MAX_METADATA_KEYS} keys"),
        ));
    }
    m.iter()
        .map(|(k, v)| {
            if k.contains('\0') {
                return Err(InvalidRequest::param("metadata", NUL_REFUSED));
            }
            let param = format!("metadata[{k}]");
            if v.as_str().is_some_and(|s| s.contains('\0')) {
                return Err(InvalidRequest::param(&param, NUL_REFUSED));
            }
            if k.starts_with(RESERVED_METADATA_PREFIX) {
                return Err(InvalidRequest::param(
                    &param,
                    format!("metadata keys starting with {RESERVED_METADATA_PREFIX} are reserved"),
                ));
            }
            if k.is_empty() || k.chars().count() > MAX_METADATA_KEY || k.contains(['[', ']']) {
                return Err(InvalidRequest::param(
                    &param,
                    format!(
                        "metadata keys must be 1-{MAX_METADATA_KEY} characters without brackets"
                    ),
                ));
            }
            match v {
                Value::String(s) if s.chars().count() <= MAX_METADATA_VALUE => {
                    Ok((k.clone(), s.clone()))
                }
                _ => Err(InvalidRequest::param(
                    &param,
                    format!(
                        "metadata values must be strings of at most {MAX_METADATA_VALUE} characters"
                    ),
                )),
            }
        })
        .collect()
}

/// Where a charge is in its life. `Unknown` is for reconciliation: the
/// provider's outcome could not be learned in time. A hold (a charge made
/// with `"capture": false`) is `RequiresCapture` once authorized, then
/// `Succeeded` when captured, `Canceled` when released, or `Expired` when
/// it lapsed uncaptured. Refunds and captures use the first four.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ChargeStatus {
    Pending,
    Succeeded,
    Failed,
    Unknown,
    RequiresCapture,
    Canceled,
    Expired,
}

impl ChargeStatus {
    pub const ALL: [Self; 7] = [
        Self::Pending,
        Self::Succeeded,
        Self::Failed,
        Self::Unknown,
        Self::RequiresCapture,
        Self::Canceled,
        Self::Expired,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Unknown => "unknown",
            Self::RequiresCapture => "requires_capture",
            Self::Canceled => "canceled",
            Self::Expired => "expired",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|status| status.as_str() == s)
    }
}

/// A charge as recorded in the `charges` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Charge {
    pub id: String,
    pub customer_id: String,
    pub amount_cents: i64,
    pub currency: String,
    pub card_token: CardToken,
    pub description: Option<String>,
    pub metadata: BTreeMap<String, String>,
    pub status: ChargeStatus,
    /// The idempotency key sent to the provider; see [`Charge::provider_key_for`].
    pub provider_key: String,
    pub gateway_charge_id: Option<String>,
    pub decline_code: Option<String>,
    /// The sum of its succeeded refunds.
    pub amount_refunded: i64,
    /// The key of the operation that made it (`None` without one).
    pub idempotency_key: Option<String>,
    /// False for a hold: authorized, to be captured or released later.
    pub capture: bool,
    /// What a hold's capture took (0 until then); `None` for a charge
    /// captured when it was made (all of it, once it succeeded).
    pub amount_captured: Option<i64>,
    /// When a hold lapses uncaptured: the provider's `capture_before`, or
    /// its authorization's time plus `HOLD_EXPIRY`. `None` for a charge
    /// that is no hold, or a hold not authorized yet.
    pub capture_before: Option<DateTime<Utc>>,
    /// When the row was written, by the database's clock.
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl Charge {
    /// A new `pending` charge, with a fresh random id and its provider key
    /// (a claim replaces both with derived ones,
    /// [`crate::store::Claim::derive`]). It is not stored yet, so it has no
    /// time: its timestamps are the Unix epoch until the store writes the row and returns it stamped with
    /// the database's clock (`ClaimOutcome::Claimed`, `Store::insert_charge`);
    /// only the stored charge is ever shown.
    pub fn pending(customer: &CustomerId, request: &ChargeRequest) -> Self {
        let id = format!("ch_{}", uuid::Uuid::now_v7().simple());
        Self {
            provider_key: Self::provider_key_for(&id),
            id,
            customer_id: customer.as_str().to_owned(),
            amount_cents: request.amount.get(),
            currency: request.currency.code().to_owned(),
            card_token: request.card_token.clone(),
            description: request.description.clone(),
            metadata: request.metadata.clone(),
            status: ChargeStatus::Pending,
            gateway_charge_id: None,
            decline_code: None,
            amount_refunded: 0,
            idempotency_key: None,
            capture: request.capture,
            amount_captured: (!request.capture).then_some(0),
            capture_before: None,
            created_at: DateTime::UNIX_EPOCH,
            updated_at: DateTime::UNIX_EPOCH,
        }
    }

    /// Whether it was made as a hold (`"capture": false`).
    pub fn is_hold(&self) -> bool {
        !self.capture
    }

    /// What was captured: a hold's captured amount, or all of a charge
    /// captured when made once it succeeded (0 before).
    pub fn captured_cents(&self) -> i64 {
        match self.amount_captured {
            Some(captured) => captured,
            None if self.status == ChargeStatus::Succeeded => self.amount_cents,
            None => 0,
        }
    }

    /// What of a hold was released uncaptured: the rest after a partial
    /// capture, all of it once canceled or expired, else 0.
    pub fn released_cents(&self) -> i64 {
        match self.status {
            ChargeStatus::Canceled | ChargeStatus::Expired => self.amount_cents,
            ChargeStatus::Succeeded if self.is_hold() => self.amount_cents - self.captured_cents(),
            _ => 0,
        }
    }

    /// The provider key of a charge without an idempotency key (the
    /// `optional` rollout mode), which has nothing to derive from, and of
    /// every charge made before keys were derived: from its random id.
    /// A keyed charge's id and key are derived from the operation instead
    /// ([`crate::derive`], [`crate::store::Claim::derive`]).
    pub fn provider_key_for(charge_id: &str) -> String {
        format!("payments-charge-{charge_id}")
    }

    /// Where the charge can be read back.
    pub fn location(&self) -> String {
        format!("/api/charges/{}", self.id)
    }

    /// [`Charge::to_json`] with one more member, `key`: `value` (a
    /// charge's dispute, on `GET /api/charges/{id}`).
    pub fn to_json_with(&self, key: &str, value: &impl Serialize) -> String {
        // The charge's own members in their order, the new one last.
        let mut shown = self.to_json();
        shown.pop();
        shown.push_str(&format!(
            ",{}:{}}}",
            serde_json::to_string(key).expect("a string always serialises"),
            serde_json::to_string(value).expect("a view always serialises")
        ));
        shown
    }

    /// The public JSON representation (201 bodies and `GET /api/charges/{id}`).
    pub fn to_json(&self) -> String {
        #[derive(Serialize)]
        struct View<'a> {
            id: &'a str,
            customer_id: &'a str,
            amount_cents: i64,
            amount_refunded: i64,
            captured: bool,
            amount_captured: i64,
            amount_released: i64,
            capture_before: Option<String>,
            currency: &'a str,
            status: ChargeStatus,
            description: Option<&'a str>,
            metadata: &'a BTreeMap<String, String>,
            gateway_charge_id: Option<&'a str>,
            created_at: String,
        }
        let view = View {
            id: &self.id,
            customer_id: &self.customer_id,
            amount_cents: self.amount_cents,
            amount_refunded: self.amount_refunded,
            captured: self.status == ChargeStatus::Succeeded,
            amount_captured: self.captured_cents(),
            amount_released: self.released_cents(),
            capture_before: self.capture_before.map(time::rfc3339),
            currency: &self.currency,
            status: self.status,
            description: self.description.as_deref(),
            metadata: &self.metadata,
            gateway_charge_id: self.gateway_charge_id.as_deref(),
            created_at: time::rfc3339(self.created_at),
        };
        // An invariant, not input: strings, integers and a string map always
        // serialise, and an empty body must never be stored as an answer.
        serde_json::to_string(&view).expect("a charge view always serialises")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Result<ChargeRequest, InvalidRequest> {
        ChargeRequest::from_json(&v, 1_000_000)
    }

    fn param_of(v: Value) -> Option<String> {
        parse(v).err().and_then(|e| e.param)
    }

    #[test]
    fn accepts_a_valid_body() {
        let r = parse(
            json!({"amount_cents": 4900, "currency": "GBP", "card_token": "tok_visa",
            "description": "tea", "metadata": {"order": "42"}}),
        )
        .expect("valid");
        assert_eq!(r.amount.get(), 4900);
        assert_eq!(r.currency.code(), "GBP");
        assert_eq!(r.metadata.get("order").map(String::as_str), Some("42"));
    }

    #[test]
    fn names_the_bad_param() {
        let base = json!({"amount_cents": 100, "currency": "GBP", "card_token": "tok_visa"});
        let with = |k: &str, v: Value| {
            let mut b = base.clone();
            b[k] = v;
            b
        };
        assert_eq!(
            param_of(with("amount_cents", json!(0))).as_deref(),
            Some("amount_cents")
        );
        assert_eq!(
            param_of(with("amount_cents", json!(-5))).as_deref(),
            Some("amount_cents")
        );
        assert_eq!(
            param_of(with("amount_cents", json!(1.5))).as_deref(),
            Some("amount_cents")
        );
        assert_eq!(
            param_of(with("amount_cents", json!("5"))).as_deref(),
            Some("amount_cents")
        );
        assert_eq!(
            param_of(with("amount_cents", json!(1_000_001))).as_deref(),
            Some("amount_cents")
        );
        assert_eq!(
            param_of(with("currency", json!("ZZZ"))).as_deref(),
            Some("currency")
        );
        assert_eq!(
            param_of(with("currency", json!("gb"))).as_deref(),
            Some("currency")
        );
        assert_eq!(
            param_of(with("currency", json!("XAU"))).as_deref(),
            Some("currency")
        );
        assert_eq!(
            param_of(with("card_token", json!(""))).as_deref(),
            Some("card_token")
        );
        assert_eq!(
            param_of(with("card_token", json!("tok visa"))).as_deref(),
            Some("card_token")
        );
        assert_eq!(
            param_of(with("metadata", json!({"k": 1}))).as_deref(),
            Some("metadata[k]")
        );
        assert_eq!(
            param_of(with("extra", json!(true))).as_deref(),
            Some("extra")
        );
        assert!(parse(json!([1])).is_err());
        let mut missing = base.clone();
        missing.as_object_mut().map(|o| o.remove("currency"));
        assert_eq!(param_of(missing).as_deref(), Some("currency"));
    }

    #[test]
    fn currency_is_accepted_in_either_case_and_held_upper_case() {
        for code in ["GBP", "gbp", "Gbp", "gBP"] {
            let r = parse(json!({"amount_cents": 100, "currency": code, "card_token": "tok_visa"}))
                .expect(code);
            assert_eq!(r.currency.code(), "GBP", "{code}");
        }
        // The minimum is the canonical currency's.
        let below = json!({"amount_cents": 29, "currency": "gbp", "card_token": "tok_visa"});
        assert_eq!(param_of(below).as_deref(), Some("amount_cents"));
    }

    #[test]
    fn a_code_that_is_not_iso_4217_is_told_the_form() {
        for bad in [
            json!("ZZZ"),
            json!("zzz"),
            json!("GB"),
            json!("GBPP"),
            json!("G8P"),
            json!(""),
            json!(826),
            json!(null),
        ] {
            let body = json!({"amount_cents": 100, "currency": bad, "card_token": "tok_visa"});
            let refused = parse(body).expect_err("not a currency");
            assert_eq!(refused.param.as_deref(), Some("currency"), "{bad}");
            assert!(
                refused.message.starts_with(Currency::RULE),
                "{bad}: {}",
                refused.message
            );
            assert!(
                refused.message.contains(&bad.to_string()),
                "{}",
                refused.message
            );
        }
        // A real code without minor units says so, in the canonical form.
        let gold = json!({"amount_cents": 100, "currency": "xau", "card_token": "tok_visa"});
        let refused = parse(gold).expect_err("XAU");
        assert_eq!(refused.message, "XAU is not a currency that can be charged");
    }

    #[test]
    fn the_fingerprint_is_over_the_canonical_currency() {
        use crate::idempotency::RequestFingerprint;
        let fingerprint = |body: Value| {
            let request = parse(body.clone()).expect("valid");
            RequestFingerprint::of(&request.fingerprinted(&body))
        };
        let body = |currency: &str| {
            json!({"amount_cents": 100, "currency": currency, "card_token": "tok_visa",
                "description": "tea"})
        };
        let upper = fingerprint(body("GBP"));
        assert_eq!(fingerprint(body("gbp")), upper);
        assert_eq!(fingerprint(body("Gbp")), upper);
        assert_ne!(fingerprint(body("usd")), upper);
        // A canonical body is fingerprinted as sent, as before lower case
        // was accepted: the records stored then still match.
        let canonical = body("GBP");
        let request = parse(canonical.clone()).expect("valid");
        assert!(matches!(
            request.fingerprinted(&canonical),
            Cow::Borrowed(_)
        ));
        assert_eq!(upper, RequestFingerprint::of(&canonical));
    }

    #[test]
    fn amounts_below_the_providers_minimum_are_refused() {
        let body = |amount: i64, currency: &str| json!({"amount_cents": amount, "currency": currency, "card_token": "tok_visa"});
        for (below, at, currency) in [(29, 30, "GBP"), (49, 50, "JPY"), (17_499, 17_500, "HUF")] {
            let refused = parse(body(below, currency)).expect_err("below the minimum");
            assert_eq!(refused.param.as_deref(), Some("amount_cents"));
            assert!(
                refused.message.contains(&at.to_string()),
                "{}",
                refused.message
            );
            assert!(parse(body(at, currency)).is_ok(), "{at} {currency}");
        }
        // No published minimum: left to the provider.
        assert!(parse(body(1, "ISK")).is_ok());
        // Another bad field is named first.
        let bad_token = json!({"amount_cents": 1, "currency": "GBP", "card_token": "x-y"});
        assert_eq!(param_of(bad_token).as_deref(), Some("card_token"));
    }

    #[test]
    fn provider_key_comes_from_the_charge_id() {
        let customer = CustomerId::parse("cus_1").expect("valid");
        let request =
            parse(json!({"amount_cents": 100, "currency": "JPY", "card_token": "tok_visa"}))
                .expect("valid");
        let a = Charge::pending(&customer, &request);
        let b = Charge::pending(&customer, &request);
        assert_ne!(a.provider_key, b.provider_key);
        assert!(a.provider_key.contains(&a.id));
    }
}
