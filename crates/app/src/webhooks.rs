//! `WEBHOOK_ENDPOINTS`: the merchant's webhook endpoints, a JSON array.
//!
//! ```json
//! [{"url": "https://shop.example/hooks", "secret": "whsec_...",
//!   "events": ["charge.succeeded", "refund.failed"]}]
//! ```
//!
//! - `url`: https (plain http only on loopback), no user info, no fragment,
//!   at most [`MAX_URL_LEN`] characters; one endpoint per URL. It is kept
//!   as the `url` crate writes it (the form the HTTP client sends to), so
//!   `https://Shop.example` and `https://shop.example/` are one endpoint.
//! - `secret`, or `secrets` during a rotation (each signs every event:
//!   `["new", "old"]`): each at least [`MIN_SECRET_CHARS`] characters.
//! - `events`: the types it wants; absent, `[]` or `["*"]`: all.
//!
//! An empty value or `[]`: no endpoints. Every refusal names
//! `WEBHOOK_ENDPOINTS` and the endpoint's index, and never a secret.

use std::collections::{BTreeSet, HashMap};

use payments_domain::events::EventType;
use payments_domain::webhook::{Endpoint, MAX_URL_LEN};
use serde_json::{Map, Value};

use crate::settings::{ConfigError, https_or_loopback};

/// The setting's name, in every message.
pub const SETTING: &str = "WEBHOOK_ENDPOINTS";

/// The shortest secret accepted.
pub const MIN_SECRET_CHARS: usize = 24;

/// An endpoint's fields; any other is refused (a misspelt `evnets` would
/// otherwise silently mean "all types").
const FIELDS: [&str; 4] = ["url", "secret", "secrets", "events"];

/// `WEBHOOK_ENDPOINTS`' endpoints, or the first reason it is refused.
pub fn parse_endpoints(json: &str) -> Result<Vec<Endpoint>, ConfigError> {
    if json.trim().is_empty() {
        return Ok(Vec::new());
    }
    // Read as untyped JSON, then field by field: a typed decode's errors
    // quote the value they could not read, which may be a secret.
    let value: Value = serde_json::from_str(json).map_err(|e| {
        ConfigError(format!(
            "{SETTING} is not valid JSON ({e}); expected an array like \
             [{{\"url\": \"https://shop.example/hooks\", \"secret\": \"...\", \"events\": \
             [\"charge.succeeded\"]}}]"
        ))
    })?;
    let Value::Array(items) = value else {
        return Err(ConfigError(format!(
            "{SETTING} must be a JSON array of endpoints (got {})",
            kind(&value)
        )));
    };
    let mut endpoints: Vec<Endpoint> = Vec::with_capacity(items.len());
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (index, item) in items.iter().enumerate() {
        let endpoint = endpoint(index, item)?;
        if let Some(first) = seen.insert(endpoint.url.clone(), index) {
            return Err(ConfigError(format!(
                "{SETTING}[{index}].url is the URL of {SETTING}[{first}] ({}): one endpoint per \
                 URL (to rotate its secret, list both in `secrets`; to add types, list them in \
                 `events`)",
                endpoint.url
            )));
        }
        endpoints.push(endpoint);
    }
    Ok(endpoints)
}

/// The endpoint at `index`.
fn endpoint(index: usize, item: &Value) -> Result<Endpoint, ConfigError> {
    let at = format!("{SETTING}[{index}]");
    let Value::Object(fields) = item else {
        return Err(ConfigError(format!(
            "{at} must be an object with `url`, `secret` (or `secrets`) and optionally `events` \
             (got {})",
            kind(item)
        )));
    };
    if let Some(unknown) = fields.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(ConfigError(format!(
            "{at} has an unknown field {unknown:?}; the fields are {}",
            FIELDS.join(", ")
        )));
    }
    let url = url(&at, fields)?;
    let secrets = secrets(&at, fields)?;
    let types = types(&at, fields)?;
    Ok(Endpoint {
        url,
        secrets,
        types,
    })
}

/// `url`, checked and written as the `url` crate writes it.
fn url(at: &str, fields: &Map<String, Value>) -> Result<String, ConfigError> {
    let raw = match fields.get("url") {
        Some(Value::String(raw)) => raw,
        Some(other) => {
            return Err(ConfigError(format!(
                "{at}.url must be a string (got {})",
                kind(other)
            )));
        }
        None => return Err(ConfigError(format!("{at} has no `url`"))),
    };
    let too_long = |chars: usize| {
        ConfigError(format!(
            "{at}.url is {chars} characters; at most {MAX_URL_LEN} are allowed"
        ))
    };
    let chars = raw.chars().count();
    if chars > MAX_URL_LEN {
        return Err(too_long(chars));
    }
    let setting = format!("{at}.url");
    let url = https_or_loopback(
        &setting,
        raw,
        "events (customers' payments) would travel in clear, readable and replayable by anyone \
         on the way",
        "user info can disguise the real host, and the URL is stored with every delivery and \
         shown to operators",
    )?;
    if url.fragment().is_some() {
        return Err(ConfigError(format!(
            "{at}.url must not have a fragment (#...): it is never sent to the receiver"
        )));
    }
    let url = String::from(url);
    // Written out, the URL may grow (percent-encoding, a trailing `/`).
    if url.len() > MAX_URL_LEN {
        return Err(too_long(url.chars().count()));
    }
    Ok(url)
}

/// `secret` or `secrets`: one of them, each long enough. Never quoted in
/// a message.
fn secrets(at: &str, fields: &Map<String, Value>) -> Result<Vec<String>, ConfigError> {
    let secrets = match (fields.get("secret"), fields.get("secrets")) {
        (Some(_), Some(_)) => {
            return Err(ConfigError(format!(
                "{at} has both `secret` and `secrets`; give one (`secrets`: every secret that \
                 signs, during a rotation)"
            )));
        }
        (None, None) => {
            return Err(ConfigError(format!(
                "{at} has no `secret` (or `secrets`): events are signed with it, so that the \
                 receiver can tell them from forgeries"
            )));
        }
        (Some(Value::String(secret)), None) => vec![(format!("{at}.secret"), secret)],
        (Some(other), None) => {
            return Err(ConfigError(format!(
                "{at}.secret must be a string (got {})",
                kind(other)
            )));
        }
        (None, Some(Value::Array(list))) if list.is_empty() => {
            return Err(ConfigError(format!(
                "{at}.secrets is empty: give at least one secret"
            )));
        }
        (None, Some(Value::Array(list))) => list
            .iter()
            .enumerate()
            .map(|(i, secret)| match secret {
                Value::String(secret) => Ok((format!("{at}.secrets[{i}]"), secret)),
                other => Err(ConfigError(format!(
                    "{at}.secrets[{i}] must be a string (got {})",
                    kind(other)
                ))),
            })
            .collect::<Result<_, _>>()?,
        (None, Some(other)) => {
            return Err(ConfigError(format!(
                "{at}.secrets must be an array of strings (got {})",
                kind(other)
            )));
        }
    };
    secrets
        .into_iter()
        .map(|(name, secret)| {
            let chars = secret.chars().count();
            if chars < MIN_SECRET_CHARS {
                return Err(ConfigError(format!(
                    "{name} is {chars} characters; at least {MIN_SECRET_CHARS} are needed: a \
                     short or guessable secret lets anyone forge events the receiver would \
                     trust (generate one, e.g. `openssl rand -hex 32`)"
                )));
            }
            Ok(secret.clone())
        })
        .collect()
}

/// `events`: the types wanted; empty for all.
fn types(at: &str, fields: &Map<String, Value>) -> Result<BTreeSet<EventType>, ConfigError> {
    let names = match fields.get("events") {
        None => return Ok(BTreeSet::new()),
        Some(Value::Array(names)) => names,
        Some(other) => {
            return Err(ConfigError(format!(
                "{at}.events must be an array of event types (got {}); leave it out for all",
                kind(other)
            )));
        }
    };
    let all = names.iter().any(|n| n.as_str() == Some("*"));
    if all && names.len() > 1 {
        return Err(ConfigError(format!(
            "{at}.events lists \"*\" (all types) with others: give [\"*\"] alone, or the types"
        )));
    }
    if all {
        return Ok(BTreeSet::new());
    }
    names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let Value::String(name) = name else {
                return Err(ConfigError(format!(
                    "{at}.events[{i}] must be a string (got {})",
                    kind(name)
                )));
            };
            EventType::parse(name).ok_or_else(|| {
                ConfigError(format!(
                    "{at}.events[{i}] {name:?} is not an event type; the types are {} (or \"*\" \
                     for all)",
                    EventType::names()
                ))
            })
        })
        .collect()
}

/// What a JSON value is, for a message (never the value: it may be a
/// secret).
fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "whsec_0123456789abcdef0123";
    const OLD: &str = "whsec_old_0123456789abcdef";

    fn refused(json: &str) -> String {
        let e = parse_endpoints(json).expect_err(json).0;
        assert!(e.contains(SETTING), "{e}");
        for secret in [SECRET, OLD, "whsec_short", "s3cr3t_in_a_wrong_place_x"] {
            assert!(!e.contains(secret), "a secret in {e}");
        }
        e
    }

    fn one(fields: &str) -> String {
        format!(r#"[{{"url": "https://shop.example/hooks", {fields}}}]"#)
    }

    #[test]
    fn nothing_is_no_endpoints() {
        for json in ["", "  \n", "[]", " [ ] "] {
            assert_eq!(
                parse_endpoints(json).map_err(|e| e.0),
                Ok(vec![]),
                "{json:?}"
            );
        }
    }

    #[test]
    fn endpoints_are_read() -> Result<(), ConfigError> {
        let json = format!(
            r#"[
                {{"url": "https://shop.example/hooks", "secret": "{SECRET}",
                  "events": ["charge.succeeded", "refund.failed", "charge.succeeded"]}},
                {{"url": "https://Other.Example", "secrets": ["{SECRET}", "{OLD}"]}},
                {{"url": "http://127.0.0.1:9000/in?x=1", "secret": "{SECRET}", "events": []}},
                {{"url": "http://localhost:9000/in", "secret": "{SECRET}", "events": ["*"]}},
                {{"url": "http://[::1]:9000/in", "secret": "{SECRET}"}}
            ]"#
        );
        let endpoints = parse_endpoints(&json)?;
        assert_eq!(
            endpoints[0],
            Endpoint {
                url: "https://shop.example/hooks".to_owned(),
                secrets: vec![SECRET.to_owned()],
                types: BTreeSet::from([EventType::ChargeSucceeded, EventType::RefundFailed]),
            }
        );
        // Written as the client sends it; both secrets sign.
        assert_eq!(endpoints[1].url, "https://other.example/");
        assert_eq!(
            endpoints[1].secrets,
            vec![SECRET.to_owned(), OLD.to_owned()]
        );
        assert_eq!(endpoints[2].url, "http://127.0.0.1:9000/in?x=1");
        assert!(
            endpoints[1..].iter().all(|e| e.types.is_empty()),
            "all types"
        );
        assert_eq!(endpoints.len(), 5);
        Ok(())
    }

    #[test]
    fn only_a_json_array_of_objects_with_known_fields() {
        for (json, says) in [
            ("{", "not valid JSON"),
            (r#"{"url": "https://shop.example"}"#, "must be a JSON array"),
            ("[1]", "WEBHOOK_ENDPOINTS[0] must be an object"),
            (r#"["https://shop.example"]"#, "[0] must be an object"),
        ] {
            let e = refused(json);
            assert!(e.contains(says), "{json}: {e}");
        }
        let e = refused(&one(&format!(
            r#""secret": "{SECRET}", "evnets": ["charge.failed"]"#
        )));
        assert!(
            e.contains("WEBHOOK_ENDPOINTS[0] has an unknown field \"evnets\""),
            "{e}"
        );
        let e = refused(&format!(r#"[{{"secret": "{SECRET}"}}]"#));
        assert!(e.contains("WEBHOOK_ENDPOINTS[0] has no `url`"), "{e}");
        let e = refused(&format!(r#"[{{"url": 7, "secret": "{SECRET}"}}]"#));
        assert!(e.contains("[0].url must be a string"), "{e}");
    }

    #[test]
    fn urls_are_https_or_loopback_without_user_info() {
        let with = |url: &str| format!(r#"[{{"url": "{url}", "secret": "{SECRET}"}}]"#);
        for url in [
            "http://shop.example/hooks",
            "http://10.0.0.1/hooks",
            "http://[::ffff:127.0.0.1]/",
            "http://localhost.shop.example/",
        ] {
            let e = refused(&with(url));
            assert!(
                e.contains("WEBHOOK_ENDPOINTS[0].url must be https (plain http only on loopback)"),
                "{url}: {e}"
            );
        }
        for url in [
            "https://user:pw@shop.example/",
            "http://user@localhost:9000/",
        ] {
            let e = refused(&with(url));
            assert!(
                e.contains("[0].url must not contain user info"),
                "{url}: {e}"
            );
        }
        for url in ["shop.example/hooks", "ftp://shop.example/", "https://"] {
            let e = refused(&with(url));
            assert!(e.contains("WEBHOOK_ENDPOINTS[0].url"), "{url}: {e}");
        }
        let e = refused(&with(r"https://shop.example\\@localhost/"));
        assert!(e.contains("backslash"), "{e}");
    }

    #[test]
    fn urls_have_no_fragment() {
        for url in ["https://shop.example/hooks#x", "https://shop.example/#"] {
            let e = refused(&format!(r#"[{{"url": "{url}", "secret": "{SECRET}"}}]"#));
            assert!(e.contains("[0].url must not have a fragment"), "{url}: {e}");
        }
    }

    #[test]
    fn urls_are_at_most_max_url_len() {
        let with = |url: &str| format!(r#"[{{"url": "{url}", "secret": "{SECRET}"}}]"#);
        let prefix = "https://shop.example/";
        let longest = format!("{prefix}{}", "a".repeat(MAX_URL_LEN - prefix.len()));
        assert!(parse_endpoints(&with(&longest)).is_ok());
        let e = refused(&with(&format!("{longest}a")));
        assert!(e.contains("[0].url is 501 characters; at most 500"), "{e}");
        // Written out, `é` becomes `%C3%A9`: the stored form counts.
        let grows = format!("{prefix}{}", "é".repeat(100));
        let e = refused(&with(&grows));
        assert!(e.contains("[0].url is 621 characters"), "{e}");
    }

    #[test]
    fn urls_are_unique() {
        let json = format!(
            r#"[{{"url": "https://a.example/h", "secret": "{SECRET}"}},
                {{"url": "https://b.example/h", "secret": "{SECRET}"}},
                {{"url": "https://A.EXAMPLE:443/h", "secret": "{OLD}"}}]"#
        );
        let e = refused(&json);
        assert!(
            e.contains("WEBHOOK_ENDPOINTS[2].url is the URL of WEBHOOK_ENDPOINTS[0]"),
            "{e}"
        );
    }

    #[test]
    fn secrets_are_long_and_never_shown() {
        let e = refused(&one(r#""secret": "whsec_short""#));
        assert!(
            e.contains("WEBHOOK_ENDPOINTS[0].secret is 11 characters; at least 24")
                && e.contains("forge"),
            "{e}"
        );
        let e = refused(&one(&format!(r#""secrets": ["{SECRET}", "whsec_short"]"#)));
        assert!(e.contains("[0].secrets[1] is 11 characters"), "{e}");
        let e = refused(&one(r#""secrets": []"#));
        assert!(e.contains("[0].secrets is empty"), "{e}");
        let e = refused(&one(&format!(
            r#""secret": "{SECRET}", "secrets": ["{OLD}"]"#
        )));
        assert!(e.contains("both `secret` and `secrets`"), "{e}");
        let e = refused(&one(r#""events": ["charge.failed"]"#));
        assert!(e.contains("[0] has no `secret`"), "{e}");
        // A secret in the wrong shape is not quoted either.
        let e = refused(&one(r#""secrets": "s3cr3t_in_a_wrong_place_x""#));
        assert!(
            e.contains("[0].secrets must be an array of strings (got a string)"),
            "{e}"
        );
        let e = refused(&one(r#""secret": ["s3cr3t_in_a_wrong_place_x"]"#));
        assert!(
            e.contains("[0].secret must be a string (got an array)"),
            "{e}"
        );
        let e = refused(&one(r#""secrets": [12345678901234567890123456]"#));
        assert!(
            e.contains("[0].secrets[0] must be a string (got a number)")
                && !e.contains("1234567890"),
            "{e}"
        );
    }

    #[test]
    fn event_types_are_known() {
        let e = refused(&one(&format!(
            r#""secret": "{SECRET}", "events": ["charge.succeeded", "charge.succeded"]"#
        )));
        assert!(
            e.contains("WEBHOOK_ENDPOINTS[0].events[1] \"charge.succeded\" is not an event type")
                && e.contains(&EventType::names()),
            "{e}"
        );
        let e = refused(&one(&format!(
            r#""secret": "{SECRET}", "events": ["*", "refund.failed"]"#
        )));
        assert!(e.contains("[0].events lists \"*\""), "{e}");
        let e = refused(&one(&format!(
            r#""secret": "{SECRET}", "events": "charge.failed""#
        )));
        assert!(e.contains("[0].events must be an array"), "{e}");
        let e = refused(&one(&format!(r#""secret": "{SECRET}", "events": [3]"#)));
        assert!(e.contains("[0].events[0] must be a string"), "{e}");
    }

    #[test]
    fn the_index_named_is_the_endpoint_refused() {
        let json = format!(
            r#"[{{"url": "https://a.example/", "secret": "{SECRET}"}},
                {{"url": "https://b.example/", "secret": "short"}}]"#
        );
        assert!(refused(&json).contains("WEBHOOK_ENDPOINTS[1].secret"));
    }
}
