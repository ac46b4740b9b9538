//! The HTTP checks. Each sends raw single requests (no retry loop) so it
//! sees every status the server gives, and judges them against the contract.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use payments_client::client::{Answer, Client, Exchange, exchange};
use payments_client::error::{ClientError, error_chain};
use payments_client::key::IdempotencyKey;
use payments_client::model::{
    ApiError, CaptureRequest, ChargeQuery, ChargeRequest, ChargeStatus, RefundRequest,
};

use super::Config;
use super::report::{Check, CheckResult};

/// How long one request may wait out the server's rate limit in all.
const MOST_RATE_WAIT: Duration = Duration::from_secs(120);

/// One smoke run: its id, its client and its settings.
#[derive(Debug)]
pub(crate) struct Run {
    pub id: String,
    /// The customer's.
    pub client: Client,
    /// The back office's (refunds), or the customer's again.
    pub back_office: Client,
    pub config: Config,
    /// How long each check waited out 429 `rate_limited` answers.
    pub waited: Mutex<BTreeMap<Check, Duration>>,
}

impl Run {
    /// A charge body tagged with this run and `check`.
    fn request(&self, check: Check) -> ChargeRequest {
        ChargeRequest::new(
            self.config.amount_cents,
            self.config.currency.clone(),
            self.config.card_token.clone(),
        )
        .with_description(format!("payments-smoke {check}"))
        .with_metadata("smoke_run", self.id.clone())
        .with_metadata("smoke_check", check.name())
    }

    /// One `POST /api/charges` for `check`, answered or described as a
    /// failure. A 429 `rate_limited` is waited out (its `Retry-After`, for
    /// at most [`MOST_RATE_WAIT`] in all) and the request sent again: the
    /// server stored nothing for it, and the smoke is a customer like any
    /// other, under the server's per-customer rate. The wait is noted.
    async fn post(
        &self,
        check: Check,
        key: Option<&IdempotencyKey>,
        request: &ChargeRequest,
    ) -> Result<Exchange, String> {
        let mut waited = Duration::ZERO;
        loop {
            let answer = self.post_once(key, request).await?;
            match rate_limited(&[&answer]) {
                Some(wait) if self.wait_out(check, wait, &mut waited).await => {}
                _ => return Ok(answer),
            }
        }
    }

    /// One `POST /api/charges`, whatever it answers.
    async fn post_once(
        &self,
        key: Option<&IdempotencyKey>,
        request: &ChargeRequest,
    ) -> Result<Exchange, String> {
        let body = serde_json::to_vec(request).map_err(|e| e.to_string())?;
        exchange(self.client.post_charge(key, body, self.config.timeout))
            .await
            .map_err(|e| error_chain(&e))
    }

    /// Sleeps `wait` for `check` and notes it, unless `waited` would then
    /// exceed [`MOST_RATE_WAIT`] (false: give up).
    async fn wait_out(&self, check: Check, wait: Duration, waited: &mut Duration) -> bool {
        if *waited + wait > MOST_RATE_WAIT {
            return false;
        }
        tokio::time::sleep(wait).await;
        *waited += wait;
        if let Ok(mut all) = self.waited.lock() {
            *all.entry(check).or_default() += wait;
        }
        true
    }

    /// `result`, with a note of the time its check waited out the rate
    /// limit, if it did.
    pub(crate) fn noted(&self, result: CheckResult) -> CheckResult {
        let waited = self
            .waited
            .lock()
            .ok()
            .and_then(|all| all.get(&result.name).copied());
        match waited {
            Some(wait) if result.note.is_none() => result.with_note(format!(
                "waited {} s for the server's per-customer rate limit (429 rate_limited, which \
                 stores nothing; RATE_LIMIT_PER_MINUTE)",
                wait.as_secs()
            )),
            _ => result,
        }
    }
}

/// The longest `Retry-After` among `answers` that are 429 `rate_limited`
/// (1 s if one has none), or `None` if none is.
fn rate_limited(answers: &[&Exchange]) -> Option<Duration> {
    answers
        .iter()
        .filter(|a| a.status == 429 && ApiError::from_response(429, &a.body).code == "rate_limited")
        .map(|a| a.retry_after.unwrap_or(Duration::from_secs(1)))
        .max()
}

/// A check's verdict and the charges its answers named.
#[derive(Debug)]
pub(crate) struct Checked {
    pub result: CheckResult,
    pub charge_ids: Vec<String>,
}

/// `sequential_replay` also hands its completed key to `key_reuse_other_body`.
#[derive(Debug)]
pub(crate) struct SequentialChecked {
    pub result: CheckResult,
    pub charge_ids: Vec<String>,
    pub completed: Option<(IdempotencyKey, ChargeRequest)>,
}

/// Two concurrent requests with one key: exactly one of them makes the
/// charge; the other is 409 (and its retry replays the charge) or a replay.
/// A server that charges every request answers 201 + 201, neither a replay,
/// with two charge ids: the original incident.
pub(crate) async fn concurrent_same_key(run: &Run) -> Checked {
    let check = Check::ConcurrentSameKey;
    let key = IdempotencyKey::generate();
    let request = run.request(check);
    // A pair that made nothing because the customer was over its rate
    // (429, and 409 for a claim the 429 then undid) is sent again after
    // the wait: neither stored anything.
    let mut waited = Duration::ZERO;
    let (a, b) = loop {
        let (a, b) = tokio::join!(
            run.post_once(Some(&key), &request),
            run.post_once(Some(&key), &request)
        );
        let (a, b) = match (a, b) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(e), _) | (_, Err(e)) => {
                return Checked {
                    result: CheckResult::fail(check, format!("a request failed: {e}")),
                    charge_ids: Vec::new(),
                };
            }
        };
        let made = is_fresh_charge(&a) || is_fresh_charge(&b);
        match rate_limited(&[&a, &b]) {
            Some(wait) if !made && run.wait_out(check, wait, &mut waited).await => {}
            _ => break (a, b),
        }
    };
    let mut charge_ids: Vec<String> = [&a, &b].into_iter().filter_map(charge_id).collect();
    charge_ids.dedup();
    let pair = format!("{} + {}", describe(&a), describe(&b));
    // `first` made the charge, if either did.
    let (first, second) = if is_fresh_charge(&b) && !is_fresh_charge(&a) {
        (b, a)
    } else {
        (a, b)
    };
    let result = match (is_fresh_charge(&first), charge_id(&first)) {
        (true, Some(id)) => judge_second(run, &key, &request, &pair, &id, &second).await,
        _ => CheckResult::fail(
            check,
            format!("{pair}: expected one 201 that makes the charge"),
        ),
    };
    Checked { result, charge_ids }
}

async fn judge_second(
    run: &Run,
    key: &IdempotencyKey,
    request: &ChargeRequest,
    pair: &str,
    id: &str,
    second: &Exchange,
) -> CheckResult {
    let check = Check::ConcurrentSameKey;
    let fail = |why: String| CheckResult::fail(check, format!("{pair}: {why}"));
    match second.status {
        201 => match charge_id(second) {
            Some(other) if other != id => fail(format!(
                "two charges for one key ({id} and {other}){}: the server is not idempotent",
                if second.replayed {
                    ""
                } else {
                    ", neither a replay"
                }
            )),
            Some(_) if !second.replayed => {
                fail("the second 201 lacks Idempotent-Replay: true".to_owned())
            }
            Some(_) => CheckResult::pass(
                check,
                format!("{pair}: one charge, the second answer a replay of it"),
            ),
            None => fail("the second 201 names no charge".to_owned()),
        },
        409 | 429 => {
            let code = ApiError::from_response(second.status, &second.body).code;
            let expected = if second.status == 409 {
                "request_in_progress"
            } else {
                "rate_limited"
            };
            if code != expected {
                return fail(format!(
                    "{} with code {code}, expected {expected}",
                    second.status
                ));
            }
            // The loser was told to wait (its key in flight, or, when the
            // two raced a rate limit's refill, over the rate with nothing
            // stored): its retry with the same key must get the winner's
            // stored answer.
            match run.client.charge_with_key(key, request).await {
                Ok(outcome) => match &outcome.answer {
                    Answer::Done(charge) if charge.id == id && outcome.replayed => {
                        CheckResult::pass(
                            check,
                            format!(
                                "{pair}; the retry with the same key replayed {id} \
                                 (after {} attempt(s))",
                                outcome.attempts
                            ),
                        )
                    }
                    Answer::Done(charge) if charge.id != id => fail(format!(
                        "the 409's retry got another charge, {}: charged twice",
                        charge.id
                    )),
                    Answer::Done(_) => fail(
                        "the 409's retry got the charge without Idempotent-Replay: true".to_owned(),
                    ),
                    Answer::Declined(e) => {
                        fail(format!("the 409's retry was declined: {}", e.code))
                    }
                },
                Err(e) => fail(format!("the 409's retry failed: {e}")),
            }
        }
        _ => fail("expected 201 + 409, or 201 + a replayed 201".to_owned()),
    }
}

/// A completed key, retried sequentially: the stored 201 again, byte for
/// byte, marked as a replay.
pub(crate) async fn sequential_replay(run: &Run) -> SequentialChecked {
    let check = Check::SequentialReplay;
    let key = IdempotencyKey::generate();
    let request = run.request(check);
    let outcome = |result, charge_ids, completed| SequentialChecked {
        result,
        charge_ids,
        completed,
    };
    let first = match run.post(check, Some(&key), &request).await {
        Ok(first) => first,
        Err(e) => {
            let result = CheckResult::fail(check, format!("the first request failed: {e}"));
            return outcome(result, Vec::new(), None);
        }
    };
    let Some(first_id) = charge_id(&first).filter(|_| is_fresh_charge(&first)) else {
        let result = CheckResult::fail(
            check,
            format!(
                "the first request answered {}, expected 201",
                describe(&first)
            ),
        );
        return outcome(result, Vec::new(), None);
    };
    let mut charge_ids = vec![first_id.clone()];
    let completed = Some((key.clone(), request.clone()));
    let second = match run.post(check, Some(&key), &request).await {
        Ok(second) => second,
        Err(e) => {
            let result = CheckResult::fail(check, format!("the retry failed: {e}"));
            return outcome(result, charge_ids, completed);
        }
    };
    if let Some(id) = charge_id(&second).filter(|id| *id != first_id) {
        charge_ids.push(id);
    }
    let mut problems = Vec::new();
    if second.status != 201 {
        problems.push(format!("the retry answered {}", describe(&second)));
    } else {
        if !second.replayed {
            problems.push("no Idempotent-Replay: true".to_owned());
        }
        if second.body != first.body {
            problems.push(match charge_id(&second) {
                Some(id) if id != first_id => {
                    format!("another charge ({first_id} then {id}): charged twice")
                }
                _ => "the body differs from the first answer".to_owned(),
            });
        }
    }
    let result = if problems.is_empty() {
        CheckResult::pass(
            check,
            format!("201 then 201 replay of {first_id}, byte-identical body"),
        )
    } else {
        CheckResult::fail(check, problems.join("; "))
    };
    outcome(result, charge_ids, completed)
}

/// The completed key of `sequential_replay` (or a fresh one, completed
/// here) with another amount: 422, never the first answer, never a charge.
pub(crate) async fn key_reuse_other_body(
    run: &Run,
    completed: Option<(IdempotencyKey, ChargeRequest)>,
) -> CheckResult {
    let check = Check::KeyReuseOtherBody;
    let (key, request) = match completed {
        Some(done) => done,
        None => {
            let key = IdempotencyKey::generate();
            let request = run.request(check);
            match run.post(check, Some(&key), &request).await {
                Ok(first) if is_fresh_charge(&first) => {}
                Ok(first) => {
                    return CheckResult::fail(
                        check,
                        format!("could not complete a first charge: {}", describe(&first)),
                    );
                }
                Err(e) => {
                    return CheckResult::fail(check, format!("the first request failed: {e}"));
                }
            }
            (key, request)
        }
    };
    let other = ChargeRequest {
        amount_cents: request.amount_cents + 1,
        ..request
    };
    match run.post(check, Some(&key), &other).await {
        Err(e) => CheckResult::fail(check, format!("the request failed: {e}")),
        Ok(answer) => {
            let code = ApiError::from_response(answer.status, &answer.body).code;
            match answer.status {
                422 if code == "idempotency_key_reused" => {
                    CheckResult::pass(check, "422 idempotency_key_reused")
                }
                201 if answer.replayed => CheckResult::fail(
                    check,
                    "201 replay: the first request's answer for a different amount, so the \
                     caller would believe a charge happened that did not",
                ),
                201 => CheckResult::fail(
                    check,
                    format!(
                        "{}: the server charged another amount under a used key",
                        describe(&answer)
                    ),
                ),
                _ => CheckResult::fail(
                    check,
                    format!("{}, expected 422 idempotency_key_reused", describe(&answer)),
                ),
            }
        }
    }
}

/// No key: 400 `idempotency_key_missing`, or a 201 from a server in the
/// `optional` rollout mode (a pass with a note, unless keys are required).
pub(crate) async fn missing_key(run: &Run) -> CheckResult {
    let check = Check::MissingKey;
    let request = run.request(check);
    match run.post(check, None, &request).await {
        Err(e) => CheckResult::fail(check, format!("the request failed: {e}")),
        Ok(answer) => {
            let code = ApiError::from_response(answer.status, &answer.body).code;
            match answer.status {
                400 if code == "idempotency_key_missing" => {
                    CheckResult::pass(check, "400 idempotency_key_missing: keys are required")
                }
                201 if run.config.require_key => CheckResult::fail(
                    check,
                    "201 without a key: the server is in `optional` rollout mode and charged \
                     without protection (--require-key)",
                ),
                201 => CheckResult::pass(
                    check,
                    "201 without a key: the server is in `optional` rollout mode",
                )
                .with_note(
                    "keyless charges are served without protection; set \
                     IDEMPOTENCY_KEY_MODE=required and smoke with --require-key once no \
                     client sends requests without a key",
                ),
                _ => CheckResult::fail(
                    check,
                    format!(
                        "{}, expected 400 idempotency_key_missing",
                        describe(&answer)
                    ),
                ),
            }
        }
    }
}

/// A 201 that is not a replay: this request made the charge.
fn is_fresh_charge(exchange: &Exchange) -> bool {
    exchange.status == 201 && !exchange.replayed
}

/// The `id` of a 201's charge. Read loosely (any JSON object with an `id`)
/// so a server with a different charge shape is still judged on idempotency.
fn charge_id(exchange: &Exchange) -> Option<String> {
    if exchange.status != 201 {
        return None;
    }
    let body: serde_json::Value = serde_json::from_slice(&exchange.body).ok()?;
    body.get("id")?.as_str().map(str::to_owned)
}

/// `201 (ch_1)`, `201 replay (ch_1)`, `409 request_in_progress`.
fn describe(exchange: &Exchange) -> String {
    match exchange.status {
        201 => format!(
            "201{} ({})",
            if exchange.replayed { " replay" } else { "" },
            charge_id(exchange).unwrap_or_else(|| "no charge id".to_owned())
        ),
        status => format!(
            "{status} {}",
            ApiError::from_response(status, &exchange.body).code
        ),
    }
}

/// A charge (`sequential_replay`'s, read by replaying its key, so the run
/// starts no more operations than it must; or a new one if that check made
/// none), then two concurrent refunds of half of it under one key (each
/// through the client's retry loop): both end with the same refund, and
/// the charge counts exactly that much refunded. Then the charge's key
/// finds it in `GET /api/charges`.
pub(crate) async fn refund_once_and_find(
    run: &Run,
    completed: Option<(IdempotencyKey, ChargeRequest)>,
) -> [CheckResult; 2] {
    let (refund, list) = (Check::RefundOnce, Check::ListFindsCharge);
    let (key, request) =
        completed.unwrap_or_else(|| (IdempotencyKey::generate(), run.request(refund)));
    let charge = match run.client.charge_with_key(&key, &request).await {
        Ok(outcome) => match outcome.answer {
            Answer::Done(charge) => charge,
            Answer::Declined(e) => {
                let why = format!("the charge to refund was declined: {}", e.code);
                return [
                    CheckResult::fail(refund, why.clone()),
                    CheckResult::fail(list, why),
                ];
            }
        },
        Err(e) => {
            let why = format!("the charge to refund failed: {e}");
            return [
                CheckResult::fail(refund, why.clone()),
                CheckResult::fail(list, why),
            ];
        }
    };
    let half = RefundRequest {
        amount_cents: Some((charge.amount_cents / 2).max(1)),
        reason: Some("requested_by_customer".to_owned()),
        metadata: None,
    };
    let refund_key = IdempotencyKey::generate();
    let (a, b) = tokio::join!(
        run.back_office
            .refund_with_key(&refund_key, &charge.id, &half),
        run.back_office
            .refund_with_key(&refund_key, &charge.id, &half)
    );
    let refunded = match both(refund, ("refund", "refunds:write"), a, b) {
        Err(failed) => failed,
        Ok((a, b)) => match (a.done(), b.done()) {
            (Some(x), Some(y)) if x.id == y.id => {
                let read = run.client.get_charge(&charge.id).await;
                match read {
                    Ok(Some(c)) if Some(c.amount_refunded) == half.amount_cents => {
                        CheckResult::pass(
                            refund,
                            format!("one refund {} of {}", x.id, c.amount_refunded),
                        )
                    }
                    other => CheckResult::fail(
                        refund,
                        format!(
                            "the charge reads {other:?} after one refund of {:?}",
                            half.amount_cents
                        ),
                    ),
                }
            }
            (x, y) => CheckResult::fail(
                refund,
                format!("two refunds or none under one key: {x:?} / {y:?}"),
            ),
        },
    };
    let query = ChargeQuery {
        idempotency_key: Some(key.as_str().to_owned()),
        ..ChargeQuery::default()
    };
    let found = match run.client.list_charges(&query).await {
        Ok(page) if page.data.len() == 1 && page.data[0].id == charge.id => {
            CheckResult::pass(list, format!("its key finds {}", charge.id))
        }
        Ok(page) => {
            let ids: Vec<&str> = page.data.iter().map(|c| c.id.as_str()).collect();
            CheckResult::fail(list, format!("its key finds {ids:?}, not {}", charge.id))
        }
        Err(e) => CheckResult::fail(list, format!("the list failed: {e}")),
    };
    [refunded, found]
}

/// A hold authorized by the customer, then two concurrent captures of half
/// of it under one key by the back office (each through the client's retry
/// loop): both end with the same capture, and the charge reads captured
/// once, the rest released. A new hold each run: a smoke run is safe to
/// repeat.
pub(crate) async fn authorize_capture(run: &Run) -> CheckResult {
    let check = Check::AuthorizeCapture;
    let hold = match run.client.authorize(&run.request(check)).await {
        Ok(outcome) => match outcome.answer {
            Answer::Done(hold) if hold.status == ChargeStatus::RequiresCapture => hold,
            Answer::Done(other) => {
                return CheckResult::fail(
                    check,
                    format!(
                        "the hold was answered {:?}, not requires_capture",
                        other.status
                    ),
                );
            }
            Answer::Declined(e) => {
                return CheckResult::fail(check, format!("the hold was declined: {}", e.code));
            }
        },
        Err(e) => return CheckResult::fail(check, format!("the authorization failed: {e}")),
    };
    let half = CaptureRequest {
        amount_cents: Some((hold.amount_cents / 2).max(1)),
    };
    let key = IdempotencyKey::generate();
    let (a, b) = tokio::join!(
        run.back_office.capture_with_key(&key, &hold.id, &half),
        run.back_office.capture_with_key(&key, &hold.id, &half)
    );
    match both(check, ("capture", "charges:capture"), a, b) {
        Err(failed) => failed,
        Ok((a, b)) => match (a.done(), b.done()) {
            (Some(x), Some(y)) if x == y && x.status == ChargeStatus::Succeeded => {
                match run.client.get_charge(&hold.id).await {
                    Ok(Some(c)) if Some(c.amount_captured) == half.amount_cents => {
                        CheckResult::pass(
                            check,
                            format!(
                                "{} captured once: {} of {}, {} released",
                                c.id, c.amount_captured, c.amount_cents, c.amount_released
                            ),
                        )
                    }
                    other => CheckResult::fail(
                        check,
                        format!("the hold reads {other:?} after one capture of {half:?}"),
                    ),
                }
            }
            (x, y) => CheckResult::fail(
                check,
                format!("two captures or none under one key: {x:?} / {y:?}"),
            ),
        },
    }
}

/// Two concurrent back-office operations' results, both answered, or the
/// check's failure: a 403 says which scope the back-office token lacks
/// (`what` and `scope`: `refund`, `refunds:write`), any other error what
/// it was.
fn both<T>(
    check: Check,
    (what, scope): (&str, &str),
    a: Result<T, ClientError>,
    b: Result<T, ClientError>,
) -> Result<(T, T), CheckResult> {
    match (a, b) {
        (Ok(a), Ok(b)) => Ok((a, b)),
        (Err(ClientError::Rejected { status: 403, .. }), _)
        | (_, Err(ClientError::Rejected { status: 403, .. })) => Err(CheckResult::fail(
            check,
            format!(
                "the token cannot {what} (403 insufficient_scope): {what}s are the back \
                 office's; pass --back-office-token with a token that has {scope}"
            ),
        )),
        (Err(e), _) | (_, Err(e)) => Err(CheckResult::fail(check, format!("a {what} failed: {e}"))),
    }
}
