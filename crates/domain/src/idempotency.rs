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
/// The route scope of a refund: the path's template, the same for every
/// charge (the fingerprint covers the charge id, so one key sent to refund
/// two charges is a 422, never the first refund's replay).
pub const REFUNDS_ROUTE: &str = "POST /api/charges/{id}/refunds";
/// The route scopes of a hold's capture and cancel, like a refund's.
pub const CAPTURES_ROUTE: &str = "POST /api/charges/{id}/capture";
pub const CANCELS_ROUTE: &str = "POST /api/charges/{id}/cancel";

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
/// whitespace do not change it, nor does an optional field sent as `null`
/// instead of left out (`"description": null` is no description); any value
/// does.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct RequestFingerprint([u8; 32]);

impl RequestFingerprint {
    /// The current fingerprint (version 2): top-level `null` fields dropped
    /// (only optional fields can be null in a valid request), then hashed.
    pub fn of(body: &Value) -> Self {
        match body {
            Value::Object(fields) if Self::drops_nulls(body) => {
                let present: serde_json::Map<String, Value> = fields
                    .iter()
                    .filter(|(_, v)| !v.is_null())
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                Self::of_v1(&Value::Object(present))
            }
            _ => Self::of_v1(body),
        }
    }

    /// Whether version 2 hashes something other than `body` as sent (it has
    /// top-level `null` fields): only then do the two versions differ.
    pub fn drops_nulls(body: &Value) -> bool {
        matches!(body, Value::Object(fields) if fields.values().any(Value::is_null))
    }

    /// The first version, over the body exactly as sent: records written
    /// before version 2 hold it, and are compared with it too.
    pub fn of_v1(body: &Value) -> Self {
        let mut hasher = Sha256::new();
        if serde_json_writes_canonical(body) {
            // serde_json's compact form of this value is its RFC 8785 form
            // byte for byte, written straight into the hash.
            let written = serde_json::to_writer(HashWriter(&mut hasher), body);
            if written.is_ok() {
                return Self(hasher.finalize().into());
            }
            hasher = Sha256::new();
        }
        // Canonicalising a parsed `Value` cannot fail: its numbers are finite
        // and its keys are strings. An empty fingerprint would match any body.
        let canonical = serde_json_canonicalizer::to_vec(body)
            .expect("a parsed JSON value always canonicalises");
        hasher.update(&canonical);
        Self(hasher.finalize().into())
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

/// Whether serde_json's compact output of `value` is already its RFC 8785
/// canonical form, so the fingerprint needs no canonicaliser (which sorts
/// each object's keys by re-parsing them, an allocation per key: 7.6% of a
/// replay's CPU in issue 31's profile). It is when:
/// - every number is an integer of at most 2^53 in size (RFC 8785 writes
///   numbers as ECMAScript does; a fraction, an exponent or a larger
///   integer goes the long way);
/// - every object key is below U+D800: serde_json's map is ordered by code
///   point, RFC 8785 orders by UTF-16 code unit, and the two orders differ
///   only for characters from U+E000 (past the surrogates);
/// - strings are escaped alike: both write `\"`, `\\`, `\b \t \n \f \r`, other
///   control characters as lowercase `\u00xx`, and everything else as is.
///
/// `canonical_form_is_serde_jsons_where_claimed` holds the two to the same
/// bytes over every control character, unicode keys and nested values.
fn serde_json_writes_canonical(value: &Value) -> bool {
    const MAX_EXACT: u64 = 1 << 53;
    match value {
        Value::Null | Value::Bool(_) | Value::String(_) => true,
        Value::Number(n) => {
            n.as_u64().is_some_and(|n| n <= MAX_EXACT)
                || n.as_i64().is_some_and(|n| n.unsigned_abs() <= MAX_EXACT)
        }
        Value::Array(items) => items.iter().all(serde_json_writes_canonical),
        Value::Object(fields) => fields.iter().all(|(key, value)| {
            key.chars().all(|c| u32::from(c) < 0xD800) && serde_json_writes_canonical(value)
        }),
    }
}

/// Bytes written go into a hash.
struct HashWriter<'a>(&'a mut Sha256);

impl std::io::Write for HashWriter<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.update(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl fmt::Debug for RequestFingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RequestFingerprint({})", self.to_hex())
    }
}

/// Who is driving an in-progress request, and until when (the database's
/// clock). Every state change of an in-progress record is a compare-and-set
/// on the token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub token: LeaseToken,
    pub until: DateTime<Utc>,
}

/// A lease's token: whoever holds it drives the request, and every write
/// that depends on the lease compares it (compare-and-set).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LeaseToken(String);

impl LeaseToken {
    /// A fresh, unguessable token.
    pub fn generate() -> Self {
        Self(uuid::Uuid::new_v4().simple().to_string())
    }

    /// A token as a store read it back.
    pub fn from_stored(token: String) -> Self {
        Self(token)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The id of a row of `idempotent_requests`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RecordId(pub i64);

impl fmt::Display for RecordId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordState {
    InProgress,
    /// A final answer from the provider (201 or 402): replayed until the
    /// TTL, then reclaimable and prunable.
    Complete,
    /// Given up on with the provider's outcome unknown (`500
    /// request_abandoned`): replayed, and never reclaimed nor pruned, since
    /// the money may have moved; reconciliation settles it.
    Abandoned,
}

impl RecordState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InProgress => "in_progress",
            Self::Complete => "complete",
            Self::Abandoned => "abandoned",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "in_progress" => Some(Self::InProgress),
            "complete" => Some(Self::Complete),
            "abandoned" => Some(Self::Abandoned),
            _ => None,
        }
    }

    /// Whether the record holds a stored answer to replay.
    pub fn is_answered(self) -> bool {
        !matches!(self, Self::InProgress)
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

/// One row of `idempotent_requests`, with what the database's clock said
/// of it when it was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyRecord {
    pub id: RecordId,
    pub key: String,
    pub route: String,
    pub customer_id: String,
    pub request_hash: String,
    pub state: RecordState,
    pub lease: Option<Lease>,
    /// The charge made, or (on a refund's record) refunded.
    pub charge_id: String,
    /// A refund's record: the refund it drives (`None` on a charge's, and
    /// on a refund refused as not fitting, which made none); a capture's
    /// or cancel's record: the capture (`cp_`) or cancel (`cn_`) it
    /// drives, in the same column (`None` when refused).
    pub refund_id: Option<String>,
    pub response: Option<StoredResponse>,
    pub created_at: DateTime<Utc>,
    pub completed_at: Option<DateTime<Utc>>,
    pub expires_at: DateTime<Utc>,
    /// The lease had not ended (`locked_until` > the database's now).
    pub lease_live: bool,
    /// Past `expires_at` by the database's clock.
    pub expired: bool,
    /// How long ago the record was claimed, by the database's clock.
    pub age: std::time::Duration,
    /// How long until `expires_at`, by the database's clock when it was
    /// read (zero once past): what bounds a copy kept in memory.
    pub ttl_left: std::time::Duration,
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

    /// Past its TTL with a final answer: behaves as absent, and a claim
    /// reclaims it. In-progress and abandoned records never are.
    pub fn reclaimable(&self) -> bool {
        self.state == RecordState::Complete && self.expired
    }

    /// The id of the operation the record drives: its refund's, else its charge's.
    pub fn operation_id(&self) -> &str {
        self.refund_id.as_deref().unwrap_or(&self.charge_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Where the fast path is taken, its bytes are the canonicaliser's; and
    /// it is taken for a charge's body.
    #[test]
    fn canonical_form_is_serde_jsons_where_claimed() {
        let mut cases = vec![
            json!({"amount": 4900, "currency": "usd", "card_token": "tok_visa", "capture": true,
                   "description": null, "metadata": {"order": "o-1", "z": "", "a": "b"}}),
            json!({"b": [1, -2, {"y": false, "x": null}], "a": "q\"uote\\back/slash"}),
            json!({"é": 1, "e": 2, "z": 3, "日本": 4, "\u{d7ff}": 5}),
            json!({"big": 9_007_199_254_740_992_u64, "neg": -9_007_199_254_740_992_i64}),
            json!({"s": "\u{2028}\u{2029}\u{7f}\u{80}\u{ffff}\u{1f600}"}),
            json!([]),
            json!({}),
            json!("top"),
        ];
        // Every control character and every ASCII character, in a value
        // and in a key.
        for c in (0u8..=0x7f).map(char::from) {
            cases.push(json!({ format!("k{c}"): format!("v{c}w") }));
        }
        for case in &cases {
            assert!(serde_json_writes_canonical(case), "{case}");
            let fast = serde_json::to_vec(case).expect("serialises");
            let canonical = serde_json_canonicalizer::to_vec(case).expect("canonicalises");
            assert_eq!(
                String::from_utf8_lossy(&fast),
                String::from_utf8_lossy(&canonical),
                "{case}"
            );
        }
        // The long way, and still one fingerprint per value however sent.
        for slow in [
            json!({"amount": 1.5}),
            json!({"amount": 1e21}),
            json!({"amount": 9_007_199_254_740_993_u64}),
            json!({"\u{e000}": 1, "\u{1f600}": 2}),
            json!([{"a": -0.0}]),
        ] {
            assert!(!serde_json_writes_canonical(&slow), "{slow}");
            let canonical = serde_json_canonicalizer::to_vec(&slow).expect("canonicalises");
            assert_eq!(
                RequestFingerprint::of_v1(&slow),
                RequestFingerprint(Sha256::digest(&canonical).into())
            );
        }
        let reordered: Value = serde_json::from_str(
            r#"{"metadata":{"z":"","a":"b","order":"o-1"},"currency":"usd","amount":4900}"#,
        )
        .expect("parses");
        let sorted: Value = serde_json::from_str(
            r#"{"amount":4900,"currency":"usd","metadata":{"a":"b","order":"o-1","z":""}}"#,
        )
        .expect("parses");
        assert_eq!(
            RequestFingerprint::of_v1(&reordered),
            RequestFingerprint::of_v1(&sorted)
        );
    }

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

    #[test]
    fn null_and_absent_optional_fields_are_the_same_request() {
        let absent = json!({"amount_cents": 1, "currency": "GBP", "card_token": "tok_visa"});
        let null = json!({"amount_cents": 1, "currency": "GBP", "card_token": "tok_visa",
            "description": null, "metadata": null});
        let set = json!({"amount_cents": 1, "currency": "GBP", "card_token": "tok_visa",
            "description": "tea"});
        assert_eq!(
            RequestFingerprint::of(&absent),
            RequestFingerprint::of(&null)
        );
        assert_ne!(
            RequestFingerprint::of(&absent),
            RequestFingerprint::of(&set)
        );
        // Version 1 hashed the body as sent: without nulls the two agree, so
        // records written before the change keep matching.
        assert_eq!(
            RequestFingerprint::of(&absent),
            RequestFingerprint::of_v1(&absent)
        );
        assert_ne!(
            RequestFingerprint::of_v1(&null),
            RequestFingerprint::of(&null)
        );
    }
}
