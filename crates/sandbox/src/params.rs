//! The form-encoded body of `POST /v1/charges`: raw pairs, their
//! fingerprint for idempotency, and validation into a [`ChargeRequest`].
//!
//! The fingerprint is taken over the raw pairs, before validation, because
//! Stripe stores validation errors under the idempotency key too: a retry with
//! the same (still invalid) parameters replays the 400, a retry with corrected
//! parameters is a parameter mismatch.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use crate::error::ApiError;

/// Stripe's ceiling for `amount` (99,999,999 minor units).
const MAX_AMOUNT: u64 = 99_999_999;
/// Stripe's metadata limits.
const MAX_METADATA_KEYS: usize = 50;
const MAX_METADATA_KEY_CHARS: usize = 40;
const MAX_METADATA_VALUE_CHARS: usize = 500;

/// The decoded `name=value` pairs of a form body, in the order sent.
#[derive(Debug, Clone)]
pub(crate) struct FormParams {
    pairs: Vec<(String, String)>,
}

/// SHA-256 over the canonical form of the parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fingerprint([u8; 32]);

/// A charge request that passed validation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ChargeRequest {
    /// Minor units, 1..=99,999,999.
    pub(crate) amount: u64,
    /// Three ASCII letters, lower-case.
    pub(crate) currency: String,
    /// The card token.
    pub(crate) source: String,
    pub(crate) description: Option<String>,
    pub(crate) metadata: BTreeMap<String, String>,
}

impl FormParams {
    /// Decodes an `application/x-www-form-urlencoded` body.
    pub(crate) fn parse(body: &[u8]) -> Result<Self, ApiError> {
        serde_urlencoded::from_bytes::<Vec<(String, String)>>(body)
            .map(|pairs| Self { pairs })
            .map_err(|error| {
                ApiError::invalid_request(format!(
                    "The request body could not be decoded as \
                     application/x-www-form-urlencoded: {error}"
                ))
            })
    }

    /// The same parameters in any order give the same fingerprint. Pairs are
    /// sorted by name only (a stable sort), so repeated names keep their
    /// order: `a=1&a=2` and `a=2&a=1` mean different things (last one wins).
    pub(crate) fn fingerprint(&self) -> Fingerprint {
        let mut pairs: Vec<&(String, String)> = self.pairs.iter().collect();
        pairs.sort_by(|a, b| a.0.cmp(&b.0));
        let mut hasher = Sha256::new();
        for (name, value) in pairs {
            // Length prefixes keep `ab=c` and `a=bc` apart.
            for part in [name, value] {
                hasher.update((part.len() as u64).to_be_bytes());
                hasher.update(part.as_bytes());
            }
        }
        Fingerprint(hasher.finalize().into())
    }

    /// Validates the parameters as Stripe's charge endpoint does.
    pub(crate) fn charge_request(&self) -> Result<ChargeRequest, ApiError> {
        let mut amount = None;
        let mut currency = None;
        let mut source = None;
        let mut description = None;
        let mut metadata = BTreeMap::new();
        for (name, value) in &self.pairs {
            match name.as_str() {
                "amount" => amount = Some(value),
                "currency" => currency = Some(value),
                "source" => source = Some(value),
                "description" => description = Some(value.clone()),
                // An empty `metadata=` is how Stripe clients send "no metadata".
                "metadata" if value.is_empty() => {}
                _ => match metadata_key(name) {
                    Some(key) => {
                        validate_metadata_entry(key, value)?;
                        metadata.insert(key.to_owned(), value.clone());
                    }
                    None => {
                        return Err(ApiError::invalid_request(format!(
                            "Received unknown parameter: {name}"
                        ))
                        .with_code("parameter_unknown")
                        .with_param(name.clone()));
                    }
                },
            }
        }
        if metadata.len() > MAX_METADATA_KEYS {
            return Err(ApiError::invalid_request(format!(
                "You can specify up to {MAX_METADATA_KEYS} keys in metadata."
            ))
            .with_param("metadata"));
        }
        Ok(ChargeRequest {
            amount: parse_amount(amount)?,
            currency: parse_currency(currency)?,
            source: parse_source(source)?,
            description,
            metadata,
        })
    }
}

/// `metadata[KEY]` -> `KEY`.
fn metadata_key(name: &str) -> Option<&str> {
    name.strip_prefix("metadata[")?.strip_suffix(']')
}

fn validate_metadata_entry(key: &str, value: &str) -> Result<(), ApiError> {
    let param = format!("metadata[{key}]");
    if key.is_empty() || key.contains(['[', ']']) {
        return Err(
            ApiError::invalid_request(format!("Invalid metadata key: {param}"))
                .with_code("parameter_invalid_empty")
                .with_param(param),
        );
    }
    if key.chars().count() > MAX_METADATA_KEY_CHARS {
        return Err(ApiError::invalid_request(format!(
            "Metadata keys can be at most {MAX_METADATA_KEY_CHARS} characters long."
        ))
        .with_param(param));
    }
    if value.chars().count() > MAX_METADATA_VALUE_CHARS {
        return Err(ApiError::invalid_request(format!(
            "Metadata values can be at most {MAX_METADATA_VALUE_CHARS} characters long."
        ))
        .with_param(param));
    }
    Ok(())
}

fn missing(param: &'static str) -> ApiError {
    ApiError::invalid_request(format!("Missing required param: {param}."))
        .with_code("parameter_missing")
        .with_param(param)
}

fn parse_amount(raw: Option<&String>) -> Result<u64, ApiError> {
    let raw = raw
        .filter(|raw| !raw.is_empty())
        .ok_or_else(|| missing("amount"))?;
    let invalid_integer = |message: String| {
        ApiError::invalid_request(message)
            .with_code("parameter_invalid_integer")
            .with_param("amount")
    };
    let amount: i64 = raw
        .parse()
        .map_err(|_| invalid_integer(format!("Invalid integer: {raw}")))?;
    let amount = u64::try_from(amount)
        .ok()
        .filter(|amount| *amount >= 1)
        .ok_or_else(|| invalid_integer("This value must be greater than or equal to 1.".into()))?;
    if amount > MAX_AMOUNT {
        return Err(ApiError::invalid_request(format!(
            "Amount must be no more than {MAX_AMOUNT} (in the currency's minor unit)."
        ))
        .with_code("amount_too_large")
        .with_param("amount"));
    }
    Ok(amount)
}

fn parse_currency(raw: Option<&String>) -> Result<String, ApiError> {
    let raw = raw
        .filter(|raw| !raw.is_empty())
        .ok_or_else(|| missing("currency"))?;
    if raw.len() != 3 || !raw.bytes().all(|byte| byte.is_ascii_alphabetic()) {
        // Stripe gives no error code for an unknown currency, only the param.
        return Err(
            ApiError::invalid_request(format!("Invalid currency: {raw}")).with_param("currency"),
        );
    }
    Ok(raw.to_ascii_lowercase())
}

fn parse_source(raw: Option<&String>) -> Result<String, ApiError> {
    raw.filter(|raw| !raw.is_empty())
        .cloned()
        .ok_or_else(|| missing("source"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(body: &str) -> Result<FormParams, ApiError> {
        FormParams::parse(body.as_bytes())
    }

    #[test]
    fn parses_a_full_request() -> Result<(), ApiError> {
        let request = params(
            "amount=4900&currency=GBP&source=tok_visa&description=Tea+%26+cake\
             &metadata[order]=42&metadata%5Bnote%5D=hi",
        )?
        .charge_request()?;
        assert_eq!(request.amount, 4900);
        assert_eq!(request.currency, "gbp");
        assert_eq!(request.source, "tok_visa");
        assert_eq!(request.description.as_deref(), Some("Tea & cake"));
        assert_eq!(
            request.metadata.get("order").map(String::as_str),
            Some("42")
        );
        assert_eq!(request.metadata.get("note").map(String::as_str), Some("hi"));
        Ok(())
    }

    #[test]
    fn fingerprint_ignores_order_but_not_values() -> Result<(), ApiError> {
        let a = params("amount=1&currency=gbp&source=tok_visa")?.fingerprint();
        let b = params("source=tok_visa&currency=gbp&amount=1")?.fingerprint();
        let c = params("amount=2&currency=gbp&source=tok_visa")?.fingerprint();
        let d = params("amount=1&amount=2")?.fingerprint();
        let e = params("amount=2&amount=1")?.fingerprint();
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_ne!(d, e);
        Ok(())
    }

    #[test]
    fn rejects_bad_parameters() -> Result<(), ApiError> {
        for body in [
            "currency=gbp&source=tok_visa",
            "amount=abc&currency=gbp&source=tok_visa",
            "amount=0&currency=gbp&source=tok_visa",
            "amount=-5&currency=gbp&source=tok_visa",
            "amount=100000000&currency=gbp&source=tok_visa",
            "amount=1&currency=pounds&source=tok_visa",
            "amount=1&source=tok_visa",
            "amount=1&currency=gbp",
            "amount=1&currency=gbp&source=tok_visa&colour=red",
            "amount=1&currency=gbp&source=tok_visa&metadata[]=x",
        ] {
            assert!(params(body)?.charge_request().is_err(), "accepted {body}");
        }
        Ok(())
    }
}
