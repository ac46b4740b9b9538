//! What the sandbox's test files share: a sandbox on loopback with a client
//! for it, and its answers read whole. Each test file declares it with
//! `mod common;` and uses a part of it.

// Each test file is a crate of its own, and none uses all of this.
#![allow(dead_code)]

use payments_sandbox::{SandboxConfig, SandboxHandle};
use reqwest::StatusCode;
use serde_json::Value;

pub type Error = Box<dyn std::error::Error + Send + Sync>;
pub type TestResult = Result<(), Error>;

/// A sandbox and a client for it.
pub struct Sandbox {
    pub handle: SandboxHandle,
    pub client: reqwest::Client,
}

impl Sandbox {
    /// A sandbox on `config`, on a random port.
    pub async fn start(config: SandboxConfig) -> Result<Self, Error> {
        Ok(Self::serving(SandboxHandle::start(config).await?)?)
    }

    /// A client for the sandbox `handle` serves.
    pub fn serving(handle: SandboxHandle) -> Result<Self, reqwest::Error> {
        let client = reqwest::Client::builder().no_proxy().build()?;
        Ok(Self { handle, client })
    }

    /// The sandbox's URL of `path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.handle.url())
    }

    /// `POST /_sandbox/reset`.
    pub async fn reset(&self) -> Result<reqwest::Response, reqwest::Error> {
        self.client.post(self.url("/_sandbox/reset")).send().await
    }

    /// `POST` of JSON (a `/_sandbox` route).
    pub async fn post_json(&self, path: &str, body: &Value) -> Result<Answer, reqwest::Error> {
        answer(self.client.post(self.url(path)).json(body).send().await?).await
    }

    /// `POST` of a form to a `/v1` path, with the secret key, and with an
    /// `Idempotency-Key` if given.
    pub async fn form(
        &self,
        path: &str,
        form: &(impl serde::Serialize + ?Sized),
        key: Option<&str>,
    ) -> Result<Answer, reqwest::Error> {
        let mut request = self
            .client
            .post(self.url(path))
            .bearer_auth("sk_test_sandbox")
            .form(form);
        if let Some(key) = key {
            request = request.header("Idempotency-Key", key);
        }
        answer(request.send().await?).await
    }

    /// `GET` with the secret key.
    pub async fn get(&self, path: &str) -> Result<Answer, reqwest::Error> {
        let request = self
            .client
            .get(self.url(path))
            .bearer_auth("sk_test_sandbox");
        answer(request.send().await?).await
    }
}

/// An answer: status, `Idempotent-Replayed`, body bytes and body as JSON.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub replayed: bool,
    pub bytes: Vec<u8>,
    pub json: Value,
}

impl Answer {
    /// The error's `code`, or null.
    pub fn code(&self) -> &Value {
        &self.json["error"]["code"]
    }
}

/// `response`, read whole. The sandbox marks a replay
/// `Idempotent-Replayed: true`, and never says anything else there.
pub async fn answer(response: reqwest::Response) -> Result<Answer, reqwest::Error> {
    let status = response.status();
    let replayed = match response.headers().get("idempotent-replayed") {
        Some(value) => {
            assert_eq!(value, "true");
            true
        }
        None => false,
    };
    let bytes = response.bytes().await?.to_vec();
    let json = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Ok(Answer {
        status,
        replayed,
        bytes,
        json,
    })
}

/// One webhook delivery as a [`Receiver`] got it.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// `Stripe-Signature`, if sent.
    pub signature: Option<String>,
    pub content_type: Option<String>,
    pub user_agent: Option<String>,
    /// The raw body, as signed.
    pub body: Vec<u8>,
    /// The body as JSON (null if it is not).
    pub json: Value,
}

impl Delivery {
    /// The event's `type`.
    pub fn kind(&self) -> &str {
        self.json["type"].as_str().unwrap_or_default()
    }

    /// The event's `id`.
    pub fn id(&self) -> &str {
        self.json["id"].as_str().unwrap_or_default()
    }
}

/// What a [`Receiver`] shares with its handler.
#[derive(Debug, Default)]
struct Inbox {
    deliveries: std::sync::Mutex<Vec<Delivery>>,
    /// The statuses of the next answers, in order; 200 once empty.
    script: std::sync::Mutex<std::collections::VecDeque<u16>>,
}

/// A webhook endpoint on 127.0.0.1 that records every request's headers
/// and body and answers as scripted (200 unless told). Stops when dropped.
#[derive(Debug)]
pub struct Receiver {
    pub url: String,
    inbox: std::sync::Arc<Inbox>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Receiver {
    /// A receiver on a random port; its URL is `http://127.0.0.1:PORT/webhooks`.
    pub async fn start() -> Result<Self, Error> {
        use axum::body::Bytes;
        use axum::extract::State;
        use axum::http::{HeaderMap, StatusCode};

        async fn receive(
            State(inbox): State<std::sync::Arc<Inbox>>,
            headers: HeaderMap,
            body: Bytes,
        ) -> StatusCode {
            let header = |name: &str| {
                headers
                    .get(name)
                    .map(|value| String::from_utf8_lossy(value.as_bytes()).into_owned())
            };
            let delivery = Delivery {
                signature: header("stripe-signature"),
                content_type: header("content-type"),
                user_agent: header("user-agent"),
                json: serde_json::from_slice(&body).unwrap_or(Value::Null),
                body: body.to_vec(),
            };
            let status = {
                let mut script = inbox
                    .script
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                script.pop_front().unwrap_or(200)
            };
            inbox
                .deliveries
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(delivery);
            StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
        }

        let inbox = std::sync::Arc::new(Inbox::default());
        let listener = tokio::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)).await?;
        let url = format!("http://{}/webhooks", listener.local_addr()?);
        let router = axum::Router::new()
            .route("/webhooks", axum::routing::post(receive))
            .with_state(std::sync::Arc::clone(&inbox));
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Ok(Self { url, inbox, task })
    }

    /// The next answers' statuses, in order (then 200 again).
    pub fn answer_with(&self, statuses: &[u16]) {
        self.inbox
            .script
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend(statuses);
    }

    /// Every delivery so far, in the order received.
    pub fn deliveries(&self) -> Vec<Delivery> {
        self.inbox
            .deliveries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Waits (at most 15 s) until the deliveries satisfy `done`; returns
    /// them either way, for the caller's assertion to name what is missing.
    pub async fn wait_until(&self, done: impl Fn(&[Delivery]) -> bool) -> Vec<Delivery> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
        loop {
            let deliveries = self.deliveries();
            if done(&deliveries) || std::time::Instant::now() > deadline {
                return deliveries;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    /// Waits until at least `count` deliveries arrived.
    pub async fn wait_for(&self, count: usize) -> Vec<Delivery> {
        self.wait_until(|deliveries| deliveries.len() >= count)
            .await
    }
}
