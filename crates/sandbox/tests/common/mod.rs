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
