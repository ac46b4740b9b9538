//! The error envelope: `{"error":{"code":"...","message":"...","param":"..."}}`.
//!
//! One type, so a stored decline and a live validation error look alike.

use serde::Serialize;

/// The body of every error answer.
#[derive(Debug, Clone, Serialize)]
pub struct ErrorEnvelope {
    pub error: ErrorBody,
}

/// Stable `code`, human `message`, and the offending `param` where there is one.
#[derive(Debug, Clone, Serialize)]
pub struct ErrorBody {
    pub code: String,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub param: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decline_code: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub charge_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refund_id: Option<String>,
    /// What is left to refund of a charge (`refund_exceeds_charge`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refundable_amount_cents: Option<i64>,
    /// The provider's own error code (`provider_rejected_request`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider_code: Option<String>,
}

impl ErrorEnvelope {
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            error: ErrorBody {
                code: code.into(),
                message: message.into(),
                param: None,
                decline_code: None,
                charge_id: None,
                refund_id: None,
                refundable_amount_cents: None,
                provider_code: None,
            },
        }
    }

    pub fn with_param(mut self, param: Option<String>) -> Self {
        self.error.param = param;
        self
    }

    /// The answer of `status` with this envelope as its JSON body, as a
    /// record stores it.
    pub fn stored(&self, status: u16) -> crate::idempotency::StoredResponse {
        crate::idempotency::StoredResponse {
            status,
            body: self.to_json(),
            content_type: crate::idempotency::JSON.to_owned(),
            location: None,
        }
    }

    /// The JSON text. Serialising plain strings cannot fail; the fallback
    /// keeps this infallible without an unwrap.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| {
            r#"{"error":{"code":"internal_error","message":"internal error"}}"#.to_owned()
        })
    }
}
