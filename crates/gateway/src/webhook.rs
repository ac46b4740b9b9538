//! [`HttpWebhookSender`]: the domain's [`WebhookSender`] port over reqwest.
//!
//! One attempt is one `POST` of the event's JSON with its
//! `Payments-Signature`, under a total timeout, never following a redirect
//! (a 3xx is an answer like any other: not 2xx, so not delivered).
//!
//! # Server-side request forgery
//!
//! The URLs are the merchant's, and the attempts are made from inside our
//! network: without a guard, an endpoint could make the server call its
//! neighbours (a database's HTTP port, an admin page) or the cloud's
//! metadata service (`169.254.169.254`, which hands out credentials). So
//! every address a connection would go to is checked by one rule,
//! [`refused_address`]:
//!
//! - a host name is checked **when connecting**, by the client's own
//!   resolver ([`reqwest::dns::Resolve`]), which drops every refused address
//!   it finds and fails the connection when none is left. The connection
//!   goes to the addresses that were checked, so a name that resolves to a
//!   public address when validated and to a private one a moment later (DNS
//!   rebinding) gains nothing;
//! - an IP literal (`http://10.0.0.1/`), which the client connects to
//!   without resolving, is checked in [`HttpWebhookSender::send`] before
//!   anything is sent.
//!
//! Exceptions: a URL whose host is literally loopback (`localhost`,
//! `127.0.0.0/8`, `[::1]`) is allowed: receivers are tested that way on
//! one machine (and the settings allow plain http only there). And
//! `allow_private` (`WEBHOOK_ALLOW_PRIVATE_NETWORKS`) turns the guard off
//! entirely, for a receiver on the merchant's own private network.
//!
//! System proxies (`HTTP_PROXY`, `HTTPS_PROXY`) are not used: through a
//! proxy the client would resolve only the proxy's name, and the proxy
//! would connect wherever the URL says, past the guard.

use std::error::Error as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use async_trait::async_trait;
use payments_domain::webhook::{Sent, WebhookSender};
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

/// `WEBHOOK_TIMEOUT`'s default: the longest one attempt waits for its
/// answer, connecting included.
pub const DEFAULT_WEBHOOK_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest an attempt waits for its connection (at most the total
/// timeout).
pub const WEBHOOK_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// What every attempt says it is.
pub const WEBHOOK_USER_AGENT: &str = "payments-webhooks/1";
/// The header the signature travels in.
pub const SIGNATURE_HEADER: &str = "Payments-Signature";

/// The longest reason a [`Sent::NoAnswer`] gives (it is stored with the
/// delivery).
const MAX_REASON_CHARS: usize = 300;

/// The webhooks' HTTP client: see the module's documentation.
#[derive(Debug, Clone)]
pub struct HttpWebhookSender {
    client: reqwest::Client,
    timeout: Duration,
    allow_private: bool,
}

impl HttpWebhookSender {
    /// A client whose attempts each last at most `timeout` (connecting at
    /// most [`WEBHOOK_CONNECT_TIMEOUT`] of it). `allow_private` turns the
    /// address guard off (`WEBHOOK_ALLOW_PRIVATE_NETWORKS`): then every
    /// address is reached, the cloud's metadata service included.
    pub fn new(timeout: Duration, allow_private: bool) -> Result<Self, reqwest::Error> {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout.min(WEBHOOK_CONNECT_TIMEOUT))
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .user_agent(WEBHOOK_USER_AGENT)
            .dns_resolver(GuardedResolver { allow_private })
            .build()?;
        Ok(Self {
            client,
            timeout,
            allow_private,
        })
    }
}

#[async_trait]
impl WebhookSender for HttpWebhookSender {
    async fn send(&self, url: &str, body: &str, signature: &str) -> Sent {
        let parsed = match reqwest::Url::parse(url) {
            Ok(parsed) => parsed,
            Err(e) => return Sent::NoAnswer(format!("not a URL: {e}")),
        };
        let literal = match parsed.host() {
            Some(url::Host::Ipv4(ip)) => Some(IpAddr::V4(ip)),
            Some(url::Host::Ipv6(ip)) => Some(IpAddr::V6(ip)),
            Some(url::Host::Domain(_)) | None => None,
        };
        if let Some(ip) = literal.filter(|&ip| !allowed(ip, true, self.allow_private)) {
            return Sent::NoAnswer(Refused::Literal(ip).to_string());
        }
        let attempt = self
            .client
            .post(parsed)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(SIGNATURE_HEADER, signature)
            .body(body.to_owned())
            .send()
            .await;
        match attempt {
            Ok(answer) => Sent::Answered(answer.status().as_u16()),
            Err(e) => Sent::NoAnswer(reason(&e, self.timeout)),
        }
    }
}

/// Whether the guard refuses to connect to `ip`: every address that is not
/// a public unicast one. IPv4: `0.0.0.0/8` (unspecified; Linux connects
/// `0.0.0.0` to the host itself), loopback `127/8`, private `10/8`,
/// `172.16/12`, `192.168/16`, link-local `169.254/16` (the cloud's metadata
/// service, `169.254.169.254`), shared (CGNAT) `100.64/10`, IETF protocol
/// assignments `192.0.0/24`, documentation `192.0.2/24`, `198.51.100/24`,
/// `203.0.113/24`, benchmarking `198.18/15`, multicast `224/4`, reserved
/// `240/4` and broadcast. IPv6: the IPv4-compatible `::/96` (unspecified
/// and loopback among them), link-local `fe80::/10`, site-local
/// `fec0::/10`, unique-local `fc00::/7`, multicast `ff00::/8`,
/// documentation `2001:db8::/32` and `3fff::/20`, discard `100::/64`,
/// Teredo `2001::/32`, local-use NAT64 `64:ff9b:1::/48`; and an IPv4
/// address carried in IPv6 (mapped `::ffff:0:0/96`, translated
/// `::ffff:0:0:0/96`, NAT64 `64:ff9b::/96`, 6to4 `2002::/16`) by the IPv4
/// rule.
pub fn refused_address(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(ip) => refused_v4(ip),
        IpAddr::V6(ip) => refused_v6(ip),
    }
}

fn refused_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    a == 0
        || ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || (a == 100 && b & 0xc0 == 64)
        || (a == 192 && b == 0 && c == 0)
        || ip.is_documentation()
        || (a == 198 && b & 0xfe == 18)
        || ip.is_multicast()
        || a >= 240
}

fn refused_v6(ip: Ipv6Addr) -> bool {
    if let Some(v4) = carried_v4(ip) {
        return refused_v4(v4);
    }
    let s = ip.segments();
    s[..6].iter().all(|&x| x == 0)
        || s[0] & 0xffc0 == 0xfe80
        || s[0] & 0xffc0 == 0xfec0
        || s[0] & 0xfe00 == 0xfc00
        || s[0] & 0xff00 == 0xff00
        || (s[0] == 0x2001 && s[1] == 0x0db8)
        || (s[0] == 0x3fff && s[1] & 0xf000 == 0)
        || s[..4] == [0x0100, 0, 0, 0]
        || (s[0] == 0x2001 && s[1] == 0)
        || s[..3] == [0x0064, 0xff9b, 0x0001]
}

/// The IPv4 address an IPv6 one stands for, where the network would
/// deliver it over IPv4: mapped, translated, NAT64's well-known prefix,
/// 6to4.
fn carried_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let last = |hi: u16, lo: u16| Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo));
    if let Some(v4) = ip.to_ipv4_mapped() {
        Some(v4)
    } else if s[..6] == [0, 0, 0, 0, 0xffff, 0] || s[..6] == [0x0064, 0xff9b, 0, 0, 0, 0] {
        Some(last(s[6], s[7]))
    } else if s[0] == 0x2002 {
        Some(last(s[1], s[2]))
    } else {
        None
    }
}

/// Whether a connection may go to `ip`: the guard is off, or the rule
/// does not refuse it, or it is loopback and the URL said so
/// (`named_loopback`: its host is `localhost` or a loopback literal).
fn allowed(ip: IpAddr, named_loopback: bool, allow_private: bool) -> bool {
    allow_private || !refused_address(ip) || (named_loopback && ip.is_loopback())
}

/// What the resolver keeps of the addresses `host` resolved to.
fn kept(
    host: &str,
    found: impl IntoIterator<Item = SocketAddr>,
    allow_private: bool,
) -> Vec<SocketAddr> {
    let localhost = host.eq_ignore_ascii_case("localhost");
    found
        .into_iter()
        .filter(|addr| allowed(addr.ip(), localhost, allow_private))
        .collect()
}

/// The client's resolver: the system's (`getaddrinfo`, through tokio),
/// less every address the guard refuses.
#[derive(Debug, Clone, Copy)]
struct GuardedResolver {
    allow_private: bool,
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let host = name.as_str().to_owned();
        let allow_private = self.allow_private;
        Box::pin(async move {
            let found: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let addrs = kept(&host, found.iter().copied(), allow_private);
            if addrs.is_empty() {
                let first = found.first().map(SocketAddr::ip);
                return Err(Box::new(Refused::Name { host, first }) as _);
            }
            Ok(Box::new(addrs.into_iter()) as Addrs)
        })
    }
}

/// Why the guard refused an attempt (the reason [`Sent::NoAnswer`] gives).
#[derive(Debug)]
enum Refused {
    /// The URL's host is an address the guard refuses.
    Literal(IpAddr),
    /// Every address `host` resolved to is refused (`first`: one of them).
    Name { host: String, first: Option<IpAddr> },
}

const ALLOW: &str = "WEBHOOK_ALLOW_PRIVATE_NETWORKS=true allows a receiver on a private network";

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Literal(ip) => write!(
                f,
                "refused address {ip}: not a public address (loopback, private, link-local or \
                 reserved); {ALLOW}"
            ),
            Self::Name { host, first: None } => {
                write!(f, "refused address: {host} resolved to no address")
            }
            Self::Name {
                host,
                first: Some(ip),
            } => write!(
                f,
                "refused address: {host} resolves only to addresses that are not public \
                 ({ip}); {ALLOW}"
            ),
        }
    }
}

impl std::error::Error for Refused {}

/// A short reason for a failed attempt: the guard's refusal, a timeout, or
/// the innermost cause. Never the URL (it may hold the receiver's token),
/// the body or the signature.
fn reason(e: &reqwest::Error, timeout: Duration) -> String {
    let mut innermost: Option<&(dyn std::error::Error + 'static)> = None;
    let mut source = e.source();
    while let Some(cause) = source {
        if let Some(refused) = cause.downcast_ref::<Refused>() {
            return short(refused.to_string());
        }
        innermost = Some(cause);
        source = cause.source();
    }
    if e.is_timeout() {
        return if e.is_connect() {
            format!(
                "no connection within {:?}",
                timeout.min(WEBHOOK_CONNECT_TIMEOUT)
            )
        } else {
            format!("no answer within {timeout:?}")
        };
    }
    let what = if e.is_connect() {
        "connection failed"
    } else if e.is_builder() {
        "invalid request"
    } else {
        "request failed"
    };
    match innermost {
        Some(cause) => short(format!("{what}: {cause}")),
        None => what.to_owned(),
    }
}

/// At most [`MAX_REASON_CHARS`] characters.
fn short(mut reason: String) -> String {
    if let Some((cut, _)) = reason.char_indices().nth(MAX_REASON_CHARS) {
        reason.truncate(cut);
    }
    reason
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;
    use tokio::sync::mpsc;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("an address")
    }

    #[test]
    fn public_addresses_are_allowed() {
        for public in [
            "93.184.216.34",
            "8.8.8.8",
            "1.1.1.1",
            "100.63.255.255",
            "100.128.0.0",
            "172.15.255.255",
            "172.32.0.0",
            "192.0.1.1",
            "198.17.255.255",
            "198.20.0.0",
            "223.255.255.255",
            "2606:4700::1",
            "2a00:1450:4001:80b::200e",
            "::ffff:93.184.216.34",
            "64:ff9b::5db8:d822",
            "2002:5db8:d822::1",
        ] {
            assert!(!refused_address(ip(public)), "{public}");
        }
    }

    #[test]
    fn every_range_that_is_not_public_is_refused() {
        for (range, addresses) in [
            ("this network", &["0.0.0.0", "0.1.2.3"][..]),
            ("loopback", &["127.0.0.1", "127.255.255.254", "::1"]),
            (
                "private",
                &[
                    "10.0.0.1",
                    "10.255.255.255",
                    "172.16.0.1",
                    "172.31.255.255",
                    "192.168.0.1",
                    "192.168.255.255",
                ],
            ),
            (
                "link-local",
                &["169.254.169.254", "169.254.0.1", "fe80::1", "febf::1"],
            ),
            ("shared (CGNAT)", &["100.64.0.1", "100.127.255.255"]),
            ("IETF assignments", &["192.0.0.170"]),
            (
                "documentation",
                &[
                    "192.0.2.1",
                    "198.51.100.7",
                    "203.0.113.9",
                    "2001:db8::1",
                    "3fff::1",
                ],
            ),
            ("benchmarking", &["198.18.0.1", "198.19.255.255"]),
            ("multicast", &["224.0.0.1", "239.255.255.250", "ff02::1"]),
            ("reserved, broadcast", &["240.0.0.1", "255.255.255.255"]),
            ("unspecified", &["::", "0.0.0.0"]),
            ("unique-local", &["fc00::1", "fd12:3456::1"]),
            ("site-local", &["fec0::1"]),
            ("IPv4-compatible", &["::127.0.0.1", "::8.8.8.8"]),
            ("discard", &["100::1"]),
            ("Teredo", &["2001::1"]),
            ("local NAT64", &["64:ff9b:1::a00:1"]),
            (
                "IPv4 in IPv6",
                &[
                    "::ffff:127.0.0.1",
                    "::ffff:10.0.0.1",
                    "::ffff:169.254.169.254",
                    "::ffff:100.64.0.1",
                    "::ffff:0:a9fe:a9fe",
                    "64:ff9b::a9fe:a9fe",
                    "64:ff9b::7f00:1",
                    "2002:a00:1::1",
                    "2002:a9fe:a9fe::",
                ],
            ),
        ] {
            for address in addresses {
                assert!(refused_address(ip(address)), "{range}: {address}");
            }
        }
    }

    fn at(addresses: &[&str]) -> Vec<SocketAddr> {
        addresses
            .iter()
            .map(|a| SocketAddr::new(ip(a), 443))
            .collect()
    }

    #[test]
    fn the_resolver_keeps_only_public_addresses() {
        let found = at(&[
            "10.0.0.5",
            "93.184.216.34",
            "127.0.0.1",
            "2606:4700::1",
            "fd00::1",
        ]);
        assert_eq!(
            kept("shop.example", found.clone(), false),
            at(&["93.184.216.34", "2606:4700::1"])
        );
        // A name that resolves only to private addresses: nothing is left,
        // and the connection fails.
        let inside = at(&["169.254.169.254", "10.1.2.3", "::ffff:192.168.1.1"]);
        assert!(kept("metadata.example", inside.clone(), false).is_empty());
        // A name is not loopback because it resolves to loopback.
        assert!(kept("localhost.shop.example", at(&["127.0.0.1", "::1"]), false).is_empty());
        assert!(kept("127.0.0.1.nip.io", at(&["127.0.0.1"]), false).is_empty());
        // `localhost` by name keeps its loopback addresses, and only those.
        assert_eq!(
            kept("LocalHost", at(&["127.0.0.1", "::1", "10.0.0.1"]), false),
            at(&["127.0.0.1", "::1"])
        );
        // WEBHOOK_ALLOW_PRIVATE_NETWORKS: everything.
        assert_eq!(kept("metadata.example", inside.clone(), true), inside);
        assert_eq!(kept("shop.example", found.clone(), true), found);
    }

    #[tokio::test]
    async fn the_resolver_refuses_a_name_with_only_refused_addresses() {
        let resolver = GuardedResolver {
            allow_private: false,
        };
        // getaddrinfo answers an address written as a name without a query.
        for name in ["10.0.0.1", "169.254.169.254", "127.0.0.1"] {
            let refused = resolver
                .resolve(name.parse().expect("a name"))
                .await
                .err()
                .map(|e| e.to_string());
            assert!(
                refused
                    .as_deref()
                    .is_some_and(|e| e.starts_with("refused address: ")),
                "{name}: {refused:?}"
            );
        }
        let localhost = resolver
            .resolve("localhost".parse().expect("a name"))
            .await
            .map(|addrs| addrs.map(|a| a.ip()).collect::<Vec<_>>())
            .map_err(|e| e.to_string());
        assert!(
            localhost
                .as_ref()
                .is_ok_and(|ips| !ips.is_empty() && ips.iter().all(IpAddr::is_loopback)),
            "{localhost:?}"
        );
        let open = GuardedResolver {
            allow_private: true,
        };
        let private = open
            .resolve("10.0.0.1".parse().expect("a name"))
            .await
            .map(|addrs| addrs.map(|a| a.ip()).collect::<Vec<_>>())
            .map_err(|e| e.to_string());
        assert_eq!(private, Ok(vec![ip("10.0.0.1")]));
    }

    /// A loopback HTTP/1.1 server that sends each request it reads (head
    /// and body, as text) to the channel, waits `delay`, then answers
    /// `response` and closes.
    async fn server(
        response: String,
        delay: Duration,
    ) -> std::io::Result<(SocketAddr, mpsc::UnboundedReceiver<String>)> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let (tx, response) = (tx.clone(), response.clone());
                tokio::spawn(async move {
                    let request = read_request(&mut stream).await;
                    let _ = tx.send(request);
                    tokio::time::sleep(delay).await;
                    let _ = stream.write_all(response.as_bytes()).await;
                    let _ = stream.shutdown().await;
                });
            }
        });
        Ok((addr, rx))
    }

    async fn read_request(stream: &mut tokio::net::TcpStream) -> String {
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let text = String::from_utf8_lossy(&seen).into_owned();
            if let Some(end) = text.find("\r\n\r\n") {
                let length = text[..end]
                    .lines()
                    .find_map(|l| {
                        let (name, value) = l.split_once(':')?;
                        name.eq_ignore_ascii_case("content-length")
                            .then(|| value.trim().parse::<usize>().ok())?
                    })
                    .unwrap_or(0);
                if seen.len() >= end + 4 + length {
                    return text;
                }
            }
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return String::from_utf8_lossy(&seen).into_owned(),
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
    }

    fn answer(status: &str, extra: &str) -> String {
        format!("HTTP/1.1 {status}\r\n{extra}content-length: 0\r\nconnection: close\r\n\r\n")
    }

    fn header<'a>(request: &'a str, name: &str) -> Option<&'a str> {
        request.lines().find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }

    fn sender(timeout: Duration, allow_private: bool) -> HttpWebhookSender {
        HttpWebhookSender::new(timeout, allow_private).expect("a client")
    }

    #[tokio::test]
    async fn a_2xx_is_answered_and_the_request_is_signed() -> std::io::Result<()> {
        let (addr, mut requests) = server(answer("200 OK", ""), Duration::ZERO).await?;
        let body = r#"{"id":"evt_1","type":"charge.succeeded"}"#;
        let sent = sender(DEFAULT_WEBHOOK_TIMEOUT, false)
            .send(&format!("http://{addr}/hooks?x=1"), body, "t=1,v1=abc")
            .await;
        assert_eq!(sent, Sent::Answered(200));
        let request = requests.recv().await.unwrap_or_default();
        assert!(
            request.starts_with("POST /hooks?x=1 HTTP/1.1\r\n"),
            "{request}"
        );
        assert_eq!(header(&request, "payments-signature"), Some("t=1,v1=abc"));
        assert_eq!(header(&request, "content-type"), Some("application/json"));
        assert_eq!(header(&request, "user-agent"), Some("payments-webhooks/1"));
        assert!(request.ends_with(&format!("\r\n\r\n{body}")), "{request}");
        Ok(())
    }

    #[tokio::test]
    async fn other_statuses_are_answers_too() -> std::io::Result<()> {
        for (status, code) in [("500 Internal Server Error", 500), ("404 Not Found", 404)] {
            let (addr, _requests) = server(answer(status, ""), Duration::ZERO).await?;
            let sent = sender(DEFAULT_WEBHOOK_TIMEOUT, false)
                .send(&format!("http://{addr}/"), "{}", "sig")
                .await;
            assert_eq!(sent, Sent::Answered(code));
        }
        Ok(())
    }

    #[tokio::test]
    async fn a_redirect_is_an_answer_and_never_followed() -> std::io::Result<()> {
        let (target, mut hits) = server(answer("200 OK", ""), Duration::ZERO).await?;
        let location = format!("location: http://{target}/elsewhere\r\n");
        for status in [
            "302 Found",
            "307 Temporary Redirect",
            "308 Permanent Redirect",
        ] {
            let (addr, mut requests) = server(answer(status, &location), Duration::ZERO).await?;
            let sent = sender(DEFAULT_WEBHOOK_TIMEOUT, false)
                .send(&format!("http://{addr}/"), "{}", "sig")
                .await;
            let code = status[..3].parse::<u16>().unwrap_or_default();
            assert_eq!(sent, Sent::Answered(code));
            assert!(requests.recv().await.is_some());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(hits.try_recv().is_err(), "the redirect was followed");
        Ok(())
    }

    #[tokio::test]
    async fn a_slow_receiver_is_no_answer() -> std::io::Result<()> {
        let (addr, _requests) = server(answer("200 OK", ""), Duration::from_secs(5)).await?;
        let sent = sender(Duration::from_millis(300), false)
            .send(&format!("http://{addr}/"), "{}", "sig")
            .await;
        assert_eq!(sent, Sent::NoAnswer("no answer within 300ms".to_owned()));
        Ok(())
    }

    #[tokio::test]
    async fn a_closed_port_is_no_answer_without_the_url() -> std::io::Result<()> {
        let addr = TcpListener::bind("127.0.0.1:0").await?.local_addr()?;
        let sent = sender(DEFAULT_WEBHOOK_TIMEOUT, false)
            .send(
                &format!("http://{addr}/hooks?token=s3cret"),
                "{\"x\":1}",
                "sig",
            )
            .await;
        let Sent::NoAnswer(reason) = sent else {
            panic!("answered: {sent:?}");
        };
        assert!(reason.starts_with("connection failed: "), "{reason}");
        assert!(
            !reason.contains("s3cret") && !reason.contains("hooks"),
            "{reason}"
        );
        let bad = sender(DEFAULT_WEBHOOK_TIMEOUT, false)
            .send("not a url", "{}", "sig")
            .await;
        assert!(
            matches!(bad, Sent::NoAnswer(ref r) if r.starts_with("not a URL")),
            "{bad:?}"
        );
        Ok(())
    }

    #[tokio::test]
    async fn private_literals_are_refused_before_connecting() -> std::io::Result<()> {
        let webhooks = sender(DEFAULT_WEBHOOK_TIMEOUT, false);
        for url in [
            "http://169.254.169.254/latest/meta-data/",
            "http://10.0.0.1/",
            "https://[fd00::1]/",
            "http://0.0.0.0:80/",
            "http://[::ffff:a9fe:a9fe]/",
        ] {
            let sent = webhooks.send(url, "{}", "sig").await;
            assert!(
                matches!(sent, Sent::NoAnswer(ref r) if r.starts_with("refused address ")
                    && r.contains("WEBHOOK_ALLOW_PRIVATE_NETWORKS")),
                "{url}: {sent:?}"
            );
        }
        // IPv4-mapped loopback is not loopback by name: refused, and the
        // server behind it sees no connection. With the guard off, it is
        // reached.
        let (addr, mut requests) = server(answer("204 No Content", ""), Duration::ZERO).await?;
        let mapped = format!("http://[::ffff:127.0.0.1]:{}/", addr.port());
        let sent = webhooks.send(&mapped, "{}", "sig").await;
        refused_unless_allowed(sent, "refused", &mapped, &mut requests, 204).await;
        Ok(())
    }

    /// `sent` was refused (its reason starts with `refusal`) and the server
    /// behind `url` saw no connection; with the guard off, `url` answers
    /// `status`.
    async fn refused_unless_allowed(
        sent: Sent,
        refusal: &str,
        url: &str,
        requests: &mut mpsc::UnboundedReceiver<String>,
        status: u16,
    ) {
        assert!(
            matches!(sent, Sent::NoAnswer(ref r) if r.starts_with(refusal)),
            "{sent:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            requests.try_recv().is_err(),
            "a refused address was connected to"
        );
        let open = sender(DEFAULT_WEBHOOK_TIMEOUT, true);
        assert_eq!(open.send(url, "{}", "sig").await, Sent::Answered(status));
    }

    #[tokio::test]
    async fn literal_loopback_and_localhost_are_allowed() -> std::io::Result<()> {
        let (addr, _requests) = server(answer("200 OK", ""), Duration::ZERO).await?;
        let webhooks = sender(DEFAULT_WEBHOOK_TIMEOUT, false);
        for url in [
            format!("http://127.0.0.1:{}/", addr.port()),
            format!("http://localhost:{}/", addr.port()),
        ] {
            assert_eq!(
                webhooks.send(&url, "{}", "sig").await,
                Sent::Answered(200),
                "{url}"
            );
        }
        Ok(())
    }

    /// End to end through the client: a name other than `localhost` that
    /// resolves to loopback (this machine's host name, in most containers)
    /// is refused when connecting, and the server is never reached. Skipped
    /// where the host name does not resolve only to refused addresses.
    #[tokio::test]
    async fn a_name_resolving_to_a_refused_address_is_refused_when_connecting()
    -> std::io::Result<()> {
        let Ok(name) = std::fs::read_to_string("/proc/sys/kernel/hostname") else {
            return Ok(());
        };
        let name = name.trim().to_owned();
        let found: Vec<SocketAddr> = match tokio::net::lookup_host((name.as_str(), 0)).await {
            Ok(found) => found.collect(),
            Err(_) => return Ok(()),
        };
        let all_loopback = found.iter().all(|a| a.ip().is_loopback());
        if name.is_empty()
            || name.eq_ignore_ascii_case("localhost")
            || found.is_empty()
            || !all_loopback
            || reqwest::Url::parse(&format!("http://{name}/")).is_err()
        {
            eprintln!("skipped: host name {name:?} resolves to {found:?}");
            return Ok(());
        }
        let (addr, mut requests) = server(answer("200 OK", ""), Duration::ZERO).await?;
        let url = format!("http://{name}:{}/", addr.port());
        let sent = sender(DEFAULT_WEBHOOK_TIMEOUT, false)
            .send(&url, "{}", "sig")
            .await;
        let refusal = format!("refused address: {name} resolves only");
        refused_unless_allowed(sent, &refusal, &url, &mut requests, 200).await;
        Ok(())
    }

    #[test]
    fn reasons_are_short() {
        assert_eq!(short("é".repeat(400)).chars().count(), MAX_REASON_CHARS);
        assert_eq!(short("x".to_owned()), "x");
    }
}
