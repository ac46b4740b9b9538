//! `GET /v1/charges/search`: Stripe's Search API for charges, for exactly
//! one form of query, `metadata['KEY']:'VALUE'`.
//!
//! Like Stripe's search index, the sandbox's lags: a charge shows up only
//! `search_lag_ms` after it was made. A client that searches for a charge it
//! just made (to find out whether a lost request charged) must not take an
//! empty answer for "never charged".

use axum::Json;
use axum::extract::{RawQuery, State};
use axum::http::HeaderMap;
use serde_json::{Value, json};

use crate::error::ApiError;
use crate::params::FormParams;
use crate::processing;
use crate::state::AppState;

/// A parsed `metadata['KEY']:'VALUE'` query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MetadataQuery {
    pub(crate) key: String,
    pub(crate) value: String,
}

/// The handler. Answers one page, newest first; `next_page` is always null
/// (the sandbox does not paginate searches).
pub(crate) async fn search_charges(
    State(state): State<AppState>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Result<Json<Value>, ApiError> {
    processing::api_key(&headers)?;
    let request = FormParams::parse_query(query.as_deref())?.search_request()?;
    let query = parse_query(&request.query)?;
    let lag_ms = state.config().search_lag_ms;
    let page = state
        .ledger
        .search(&query.key, &query.value, lag_ms, request.limit);
    Ok(Json(json!({
        "object": "search_result",
        "data": page.data,
        "has_more": page.has_more,
        "next_page": null,
        "url": "/v1/charges/search",
    })))
}

/// Parses `metadata['KEY']:'VALUE'`. Each string may be in single or double
/// quotes, as Stripe allows, with `\` escaping the quote or a backslash;
/// spaces around the whole query are ignored. Anything else, Stripe's other
/// fields and operators included, is refused with the supported form.
pub(crate) fn parse_query(query: &str) -> Result<MetadataQuery, ApiError> {
    let unsupported = || {
        ApiError::invalid_request(format!(
            "payments-sandbox supports only search queries of the form \
             metadata['KEY']:'VALUE' (single or double quotes); got: {query}"
        ))
        .with_param("query")
    };
    let rest = query
        .trim()
        .strip_prefix("metadata[")
        .ok_or_else(unsupported)?;
    let (key, rest) = quoted(rest).ok_or_else(unsupported)?;
    let rest = rest.strip_prefix("]:").ok_or_else(unsupported)?;
    let (value, rest) = quoted(rest).ok_or_else(unsupported)?;
    if !rest.is_empty() {
        return Err(unsupported());
    }
    Ok(MetadataQuery { key, value })
}

/// A string in `'` or `"` at the start of `input`: its unescaped content
/// and what follows the closing quote.
fn quoted(input: &str) -> Option<(String, &str)> {
    let mut chars = input.char_indices();
    let (_, quote) = chars.next().filter(|(_, c)| matches!(c, '\'' | '"'))?;
    let mut content = String::new();
    while let Some((index, c)) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some((_, escaped)) if escaped == quote || escaped == '\\' => content.push(escaped),
                _ => return None,
            },
            c if c == quote => return Some((content, &input[index + c.len_utf8()..])),
            c => content.push(c),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(query: &str) -> Option<(String, String)> {
        parse_query(query)
            .ok()
            .map(|query| (query.key, query.value))
    }

    fn pair(key: &str, value: &str) -> Option<(String, String)> {
        Some((key.to_owned(), value.to_owned()))
    }

    #[test]
    fn parses_the_metadata_form_in_either_quotes() {
        let want = pair("payments_charge_id", "ch_123");
        assert_eq!(parsed("metadata['payments_charge_id']:'ch_123'"), want);
        assert_eq!(parsed(r#"metadata["payments_charge_id"]:"ch_123""#), want);
        assert_eq!(parsed(r#"metadata['payments_charge_id']:"ch_123""#), want);
        assert_eq!(parsed("  metadata['payments_charge_id']:'ch_123' "), want);
    }

    #[test]
    fn unescapes_quotes_and_backslashes() {
        assert_eq!(
            parsed(r"metadata['it\'s']:'a \\ b'"),
            pair("it's", r"a \ b")
        );
        assert_eq!(
            parsed(r#"metadata["k"]:"say \"hi\"""#),
            pair("k", r#"say "hi""#)
        );
        // The other quote needs no escape.
        assert_eq!(
            parsed(r#"metadata['k']:'say "hi"'"#),
            pair("k", r#"say "hi""#)
        );
        assert_eq!(parsed("metadata['k']:''"), pair("k", ""));
    }

    #[test]
    fn refuses_every_other_form() {
        for query in [
            "",
            "status:'succeeded'",
            "amount>1000",
            "metadata[k]:'v'",
            "metadata['k']:v",
            "metadata['k']: 'v'",
            "metadata['k'] : 'v'",
            "metadata['k']:'v' AND status:'succeeded'",
            "-metadata['k']:'v'",
            "metadata['k']~'v'",
            "metadata['k']:'v",
            "metadata['k:'v'",
            r"metadata['k']:'\n'",
            "metadata['k']:'v'x",
        ] {
            let error = parse_query(query);
            assert!(error.is_err(), "accepted {query:?}");
        }
    }
}
