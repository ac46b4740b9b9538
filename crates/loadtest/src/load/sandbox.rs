//! The sandbox provider's control API: what it charged (`GET
//! /_sandbox/charges`) and captured (`GET /_sandbox/captures`), its fault
//! injection (`GET`/`POST /_sandbox/config`) and `POST /_sandbox/reset`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use reqwest::Url;
use serde::Deserialize;
use serde_json::Value;

use super::LoadError;

/// A client for one sandbox's `/_sandbox/*` endpoints.
#[derive(Debug, Clone)]
pub(crate) struct Sandbox {
    http: reqwest::Client,
    base: Url,
}

/// One line of `GET /_sandbox/charges`.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct ProviderCharge {
    pub id: String,
    pub status: String,
    /// The key the API sent to the provider (derived from its charge id).
    pub idempotency_key: Option<String>,
}

/// One line of `GET /_sandbox/captures`: the part the count needs.
#[derive(Debug, Deserialize)]
struct ProviderCapture {
    /// The provider's id of the hold captured.
    charge: String,
}

/// One of the sandbox's lists: `{"data": [..]}`.
#[derive(Debug, Deserialize)]
struct List<T> {
    data: Vec<T>,
}

/// The provider's successful charges made during a run.
#[derive(Debug, Clone, Default)]
pub(crate) struct ProviderCount {
    /// Their provider charge ids.
    pub ids: BTreeSet<String>,
    /// Provider keys that were charged more than once, with the count.
    pub keys_charged_twice: BTreeMap<String, u64>,
}

impl Sandbox {
    pub(crate) fn new(base: Url, timeout: Duration) -> Result<Self, LoadError> {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .build()
            .map_err(|e| LoadError::Sandbox(e.to_string()))?;
        Ok(Self { http, base })
    }

    fn url(&self, path: &str) -> Url {
        let mut url = self.base.clone();
        if let Ok(mut segments) = url.path_segments_mut() {
            segments.pop_if_empty().extend(["_sandbox", path]);
        }
        url
    }

    /// Every charge the sandbox recorded, declined ones too.
    pub(crate) async fn charges(&self) -> Result<Vec<ProviderCharge>, LoadError> {
        let list: List<ProviderCharge> = self.json(self.http.get(self.url("charges"))).await?;
        Ok(list.data)
    }

    /// The ids of the successful charges, to tell them from this run's.
    pub(crate) async fn succeeded_ids(&self) -> Result<BTreeSet<String>, LoadError> {
        Ok(self
            .charges()
            .await?
            .into_iter()
            .filter(|c| c.status == "succeeded")
            .map(|c| c.id)
            .collect())
    }

    /// The successful charges not in `before`.
    pub(crate) async fn charged_since(
        &self,
        before: &BTreeSet<String>,
    ) -> Result<ProviderCount, LoadError> {
        let mut count = ProviderCount::default();
        let mut per_key: BTreeMap<String, u64> = BTreeMap::new();
        for charge in self.charges().await? {
            if charge.status != "succeeded" || before.contains(&charge.id) {
                continue;
            }
            if let Some(key) = charge.idempotency_key {
                *per_key.entry(key).or_default() += 1;
            }
            count.ids.insert(charge.id);
        }
        count.keys_charged_twice = per_key.into_iter().filter(|(_, n)| *n > 1).collect();
        Ok(count)
    }

    /// How many refunds the sandbox has made (since its last reset).
    pub(crate) async fn refund_count(&self) -> Result<u64, LoadError> {
        let stats: Value = self.json(self.http.get(self.url("stats"))).await?;
        stats["refunds"]
            .as_u64()
            .ok_or_else(|| LoadError::Sandbox(format!("no refunds count in {stats}")))
    }

    /// How many captures the sandbox made of each of `charges` (provider
    /// charge ids) that it captured at all.
    pub(crate) async fn captures_of(
        &self,
        charges: &BTreeSet<String>,
    ) -> Result<BTreeMap<String, u64>, LoadError> {
        let list: List<ProviderCapture> = self.json(self.http.get(self.url("captures"))).await?;
        let mut per_charge = BTreeMap::new();
        for capture in list.data {
            if charges.contains(&capture.charge) {
                *per_charge.entry(capture.charge).or_default() += 1;
            }
        }
        Ok(per_charge)
    }

    /// Forgets every charge, key and counter (not the config).
    pub(crate) async fn reset(&self) -> Result<(), LoadError> {
        let _: Value = self.json(self.http.post(self.url("reset"))).await?;
        Ok(())
    }

    /// The current fault-injection config, as JSON.
    pub(crate) async fn config(&self) -> Result<Value, LoadError> {
        self.json(self.http.get(self.url("config"))).await
    }

    /// Replaces the whole fault-injection config.
    pub(crate) async fn set_config(&self, config: &Value) -> Result<(), LoadError> {
        let _: Value = self
            .json(self.http.post(self.url("config")).json(config))
            .await?;
        Ok(())
    }

    /// Sets `latency_ms` and keeps the other faults as they are; returns the
    /// config as it was.
    pub(crate) async fn set_latency(&self, latency: Duration) -> Result<Value, LoadError> {
        let before = self.config().await?;
        let mut config = before.clone();
        let millis = u64::try_from(latency.as_millis()).unwrap_or(u64::MAX);
        match config.as_object_mut() {
            Some(object) => {
                object.insert("latency_ms".to_owned(), millis.into());
            }
            None => config = serde_json::json!({ "latency_ms": millis }),
        }
        self.set_config(&config).await?;
        Ok(before)
    }

    async fn json<T: serde::de::DeserializeOwned>(
        &self,
        request: reqwest::RequestBuilder,
    ) -> Result<T, LoadError> {
        let failed =
            |e: reqwest::Error| LoadError::Sandbox(payments_client::error::error_chain(&e));
        let response = request.send().await.map_err(failed)?;
        let status = response.status();
        let body = response.bytes().await.map_err(failed)?;
        if !status.is_success() {
            return Err(LoadError::Sandbox(format!(
                "{status}: {}",
                String::from_utf8_lossy(&body)
            )));
        }
        serde_json::from_slice(&body)
            .map_err(|e| LoadError::Sandbox(format!("unexpected answer ({e})")))
    }
}
