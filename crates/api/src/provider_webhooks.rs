//! `POST /webhooks/provider`'s authentication: the provider's
//! `Stripe-Signature` (`t=..,v1=..`, HMAC-SHA256 over `"{t}.{raw body}"`),
//! verified with the same code as this server's own webhooks
//! (`payments_client::webhook`), against each of GATEWAY_WEBHOOK_SECRET's
//! secrets (two during a rotation), within 5 minutes of this host's clock.

use payments_client::webhook::{DEFAULT_TOLERANCE, VerifyError, verify};
use secrecy::{ExposeSecret, SecretString};

use crate::error::ApiError;

/// Passes when any secret verifies the body; otherwise the reason, the
/// most telling first (a signature that matched but is stale).
pub fn verify_any(secrets: &[SecretString], header: &str, body: &[u8]) -> Result<(), ApiError> {
    let mut refused: Option<VerifyError> = None;
    for secret in secrets {
        match verify(secret.expose_secret(), header, body, DEFAULT_TOLERANCE) {
            Ok(_) => return Ok(()),
            Err(e @ VerifyError::Stale { .. }) => refused = Some(e),
            Err(e) => {
                refused.get_or_insert(e);
            }
        }
    }
    let reason = refused.map_or_else(|| "no secret is configured".to_owned(), |e| e.to_string());
    // The client's messages name its own header; this one is Stripe's.
    Err(ApiError::InvalidSignature(
        reason.replace("Payments-Signature", "Stripe-Signature"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use payments_client::webhook::sign;

    fn now() -> i64 {
        chrono::Utc::now().timestamp()
    }

    #[test]
    fn any_secret_of_a_rotation_verifies_and_nothing_else_does() {
        let (old, new) = (
            "whsec_old_0123456789abcdefghij",
            "whsec_new_0123456789abcdefghij",
        );
        let secrets = [SecretString::from(old), SecretString::from(new)];
        let body = br#"{"id":"evt_1"}"#;
        assert!(verify_any(&secrets, &sign(&[new], now(), body), body).is_ok());
        assert!(verify_any(&secrets, &sign(&[old], now(), body), body).is_ok());
        let other = sign(&["whsec_other_0123456789abcdefgh"], now(), body);
        assert!(verify_any(&secrets, &other, body).is_err());
        assert!(
            verify_any(&secrets, &sign(&[new], now(), body), b"{}").is_err(),
            "tampered"
        );
        let stale = verify_any(&secrets, &sign(&[new], now() - 600, body), body);
        assert!(
            matches!(&stale, Err(ApiError::InvalidSignature(why)) if why.contains("tolerance")),
            "{stale:?}"
        );
        assert!(verify_any(&secrets, "t=1", body).is_err());
        assert!(verify_any(&secrets, "", body).is_err());
    }
}
