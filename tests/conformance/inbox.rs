//! The inbox (issue 29): provider events recorded in the transaction of
//! their effects. The same event delivered many times at once is applied
//! once (its id's unique index); many events about one change at once make
//! it once (each change is guarded by the state it was planned from, and
//! provider refund and dispute ids are unique); a dispute that forbids
//! refunds refuses them in the claim's transaction.

use std::sync::Arc;

use payments_domain::charge::{Charge, ChargeStatus};
use payments_domain::events::EventType;
use payments_domain::inbox::{self, Change, InboxState, Recorded};
use payments_domain::provider::{ProviderCharge, ProviderDispute, ProviderRefund};
use payments_domain::store::{Application, Applied, ClaimOutcome, Store};
use payments_tests::{Backend, backend_tests};
use serde_json::Value;

use super::{RACERS, TTL, claimed_refund, db, refund_claim, refund_finish, succeeded_charge};

/// The provider's view of `charge`: succeeded, captured, with `refunds`
/// and `disputes`.
fn at_provider(
    charge: &Charge,
    refunds: Vec<ProviderRefund>,
    disputes: Vec<ProviderDispute>,
) -> ProviderCharge {
    ProviderCharge {
        id: charge.gateway_charge_id.clone().unwrap(),
        operation_id: Some(charge.id.clone()),
        amount_cents: charge.amount_cents,
        currency: charge.currency.clone(),
        status: "succeeded".into(),
        captured: true,
        amount_captured: charge.amount_cents,
        refunded: false,
        refunds,
        disputes,
    }
}

fn dashboard_refund(id: &str, amount: i64, status: &str) -> ProviderRefund {
    ProviderRefund {
        id: id.into(),
        operation_id: None,
        amount_cents: amount,
        status: status.into(),
        reason: None,
        failure_reason: None,
    }
}

fn dispute(status: &str, refundable: bool) -> ProviderDispute {
    ProviderDispute {
        id: "dp_conformance".into(),
        amount_cents: 1000,
        currency: "GBP".into(),
        status: status.into(),
        reason: "fraudulent".into(),
        refundable,
        evidence_due_by: Some(1_900_000_000),
    }
}

/// The application of `event_id` planned from the local state now.
async fn planned(store: &Arc<dyn Store>, event_id: &str, provider: &ProviderCharge) -> Application {
    let local = store
        .inbox_local(provider.operation_id.as_deref().unwrap())
        .await
        .unwrap()
        .unwrap();
    let plan = inbox::plan(&local, provider);
    Application {
        record: Recorded {
            event_id: event_id.into(),
            event_type: "charge.refunded".into(),
            gateway_charge_id: Some(provider.id.clone()),
            state: plan.state(),
            detail: plan.detail(),
        },
        changes: plan.changes,
        keep_for: TTL,
    }
}

/// Applies each application on its own racer, all at once.
async fn race(db: &payments_tests::TestDb, applications: Vec<Application>) -> Vec<Applied> {
    let barrier = Arc::new(tokio::sync::Barrier::new(applications.len()));
    let tasks: Vec<_> = applications
        .into_iter()
        .enumerate()
        .map(|(i, application)| {
            let (store, barrier) = (db.racer(i), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                store.apply_provider_event(&application).await.unwrap()
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await.unwrap());
    }
    outcomes
}

fn count(outcomes: &[Applied], which: Applied) -> usize {
    outcomes.iter().filter(|o| **o == which).count()
}

/// The same event delivered `RACERS` times at once is applied once; then
/// `RACERS` different events that each announce the same dashboard refund,
/// planned from the same state, create it once: one applied, the rest
/// stale (nothing written), and planned again they change nothing.
async fn provider_events_apply_once_under_concurrent_deliveries(backend: Backend) {
    let Some(db) = db(backend).await else { return };
    let store = db.store();
    let charge = succeeded_charge(&store, "inbox-charge", 1000).await;
    let provider = at_provider(
        &charge,
        vec![dashboard_refund("re_dash_1", 300, "succeeded")],
        vec![],
    );

    let same = planned(&store, "evt_same", &provider).await;
    assert_eq!(same.changes.len(), 1, "{:?}", same.changes);
    let outcomes = race(&db, vec![same; RACERS]).await;
    assert_eq!(
        (
            count(&outcomes, Applied::Applied),
            count(&outcomes, Applied::Duplicate)
        ),
        (1, RACERS - 1),
        "{outcomes:?}"
    );
    let after = store.charge(&charge.id).await.unwrap().unwrap();
    assert_eq!(after.amount_refunded, 300);

    // A second dashboard refund, announced by many events at once.
    let provider = at_provider(
        &charge,
        vec![
            dashboard_refund("re_dash_1", 300, "succeeded"),
            dashboard_refund("re_dash_2", 200, "succeeded"),
        ],
        vec![],
    );
    let mut applications = Vec::new();
    for i in 0..RACERS {
        applications.push(planned(&store, &format!("evt_other_{i}"), &provider).await);
    }
    assert!(applications.iter().all(|a| a.changes.len() == 1));
    let outcomes = race(&db, applications).await;
    assert_eq!(
        (
            count(&outcomes, Applied::Applied),
            count(&outcomes, Applied::Stale)
        ),
        (1, RACERS - 1),
        "{outcomes:?}"
    );
    let after = store.charge(&charge.id).await.unwrap().unwrap();
    assert_eq!(
        after.amount_refunded, 500,
        "each provider refund counted once"
    );
    let local = store.inbox_local(&charge.id).await.unwrap().unwrap();
    assert_eq!(local.refunds.len(), 2);
    for refund in &local.refunds {
        assert_eq!(refund.requested_by.role.as_str(), "provider");
        assert_eq!(refund.status, ChargeStatus::Succeeded);
    }
    // Planned again, a stale one (whichever racer lost) changes nothing
    // and is recorded.
    let stale = outcomes
        .iter()
        .position(|o| *o == Applied::Stale)
        .map(|i| format!("evt_other_{i}"))
        .unwrap();
    let again = planned(&store, &stale, &provider).await;
    assert!(again.changes.is_empty());
    assert_eq!(
        store.apply_provider_event(&again).await.unwrap(),
        Applied::Applied
    );
    assert_eq!(
        store.provider_event(&stale).await.unwrap(),
        Some(InboxState::Applied)
    );
    let events = payments_tests::all_events(&store).await;
    let refund_events = events
        .iter()
        .filter(|e| e.event_type == "refund.succeeded")
        .count();
    assert_eq!(refund_events, 2, "one event per dashboard refund");
    assert_eq!(db.refunds_with_status("").await, 2);
}

/// A refund that failed after it succeeded gives its amount back once,
/// however many events announce it at once.
async fn a_refund_failing_later_gives_back_once(backend: Backend) {
    let Some(db) = db(backend).await else { return };
    let store = db.store();
    let charge = succeeded_charge(&store, "inbox-failed-later", 1000).await;
    let provider = at_provider(
        &charge,
        vec![dashboard_refund("re_late", 400, "succeeded")],
        vec![],
    );
    let made = planned(&store, "evt_made", &provider).await;
    assert_eq!(
        store.apply_provider_event(&made).await.unwrap(),
        Applied::Applied
    );
    let mut failed = dashboard_refund("re_late", 400, "failed");
    failed.failure_reason = Some("expired_or_canceled_card".into());
    let provider = at_provider(&charge, vec![failed], vec![]);
    let mut applications = Vec::new();
    for i in 0..RACERS {
        applications.push(planned(&store, &format!("evt_failed_{i}"), &provider).await);
    }
    assert!(
        matches!(
            applications[0].changes.as_slice(),
            [Change::RefundFailedLater { .. }]
        ),
        "{:?}",
        applications[0].changes
    );
    let outcomes = race(&db, applications).await;
    assert_eq!(count(&outcomes, Applied::Applied), 1, "{outcomes:?}");
    let after = store.charge(&charge.id).await.unwrap().unwrap();
    assert_eq!(after.amount_refunded, 0, "given back once");
    let local = store.inbox_local(&charge.id).await.unwrap().unwrap();
    assert_eq!(local.refunds[0].status, ChargeStatus::Failed);
    assert_eq!(
        local.refunds[0].failure_code.as_deref(),
        Some("expired_or_canceled_card")
    );
    // Its amount fits again: a refund of all of it is reserved.
    let c = refund_claim("after-failed-later", &after, Some(1000));
    assert!(matches!(
        store.claim(&c).await.unwrap(),
        ClaimOutcome::Claimed { .. }
    ));
}

/// A dispute is created once under racing events, followed through its
/// statuses, and while it forbids refunds a refund's claim is refused
/// (stored 400 `charge_disputed`); an inquiry, or a won dispute, does not
/// refuse them.
async fn disputes_are_kept_once_and_refuse_refunds_while_they_stand(backend: Backend) {
    let Some(db) = db(backend).await else { return };
    let store = db.store();
    let charge = succeeded_charge(&store, "inbox-disputed", 1000).await;
    let inquiry = at_provider(
        &charge,
        vec![],
        vec![dispute("warning_needs_response", true)],
    );
    let mut applications = Vec::new();
    for i in 0..RACERS {
        applications.push(planned(&store, &format!("evt_dispute_{i}"), &inquiry).await);
    }
    let outcomes = race(&db, applications).await;
    assert_eq!(count(&outcomes, Applied::Applied), 1, "{outcomes:?}");
    assert_eq!(store.disputes_of(&charge.id).await.unwrap().len(), 1);
    let c = refund_claim("refund-during-inquiry", &charge, Some(100));
    assert!(
        matches!(store.claim(&c).await.unwrap(), ClaimOutcome::Claimed { .. }),
        "an inquiry leaves the charge refundable"
    );

    let escalated = at_provider(&charge, vec![], vec![dispute("needs_response", false)]);
    let a = planned(&store, "evt_escalated", &escalated).await;
    assert_eq!(
        store.apply_provider_event(&a).await.unwrap(),
        Applied::Applied
    );
    let c = refund_claim("refund-during-dispute", &charge, Some(100));
    let ClaimOutcome::Refused(answer) = store.claim(&c).await.unwrap() else {
        panic!("a refund of a disputed charge must be refused");
    };
    let body: Value = serde_json::from_str(&answer.body).unwrap();
    assert_eq!(
        (answer.status, &body["error"]["code"]),
        (400, &Value::from("charge_disputed"))
    );

    let won = at_provider(&charge, vec![], vec![dispute("won", false)]);
    let a = planned(&store, "evt_won", &won).await;
    assert_eq!(
        store.apply_provider_event(&a).await.unwrap(),
        Applied::Applied
    );
    let stored = store.disputes_of(&charge.id).await.unwrap();
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].status, "won");
    let c = refund_claim("refund-after-won", &charge, Some(100));
    assert!(matches!(
        store.claim(&c).await.unwrap(),
        ClaimOutcome::Claimed { .. }
    ));

    // Listed: open ones by default (none now), every one with all.
    let page = payments_domain::list::parse_page(&[]).unwrap();
    assert!(store.list_disputes(&page, true).await.unwrap().is_empty());
    assert_eq!(store.list_disputes(&page, false).await.unwrap().len(), 1);
    // Events of one transaction share its time: compared as a set.
    let events = payments_tests::all_events(&store).await;
    let mut disputes: Vec<&str> = events
        .iter()
        .map(|e| e.event_type.as_str())
        .filter(|t| t.contains("dispute"))
        .collect();
    disputes.sort_unstable();
    let mut expected = [
        EventType::ChargeDisputeCreated.as_str(),
        EventType::ChargeDisputeFundsWithdrawn.as_str(),
        EventType::ChargeDisputeUpdated.as_str(),
        EventType::ChargeDisputeClosed.as_str(),
    ];
    expected.sort_unstable();
    assert_eq!(disputes, expected);
}

/// An event recorded waiting is applied again, once: a later application
/// records it; after that it is a duplicate.
async fn waiting_events_are_applied_again_once(backend: Backend) {
    let Some(db) = db(backend).await else { return };
    let store = db.store();
    let waiting = Application {
        record: Recorded {
            event_id: "evt_waiting".into(),
            event_type: "charge.succeeded".into(),
            gateway_charge_id: Some("ch_provider_waiting".into()),
            state: InboxState::Waiting,
            detail: Some("waiting: our charge has no row here yet".into()),
        },
        changes: Vec::new(),
        keep_for: TTL,
    };
    assert_eq!(
        store.apply_provider_event(&waiting).await.unwrap(),
        Applied::Applied
    );
    let listed = store.open_provider_events(10).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        listed[0].gateway_charge_id.as_deref(),
        Some("ch_provider_waiting")
    );
    let mut applied = waiting.clone();
    applied.record.state = InboxState::Applied;
    let outcomes = race(&db, vec![applied; RACERS]).await;
    assert_eq!(count(&outcomes, Applied::Applied), 1, "{outcomes:?}");
    assert_eq!(
        store.provider_event("evt_waiting").await.unwrap(),
        Some(InboxState::Applied)
    );
    assert!(store.open_provider_events(10).await.unwrap().is_empty());
    let counted = store.count_provider_events().await.unwrap();
    assert_eq!(counted, vec![(InboxState::Applied, 1)]);
}

/// The charge's `amount_reserved` and `amount_refunded`, as stored.
async fn reserved_refunded(db: &payments_tests::TestDb, id: &str) -> (i64, i64) {
    let reserved = db
        .count(
            "SELECT amount_reserved FROM charges WHERE id = ?",
            "SELECT amount_reserved FROM charges WHERE id = $1",
            &[id],
        )
        .await;
    let refunded = db
        .count(
            "SELECT amount_refunded FROM charges WHERE id = ?",
            "SELECT amount_refunded FROM charges WHERE id = $1",
            &[id],
        )
        .await;
    (reserved, refunded)
}

/// A dashboard refund that does not fit beside a refund of ours in flight
/// is not recorded (the charge cannot show more refunded than it took):
/// the event is left for a person, open, and counters stay; once ours
/// fails at the provider (there was no room) and gives back, the same
/// event applied again records the dashboard refund, once.
async fn a_dashboard_refund_beside_one_in_flight_waits_for_it(backend: Backend) {
    let Some(db) = db(backend).await else { return };
    let store = db.store();
    let charge = succeeded_charge(&store, "inbox-conflict", 1000).await;
    let c = refund_claim("ours-in-flight", &charge, Some(800));
    let (record_id, ours) = claimed_refund(store.claim(&c).await.unwrap());
    let provider = at_provider(
        &charge,
        vec![dashboard_refund("re_dash_conflict", 300, "succeeded")],
        vec![],
    );
    let conflict = planned(&store, "evt_conflict", &provider).await;
    assert!(conflict.changes.is_empty(), "{:?}", conflict.changes);
    assert_eq!(conflict.record.state, InboxState::NeedsPerson);
    assert_eq!(
        store.apply_provider_event(&conflict).await.unwrap(),
        Applied::Applied
    );
    assert_eq!(reserved_refunded(&db, &charge.id).await, (800, 0));
    let open = store.open_provider_events(10).await.unwrap();
    assert_eq!(open.len(), 1);
    assert!(open[0].detail.as_deref().unwrap().contains(&ours.id));

    let failed = refund_finish(record_id, &c, &ours, ChargeStatus::Failed);
    store.finish(&failed).await.unwrap();
    let again = planned(&store, "evt_conflict", &provider).await;
    assert_eq!(again.record.state, InboxState::Applied);
    assert_eq!(again.changes.len(), 1);
    let outcomes = race(&db, vec![again; RACERS]).await;
    assert_eq!(count(&outcomes, Applied::Applied), 1, "{outcomes:?}");
    assert_eq!(reserved_refunded(&db, &charge.id).await, (300, 300));
    assert_eq!(
        store.provider_event("evt_conflict").await.unwrap(),
        Some(InboxState::Applied)
    );
    assert!(store.open_provider_events(10).await.unwrap().is_empty());
}

/// Provider events done with (applied, ignored) are pruned once received
/// longer ago than the retention, by the database's clock; one waiting or
/// left for a person is kept however old, and so is a recent one.
async fn provider_events_done_with_are_pruned_after_the_retention(backend: Backend) {
    let Some(db) = db(backend).await else { return };
    let store = db.store();
    let record = |id: &str, state: InboxState| Application {
        record: Recorded {
            event_id: id.into(),
            event_type: "charge.updated".into(),
            gateway_charge_id: None,
            state,
            detail: None,
        },
        changes: vec![],
        keep_for: TTL,
    };
    let old = [
        ("evt_applied", InboxState::Applied),
        ("evt_ignored", InboxState::Ignored),
        ("evt_waiting", InboxState::Waiting),
        ("evt_person", InboxState::NeedsPerson),
    ];
    for (id, state) in old {
        assert_eq!(
            store
                .apply_provider_event(&record(id, state))
                .await
                .unwrap(),
            Applied::Applied
        );
    }
    let day = std::time::Duration::from_secs(86_400);
    db.age_outbox(2 * day).await;
    store
        .apply_provider_event(&record("evt_recent", InboxState::Applied))
        .await
        .unwrap();
    let pruned = store.prune_events(day, 100).await.unwrap();
    assert_eq!(pruned.provider_events, 2, "{pruned:?}");
    for (id, kept) in [
        ("evt_applied", None),
        ("evt_ignored", None),
        ("evt_waiting", Some(InboxState::Waiting)),
        ("evt_person", Some(InboxState::NeedsPerson)),
        ("evt_recent", Some(InboxState::Applied)),
    ] {
        assert_eq!(store.provider_event(id).await.unwrap(), kept, "{id}");
    }
    assert_eq!(
        store.prune_events(day, 100).await.unwrap().provider_events,
        0
    );
}

backend_tests!(
    all;
    provider_events_apply_once_under_concurrent_deliveries,
    a_refund_failing_later_gives_back_once,
    disputes_are_kept_once_and_refuse_refunds_while_they_stand,
    waiting_events_are_applied_again_once,
    provider_events_done_with_are_pruned_after_the_retention,
    a_dashboard_refund_beside_one_in_flight_waits_for_it,
);
