//! Fault injection: what the sandbox does to every charge, refund and
//! capture request it processes, how far its search index lags, and how
//! long a hold lasts. Set at start (CLI flags) and replaced at run time
//! through `POST /_sandbox/config`.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The sandbox's fault-injection settings.
///
/// Every field is optional on the wire (`{}` is the well-behaved provider) and
/// unknown fields are rejected, so a typo in a test cannot silently turn a
/// fault off. Faults apply, in field order, to every money-moving request
/// that is actually processed (`POST /v1/charges`, `POST /v1/refunds` and
/// `POST /v1/charges/{id}/capture` alike: they are not per route; set them
/// between the requests of a test to hit only one); idempotent replays and
/// idempotency errors answer at once.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct SandboxConfig {
    /// Milliseconds to sleep before processing a charge, refund or capture.
    pub latency_ms: u64,
    /// Probability (0.0 to 1.0) of answering 500 `api_error` without charging,
    /// refunding or capturing. Like Stripe, the 500 is saved under the request's
    /// idempotency key and replayed (`Idempotent-Replayed: true`) to every
    /// retry with that key for the key's retention: a retry never recovers.
    pub error_rate: f64,
    /// Probability (0.0 to 1.0) of answering 429 `rate_limit` before the
    /// idempotency key is even looked at, as Stripe's rate limiter does:
    /// nothing is done and nothing is saved, so a retry with the same key
    /// is processed anew. The fault a retry recovers from.
    pub rate_limit_rate: f64,
    /// Never answer and never charge, refund or capture; the client has to
    /// time out.
    pub hang: bool,
    /// Make and store the charge (or refund, or capture), then close the
    /// connection without writing a single byte of the response: the money
    /// moved and the answer is lost. A retry with the same key replays it.
    pub drop_after_charge: bool,
    /// Seconds the provider remembers an idempotency key (Stripe: 24 h).
    /// A request whose key was first used longer ago is processed as new,
    /// and charges again.
    pub key_retention_secs: u64,
    /// Milliseconds before a new charge shows up in `GET
    /// /v1/charges/search`, like Stripe's search index (Stripe: usually
    /// under a minute; up to an hour during an outage). Read at search
    /// time: changing it changes which existing charges are visible; a
    /// large one makes Search miss a charge `GET /v1/charges` lists.
    pub search_lag_ms: u64,
    /// The status a new refund is made with (Stripe's refund statuses):
    /// `succeeded` (the default), `pending` or `requires_action` (accepted;
    /// settled later through `POST /_sandbox/refunds/{id}`, as Stripe's test
    /// helpers do), `failed` or `canceled` (nothing refunded).
    pub refund_status: RefundStatus,
    /// The amount (minor units) every charge, refund and capture is made,
    /// recorded, answered and listed with, instead of the one asked for: a
    /// provider whose answer does not match the request. (A capture of more
    /// than its charge's amount is refused, and a hold is released whole.)
    pub answer_amount_override: Option<u64>,
    /// The same for the currency (three letters, stored lower-case).
    pub answer_currency_override: Option<String>,
    /// `GET /v1/refunds` lists a refund made without metadata (as from the
    /// provider's dashboard) with `metadata: null` and `status: null`:
    /// Stripe documents both fields of a refund as nullable.
    pub nulls_in_refund_lists: bool,
    /// The only secret key the sandbox accepts (`None`: any non-empty
    /// key). Any other key is answered 401, as Stripe answers an invalid
    /// API key, before anything else is looked at.
    pub secret_key: Option<String>,
    /// A restricted key the sandbox knows but that has no permission on the
    /// `/v1` endpoints: answered 403, as Stripe answers a restricted key
    /// lacking a permission. Only meaningful with `secret_key` set.
    pub restricted_key: Option<String>,
    /// Seconds a hold (a charge made with `capture=false`) can be captured
    /// for: its `capture_before` is its `created` plus this (Stripe: 7 days
    /// for most cards). Once the sandbox's clock reaches `capture_before`
    /// uncaptured, the hold is released: a capture is refused
    /// `charge_expired_for_capture` and the charge reads `refunded`. Fixed
    /// for a hold when it is made; 0 makes holds that lapse at once. At most
    /// [`MAX_HOLD_EXPIRY_SECS`].
    pub hold_expiry_seconds: u64,
    /// Whether a hold's answers show its `capture_before` (in
    /// `payment_method_details.card`, as Stripe does). `false` leaves it out
    /// of a hold made while it is set, in every answer about that hold, so
    /// a client's own fallback expiry can be tested; the hold still lapses
    /// on time.
    pub send_capture_before: bool,
}

/// A refund's status, as Stripe names it. `pending` and `requires_action`
/// are not final; the others are.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefundStatus {
    #[default]
    Succeeded,
    Pending,
    RequiresAction,
    Failed,
    Canceled,
}

impl RefundStatus {
    /// Settled for good: `succeeded`, `failed`, `canceled`.
    pub fn is_final(self) -> bool {
        !matches!(self, Self::Pending | Self::RequiresAction)
    }

    /// Its amount counts against the charge (as Stripe's `amount_refunded`
    /// counts a pending refund): all but `failed` and `canceled`.
    pub fn holds_amount(self) -> bool {
        !matches!(self, Self::Failed | Self::Canceled)
    }
}

/// Stripe's key retention.
pub const DEFAULT_KEY_RETENTION_SECS: u64 = 24 * 60 * 60;

/// Stripe's hold on most cards: 7 days.
pub const DEFAULT_HOLD_EXPIRY_SECS: u64 = 7 * 24 * 60 * 60;

/// The longest hold the sandbox makes, 100 years, so that `capture_before`
/// stays a Unix time any client can read.
pub const MAX_HOLD_EXPIRY_SECS: u64 = 100 * 365 * 24 * 60 * 60;

impl Default for SandboxConfig {
    fn default() -> Self {
        Self {
            latency_ms: 0,
            error_rate: 0.0,
            rate_limit_rate: 0.0,
            hang: false,
            drop_after_charge: false,
            key_retention_secs: DEFAULT_KEY_RETENTION_SECS,
            search_lag_ms: 0,
            refund_status: RefundStatus::Succeeded,
            answer_amount_override: None,
            answer_currency_override: None,
            nulls_in_refund_lists: false,
            secret_key: None,
            restricted_key: None,
            hold_expiry_seconds: DEFAULT_HOLD_EXPIRY_SECS,
            send_capture_before: true,
        }
    }
}

impl SandboxConfig {
    /// How long an idempotency key is remembered.
    pub fn key_retention(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.key_retention_secs)
    }

    /// Checks the invariants the wire format cannot express.
    pub fn validate(&self) -> Result<(), InvalidConfig> {
        for (field, rate) in [
            ("error_rate", self.error_rate),
            ("rate_limit_rate", self.rate_limit_rate),
        ] {
            if !(0.0..=1.0).contains(&rate) {
                return Err(InvalidConfig {
                    field,
                    message: format!("{field} must be between 0.0 and 1.0, got {rate}"),
                });
            }
        }
        for (field, key) in [
            ("secret_key", &self.secret_key),
            ("restricted_key", &self.restricted_key),
        ] {
            if key.as_deref().is_some_and(|key| key.trim().is_empty()) {
                return Err(InvalidConfig {
                    field,
                    message: format!("{field} must not be empty (leave it out to accept any key)"),
                });
            }
        }
        if self.hold_expiry_seconds > MAX_HOLD_EXPIRY_SECS {
            return Err(InvalidConfig {
                field: "hold_expiry_seconds",
                message: format!(
                    "hold_expiry_seconds must be at most {MAX_HOLD_EXPIRY_SECS} (100 years), \
                     got {}",
                    self.hold_expiry_seconds
                ),
            });
        }
        if let Some(currency) = &self.answer_currency_override
            && (currency.len() != 3 || !currency.bytes().all(|b| b.is_ascii_alphabetic()))
        {
            return Err(InvalidConfig {
                field: "answer_currency_override",
                message: format!(
                    "answer_currency_override must be three letters, got {currency:?}"
                ),
            });
        }
        Ok(())
    }
}

/// A [`SandboxConfig`] that [`SandboxConfig::validate`] refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidConfig {
    /// The offending field, as spelled on the wire.
    pub field: &'static str,
    /// What is wrong with it, for a human.
    pub message: String,
}

impl fmt::Display for InvalidConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for InvalidConfig {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_json_is_the_default() -> Result<(), serde_json::Error> {
        let config: SandboxConfig = serde_json::from_str("{}")?;
        assert_eq!(config, SandboxConfig::default());
        Ok(())
    }

    #[test]
    fn refund_statuses_are_stripes() -> Result<(), serde_json::Error> {
        let config: SandboxConfig = serde_json::from_str(r#"{"refund_status":"requires_action"}"#)?;
        assert_eq!(config.refund_status, RefundStatus::RequiresAction);
        assert!(!config.refund_status.is_final() && config.refund_status.holds_amount());
        assert!(RefundStatus::Canceled.is_final() && !RefundStatus::Canceled.holds_amount());
        assert!(serde_json::from_str::<SandboxConfig>(r#"{"refund_status":"done"}"#).is_err());
        Ok(())
    }

    #[test]
    fn holds_last_seven_days_unless_told() -> Result<(), serde_json::Error> {
        let config: SandboxConfig = serde_json::from_str("{}")?;
        assert_eq!(config.hold_expiry_seconds, 604_800);
        assert!(config.send_capture_before);
        let short: SandboxConfig =
            serde_json::from_str(r#"{"hold_expiry_seconds":0,"send_capture_before":false}"#)?;
        assert_eq!(short.validate(), Ok(()));
        assert!(!short.send_capture_before);
        for bad in [
            r#"{"hold_expiry_seconds":-1}"#,
            r#"{"hold_expiry_seconds":1.5}"#,
        ] {
            assert!(serde_json::from_str::<SandboxConfig>(bad).is_err(), "{bad}");
        }
        let too_long = SandboxConfig {
            hold_expiry_seconds: MAX_HOLD_EXPIRY_SECS + 1,
            ..SandboxConfig::default()
        };
        assert!(too_long.validate().is_err());
        Ok(())
    }

    #[test]
    fn unknown_fields_are_rejected() {
        assert!(serde_json::from_str::<SandboxConfig>(r#"{"latency":5}"#).is_err());
    }

    #[test]
    fn a_currency_override_must_be_a_currency_code() {
        for (currency, valid) in [("usd", true), ("USD", true), ("us", false), ("us1", false)] {
            let config = SandboxConfig {
                answer_currency_override: Some(currency.to_owned()),
                ..SandboxConfig::default()
            };
            assert_eq!(config.validate().is_ok(), valid, "{currency}");
        }
    }

    #[test]
    fn error_rate_must_be_a_probability() {
        for ok in [0.0, 0.5, 1.0] {
            let config = SandboxConfig {
                error_rate: ok,
                ..SandboxConfig::default()
            };
            assert_eq!(config.validate(), Ok(()));
        }
        for bad in [-0.1, 1.5, f64::NAN, f64::INFINITY] {
            let config = SandboxConfig {
                error_rate: bad,
                ..SandboxConfig::default()
            };
            assert!(config.validate().is_err(), "{bad} accepted");
        }
    }
}
