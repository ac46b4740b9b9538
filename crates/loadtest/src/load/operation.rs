//! One logical charge under load: its key and body (fixed before the first
//! attempt, as in [`payments_client::Client::charge`]), single attempts
//! timed into a [`Stream`], the correct retry loop, and what the answers
//! said about it.
//!
//! The load generator does not call `Client::charge`: that loop hides every
//! attempt but the last, and a load report needs each attempt's status and
//! latency. It builds every request with the same [`Client`] (its URL, token,
//! connection pool) and backs off with the same [`RetryPolicy`].

use std::collections::BTreeSet;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use payments_client::client::{Answer, Client, Exchange, REQUEST_ABANDONED, exchange};
use payments_client::error::ClientError;
use payments_client::key::IdempotencyKey;
use payments_client::model::{
    ApiError, CaptureRequest, Charge, ChargeQuery, ChargeRequest, RefundRequest,
};
use payments_client::retry::RetryPolicy;
use serde::Deserialize;
use tokio::time::Instant;

use super::stream::{Stream, TransportError};
use super::{Mark, Marker};

/// What a read-only scenario reads.
#[derive(Debug, Clone)]
pub(crate) enum Read {
    /// A page of `GET /api/charges`.
    Page(Box<ChargeQuery>),
    /// `GET /healthz`: the server's answer with no work behind it.
    Health,
}

/// How many violation messages a report keeps (all are counted).
const KEPT_VIOLATIONS: usize = 20;

/// What one run shares with all its tasks.
#[derive(Debug)]
pub(crate) struct Run {
    /// `metadata.load_run` on every charge of this run.
    pub id: String,
    /// The customer's: charges and reads.
    pub client: Client,
    /// The back office's: refunds (or the customer's again) and captures.
    pub back_office: Client,
    /// No operation, attempt, retry or probe starts after this.
    pub deadline: Instant,
    /// How long attempts in flight at the deadline may still finish.
    pub drain: Duration,
    /// One attempt's timeout.
    pub timeout: Duration,
    pub retry: RetryPolicy,
    pub amount_cents: i64,
    /// [`super::Config::marker`].
    pub marker: Option<Marker>,
    pub violations: Violations,
}

/// One logical charge (or refund of `refund_of`): a key and the exact body
/// bytes every attempt sends.
#[derive(Debug, Clone)]
pub(crate) struct Operation {
    pub key: IdempotencyKey,
    pub body: Vec<u8>,
    pub refund_of: Option<String>,
}

/// What a single request got.
#[derive(Debug)]
pub(crate) enum Seen {
    Answer(Exchange),
    NoAnswer(TransportError),
}

/// What a `GET /api/charges/{id}` (or a capture's retry loop) got.
#[derive(Debug)]
pub(crate) enum Looked {
    Found(Box<Charge>),
    /// Any other final status (a 200 or 201 whose body is not a charge is
    /// reported as that status here too).
    Answered(u16),
    NoAnswer(TransportError),
}

/// The part of a charge the accounting needs.
#[derive(Debug, Deserialize)]
struct Named {
    id: String,
    gateway_charge_id: Option<String>,
}

/// What the answers said about one operation.
#[derive(Debug, Clone, Default)]
pub(crate) struct OpRecord {
    pub key: String,
    /// Every charge id a 201 for this key named (one, if all is well).
    pub charge_ids: BTreeSet<String>,
    /// Every provider charge id those 201s named.
    pub gateway_ids: BTreeSet<String>,
    /// 201s without `Idempotent-Replay: true`: each says "this request made
    /// the charge", so more than one is a double charge.
    pub originals: u32,
    /// The final answer's status; `None` while (or if) there was none.
    pub final_status: Option<u16>,
    /// The final answer's body, to compare replays with.
    pub final_body: Vec<u8>,
}

impl OpRecord {
    pub(crate) fn new(key: &IdempotencyKey) -> Self {
        Self {
            key: key.to_string(),
            ..Self::default()
        }
    }

    /// Ended with a 201.
    pub(crate) fn charged(&self) -> bool {
        self.final_status == Some(201)
    }

    /// Ended without any final answer (out of time, or cancelled).
    pub(crate) fn unfinished(&self) -> bool {
        self.final_status.is_none()
    }

    pub(crate) fn charged_twice(&self) -> bool {
        self.charge_ids.len() > 1 || self.gateway_ids.len() > 1 || self.originals > 1
    }

    /// Notes what a 201 names; a 201 that names no charge is a violation.
    pub(crate) fn observe(&mut self, answer: &Exchange, violations: &Violations) {
        if answer.status != 201 {
            return;
        }
        match serde_json::from_slice::<Named>(&answer.body) {
            Ok(named) => {
                self.charge_ids.insert(named.id);
                self.gateway_ids.extend(named.gateway_charge_id);
                self.originals += u32::from(!answer.replayed);
            }
            Err(e) => violations.push(format!(
                "key {}: a 201 whose body is not a charge ({e})",
                self.key
            )),
        }
    }

    /// Merges what other requests of the same key saw (a storm's).
    pub(crate) fn absorb(&mut self, other: OpRecord) {
        self.charge_ids.extend(other.charge_ids);
        self.gateway_ids.extend(other.gateway_ids);
        self.originals += other.originals;
    }
}

/// What broke the contract, as messages (the first few) and a count (all).
#[derive(Debug, Default)]
pub(crate) struct Violations {
    inner: Mutex<(Vec<String>, u64)>,
}

impl Violations {
    pub(crate) fn push(&self, message: String) {
        // Never held across an `.await`.
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.1 += 1;
        if inner.0.len() < KEPT_VIOLATIONS {
            inner.0.push(message);
        }
    }

    pub(crate) fn take(&self) -> (Vec<String>, u64) {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        std::mem::take(&mut *inner)
    }
}

impl Run {
    /// Gives `mark` to [`super::Config::marker`], if any.
    pub(crate) fn mark(&self, mark: Mark) {
        if let Some(Marker(marker)) = &self.marker {
            marker(mark);
        }
    }

    /// Until the deadline, new work may start.
    pub(crate) fn open(&self) -> bool {
        Instant::now() < self.deadline
    }

    /// A new operation: a fresh key and a body tagged with this run, the
    /// scenario (`label`) and the operation's index.
    pub(crate) fn operation(
        &self,
        label: &str,
        index: u64,
    ) -> Result<Operation, serde_json::Error> {
        self.charge(label, index, None)
    }

    /// [`Run::operation`] as a hold (`"capture": false`), to be captured.
    pub(crate) fn hold(&self, label: &str, index: u64) -> Result<Operation, serde_json::Error> {
        self.charge(label, index, Some(false))
    }

    fn charge(
        &self,
        label: &str,
        index: u64,
        capture: Option<bool>,
    ) -> Result<Operation, serde_json::Error> {
        let request = ChargeRequest {
            capture,
            ..ChargeRequest::new(self.amount_cents, "GBP", "tok_visa")
                .with_description(format!("payments-load {label}"))
                .with_metadata("load_run", self.id.clone())
                .with_metadata("load_op", format!("{label}-{index}"))
        };
        Ok(Operation {
            key: IdempotencyKey::generate(),
            body: serde_json::to_vec(&request)?,
            refund_of: None,
        })
    }

    /// A new refund of `amount_cents` of `charge_id`, under a fresh key.
    pub(crate) fn refund(
        &self,
        charge_id: &str,
        amount_cents: i64,
    ) -> Result<Operation, serde_json::Error> {
        let request = RefundRequest {
            amount_cents: Some(amount_cents),
            reason: Some("requested_by_customer".to_owned()),
            metadata: None,
        };
        Ok(Operation {
            key: IdempotencyKey::generate(),
            body: serde_json::to_vec(&request)?,
            refund_of: Some(charge_id.to_owned()),
        })
    }

    /// One read (a page of `GET /api/charges`, or `GET /healthz`), timed
    /// into `stream`.
    pub(crate) async fn read(&self, read: &Read, stream: &Stream) -> Seen {
        let request = match read {
            Read::Page(query) => self.client.list_charges_request(query, self.timeout),
            Read::Health => self.client.health_request(self.timeout),
        };
        self.timed(stream, exchange(request)).await
    }

    /// One `POST /api/charges` attempt of `op`, timed into `stream`. An
    /// attempt still running at the deadline plus the drain is cancelled.
    pub(crate) async fn send(&self, op: &Operation, stream: &Stream) -> Seen {
        let (key, body) = (Some(&op.key), op.body.clone());
        let request = match &op.refund_of {
            None => self.client.post_charge(key, body, self.timeout),
            Some(charge) => self
                .back_office
                .post_refund(charge, key, body, self.timeout),
        };
        self.timed(stream, exchange(request)).await
    }

    /// `GET /api/charges/{id}` through [`Client::get_charge`], timed into
    /// `stream`.
    pub(crate) async fn get(&self, id: &str, stream: &Stream) -> Looked {
        let get = async {
            Ok(match self.client.get_charge(id).await? {
                Some(charge) => Looked::Found(Box::new(charge)),
                None => Looked::Answered(404),
            })
        };
        self.called(stream, 200, get).await
    }

    /// Captures all of `charge_id` as the back office, under a fresh key,
    /// through the client's own retry loop ([`Client::capture_with_key`]):
    /// timed into `stream` as one request, from the first attempt to the
    /// final answer (the client hides the attempts before it). The client's
    /// loop does not know the run's deadline: it is cancelled at the
    /// deadline plus the drain, and may retry until then.
    pub(crate) async fn capture(&self, charge_id: &str, stream: &Stream) -> Looked {
        let (key, request) = (IdempotencyKey::generate(), CaptureRequest::default());
        let capture = async {
            let outcome = self
                .back_office
                .capture_with_key(&key, charge_id, &request)
                .await?;
            Ok(match outcome.answer {
                Answer::Done(charge) => Looked::Found(Box::new(charge)),
                Answer::Declined(_) => Looked::Answered(402),
            })
        };
        self.called(stream, 201, capture).await
    }

    /// Runs one client call to what it found (a charge, answered `found`)
    /// or its final status, timed into `stream`; still running at the
    /// deadline plus the drain, it is cancelled.
    async fn called(
        &self,
        stream: &Stream,
        found: u16,
        call: impl Future<Output = Result<Looked, ClientError>>,
    ) -> Looked {
        let started = Instant::now();
        let looked = match tokio::time::timeout_at(self.deadline + self.drain, call).await {
            Ok(Ok(looked)) => looked,
            Ok(Err(
                ClientError::Rejected { status, .. } | ClientError::Unexpected { status, .. },
            )) => Looked::Answered(status),
            Ok(Err(ClientError::Abandoned { .. })) => Looked::Answered(500),
            Ok(Err(ClientError::Transport(e))) => Looked::NoAnswer(TransportError::of(&e)),
            Ok(Err(_)) => Looked::NoAnswer(TransportError::Other),
            Err(_) => Looked::NoAnswer(TransportError::Cancelled),
        };
        match &looked {
            Looked::Found(_) => stream.answered(started, found, false),
            Looked::Answered(status) => stream.answered(started, *status, false),
            Looked::NoAnswer(error) => stream.failed(started, *error),
        }
        looked
    }

    async fn timed(
        &self,
        stream: &Stream,
        request: impl Future<Output = Result<Exchange, reqwest::Error>>,
    ) -> Seen {
        let started = Instant::now();
        let seen = match tokio::time::timeout_at(self.deadline + self.drain, request).await {
            Ok(Ok(answer)) => Seen::Answer(answer),
            Ok(Err(e)) => Seen::NoAnswer(TransportError::of(&e)),
            Err(_) => Seen::NoAnswer(TransportError::Cancelled),
        };
        match &seen {
            Seen::Answer(answer) => stream.answered(started, answer.status, answer.replayed),
            Seen::NoAnswer(error) => stream.failed(started, *error),
        }
        seen
    }

    /// The correct retry loop: the same key and bytes on every attempt,
    /// retrying timeouts, connection errors, 408/409/425/429 and 5xx (but
    /// not 500 `request_abandoned`) with capped exponential backoff, never
    /// sooner than `Retry-After`, until a final answer or the deadline.
    /// Every attempt is recorded in `stream`.
    pub(crate) async fn drive(&self, op: &Operation, stream: &Stream) -> OpRecord {
        let mut record = OpRecord::new(&op.key);
        let mut failed = 0u32;
        // The first attempt is always sent: the scenario started this
        // operation while the run was open, and an operation that sent
        // nothing would be counted unfinished. Retries stop at the deadline.
        let mut first = true;
        while std::mem::take(&mut first) || self.open() {
            let retry_after = match self.send(op, stream).await {
                Seen::Answer(answer) => {
                    record.observe(&answer, &self.violations);
                    if !retryable(&answer) {
                        record.final_status = Some(answer.status);
                        record.final_body = answer.body;
                        return record;
                    }
                    answer.retry_after
                }
                Seen::NoAnswer(TransportError::Cancelled) => return record,
                Seen::NoAnswer(_) => None,
            };
            failed = failed.saturating_add(1);
            let delay = self.retry.delay(failed, retry_after);
            if Instant::now() + delay >= self.deadline {
                break;
            }
            tokio::time::sleep(delay).await;
        }
        record
    }
}

fn retryable(answer: &Exchange) -> bool {
    match answer.status {
        408 | 409 | 425 | 429 => true,
        500 => ApiError::from_envelope(&answer.body).is_none_or(|e| e.code != REQUEST_ABANDONED),
        501..=599 => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: u16, body: &str, replayed: bool) -> Exchange {
        Exchange {
            status,
            replayed,
            retry_after: None,
            body: body.as_bytes().to_vec(),
        }
    }

    #[test]
    fn what_is_retried() {
        for status in [408, 409, 425, 429, 502, 503, 504] {
            assert!(retryable(&answer(status, "", false)), "{status}");
        }
        assert!(retryable(&answer(
            500,
            r#"{"error":{"code":"internal"}}"#,
            false
        )));
        assert!(!retryable(&answer(
            500,
            r#"{"error":{"code":"request_abandoned"}}"#,
            false
        )));
        for status in [201, 400, 401, 402, 404, 422] {
            assert!(!retryable(&answer(status, "", false)), "{status}");
        }
    }

    #[test]
    fn two_original_answers_or_two_ids_are_a_double_charge() {
        let violations = Violations::default();
        let charge = |id: &str, gw: &str| {
            format!(r#"{{"id":"{id}","gateway_charge_id":"{gw}","status":"succeeded"}}"#)
        };
        let mut record = OpRecord::default();
        record.observe(&answer(201, &charge("ch_1", "gw_1"), false), &violations);
        record.observe(&answer(201, &charge("ch_1", "gw_1"), true), &violations);
        record.observe(&answer(409, "{}", false), &violations);
        assert!(!record.charged_twice());

        let mut again = record.clone();
        again.observe(&answer(201, &charge("ch_1", "gw_1"), false), &violations);
        assert!(again.charged_twice(), "two non-replayed 201s");

        let mut other = record.clone();
        other.observe(&answer(201, &charge("ch_2", "gw_2"), true), &violations);
        assert!(other.charged_twice(), "two charge ids");

        record.observe(&answer(201, "not json", false), &violations);
        assert_eq!(violations.take().1, 1);
    }

    #[test]
    fn violations_keep_the_first_few_and_count_all() {
        let violations = Violations::default();
        for i in 0..50 {
            violations.push(format!("v{i}"));
        }
        let (kept, total) = violations.take();
        assert_eq!((kept.len(), total), (KEPT_VIOLATIONS, 50));
        assert_eq!(kept[0], "v0");
    }
}
