//! Idempotency: the client's key, the canonical fingerprint of its request,
//! the lease that says who is driving a request, and the stored record.

use std::fmt;

use chrono::{DateTime, Utc};
use serde_json::Value;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The route scope of a charge request: records are unique per (key, route),
/// so one key sent to two endpoints never returns the other's response.
pub const CHARGES_ROUTE: &str = "POST /api/charges";

/// Why an `Idempotency-Key` header was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("Idempotency-Key must be 1-255 visible ASCII characters")]
    Invalid,
}

/// A client-generated key: 1-255 visible ASCII characters (Stripe's limit).
/// Sent bare (`abc`) or as a structured-header string (`"abc"`); both are the
/// same key.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    pub const MAX_LEN: usize = 255;

    pub fn parse(header: &str) -> Result<Self, KeyError> {
        let key = match header.strip_prefix('"') {
            Some(rest) => unquote(rest)?,
            None => header.to_owned(),
        };
        let visible = |b: u8| (0x21..=0x7e).contains(&b);
        if key.is_empty() || key.len() > Self::MAX_LEN || !key.bytes().all(visible) {
            return Err(KeyError::Invalid);
        }
        Ok(Self(key))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The rest of an RFC 8941 sf-string after its opening quote: `\"` and `\\`
/// are the only escapes, and the closing quote must end the value.
fn unquote(rest: &str) -> Result<String, KeyError> {
    let mut out = String::with_capacity(rest.len());
    let mut chars = rest.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(e @ ('"' | '\\')) => out.push(e),
                _ => return Err(KeyError::Invalid),
            },
            '"' => {
                return if chars.next().is_none() {
                    Ok(out)
                } else {
                    Err(KeyError::Invalid)
                };
            }
            c => out.push(c),
        }
    }
    Err(KeyError::Invalid)
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IdempotencyKey({:?})", self.0)
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// SHA-256 over the RFC 8785 canonical JSON of a request body: key order and
/// whitespace do not change it, any value does.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct RequestFingerprint([u8; 32]);

impl RequestFingerprint {
    pub fn of(body: &Value) -> Self {
        // Canonicalising a parsed `Value` cannot fail: its numbers are finite
        // and its keys are strings. Hash the empty string in the impossible case.
        let canonical = serde_json_canonicalizer::to_vec(body).unwrap_or_default();
        Self(Sha256::digest(&canonical).into())
    }

    pub fn to_hex(self) -> String {
        hex::encode(self.0)
    }

    /// Compares with a stored hex digest in constant time. A malformed stored
    /// digest matches nothing.
    pub fn matches_hex(&self, stored: &str) -> bool {
        let mut digest = [0u8; 32];
        if hex::decode_to_slice(stored, &mut digest).is_err() {
            return false;
        }
        self.0.ct_eq(&digest).into()
    }
}

impl fmt::Debug for RequestFingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RequestFingerprint({})", self.to_hex())
    }
}

/// Who is driving an in-progress request, and until when. Every state change
/// of an in-progress record is a compare-and-set on the token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub token: String,
    pub until: DateTime<Utc>,
}

impl Lease {
    pub fn new(until: DateTime<Utc>) -> Self {
        Self {
            token: uuid::Uuid::new_v4().simple().to_string(),
            until,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordState {
    InProgress,
    Complete,
}

impl RecordState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InProgress => "in_progress",
            Self::Complete => "complete",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "in_progress" => Some(Self::InProgress),
            "complete" => Some(Self::Complete),
            _ => None,
        }
    }
}

/// A final answer, stored so a retry gets the same bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    pub status: u16,
    pub body: String,
    pub content_type: String,
    pub location: Option<String>,
}

pub const JSON: &str = "application/json";

/// One row of `idempotent_requests`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyRecord {
    pub id: i64,
    pub key: String,
    pub route: String,
    pub customer_id: String,
    pub request_hash: String,
    pub state: RecordState,
    pub lease: Option<Lease>,
    pub charge_id: String,
    pub response: Option<StoredResponse>,
    pub created_at: DateTime<Utc>,
    pub completed_at: Option<DateTime<Utc>>,
    pub expires_at: DateTime<Utc>,
}

impl IdempotencyRecord {
    /// The owner and fingerprint check, run on every path that answers from
    /// an existing record. Either mismatch is the same 422 so another
    /// customer learns nothing about the key's first use.
    pub fn matches(&self, customer: &str, fingerprint: &RequestFingerprint) -> bool {
        // Evaluate both so the timing does not tell which one failed.
        let owner = self.customer_id.as_bytes().ct_eq(customer.as_bytes());
        let body = fingerprint.matches_hex(&self.request_hash);
        bool::from(owner) & body
    }

    /// Expiry is decided when the record is read, not when the pruner runs.
    pub fn is_expired(&self, now: DateTime<Utc>) -> bool {
        self.expires_at <= now
    }

    /// True while the request's driver still holds its lease.
    pub fn lease_is_live(&self, now: DateTime<Utc>) -> bool {
        self.lease.as_ref().is_some_and(|l| l.until > now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn bare_and_quoted_keys_are_the_same_key() {
        let bare = IdempotencyKey::parse("9c1f4a7e-3b2d").expect("bare");
        let quoted = IdempotencyKey::parse("\"9c1f4a7e-3b2d\"").expect("quoted");
        assert_eq!(bare, quoted);
        assert_eq!(
            IdempotencyKey::parse(r#""a\"b\\c""#)
                .expect("escapes")
                .as_str(),
            r#"a"b\c"#
        );
    }

    #[test]
    fn malformed_keys_are_refused() {
        for bad in ["", " ", "a b", "\"\"", "\"abc", "\"a\"b", "é", "\"a\\x\""] {
            assert_eq!(
                IdempotencyKey::parse(bad),
                Err(KeyError::Invalid),
                "{bad:?}"
            );
        }
        assert!(IdempotencyKey::parse(&"k".repeat(255)).is_ok());
        assert!(IdempotencyKey::parse(&"k".repeat(256)).is_err());
    }

    #[test]
    fn fingerprint_ignores_key_order_and_whitespace_only() {
        let a: Value = serde_json::from_str(r#"{"b": 1, "a": {"y": 2, "x": 1}}"#).expect("json");
        let b: Value = serde_json::from_str(r#"{"a":{"x":1,"y":2},"b":1}"#).expect("json");
        let c = json!({"a": {"x": 1, "y": 2}, "b": 2});
        let fa = RequestFingerprint::of(&a);
        assert_eq!(fa, RequestFingerprint::of(&b));
        assert_ne!(fa, RequestFingerprint::of(&c));
        assert!(fa.matches_hex(&RequestFingerprint::of(&b).to_hex()));
        assert!(!fa.matches_hex(&RequestFingerprint::of(&c).to_hex()));
        assert!(!fa.matches_hex("not hex"));
    }
}
