//! Finding charges and refunds: Stripe's list shape and its cursor
//! pagination, parsed from a query string once at the edge.
//!
//! Pages are keyset pages over `(created_at, id)`, newest first: a cursor
//! is an object id, and the next page is "older than that one" (or, with
//! `ending_before`, "newer"), so a page costs one index range scan however
//! deep it is, and stays stable while new objects arrive.

use crate::charge::{
    ChargeStatus, CustomerId, InvalidRequest, MAX_METADATA_KEY, MAX_METADATA_VALUE, NUL_REFUSED,
    is_object_id,
};
use crate::idempotency::IdempotencyKey;
use chrono::{DateTime, Utc};

/// Page size when `limit` is not given, and its largest value (Stripe's).
pub const DEFAULT_LIMIT: u32 = 20;
pub const MAX_LIMIT: u32 = 100;

/// Where a page starts: after (older than) or before (newer than) an object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cursor {
    After(String),
    Before(String),
}

impl Cursor {
    pub fn id(&self) -> &str {
        match self {
            Self::After(id) | Self::Before(id) => id,
        }
    }

    /// The query parameter that named it.
    pub fn param(&self) -> &'static str {
        match self {
            Self::After(_) => "starting_after",
            Self::Before(_) => "ending_before",
        }
    }
}

/// One page: how many, and from where (`None`: the newest).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    pub limit: u32,
    pub cursor: Option<Cursor>,
}

/// What `GET /api/charges` filters on, besides its owner.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChargeFilter {
    pub status: Option<ChargeStatus>,
    /// `created[gte]` and `created[lt]`, Unix seconds as Stripe takes them.
    pub created_gte: Option<DateTime<Utc>>,
    pub created_lt: Option<DateTime<Utc>>,
    /// `metadata[KEY]=VALUE`: exact match on one key.
    pub metadata: Option<(String, String)>,
    pub idempotency_key: Option<String>,
}

/// A parsed `GET /api/charges` query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChargeQuery {
    pub page: Page,
    pub filter: ChargeFilter,
    /// `customer=`: whose charges, for a caller that reads any customer's
    /// (`charges:read_all`; the service refuses it to others).
    pub customer: Option<CustomerId>,
}

impl ChargeQuery {
    /// From the query string's pairs; an unknown or repeated parameter is
    /// refused, as unknown fields are on POST.
    pub fn parse(pairs: &[(String, String)]) -> Result<Self, InvalidRequest> {
        let mut filter = ChargeFilter::default();
        let mut page = PageParams::default();
        let mut customer = None;
        for (name, value) in unique(pairs)? {
            if page.take(name, value)? {
                continue;
            }
            match name {
                "customer" => {
                    customer = Some(
                        CustomerId::parse(value)
                            .map_err(|_| InvalidRequest::param(name, CustomerId::RULE))?,
                    );
                }
                "status" => {
                    let status = ChargeStatus::parse(value).ok_or_else(|| {
                        InvalidRequest::param(
                            "status",
                            "status must be one of pending, succeeded, failed, unknown",
                        )
                    })?;
                    filter.status = Some(status);
                }
                "created[gte]" => filter.created_gte = Some(unix_seconds(name, value)?),
                "created[lt]" => filter.created_lt = Some(unix_seconds(name, value)?),
                // Only a key the Idempotency-Key header accepts was ever stored.
                "idempotency_key" => {
                    let key = IdempotencyKey::parse(value).map_err(|_| {
                        InvalidRequest::param(
                            name,
                            "idempotency_key must be 1-255 visible ASCII characters, \
                             as sent in Idempotency-Key",
                        )
                    })?;
                    filter.idempotency_key = Some(key.as_str().to_owned());
                }
                _ => match name
                    .strip_prefix("metadata[")
                    .and_then(|k| k.strip_suffix(']'))
                {
                    Some(key) if filter.metadata.is_some() => {
                        return Err(InvalidRequest::param(
                            &format!("metadata[{key}]"),
                            "filter on at most one metadata key",
                        ));
                    }
                    // NUL is refused in stored metadata: no key or value
                    // holds it (and PostgreSQL text cannot).
                    Some(key) if value.contains('\0') => {
                        return Err(InvalidRequest::param(
                            &format!("metadata[{key}]"),
                            NUL_REFUSED,
                        ));
                    }
                    Some(key) if value.chars().count() > MAX_METADATA_VALUE => {
                        return Err(InvalidRequest::param(
                            &format!("metadata[{key}]"),
                            format!("a metadata value is at most {MAX_METADATA_VALUE} characters"),
                        ));
                    }
                    Some(key)
                        if !key.is_empty()
                            && key.chars().count() <= MAX_METADATA_KEY
                            && !key.contains(['"', '\\', '[', ']', '\0']) =>
                    {
                        filter.metadata = Some((key.to_owned(), value.to_owned()));
                    }
                    Some(key) => {
                        return Err(InvalidRequest::param(
                            &format!("metadata[{key}]"),
                            "a metadata key to filter on must be 1-40 characters without \
                             quotes, backslashes, brackets or NUL",
                        ));
                    }
                    None => return Err(unknown(name)),
                },
            }
        }
        Ok(Self {
            page: page.finish()?,
            filter,
            customer,
        })
    }
}

/// A parsed page-only query (`GET /api/charges/{id}/refunds`).
pub fn parse_page(pairs: &[(String, String)]) -> Result<Page, InvalidRequest> {
    parse_page_with(pairs, |_, _| Ok(false))
}

/// A page, and the other parameters `other` takes (true when it knew the
/// name); a parameter neither knows, or one given twice, is refused.
pub(crate) fn parse_page_with(
    pairs: &[(String, String)],
    mut other: impl FnMut(&str, &str) -> Result<bool, InvalidRequest>,
) -> Result<Page, InvalidRequest> {
    let mut page = PageParams::default();
    for (name, value) in unique(pairs)? {
        if !page.take(name, value)? && !other(name, value)? {
            return Err(unknown(name));
        }
    }
    page.finish()
}

#[derive(Debug, Default)]
struct PageParams {
    limit: Option<u32>,
    cursor: Option<Cursor>,
}

impl PageParams {
    /// Takes `limit`, `starting_after` or `ending_before`; false for others.
    fn take(&mut self, name: &str, value: &str) -> Result<bool, InvalidRequest> {
        let cursor = match name {
            "limit" => {
                let limit = value
                    .parse::<u32>()
                    .ok()
                    .filter(|n| (1..=MAX_LIMIT).contains(n));
                let limit = limit.ok_or_else(|| {
                    InvalidRequest::param(
                        "limit",
                        format!("limit must be an integer from 1 to {MAX_LIMIT}"),
                    )
                })?;
                self.limit = Some(limit);
                return Ok(true);
            }
            "starting_after" => Cursor::After(value.to_owned()),
            "ending_before" => Cursor::Before(value.to_owned()),
            _ => return Ok(false),
        };
        if !is_object_id(value) {
            return Err(InvalidRequest::param(
                name,
                format!("{name} must be an object id: 1-64 letters, digits and '_'"),
            ));
        }
        if self.cursor.is_some() {
            return Err(InvalidRequest::param(
                name,
                "give starting_after or ending_before, not both",
            ));
        }
        self.cursor = Some(cursor);
        Ok(true)
    }

    fn finish(self) -> Result<Page, InvalidRequest> {
        Ok(Page {
            limit: self.limit.unwrap_or(DEFAULT_LIMIT),
            cursor: self.cursor,
        })
    }
}

/// The pairs, each name at most once.
fn unique(pairs: &[(String, String)]) -> Result<Vec<(&str, &str)>, InvalidRequest> {
    let mut seen = std::collections::BTreeSet::new();
    pairs
        .iter()
        .map(|(name, value)| {
            if seen.insert(name.as_str()) {
                Ok((name.as_str(), value.as_str()))
            } else {
                Err(InvalidRequest::param(
                    name,
                    format!("{name} is given more than once"),
                ))
            }
        })
        .collect()
}

fn unknown(name: &str) -> InvalidRequest {
    InvalidRequest::param(name, format!("unknown parameter {name:?}"))
}

/// The latest `created` bound: 9999-12-31T23:59:59Z, the end of MySQL's
/// `DATETIME`. With 0 (1970), a range every backend can compare with.
pub const MAX_CREATED: i64 = 253_402_300_799;

pub(crate) fn unix_seconds(name: &str, value: &str) -> Result<DateTime<Utc>, InvalidRequest> {
    value
        .parse::<i64>()
        .ok()
        .filter(|secs| (0..=MAX_CREATED).contains(secs))
        .and_then(|secs| DateTime::from_timestamp(secs, 0))
        .ok_or_else(|| {
            InvalidRequest::param(
                name,
                format!("{name} must be a Unix time in seconds, from 0 to {MAX_CREATED}"),
            )
        })
}

/// A page of objects in Stripe's list shape, newest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct List<T> {
    pub data: Vec<T>,
    pub has_more: bool,
    /// The path listed (`/api/charges`).
    pub url: String,
}

impl<T> List<T> {
    /// A page from the rows a store read for it: up to `limit + 1` in scan
    /// order (newest first, or oldest first for `ending_before`), the extra
    /// row saying there are more.
    pub fn from_rows(mut rows: Vec<T>, page: &Page, url: String) -> Self {
        let limit = page.limit as usize;
        let has_more = rows.len() > limit;
        rows.truncate(limit);
        if matches!(page.cursor, Some(Cursor::Before(_))) {
            rows.reverse();
        }
        Self {
            data: rows,
            has_more,
            url,
        }
    }

    /// `{"object":"list","data":[...],"has_more":..,"url":..}`, each
    /// object as `json` renders it (valid JSON, so joined as it is).
    pub fn to_json(&self, json: impl Fn(&T) -> String) -> String {
        let data: Vec<String> = self.data.iter().map(json).collect();
        let url = serde_json::to_string(&self.url).expect("a string always serialises");
        format!(
            r#"{{"object":"list","data":[{}],"has_more":{},"url":{url}}}"#,
            data.join(","),
            self.has_more
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(q: &[(&str, &str)]) -> Vec<(String, String)> {
        q.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn parses_stripes_parameters() {
        let q = ChargeQuery::parse(&pairs(&[
            ("limit", "5"),
            ("starting_after", "ch_1"),
            ("status", "succeeded"),
            ("created[gte]", "1700000000"),
            ("metadata[order_id]", "42"),
        ]))
        .expect("valid");
        assert_eq!(q.page.limit, 5);
        assert_eq!(q.page.cursor, Some(Cursor::After("ch_1".to_owned())));
        assert_eq!(q.filter.status, Some(ChargeStatus::Succeeded));
        assert_eq!(
            q.filter.created_gte.map(|t| t.timestamp()),
            Some(1_700_000_000)
        );
        assert_eq!(
            q.filter.metadata,
            Some(("order_id".to_owned(), "42".to_owned()))
        );
        assert_eq!(
            ChargeQuery::parse(&[]).expect("valid").page.limit,
            DEFAULT_LIMIT
        );
    }

    #[test]
    fn names_the_bad_parameter() {
        let param = |q: &[(&str, &str)]| ChargeQuery::parse(&pairs(q)).err().and_then(|e| e.param);
        assert_eq!(param(&[("limit", "0")]).as_deref(), Some("limit"));
        assert_eq!(param(&[("limit", "101")]).as_deref(), Some("limit"));
        assert_eq!(param(&[("limit", "x")]).as_deref(), Some("limit"));
        assert_eq!(param(&[("status", "paid")]).as_deref(), Some("status"));
        assert_eq!(
            param(&[("created[gte]", "soon")]).as_deref(),
            Some("created[gte]")
        );
        assert_eq!(param(&[("colour", "red")]).as_deref(), Some("colour"));
        assert_eq!(
            param(&[("limit", "1"), ("limit", "2")]).as_deref(),
            Some("limit")
        );
        let both = [("starting_after", "ch_1"), ("ending_before", "ch_2")];
        assert_eq!(param(&both).as_deref(), Some("ending_before"));
        let two = [("metadata[a]", "1"), ("metadata[b]", "2")];
        assert_eq!(param(&two).as_deref(), Some("metadata[b]"));
        assert_eq!(
            param(&[("metadata[a\"b]", "1")]).as_deref(),
            Some("metadata[a\"b]")
        );
        // What no backend can store or compare is refused before a query.
        for (name, value) in [
            ("starting_after", "ch_\u{0}"),
            ("ending_before", &"a".repeat(65)),
            ("idempotency_key", "\u{0}"),
            ("idempotency_key", "a b"),
            ("created[gte]", "-99999999999"),
            ("created[lt]", "253402300800"),
            ("metadata[k]", "\u{0}"),
        ] {
            assert_eq!(param(&[(name, value)]).as_deref(), Some(name), "{value:?}");
        }
        assert_eq!(
            param(&[("metadata[\u{0}]", "x")]).as_deref(),
            Some("metadata[\u{0}]")
        );
        assert_eq!(param(&[("created[lt]", "253402300799")]), None);
        assert_eq!(
            parse_page(&pairs(&[("status", "failed")]))
                .err()
                .and_then(|e| e.param)
                .as_deref(),
            Some("status")
        );
    }

    #[test]
    fn a_page_keeps_limit_rows_and_says_if_there_are_more() {
        let page = |cursor| Page { limit: 2, cursor };
        let list = List::from_rows(vec![3, 2, 1], &page(None), "/x".to_owned());
        assert_eq!((list.data.as_slice(), list.has_more), (&[3, 2][..], true));
        // Before a cursor the rows come oldest first; shown newest first.
        let before = Some(Cursor::Before("c".to_owned()));
        let list = List::from_rows(vec![4, 5], &page(before), "/x".to_owned());
        assert_eq!((list.data.as_slice(), list.has_more), (&[5, 4][..], false));
        let json = list.to_json(|n| n.to_string());
        assert_eq!(
            json,
            r#"{"object":"list","data":[5,4],"has_more":false,"url":"/x"}"#
        );
    }
}
