//! The wire types of charges, refunds and lists.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The body of `POST /api/charges`. The server refuses unknown fields, so
/// this is exactly the documented set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChargeRequest {
    /// Minor units (pence, cents); positive and at most the server's maximum.
    pub amount_cents: i64,
    /// ISO 4217, e.g. `GBP`.
    pub currency: String,
    /// A provider card token (`tok_visa` in the sandbox).
    pub card_token: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// String keys to string values.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<BTreeMap<String, String>>,
    /// `Some(false)`: a hold, authorized now and captured or canceled
    /// later ([`crate::Client::authorize`] sets it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capture: Option<bool>,
}

impl ChargeRequest {
    pub fn new(
        amount_cents: i64,
        currency: impl Into<String>,
        card_token: impl Into<String>,
    ) -> Self {
        Self {
            amount_cents,
            currency: currency.into(),
            card_token: card_token.into(),
            description: None,
            metadata: None,
            capture: None,
        }
    }

    pub fn with_description(mut self, description: impl Into<String>) -> Self {
        self.description = Some(description.into());
        self
    }

    /// Adds one metadata entry.
    pub fn with_metadata(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.metadata
            .get_or_insert_with(BTreeMap::new)
            .insert(key.into(), value.into());
        self
    }
}

/// Where a charge stands on the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChargeStatus {
    /// Claimed; the provider's answer is not recorded yet.
    Pending,
    Succeeded,
    /// Declined by the provider.
    Failed,
    /// The server gave up on the provider and reconciles by hand.
    Unknown,
    /// A hold, authorized and not captured yet.
    RequiresCapture,
    /// A hold released uncaptured.
    Canceled,
    /// A hold that lapsed uncaptured.
    Expired,
    /// A status this client does not know yet.
    #[serde(other)]
    Unrecognised,
}

/// A charge, as `201 Created` and `GET /api/charges/{id}` return it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Charge {
    pub id: String,
    pub customer_id: String,
    pub amount_cents: i64,
    /// The sum of its succeeded refunds (0 from servers before refunds).
    #[serde(default)]
    pub amount_refunded: i64,
    pub currency: String,
    pub status: ChargeStatus,
    pub description: Option<String>,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// The provider's id for the charge, once it answered.
    pub gateway_charge_id: Option<String>,
    /// Captured (a charge made to be captured at once, once it succeeded;
    /// a hold once captured). Absent from servers before holds.
    #[serde(default)]
    pub captured: bool,
    /// What was captured (a hold: its capture's amount).
    #[serde(default)]
    pub amount_captured: i64,
    /// What of a hold was released uncaptured.
    #[serde(default)]
    pub amount_released: i64,
    /// When a hold lapses uncaptured (RFC 3339), `None` for other charges.
    #[serde(default)]
    pub capture_before: Option<String>,
    /// When the server took the charge: RFC 3339 in UTC, as the server wrote
    /// it (`2024-05-01T12:00:00.123Z`). Kept as text so the client imposes
    /// no date library; parse it with the one the service already uses.
    pub created_at: String,
}

/// The body of `POST /api/charges/{id}/capture`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaptureRequest {
    /// What to capture, at most the amount authorized; by default all of
    /// it. The rest of the hold is released.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amount_cents: Option<i64>,
}

/// The body of `POST /api/charges/{id}/refunds`: every field optional.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefundRequest {
    /// What to refund; by default what is left to refund of the charge.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amount_cents: Option<i64>,
    /// `requested_by_customer`, `duplicate` or `fraudulent`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<BTreeMap<String, String>>,
}

/// A refund, as `201 Created` and the refund reads return it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refund {
    pub id: String,
    pub charge_id: String,
    pub amount_cents: i64,
    pub currency: String,
    /// The same four states as a charge's. `Pending` in a 201 means the
    /// provider accepted the refund and settles it later (its amount stays
    /// reserved); read the refund again for its outcome.
    pub status: ChargeStatus,
    pub reason: Option<String>,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    pub gateway_refund_id: Option<String>,
    pub failure_code: Option<String>,
    /// Who asked for the refund.
    pub requested_by: RequestedBy,
    /// RFC 3339 in UTC, as the server wrote it.
    pub created_at: String,
}

/// Who asked for a refund: the token's subject, and `customer` or
/// `back_office`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestedBy {
    pub subject: String,
    pub role: String,
}

/// A page of a list, Stripe's shape: pass the last item's id as
/// `starting_after` for the next page while `has_more`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct List<T> {
    pub data: Vec<T>,
    pub has_more: bool,
}

/// The filters and page of `GET /api/charges`; `Default` is the newest 20.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChargeQuery {
    pub limit: Option<u32>,
    pub starting_after: Option<String>,
    pub ending_before: Option<String>,
    pub status: Option<String>,
    /// `created[gte]` and `created[lt]`, Unix seconds.
    pub created_gte: Option<i64>,
    pub created_lt: Option<i64>,
    /// One metadata key and the value it must have (e.g. an order id).
    pub metadata: Option<(String, String)>,
    /// The key of the request that made the charge.
    pub idempotency_key: Option<String>,
    /// Whose charges: any customer's, for a token with `charges:read_all`
    /// (the back office); others get 403 `insufficient_scope`. Unset, such
    /// a token lists every customer's charges.
    pub customer: Option<String>,
}

impl ChargeQuery {
    /// The query string's pairs.
    pub fn pairs(&self) -> Vec<(String, String)> {
        let mut pairs = Vec::new();
        let mut add = |name: &str, value: Option<String>| {
            if let Some(value) = value {
                pairs.push((name.to_owned(), value));
            }
        };
        add("limit", self.limit.map(|n| n.to_string()));
        add("starting_after", self.starting_after.clone());
        add("ending_before", self.ending_before.clone());
        add("status", self.status.clone());
        add("created[gte]", self.created_gte.map(|t| t.to_string()));
        add("created[lt]", self.created_lt.map(|t| t.to_string()));
        add("idempotency_key", self.idempotency_key.clone());
        add("customer", self.customer.clone());
        if let Some((key, value)) = &self.metadata {
            add(&format!("metadata[{key}]"), Some(value.clone()));
        }
        pairs
    }
}

/// The inside of the error envelope `{"error":{...}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiError {
    /// Stable, e.g. `card_declined`, `invalid_request`, `idempotency_key_reused`.
    pub code: String,
    /// For humans; may change.
    #[serde(default)]
    pub message: String,
    /// The offending field of a 400 `invalid_request`, e.g. `currency`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub param: Option<String>,
    /// Why the provider declined a 402, e.g. `insufficient_funds`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decline_code: Option<String>,
    /// The declined charge, when the server names it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub charge_id: Option<String>,
    /// The failed refund, when the server names it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refund_id: Option<String>,
    /// What is left to refund (400 `refund_exceeds_charge`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refundable_amount_cents: Option<i64>,
    /// The provider's own error code (400 `provider_rejected_request`),
    /// e.g. `resource_missing`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_code: Option<String>,
}

#[derive(Deserialize)]
struct Envelope {
    error: ApiError,
}

impl ApiError {
    /// The envelope in `body`, if it is one.
    pub fn from_envelope(body: &[u8]) -> Option<Self> {
        serde_json::from_slice::<Envelope>(body)
            .ok()
            .map(|e| e.error)
    }

    /// The envelope in `body`, or a stand-in naming the status when the
    /// answer is not ours (a proxy's HTML page, say).
    pub fn from_response(status: u16, body: &[u8]) -> Self {
        Self::from_envelope(body).unwrap_or_else(|| Self {
            code: format!("http_{status}"),
            message: snippet(body),
            param: None,
            decline_code: None,
            charge_id: None,
            refund_id: None,
            refundable_amount_cents: None,
            provider_code: None,
        })
    }
}

/// The start of a body, for error messages.
pub(crate) fn snippet(body: &[u8]) -> String {
    const MAX: usize = 200;
    let text = String::from_utf8_lossy(body);
    let mut out: String = text.chars().take(MAX).collect();
    if text.chars().count() > MAX {
        out.push_str("...");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_serialises_only_what_is_set() -> Result<(), serde_json::Error> {
        let plain = serde_json::to_string(&ChargeRequest::new(4900, "GBP", "tok_visa"))?;
        assert_eq!(
            plain,
            r#"{"amount_cents":4900,"currency":"GBP","card_token":"tok_visa"}"#
        );
        let full = ChargeRequest::new(100, "GBP", "tok_visa")
            .with_description("tea")
            .with_metadata("order", "42");
        assert_eq!(
            serde_json::to_string(&full)?,
            r#"{"amount_cents":100,"currency":"GBP","card_token":"tok_visa","description":"tea","metadata":{"order":"42"}}"#
        );
        Ok(())
    }

    #[test]
    fn charge_parses_the_server_shape() -> Result<(), serde_json::Error> {
        let charge: Charge = serde_json::from_str(
            r#"{"id":"ch_1","customer_id":"cus_a","amount_cents":4900,"currency":"GBP",
                "status":"succeeded","description":null,"metadata":{"k":"v"},
                "gateway_charge_id":"ch_gw","created_at":"2024-05-01T12:00:00.123Z"}"#,
        )?;
        assert_eq!(charge.status, ChargeStatus::Succeeded);
        assert_eq!(charge.metadata.get("k").map(String::as_str), Some("v"));
        Ok(())
    }

    #[test]
    fn envelope_or_stand_in() {
        let declined = ApiError::from_envelope(
            br#"{"error":{"code":"card_declined","message":"no","decline_code":"insufficient_funds"}}"#,
        );
        assert_eq!(
            declined.and_then(|e| e.decline_code).as_deref(),
            Some("insufficient_funds")
        );
        let html = ApiError::from_response(502, b"<html>bad gateway</html>");
        assert_eq!(html.code, "http_502");
        assert!(html.message.contains("bad gateway"));
    }
}
