//! Request parameters: the form-encoded bodies of `POST /v1/charges`,
//! `POST /v1/refunds` and `POST /v1/charges/{id}/capture` (raw pairs, their
//! fingerprint for idempotency, and validation into a [`ChargeRequest`], a
//! [`RefundRequest`] or a [`CaptureRequest`]), and the query strings of the
//! `GET` endpoints, which use the same encoding.
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
/// Stripe's page size for lists and searches: 10 unless asked, at most 100.
const DEFAULT_LIMIT: usize = 10;
const MAX_LIMIT: usize = 100;
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
pub(crate) struct Fingerprint(pub(crate) [u8; 32]);

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
    /// Stripe's `capture`: `false` makes a hold (the card authorised, the
    /// amount captured later); `true` unless sent.
    pub(crate) capture: bool,
}

/// A capture request that passed validation. Whether the charge is a hold
/// that can still take it is the ledger's to decide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CaptureRequest {
    /// Minor units; `None` captures the whole amount held.
    pub(crate) amount: Option<u64>,
}

/// A refund request that passed validation. Whether the charge exists and
/// has that much left to refund is the ledger's to decide.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RefundRequest {
    /// The sandbox's charge id (`ch_...`).
    pub(crate) charge: String,
    /// Minor units; `None` refunds whatever is left.
    pub(crate) amount: Option<u64>,
    /// One of Stripe's [`REFUND_REASONS`].
    pub(crate) reason: Option<&'static str>,
    pub(crate) metadata: BTreeMap<String, String>,
    /// Stripe takes no currency: a refund is in its charge's (`None`). Set
    /// only by the sandbox's `answer_currency_override`.
    pub(crate) currency: Option<String>,
}

/// The reasons Stripe accepts for a refund.
pub(crate) const REFUND_REASONS: [&str; 3] = ["duplicate", "fraudulent", "requested_by_customer"];

/// `GET /v1/refunds`: which refunds, how many at most, and from where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RefundListRequest {
    /// Only this charge's refunds; `None` for every refund.
    pub(crate) charge: Option<String>,
    /// Only refunds created within these bounds.
    pub(crate) created: CreatedRange,
    pub(crate) limit: usize,
    /// Stripe's cursor: the page starts after this refund (the last one of
    /// the previous page), in the list's newest-first order.
    pub(crate) starting_after: Option<String>,
}

/// `GET /v1/charges`: Stripe's `created` bounds (Unix seconds; `created=N`
/// is `gte` and `lte` N), the page size, and the cursor (`starting_after`:
/// the page after that charge, older ones). `ending_before` is refused as
/// unknown: the sandbox pages forward only.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ChargeListRequest {
    pub(crate) created: CreatedRange,
    pub(crate) limit: usize,
    pub(crate) starting_after: Option<String>,
}

/// Bounds on a `created` time, each optional.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct CreatedRange {
    pub(crate) gt: Option<i64>,
    pub(crate) gte: Option<i64>,
    pub(crate) lt: Option<i64>,
    pub(crate) lte: Option<i64>,
}

impl CreatedRange {
    /// Whether `created` is within every bound given.
    pub(crate) fn contains(&self, created: u64) -> bool {
        let created = i64::try_from(created).unwrap_or(i64::MAX);
        self.gt.is_none_or(|b| created > b)
            && self.gte.is_none_or(|b| created >= b)
            && self.lt.is_none_or(|b| created < b)
            && self.lte.is_none_or(|b| created <= b)
    }
}

/// `GET /v1/charges/search`: the raw query (parsed by `search`) and the page
/// size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SearchRequest {
    pub(crate) query: String,
    pub(crate) limit: usize,
}

/// The parameters an endpoint knows, by name, after [`FormParams::sort`].
#[derive(Debug)]
struct Known<'a> {
    /// The last value sent for each known name.
    values: BTreeMap<&'static str, &'a str>,
    /// `metadata[KEY]` entries, validated.
    metadata: BTreeMap<String, String>,
}

impl<'a> Known<'a> {
    fn get(&self, name: &str) -> Option<&'a str> {
        self.values.get(name).copied()
    }

    /// The value, unless it is missing or empty (Stripe reads an empty value
    /// as "not set").
    fn non_empty(&self, name: &str) -> Option<&'a str> {
        self.get(name).filter(|value| !value.is_empty())
    }
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

    /// Decodes a URL's query string (absent: no parameters).
    pub(crate) fn parse_query(query: Option<&str>) -> Result<Self, ApiError> {
        serde_urlencoded::from_str::<Vec<(String, String)>>(query.unwrap_or_default())
            .map(|pairs| Self { pairs })
            .map_err(|error| {
                ApiError::invalid_request(format!("The query string could not be decoded: {error}"))
            })
    }

    /// The same parameters in any order give the same fingerprint. Pairs are
    /// sorted by name only (a stable sort), so repeated names keep their
    /// order: `a=1&a=2` and `a=2&a=1` mean different things (last one wins).
    ///
    /// `endpoint` is hashed first: Stripe refuses a key reused on another
    /// endpoint, and this makes that a parameter mismatch.
    pub(crate) fn fingerprint(&self, endpoint: &str) -> Fingerprint {
        let mut pairs: Vec<&(String, String)> = self.pairs.iter().collect();
        pairs.sort_by(|a, b| a.0.cmp(&b.0));
        let mut hasher = Sha256::new();
        hasher.update((endpoint.len() as u64).to_be_bytes());
        hasher.update(endpoint.as_bytes());
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
        let known = self.sort(
            &["amount", "currency", "source", "description", "capture"],
            true,
        )?;
        Ok(ChargeRequest {
            amount: parse_amount(known.non_empty("amount"))?,
            currency: parse_currency(known.non_empty("currency"))?,
            source: known
                .non_empty("source")
                .map(str::to_owned)
                .ok_or_else(|| missing("source"))?,
            description: known.get("description").map(str::to_owned),
            capture: parse_bool("capture", known.non_empty("capture"), true)?,
            metadata: known.metadata,
        })
    }

    /// Validates the parameters as Stripe's capture endpoint does (the
    /// subset the sandbox supports: `amount` only).
    pub(crate) fn capture_request(&self) -> Result<CaptureRequest, ApiError> {
        let known = self.sort(&["amount"], false)?;
        let amount = match known.non_empty("amount") {
            None => None,
            amount => Some(parse_amount(amount)?),
        };
        Ok(CaptureRequest { amount })
    }

    /// Validates the parameters as Stripe's refund endpoint does (the subset
    /// the sandbox supports: no `payment_intent`, no `refund_application_fee`).
    pub(crate) fn refund_request(&self) -> Result<RefundRequest, ApiError> {
        let known = self.sort(&["charge", "amount", "reason"], true)?;
        let charge = known
            .non_empty("charge")
            .map(str::to_owned)
            .ok_or_else(|| missing("charge"))?;
        let amount = match known.non_empty("amount") {
            None => None,
            amount => Some(parse_amount(amount)?),
        };
        let reason = match known.non_empty("reason") {
            None => None,
            Some(reason) => Some(
                REFUND_REASONS
                    .into_iter()
                    .find(|known| *known == reason)
                    .ok_or_else(|| {
                        ApiError::invalid_request(format!(
                            "Invalid reason: must be one of {}; got {reason}",
                            REFUND_REASONS.join(", ")
                        ))
                        .with_code("parameter_invalid_string")
                        .with_param("reason")
                    })?,
            ),
        };
        Ok(RefundRequest {
            charge,
            amount,
            reason,
            metadata: known.metadata,
            currency: None,
        })
    }

    /// The query of `GET /v1/refunds`.
    pub(crate) fn refund_list_request(&self) -> Result<RefundListRequest, ApiError> {
        let known = self.sort(&[&LIST_PARAMS[..], &["charge"]].concat(), false)?;
        Ok(RefundListRequest {
            charge: known.non_empty("charge").map(str::to_owned),
            created: created_range(&known)?,
            limit: parse_limit(known.non_empty("limit"))?,
            starting_after: known.non_empty("starting_after").map(str::to_owned),
        })
    }

    /// The query of `GET /v1/disputes`: the same as refunds' (`charge`,
    /// `created` bounds, `limit`, `starting_after`), as at Stripe.
    pub(crate) fn dispute_list_request(&self) -> Result<RefundListRequest, ApiError> {
        self.refund_list_request()
    }

    /// The query of `GET /v1/charges`.
    pub(crate) fn charge_list_request(&self) -> Result<ChargeListRequest, ApiError> {
        let known = self.sort(&LIST_PARAMS, false)?;
        Ok(ChargeListRequest {
            created: created_range(&known)?,
            limit: parse_limit(known.non_empty("limit"))?,
            starting_after: known.non_empty("starting_after").map(str::to_owned),
        })
    }

    /// The query of `GET /v1/charges/search`. Stripe's `page` cursor is
    /// refused as unknown: the sandbox answers one page only.
    pub(crate) fn search_request(&self) -> Result<SearchRequest, ApiError> {
        let known = self.sort(&["query", "limit"], false)?;
        Ok(SearchRequest {
            query: known
                .non_empty("query")
                .map(str::to_owned)
                .ok_or_else(|| missing("query"))?,
            limit: parse_limit(known.non_empty("limit"))?,
        })
    }

    /// Sorts the pairs into the endpoint's known `names` (the last value
    /// wins) and, where the endpoint takes metadata, `metadata[KEY]` entries.
    /// Any other name is refused, as Stripe refuses it, so a typo cannot
    /// silently drop a parameter.
    fn sort(&self, names: &[&'static str], takes_metadata: bool) -> Result<Known<'_>, ApiError> {
        let mut known = Known {
            values: BTreeMap::new(),
            metadata: BTreeMap::new(),
        };
        for (name, value) in &self.pairs {
            if let Some(&name) = names.iter().find(|known| **known == name.as_str()) {
                known.values.insert(name, value.as_str());
                continue;
            }
            match metadata_key(name).filter(|_| takes_metadata) {
                Some(key) => {
                    validate_metadata_entry(key, value)?;
                    known.metadata.insert(key.to_owned(), value.clone());
                }
                // An empty `metadata=` is how Stripe clients send "no metadata".
                None if takes_metadata && name == "metadata" && value.is_empty() => {}
                None => {
                    return Err(ApiError::invalid_request(format!(
                        "Received unknown parameter: {name}"
                    ))
                    .with_code("parameter_unknown")
                    .with_param(name.clone()));
                }
            }
        }
        if known.metadata.len() > MAX_METADATA_KEYS {
            return Err(ApiError::invalid_request(format!(
                "You can specify up to {MAX_METADATA_KEYS} keys in metadata."
            ))
            .with_param("metadata"));
        }
        Ok(known)
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

/// A required amount; empty counts as missing.
fn parse_amount(raw: Option<&str>) -> Result<u64, ApiError> {
    let raw = raw.ok_or_else(|| missing("amount"))?;
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

/// An optional boolean, `true` or `false` as Stripe spells them; `default`
/// when absent (or empty, which Stripe reads as not set).
fn parse_bool(param: &'static str, raw: Option<&str>, default: bool) -> Result<bool, ApiError> {
    match raw {
        None => Ok(default),
        Some("true") => Ok(true),
        Some("false") => Ok(false),
        Some(raw) => Err(ApiError::invalid_request(format!(
            "Invalid boolean: {raw} (send true or false)"
        ))
        .with_param(param)),
    }
}

fn parse_currency(raw: Option<&str>) -> Result<String, ApiError> {
    let raw = raw.ok_or_else(|| missing("currency"))?;
    if raw.len() != 3 || !raw.bytes().all(|byte| byte.is_ascii_alphabetic()) {
        // Stripe gives no error code for an unknown currency, only the param.
        return Err(
            ApiError::invalid_request(format!("Invalid currency: {raw}")).with_param("currency"),
        );
    }
    Ok(raw.to_ascii_lowercase())
}

/// Stripe's `limit`: 1 to 100, 10 when absent.
fn parse_limit(raw: Option<&str>) -> Result<usize, ApiError> {
    let Some(raw) = raw else {
        return Ok(DEFAULT_LIMIT);
    };
    let invalid = |message: String| {
        ApiError::invalid_request(message)
            .with_code("parameter_invalid_integer")
            .with_param("limit")
    };
    let limit: i64 = raw
        .parse()
        .map_err(|_| invalid(format!("Invalid integer: {raw}")))?;
    usize::try_from(limit)
        .ok()
        .filter(|limit| (1..=MAX_LIMIT).contains(limit))
        .ok_or_else(|| {
            invalid(format!(
                "limit must be between 1 and {MAX_LIMIT}, got {limit}"
            ))
        })
}

/// What Stripe's lists take: `created` bounds, a page size and a cursor.
const LIST_PARAMS: [&str; 7] = [
    "created",
    "created[gt]",
    "created[gte]",
    "created[lt]",
    "created[lte]",
    "limit",
    "starting_after",
];

/// A list's `created` bounds (Unix seconds); `created=N` is both ends.
fn created_range(known: &Known<'_>) -> Result<CreatedRange, ApiError> {
    let bound = |name: &'static str| -> Result<Option<i64>, ApiError> {
        known
            .non_empty(name)
            .map(|raw| {
                raw.parse::<i64>().map_err(|_| {
                    ApiError::invalid_request(format!("Invalid integer: {raw}"))
                        .with_code("parameter_invalid_integer")
                        .with_param(name)
                })
            })
            .transpose()
    };
    let exact = bound("created")?;
    Ok(CreatedRange {
        gt: bound("created[gt]")?,
        gte: bound("created[gte]")?.or(exact),
        lt: bound("created[lt]")?,
        lte: bound("created[lte]")?.or(exact),
    })
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
        assert!(request.capture);
        Ok(())
    }

    #[test]
    fn capture_is_a_boolean_and_a_capture_takes_an_amount() -> Result<(), ApiError> {
        let charge = "amount=1&currency=gbp&source=tok_visa";
        for (extra, capture) in [("", true), ("&capture=", true), ("&capture=true", true)] {
            assert_eq!(
                params(&format!("{charge}{extra}"))?
                    .charge_request()?
                    .capture,
                capture
            );
        }
        assert!(
            !params(&format!("{charge}&capture=false"))?
                .charge_request()?
                .capture
        );
        for bad in ["yes", "1", "False"] {
            assert!(
                params(&format!("{charge}&capture={bad}"))?
                    .charge_request()
                    .is_err(),
                "accepted capture={bad}"
            );
        }
        assert_eq!(params("")?.capture_request()?.amount, None);
        assert_eq!(params("amount=600")?.capture_request()?.amount, Some(600));
        for bad in [
            "amount=0",
            "amount=-5",
            "amount=1.5",
            "metadata[a]=b",
            "currency=gbp",
        ] {
            assert!(params(bad)?.capture_request().is_err(), "accepted {bad}");
        }
        Ok(())
    }

    #[test]
    fn fingerprint_ignores_order_but_not_values() -> Result<(), ApiError> {
        let charges = "/v1/charges";
        let a = params("amount=1&currency=gbp&source=tok_visa")?.fingerprint(charges);
        let b = params("source=tok_visa&currency=gbp&amount=1")?.fingerprint(charges);
        let c = params("amount=2&currency=gbp&source=tok_visa")?.fingerprint(charges);
        let d = params("amount=1&amount=2")?.fingerprint(charges);
        let e = params("amount=2&amount=1")?.fingerprint(charges);
        let other_endpoint =
            params("amount=1&currency=gbp&source=tok_visa")?.fingerprint("/v1/refunds");
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_ne!(d, e);
        assert_ne!(a, other_endpoint);
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

    #[test]
    fn parses_a_refund_request() -> Result<(), ApiError> {
        let full = params(
            "charge=ch_1&amount=300&reason=requested_by_customer&metadata[ticket]=7&metadata=",
        )?
        .refund_request()?;
        assert_eq!(
            full,
            RefundRequest {
                charge: "ch_1".into(),
                amount: Some(300),
                reason: Some("requested_by_customer"),
                metadata: BTreeMap::from([("ticket".into(), "7".into())]),
                currency: None,
            }
        );
        // Without an amount the ledger refunds what is left; empty is absent.
        let bare = params("charge=ch_1&amount=&reason=")?.refund_request()?;
        assert_eq!((bare.amount, bare.reason), (None, None));
        Ok(())
    }

    #[test]
    fn rejects_bad_refund_parameters() -> Result<(), ApiError> {
        for body in [
            "amount=100",
            "charge=&amount=100",
            "charge=ch_1&amount=0",
            "charge=ch_1&amount=1.5",
            "charge=ch_1&reason=because",
            "charge=ch_1&payment_intent=pi_1",
            "charge=ch_1&metadata[]=x",
        ] {
            assert!(params(body)?.refund_request().is_err(), "accepted {body}");
        }
        Ok(())
    }

    #[test]
    fn a_charge_list_query_takes_created_bounds_a_limit_and_a_cursor() -> Result<(), ApiError> {
        let all = FormParams::parse_query(None)?.charge_list_request()?;
        assert_eq!(
            all,
            ChargeListRequest {
                limit: 10,
                ..ChargeListRequest::default()
            }
        );
        let query = "created%5Bgte%5D=100&created%5Blte%5D=200&created[gt]=99&created[lt]=201\
                     &limit=100&starting_after=ch_1";
        let full = FormParams::parse_query(Some(query))?.charge_list_request()?;
        assert_eq!(
            full,
            ChargeListRequest {
                created: CreatedRange {
                    gt: Some(99),
                    gte: Some(100),
                    lt: Some(201),
                    lte: Some(200),
                },
                limit: 100,
                starting_after: Some("ch_1".to_owned()),
            }
        );
        assert!(full.created.contains(100) && full.created.contains(200));
        assert!(!full.created.contains(99) && !full.created.contains(201));
        let exact = FormParams::parse_query(Some("created=150"))?.charge_list_request()?;
        assert!(exact.created.contains(150) && !exact.created.contains(151));
        for query in [
            "created[gte]=soon",
            "created[lte]=1.5",
            "limit=101",
            "ending_before=ch_1",
            "customer=cus_1",
        ] {
            assert!(
                FormParams::parse_query(Some(query))?
                    .charge_list_request()
                    .is_err(),
                "accepted {query}"
            );
        }
        Ok(())
    }

    #[test]
    fn list_and_search_queries_take_a_limit() -> Result<(), ApiError> {
        let all = FormParams::parse_query(None)?.refund_list_request()?;
        assert_eq!((all.charge, all.limit), (None, 10));
        let one = FormParams::parse_query(Some("charge=ch_1&limit=100"))?.refund_list_request()?;
        assert_eq!((one.charge.as_deref(), one.limit), (Some("ch_1"), 100));
        let next = FormParams::parse_query(Some("charge=ch_1&starting_after=re_9"))?
            .refund_list_request()?;
        assert_eq!(next.starting_after.as_deref(), Some("re_9"));
        for query in [
            "limit=0",
            "limit=101",
            "limit=ten",
            "charge=ch_1&metadata[a]=b",
            "ending_before=re_1",
        ] {
            assert!(
                FormParams::parse_query(Some(query))?
                    .refund_list_request()
                    .is_err(),
                "accepted {query}"
            );
        }
        let search = FormParams::parse_query(Some("query=metadata%5B%27k%27%5D%3A%27v%27"))?
            .search_request()?;
        assert_eq!(search.query, "metadata['k']:'v'");
        assert_eq!(search.limit, 10);
        for query in ["", "limit=5", "query=x&page=abc"] {
            assert!(
                FormParams::parse_query(Some(query))?
                    .search_request()
                    .is_err(),
                "accepted {query}"
            );
        }
        Ok(())
    }
}
