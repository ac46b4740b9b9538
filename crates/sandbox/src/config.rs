//! Fault injection: what the sandbox does to every charge, refund and
//! capture request it processes, how far its search index lags, how long a
//! hold lasts, and where its webhooks go and what the network does to
//! them. Set at start (CLI flags) and replaced at run time through
//! `POST /_sandbox/config`.

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
    /// Where the sandbox sends its events, Stripe's webhooks (an `http` or
    /// `https` URL); `None`: no events are made at all. Fixed for an event
    /// when it is made, with [`Self::webhook_secret`]: a later change sends
    /// the events made after it elsewhere, and leaves the retries of
    /// earlier ones where they were going. `POST /_sandbox/config` keeps
    /// it (and the secret) when its body leaves it out.
    pub webhook_url: Option<String>,
    /// The endpoint's signing secret: each delivery carries
    /// `Stripe-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of
    /// "{t}.{body}">`. At least [`MIN_WEBHOOK_SECRET_CHARS`] characters;
    /// [`DEFAULT_WEBHOOK_SECRET`] unless set.
    pub webhook_secret: String,
    /// Send every delivery attempt twice, at the same moment, concurrently:
    /// Stripe delivers at least once, so a receiver must take an event it
    /// already has without doing its work twice. Read at each attempt.
    pub webhook_duplicate: bool,
    /// Each event's first delivery waits a uniformly random 0 to this many
    /// milliseconds (after [`Self::webhook_delay_ms`]), so events arrive in
    /// shuffled order, as Stripe does not promise any. 0: sent at once, in
    /// the order they were made as far as tasks allow.
    pub webhook_shuffle_ms: u64,
    /// Milliseconds every event's first delivery waits, so a receiver gets
    /// it after the API answer that caused it.
    pub webhook_delay_ms: u64,
    /// Probability (0.0 to 1.0) that a delivery attempt is lost in the
    /// network: not sent at all, then sent again
    /// [`Self::webhook_redeliver_ms`] later (as another attempt). Read at
    /// each attempt, so a test can lose a first attempt, set it back to 0
    /// and see the event redelivered.
    pub webhook_drop_rate: f64,
    /// Milliseconds after a lost attempt (`webhook_drop_rate`) before the
    /// next one.
    pub webhook_redeliver_ms: u64,
    /// Attempts per event, at most (1 to [`MAX_WEBHOOK_ATTEMPTS`]): an
    /// attempt answered other than 2xx, failing to connect or lost is
    /// followed by another, 200 ms after the first failure and doubling,
    /// at most 5 s apart (Stripe retries for three days; the sandbox's
    /// retries are bounded so a test ends).
    pub webhook_max_attempts: u32,
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

/// The signing secret of the sandbox's webhooks unless one is set (a
/// development secret: the sandbox moves no money).
pub const DEFAULT_WEBHOOK_SECRET: &str = "whsec_sandbox_development_secret_not_for_production";

/// The shortest webhook secret accepted: a short one is a typo, or a
/// secret nobody should sign with.
pub const MIN_WEBHOOK_SECRET_CHARS: usize = 24;

/// The most attempts an event gets (`webhook_max_attempts`), so a delivery
/// to an endpoint that is down ends within minutes.
pub const MAX_WEBHOOK_ATTEMPTS: u32 = 100;

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
            webhook_url: None,
            webhook_secret: DEFAULT_WEBHOOK_SECRET.to_owned(),
            webhook_duplicate: false,
            webhook_shuffle_ms: 0,
            webhook_delay_ms: 0,
            webhook_drop_rate: 0.0,
            webhook_redeliver_ms: 500,
            webhook_max_attempts: 8,
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
            ("webhook_drop_rate", self.webhook_drop_rate),
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
        self.validate_webhooks()
    }

    fn validate_webhooks(&self) -> Result<(), InvalidConfig> {
        if let Some(url) = &self.webhook_url {
            let invalid = |why: String| InvalidConfig {
                field: "webhook_url",
                message: format!("webhook_url must be an http or https URL ({why}), got {url:?}"),
            };
            let parsed = reqwest::Url::parse(url).map_err(|error| invalid(error.to_string()))?;
            if !matches!(parsed.scheme(), "http" | "https") {
                return Err(invalid(format!("not {}", parsed.scheme())));
            }
            if parsed.host_str().is_none_or(str::is_empty) {
                return Err(invalid("no host".to_owned()));
            }
        }
        let secret_chars = self.webhook_secret.chars().count();
        if secret_chars < MIN_WEBHOOK_SECRET_CHARS {
            return Err(InvalidConfig {
                field: "webhook_secret",
                message: format!(
                    "webhook_secret must be at least {MIN_WEBHOOK_SECRET_CHARS} characters, got \
                     {secret_chars}"
                ),
            });
        }
        if !(1..=MAX_WEBHOOK_ATTEMPTS).contains(&self.webhook_max_attempts) {
            return Err(InvalidConfig {
                field: "webhook_max_attempts",
                message: format!(
                    "webhook_max_attempts must be between 1 and {MAX_WEBHOOK_ATTEMPTS}, got {}",
                    self.webhook_max_attempts
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
    fn webhooks_are_off_and_their_settings_validated() -> Result<(), serde_json::Error> {
        let config: SandboxConfig = serde_json::from_str("{}")?;
        assert_eq!(config.webhook_url, None);
        assert_eq!(config.webhook_secret, DEFAULT_WEBHOOK_SECRET);
        assert_eq!(
            (config.webhook_max_attempts, config.webhook_redeliver_ms),
            (8, 500)
        );
        for (json, field) in [
            (r#"{"webhook_url":"not a url"}"#, "webhook_url"),
            (
                r#"{"webhook_url":"ftp://example.com/hooks"}"#,
                "webhook_url",
            ),
            (r#"{"webhook_url":"unix:/tmp/socket"}"#, "webhook_url"),
            (r#"{"webhook_secret":"whsec_short"}"#, "webhook_secret"),
            (r#"{"webhook_drop_rate":1.01}"#, "webhook_drop_rate"),
            (r#"{"webhook_drop_rate":-0.1}"#, "webhook_drop_rate"),
            (r#"{"webhook_max_attempts":0}"#, "webhook_max_attempts"),
            (r#"{"webhook_max_attempts":101}"#, "webhook_max_attempts"),
        ] {
            let config: SandboxConfig = serde_json::from_str(json)?;
            assert_eq!(config.validate().map_err(|e| e.field), Err(field), "{json}");
        }
        for json in [
            r#"{"webhook_url":"http://127.0.0.1:9/hooks","webhook_drop_rate":1.0}"#,
            r#"{"webhook_url":"https://example.com","webhook_max_attempts":1}"#,
        ] {
            let config: SandboxConfig = serde_json::from_str(json)?;
            assert_eq!(config.validate(), Ok(()), "{json}");
        }
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
