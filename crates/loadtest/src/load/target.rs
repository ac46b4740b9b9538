//! Loopback only: a load generator pointed at a shared or production host is
//! an outage, so every URL it sends requests to must name this machine.

use std::net::IpAddr;

use reqwest::Url;

use super::LoadError;

/// Parses `url` and accepts it only if its host is `localhost`, an address in
/// 127.0.0.0/8 or `::1`. Names other than `localhost` are refused even if
/// they would resolve to loopback: the check must not depend on DNS.
pub(crate) fn require_loopback(flag: &'static str, url: &str) -> Result<Url, LoadError> {
    let refuse = |reason: &str| LoadError::NotLoopback {
        flag,
        url: url.to_owned(),
        reason: reason.to_owned(),
    };
    let parsed = Url::parse(url).map_err(|e| refuse(&e.to_string()))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(refuse("the scheme must be http or https"));
    }
    let host = parsed
        .host_str()
        .ok_or_else(|| refuse("the URL has no host"))?;
    if host.eq_ignore_ascii_case("localhost") {
        return Ok(parsed);
    }
    // `host_str` keeps the brackets of an IPv6 literal.
    let literal = host.trim_start_matches('[').trim_end_matches(']');
    match literal.parse::<IpAddr>() {
        Ok(ip) if ip.is_loopback() => Ok(parsed),
        Ok(_) => Err(refuse("not a loopback address")),
        Err(_) => Err(refuse("only localhost, 127.0.0.0/8 and ::1 are allowed")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts_pass() {
        for url in [
            "http://127.0.0.1:8080",
            "http://127.3.2.1/prefix",
            "http://localhost:1",
            "http://LOCALHOST",
            "https://[::1]:8443/",
        ] {
            assert!(require_loopback("--base-url", url).is_ok(), "{url}");
        }
    }

    #[test]
    fn everything_else_is_refused() {
        for url in [
            "http://10.0.0.1:8080",
            "http://128.0.0.1",
            "http://[::2]",
            "http://[::ffff:127.0.0.1]",
            "http://0.0.0.0:8080",
            "http://payments.example.com",
            "http://127.0.0.1.nip.io",
            "http://localhost.example.com",
            "ftp://127.0.0.1",
            "127.0.0.1:8080",
            "not a url",
        ] {
            assert!(
                matches!(
                    require_loopback("--base-url", url),
                    Err(LoadError::NotLoopback { .. })
                ),
                "{url}"
            );
        }
    }
}
