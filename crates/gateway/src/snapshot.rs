//! A charge as the provider shows it now, with every page of its refunds
//! and disputes: what a provider webhook is applied from (the event's own
//! snapshot may be older than another event already applied).

use payments_domain::provider::{ProviderCharge, ProviderDispute, ProviderRefund};
use serde::Deserialize;
use serde_json::Value;

use super::{HttpGateway, Kind, decode, decode_value, names, wire};

/// Stripe's dispute object: the fields the server keeps.
#[derive(Debug, Deserialize)]
struct Dispute {
    id: String,
    amount: i64,
    currency: String,
    status: String,
    #[serde(default)]
    reason: Option<String>,
    is_charge_refundable: bool,
    #[serde(default)]
    evidence_details: Option<Evidence>,
}

#[derive(Debug, Deserialize)]
struct Evidence {
    #[serde(default)]
    due_by: Option<i64>,
}

impl HttpGateway {
    /// `GET /v1/charges/{id}`, then every page of its refunds and of its
    /// disputes. `Ok(None)`: the provider does not know the id.
    pub(crate) async fn snapshot(&self, id: &str) -> Result<Option<ProviderCharge>, String> {
        let Some(body) = self.get_object(Kind::Charge, id).await? else {
            return Ok(None);
        };
        let value: Value = decode(&body).map_err(|e| format!("unreadable charge {id} {e}"))?;
        let operation_id = names(&value, "payments_charge_id")
            .map_err(|e| format!("unreadable charge {id}{e}"))?
            .map(str::to_owned);
        let object: wire::Object =
            decode_value(value).map_err(|e| format!("unreadable charge {id} {e}"))?;
        let missing = |field: &str| format!("the provider's charge {id} has no {field}");
        let refunds = self
            .of_charge("refunds", id, |value| {
                let operation_id = names(&value, "payments_refund_id")?.map(str::to_owned);
                let reason = value
                    .get("reason")
                    .and_then(Value::as_str)
                    .map(str::to_owned);
                let refund: wire::Object = decode_value(value)?;
                Ok(ProviderRefund {
                    amount_cents: refund.amount.ok_or(".amount: missing")?,
                    id: refund.id,
                    operation_id,
                    status: refund.status,
                    reason,
                    failure_reason: refund.failure_reason,
                })
            })
            .await?;
        let disputes = self
            .of_charge("disputes", id, |value| {
                let d: Dispute = decode_value(value)?;
                Ok(ProviderDispute {
                    id: d.id,
                    amount_cents: d.amount,
                    currency: d.currency.to_ascii_uppercase(),
                    status: d.status,
                    reason: d.reason.unwrap_or_else(|| "general".to_owned()),
                    refundable: d.is_charge_refundable,
                    evidence_due_by: d.evidence_details.and_then(|e| e.due_by),
                })
            })
            .await?;
        Ok(Some(ProviderCharge {
            amount_cents: object.amount.ok_or_else(|| missing("amount"))?,
            currency: object
                .currency
                .ok_or_else(|| missing("currency"))?
                .to_ascii_uppercase(),
            status: object.status,
            captured: object.captured.unwrap_or(false),
            amount_captured: object.amount_captured.unwrap_or(0),
            refunded: object.refunded.unwrap_or(false),
            id: object.id,
            operation_id,
            refunds,
            disputes,
        }))
    }

    /// Every object of the list `GET /v1/{path}?charge={charge}`, each read
    /// by `read`.
    async fn of_charge<T>(
        &self,
        path: &str,
        charge: &str,
        read: impl Fn(Value) -> Result<T, String>,
    ) -> Result<Vec<T>, String> {
        let url = format!("{}/v1/{path}", self.base_url);
        let what = format!("the {path} of {charge}");
        self.every_page(&url, &[("charge", charge)], &what, |v| read(v).map(Some))
            .await
    }
}
