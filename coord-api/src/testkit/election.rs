//! Cases for elections: key layout, queue order, resign, proclaim, cancellation, a candidate
//! whose lease dies, observe.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use tokio::task::JoinHandle;

use super::{eventually, within, Ctx, PROMPT};
use crate::{
    candidate_key, DynKvLeaseStore, Error, KvLeaseStore, KvLeaseStoreExt, LeaderKey, LeaseId,
    PutRequest, Result, TxnRequest,
};

async fn lease(cx: &Ctx) -> LeaseId {
    cx.store().grant(cx.long_ttl()).await.unwrap().id
}

/// Spawns a campaign and waits until its key is queued, so queue order is the spawn order.
async fn queue(
    cx: &Ctx,
    name: &str,
    value: &'static str,
) -> (LeaseId, JoinHandle<Result<LeaderKey>>) {
    let id = lease(cx).await;
    let store: Arc<DynKvLeaseStore> = cx.store().clone();
    let n = name.to_owned();
    let task = tokio::spawn(async move { store.campaign(&n, Bytes::from(value), id).await });
    let key = candidate_key(name, id);
    eventually(PROMPT, "the candidate key to be queued", || async {
        cx.store().get_key(key.clone()).await.unwrap().is_some()
    })
    .await;
    (id, task)
}

/// Waits briefly and asserts a campaign is still waiting.
async fn assert_waiting(task: &JoinHandle<Result<LeaderKey>>) {
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!task.is_finished(), "campaign should still be waiting");
}

/// An uncontested campaign wins at once, with etcd's key layout `name/<lease hex>` and the
/// key's create revision as its token.
pub async fn election_uncontested_campaign_wins(cx: Ctx) {
    let s = cx.store();
    let name = cx.key("e");
    let id = lease(&cx).await;
    let leader = within(PROMPT, "campaign", s.campaign(&name, Bytes::from("a"), id))
        .await
        .unwrap();
    assert_eq!(leader.name, name);
    assert_eq!(leader.key, format!("{name}/{:x}", id.0).as_bytes());
    assert_eq!(leader.lease, id);
    let kv = s.get_key(leader.key.to_vec()).await.unwrap().unwrap();
    assert_eq!(kv.create_revision, leader.token);
    assert_eq!(kv.lease, id);
    let current = s.leader(&name).await.unwrap();
    assert_eq!(current.key, leader.key);
    assert_eq!(current.value, "a".as_bytes());
    s.revoke(id).await.unwrap();
}

/// With no candidate, `leader` is `NoLeader`.
pub async fn election_leader_without_candidates_is_no_leader(cx: Ctx) {
    let err = cx.store().leader(&cx.key("e")).await.unwrap_err();
    assert!(matches!(err, Error::NoLeader { .. }), "{err:?}");
}

/// Candidates lead in the order they queued; each resign hands over to the next, and the
/// fencing tokens grow.
pub async fn election_queue_order_is_creation_order(cx: Ctx) {
    let s = cx.store();
    let name = cx.key("e");
    let a_id = lease(&cx).await;
    let a = s.campaign(&name, Bytes::from("a"), a_id).await.unwrap();
    let (_, b) = queue(&cx, &name, "b").await;
    let (_, c) = queue(&cx, &name, "c").await;
    assert_waiting(&b).await;
    assert_eq!(s.leader(&name).await.unwrap().value, "a".as_bytes());
    s.resign(&a).await.unwrap();
    let b = within(PROMPT, "b to win", b).await.unwrap().unwrap();
    assert!(b.token > a.token);
    assert_eq!(s.leader(&name).await.unwrap().value, "b".as_bytes());
    assert_waiting(&c).await;
    s.resign(&b).await.unwrap();
    let c = within(PROMPT, "c to win", c).await.unwrap().unwrap();
    assert!(c.token > b.token);
    s.resign(&c).await.unwrap();
}

/// Resigning twice, or after the key is gone, is `Ok` and deletes nothing else.
pub async fn election_resign_is_idempotent(cx: Ctx) {
    let s = cx.store();
    let name = cx.key("e");
    let id = lease(&cx).await;
    let leader = s.campaign(&name, Bytes::from("a"), id).await.unwrap();
    s.resign(&leader).await.unwrap();
    s.resign(&leader).await.unwrap();
    assert!(matches!(s.leader(&name).await, Err(Error::NoLeader { .. })));
    // A newer incarnation of the same key must survive a stale resign.
    let again = s.campaign(&name, Bytes::from("b"), id).await.unwrap();
    assert!(again.token > leader.token);
    s.resign(&leader).await.unwrap();
    assert_eq!(s.leader(&name).await.unwrap().value, "b".as_bytes());
    s.revoke(id).await.unwrap();
}

/// A leader's proclaim replaces its value and keeps its key and token.
pub async fn election_proclaim_updates_value(cx: Ctx) {
    let s = cx.store();
    let name = cx.key("e");
    let id = lease(&cx).await;
    let leader = s.campaign(&name, Bytes::from("v1"), id).await.unwrap();
    s.proclaim(&leader, Bytes::from("v2")).await.unwrap();
    let kv = s.leader(&name).await.unwrap();
    assert_eq!(kv.value, "v2".as_bytes());
    assert_eq!(kv.create_revision, leader.token);
    assert_eq!(kv.lease, id);
    assert_eq!(kv.version, 2);
    s.revoke(id).await.unwrap();
}

/// Proclaiming with a key that no longer leads (resigned, or never was) is `NotLeader`, and
/// writes nothing.
pub async fn election_proclaim_by_non_leader_fails(cx: Ctx) {
    let s = cx.store();
    let name = cx.key("e");
    let id = lease(&cx).await;
    let leader = s.campaign(&name, Bytes::from("v1"), id).await.unwrap();
    let forged = LeaderKey {
        token: leader.token + 1,
        ..leader.clone()
    };
    let err = s.proclaim(&forged, Bytes::from("x")).await.unwrap_err();
    assert!(matches!(err, Error::NotLeader { .. }), "{err:?}");
    s.resign(&leader).await.unwrap();
    let err = s.proclaim(&leader, Bytes::from("x")).await.unwrap_err();
    assert!(matches!(err, Error::NotLeader { .. }), "{err:?}");
    assert_eq!(s.get_key(leader.key.to_vec()).await.unwrap(), None);
    s.revoke(id).await.unwrap();
}

/// A campaign dropped while waiting (here by a timeout) leaves no key behind.
pub async fn election_cancelled_campaign_leaves_no_key(cx: Ctx) {
    let s = cx.store();
    let name = cx.key("e");
    let a_id = lease(&cx).await;
    let _a = s.campaign(&name, Bytes::from("a"), a_id).await.unwrap();
    let b_id = lease(&cx).await;
    let waited = tokio::time::timeout(
        Duration::from_millis(500),
        s.campaign(&name, Bytes::from("b"), b_id),
    )
    .await;
    assert!(waited.is_err(), "the campaign should have been waiting");
    let b_key = candidate_key(&name, b_id);
    eventually(
        PROMPT,
        "the cancelled candidate's key to be deleted",
        || async { s.get_key(b_key.clone()).await.unwrap().is_none() },
    )
    .await;
    assert_eq!(s.get_prefix(format!("{name}/")).await.unwrap().count, 1);
    s.revoke(a_id).await.unwrap();
    s.revoke(b_id).await.unwrap();
}

/// A waiting candidate whose own lease dies gets `CandidacyLost`, never a leadership, even
/// when the leader goes away right after (the etcd 3.4 phantom-leadership sequence).
pub async fn election_candidate_lease_death_is_an_error(cx: Ctx) {
    let s = cx.store();
    let name = cx.key("e");
    let a_id = lease(&cx).await;
    let a = s.campaign(&name, Bytes::from("a"), a_id).await.unwrap();
    let (b_id, b) = queue(&cx, &name, "b").await;
    s.revoke(b_id).await.unwrap();
    s.resign(&a).await.unwrap();
    let res = within(PROMPT, "the campaign to fail", b).await.unwrap();
    match res {
        Err(Error::CandidacyLost { lease, .. }) => assert_eq!(lease, b_id),
        other => panic!("expected CandidacyLost, got {other:?}"),
    }
    assert!(matches!(s.leader(&name).await, Err(Error::NoLeader { .. })));
    s.revoke(a_id).await.unwrap();
}

/// Campaigning with a lease that is already gone is `LeaseNotFound` and queues nothing.
pub async fn election_campaign_with_dead_lease_fails(cx: Ctx) {
    let s = cx.store();
    let name = cx.key("e");
    let id = lease(&cx).await;
    s.revoke(id).await.unwrap();
    let err = s.campaign(&name, Bytes::from("a"), id).await.unwrap_err();
    assert!(
        matches!(err, Error::LeaseNotFound { lease } if lease == id),
        "{err:?}"
    );
    assert_eq!(s.get_prefix(format!("{name}/")).await.unwrap().count, 0);
}

/// When the leader's lease expires, the next candidate wins within the expiry bound.
pub async fn election_leader_expiry_hands_over(cx: Ctx) {
    let s = cx.store();
    let name = cx.key("e");
    let ttl = cx.short_ttl();
    let a_id = s.grant(ttl).await.unwrap().id;
    let a = s.campaign(&name, Bytes::from("a"), a_id).await.unwrap();
    let (b_id, b) = queue(&cx, &name, "b").await;
    let b = within(
        cx.expiry_bound(ttl) + PROMPT,
        "b to win after a's expiry",
        b,
    )
    .await
    .unwrap()
    .unwrap();
    assert!(b.token > a.token);
    assert_eq!(b.lease, b_id);
    s.revoke(b_id).await.unwrap();
}

/// Campaigning again with the same lease rejoins at the same place and updates the value.
pub async fn election_recampaign_with_same_lease_rejoins(cx: Ctx) {
    let s = cx.store();
    let name = cx.key("e");
    let id = lease(&cx).await;
    let first = s.campaign(&name, Bytes::from("a"), id).await.unwrap();
    let second = s.campaign(&name, Bytes::from("b"), id).await.unwrap();
    assert_eq!(first, second);
    assert_eq!(s.leader(&name).await.unwrap().value, "b".as_bytes());
    assert_eq!(s.get_prefix(format!("{name}/")).await.unwrap().count, 1);
    s.revoke(id).await.unwrap();
}

/// Malformed election names are refused with `InvalidArgument` by every election call.
pub async fn election_invalid_name_is_refused(cx: Ctx) {
    let s = cx.store();
    let id = lease(&cx).await;
    for name in ["", "trailing/"] {
        let err = s.campaign(name, Bytes::from("a"), id).await.unwrap_err();
        assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");
        let err = s.leader(name).await.unwrap_err();
        assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");
        let err = s.observe(name).await.err().expect("refused");
        assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");
    }
    s.revoke(id).await.unwrap();
}

/// The leader's `is_current` compare fences writes: it holds while leading and fails after.
pub async fn election_token_fences_writes(cx: Ctx) {
    let s = cx.store();
    let name = cx.key("e");
    let id = lease(&cx).await;
    let leader = s.campaign(&name, Bytes::from("a"), id).await.unwrap();
    let guarded = |v: &'static str| {
        TxnRequest::new()
            .when([leader.is_current()])
            .and_then([PutRequest::new(cx.key("resource"), v)])
    };
    assert!(s.txn(guarded("by leader")).await.unwrap().succeeded);
    s.resign(&leader).await.unwrap();
    assert!(!s.txn(guarded("by ex-leader")).await.unwrap().succeeded);
    let kv = s.get_key(cx.key("resource")).await.unwrap().unwrap();
    assert_eq!(kv.value, "by leader".as_bytes());
    s.revoke(id).await.unwrap();
}

/// Observe reports the current leader, each proclaimed value, and the next leader.
pub async fn election_observe_follows_leaders(cx: Ctx) {
    let s = cx.store();
    let name = cx.key("e");
    let a_id = lease(&cx).await;
    let a = s.campaign(&name, Bytes::from("a1"), a_id).await.unwrap();
    let mut obs = s.observe(&name).await.unwrap();
    let first = next_leader(&mut obs).await;
    assert_eq!(
        (first.key.clone(), first.value.clone()),
        (a.key.clone(), Bytes::from("a1"))
    );
    s.proclaim(&a, Bytes::from("a2")).await.unwrap();
    assert_eq!(next_leader(&mut obs).await.value, "a2".as_bytes());
    let (_, b) = queue(&cx, &name, "b1").await;
    s.resign(&a).await.unwrap();
    let b = within(PROMPT, "b to win", b).await.unwrap().unwrap();
    let seen = next_leader(&mut obs).await;
    assert_eq!(seen.key, b.key);
    assert_eq!(seen.value, "b1".as_bytes());
    s.resign(&b).await.unwrap();
}

async fn next_leader(obs: &mut crate::LeaderStream) -> crate::KeyValue {
    within(PROMPT, "an observed leader", obs.next())
        .await
        .expect("stream open")
        .expect("no error")
}

/// Observe on an election without candidates waits for the first one.
pub async fn election_observe_waits_for_a_first_leader(cx: Ctx) {
    let s = cx.store();
    let name = cx.key("e");
    let mut obs = s.observe(&name).await.unwrap();
    let id = lease(&cx).await;
    let leader = s.campaign(&name, Bytes::from("first"), id).await.unwrap();
    let seen = within(PROMPT, "the first leader", obs.next())
        .await
        .expect("stream open")
        .expect("no error");
    assert_eq!(seen.key, leader.key);
    assert_eq!(seen.value, "first".as_bytes());
    s.revoke(id).await.unwrap();
}
