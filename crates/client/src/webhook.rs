//! Webhook signatures: the code the server's deliverer signs with and a
//! merchant's Rust receiver verifies with (the scheme of Stripe's
//! `Stripe-Signature`).
//!
//! Each delivery is a `POST` of the event's JSON with the header
//!
//! ```text
//! Payments-Signature: t=1700000000,v1=c89214b5b5da833daed6f0b8c5bb6bd58cea9022bd80ccc78230f3942d632925
//! ```
//!
//! `t` is the Unix time of signing and each `v1` is the hex
//! HMAC-SHA256, keyed with one of the endpoint's secrets, of `t`, a `.` and
//! the raw body. During a secret rotation there is one `v1` per secret, so
//! a receiver holding either the old or the new secret accepts the
//! delivery. Other schemes (`v0=`, ...) are ignored.
//!
//! The timestamp is signed so that a captured delivery cannot be replayed
//! later: changing `t` breaks the signature, and an old `t` is refused once
//! it is more than the tolerance ([`DEFAULT_TOLERANCE`]) away from the
//! receiver's clock.
//!
//! To verify, read the **raw body bytes** before any JSON parsing (a
//! re-serialised body does not have the same bytes), then call [`verify`]
//! (the example in `docs/client-guide.md`):
//!
//! ```
//! use payments_client::webhook::{self, DEFAULT_TOLERANCE};
//!
//! /// The event if the delivery is genuine; on `None`, answer 400.
//! /// `header`: the request's `Payments-Signature` (`webhook::SIGNATURE_HEADER`);
//! /// `raw_body`: its body bytes. With axum, take `HeaderMap` and `Bytes`, not `Json<_>`.
//! fn verified_event(secret: &str, header: Option<&str>, raw_body: &[u8]) -> Option<serde_json::Value> {
//!     let header = header.unwrap_or_default();
//!     if let Err(error) = webhook::verify(secret, header, raw_body, DEFAULT_TOLERANCE) {
//!         eprintln!("refused a webhook: {error}");
//!         return None;
//!     }
//!     // Only now parse: the signature is over these exact bytes.
//!     serde_json::from_slice(raw_body).ok()
//! }
//! # let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
//! # let (body, now) = (br#"{"id":"evt_1"}"#, now.as_secs() as i64);
//! # let header = webhook::sign(&["whsec_old", "whsec_new"], now, body);
//! # assert!(verified_event("whsec_new", Some(&header), body).is_some());
//! # assert!(verified_event("whsec_new", Some(&header), b"{}").is_none());
//! # assert!(verified_event("whsec_new", None, body).is_none());
//! ```

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::{Choice, ConstantTimeEq};

/// The request header that carries the signature.
pub const SIGNATURE_HEADER: &str = "Payments-Signature";

/// How far `t` may be from the receiver's clock, either way: 5 minutes.
pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(5 * 60);

/// Why a delivery's signature was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    /// The header is not `t=<seconds>,v1=<hex>[,v1=<hex>...]`.
    #[error("malformed Payments-Signature header: {0}")]
    Malformed(String),
    /// The signature matches but `t` is too far from `now`: a replay, or a
    /// clock that is wrong.
    #[error("signature timestamp {timestamp} is outside the tolerance (now {now})")]
    Stale { timestamp: i64, now: i64 },
    /// No `v1` was made with this secret over this body.
    #[error("no v1 signature matches")]
    Mismatch,
}

/// The HMAC-SHA256 of `{timestamp}.{body}` keyed with `secret`.
fn signature(secret: &str, timestamp: &str, body: &[u8]) -> [u8; 32] {
    let mut mac =
        Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes a key of any length");
    mac.update(timestamp.as_bytes());
    mac.update(b".");
    mac.update(body);
    mac.finalize().into_bytes().into()
}

/// The header value for `body` signed at `timestamp`: one `v1` per secret,
/// in the order given.
pub fn sign(secrets: &[&str], timestamp: i64, body: &[u8]) -> String {
    let t = timestamp.to_string();
    let mut header = format!("t={t}");
    for secret in secrets {
        header.push_str(",v1=");
        header.push_str(&hex::encode(signature(secret, &t, body)));
    }
    header
}

/// Verifies `header` for `raw_body` against the system clock; returns `t`.
/// See [`verify_at`].
pub fn verify(
    secret: &str,
    header: &str,
    raw_body: &[u8],
    tolerance: Duration,
) -> Result<i64, VerifyError> {
    // A clock before 1970 or past i64 seconds is only ever "stale".
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    verify_at(secret, header, raw_body, tolerance, now)
}

/// Verifies `header` for `raw_body` with `now_unix` as the clock: passes when
/// any `v1` is the signature made with `secret` (compared in constant time)
/// and `t` is within `tolerance` of `now_unix`, past or future. Returns `t`.
pub fn verify_at(
    secret: &str,
    header: &str,
    raw_body: &[u8],
    tolerance: Duration,
    now_unix: i64,
) -> Result<i64, VerifyError> {
    let malformed = |why: &str| VerifyError::Malformed(why.to_owned());
    let mut t: Option<(&str, i64)> = None;
    let mut v1: Vec<Vec<u8>> = Vec::new();
    for item in header.split(',') {
        let Some((key, value)) = item.trim().split_once('=') else {
            return Err(malformed("an item is not key=value"));
        };
        match key {
            "t" if t.is_some() => return Err(malformed("more than one t")),
            "t" => {
                let seconds = value.parse().map_err(|_| malformed("t is not a number"))?;
                t = Some((value, seconds));
            }
            "v1" => match hex::decode(value) {
                Ok(bytes) if bytes.len() == 32 => v1.push(bytes),
                _ => return Err(malformed("v1 is not 64 hex digits")),
            },
            _ => {} // another scheme
        }
    }
    let Some((t_text, timestamp)) = t else {
        return Err(malformed("no t"));
    };
    if v1.is_empty() {
        return Err(malformed("no v1"));
    }
    // The bytes the sender signed: `t` as written in the header.
    let expected = signature(secret, t_text, raw_body);
    let matched = v1.iter().fold(Choice::from(0), |any, candidate| {
        any | expected.ct_eq(candidate.as_slice())
    });
    if !bool::from(matched) {
        return Err(VerifyError::Mismatch);
    }
    if now_unix.abs_diff(timestamp) > tolerance.as_secs() {
        return Err(VerifyError::Stale {
            timestamp,
            now: now_unix,
        });
    }
    Ok(timestamp)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BODY: &[u8] = br#"{"id":"evt_1"}"#;
    const T: i64 = 1_700_000_000;

    fn check(header: &str, now: i64) -> Result<i64, VerifyError> {
        verify_at("whsec_test", header, BODY, DEFAULT_TOLERANCE, now)
    }

    #[test]
    fn round_trip() {
        let header = sign(&["whsec_test"], T, BODY);
        assert_eq!(check(&header, T), Ok(T));
        assert_eq!(check(&header, T + 300), Ok(T));
        // Against the system clock, signed now.
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after 1970");
        let now = i64::try_from(now.as_secs()).expect("seconds fit an i64");
        let header = sign(&["whsec_test"], now, BODY);
        assert_eq!(
            verify("whsec_test", &header, BODY, DEFAULT_TOLERANCE),
            Ok(now)
        );
    }

    #[test]
    fn known_answer() {
        // python3 -c 'import hmac,hashlib;print(hmac.new(b"whsec_test",
        //   b"1700000000.{\"id\":\"evt_1\"}",hashlib.sha256).hexdigest())'
        let hex = "c89214b5b5da833daed6f0b8c5bb6bd58cea9022bd80ccc78230f3942d632925";
        assert_eq!(
            sign(&["whsec_test"], T, BODY),
            format!("t=1700000000,v1={hex}")
        );
        assert_eq!(check(&format!("t=1700000000,v1={hex}"), T), Ok(T));
    }

    #[test]
    fn rotation_old_and_new_secret_both_pass() {
        let header = sign(&["whsec_old", "whsec_new"], T, BODY);
        assert_eq!(header.matches(",v1=").count(), 2);
        for secret in ["whsec_old", "whsec_new"] {
            assert_eq!(
                verify_at(secret, &header, BODY, DEFAULT_TOLERANCE, T),
                Ok(T)
            );
        }
        // Unknown schemes are ignored.
        assert_eq!(
            check(&format!("{},v0=xyz", sign(&["whsec_test"], T, BODY)), T),
            Ok(T)
        );
    }

    #[test]
    fn tampered_body_or_wrong_secret_is_refused() {
        let header = sign(&["whsec_test"], T, BODY);
        let tampered = br#"{"id":"evt_2"}"#;
        let result = verify_at("whsec_test", &header, tampered, DEFAULT_TOLERANCE, T);
        assert_eq!(result, Err(VerifyError::Mismatch));
        let result = verify_at("whsec_other", &header, BODY, DEFAULT_TOLERANCE, T);
        assert_eq!(result, Err(VerifyError::Mismatch));
        // Changing t to get past the tolerance breaks the signature.
        let moved = header.replace("t=1700000000", "t=1700000900");
        assert_eq!(check(&moved, T + 900), Err(VerifyError::Mismatch));
    }

    #[test]
    fn old_or_future_timestamp_is_refused() {
        let header = sign(&["whsec_test"], T, BODY);
        let stale = |now| Err(VerifyError::Stale { timestamp: T, now });
        assert_eq!(check(&header, T + 301), stale(T + 301));
        assert_eq!(check(&header, T - 301), stale(T - 301));
        assert_eq!(check(&header, i64::MIN), stale(i64::MIN));
    }

    #[test]
    fn malformed_headers_are_refused() {
        let v1 = hex::encode([0u8; 32]);
        let headers = [
            String::new(),
            ",".into(),
            "t=abc".into(),
            format!("t=abc,v1={v1}"),
            "t=1700000000".into(),
            format!("v1={v1}"),
            "t=1700000000,v1=zz".into(),
            "t=1700000000,v1=abc".into(),
            format!("t=1,t=2,v1={v1}"),
            format!("t=99999999999999999999999,v1={v1}"),
            format!("t={},v1={v1}", i64::MIN),
            "t=1700000000,v1".into(),
            "t=1700000000,v1=é".into(),
        ];
        for header in headers {
            let result = check(&header, T);
            assert!(result.is_err(), "{header:?} passed");
        }
        assert!(matches!(
            check("t=1,t=2", T),
            Err(VerifyError::Malformed(_))
        ));
    }
}
