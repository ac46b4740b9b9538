//! The `Idempotency-Key`: one per logical operation, never one per attempt.

use std::fmt;

/// The value sent in `Idempotency-Key`: 1-255 visible ASCII characters.
///
/// One key names one logical operation ("charge this basket once"). Every
/// retry of that operation must send the same key; a new payment gets a new
/// key. [`IdempotencyKey::generate`] makes a UUID v4, so two clients can
/// never pick the same key by accident.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

/// A key the server would refuse (`idempotency_key_invalid`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "an idempotency key is 1-255 visible ASCII characters and does not start with a double quote"
)]
pub struct InvalidKey;

impl IdempotencyKey {
    /// The server's limit (Stripe's).
    pub const MAX_LEN: usize = 255;

    /// A fresh random key (UUID v4) for a new logical operation.
    pub fn generate() -> Self {
        Self(uuid::Uuid::new_v4().to_string())
    }

    /// A key the caller generated and persisted itself (for example before
    /// an app restart). A leading `"` is refused: the server would read the
    /// value as a quoted structured-header string, i.e. as another key.
    pub fn parse(key: impl Into<String>) -> Result<Self, InvalidKey> {
        let key = key.into();
        let visible = |b: u8| (0x21..=0x7e).contains(&b);
        if key.is_empty()
            || key.len() > Self::MAX_LEN
            || key.starts_with('"')
            || !key.bytes().all(visible)
        {
            return Err(InvalidKey);
        }
        Ok(Self(key))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_keys_are_valid_and_distinct() {
        let a = IdempotencyKey::generate();
        let b = IdempotencyKey::generate();
        assert_ne!(a, b);
        assert_eq!(IdempotencyKey::parse(a.as_str()), Ok(a));
    }

    #[test]
    fn parse_enforces_the_server_rules() {
        assert!(IdempotencyKey::parse("order-42/attempt").is_ok());
        assert!(IdempotencyKey::parse("x".repeat(255)).is_ok());
        assert_eq!(IdempotencyKey::parse(""), Err(InvalidKey));
        assert_eq!(IdempotencyKey::parse("x".repeat(256)), Err(InvalidKey));
        assert_eq!(IdempotencyKey::parse("has space"), Err(InvalidKey));
        assert_eq!(IdempotencyKey::parse("caf\u{e9}"), Err(InvalidKey));
        assert_eq!(IdempotencyKey::parse("\"quoted\""), Err(InvalidKey));
    }
}
