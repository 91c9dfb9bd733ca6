//! The cases of `Election` and `Leadership`, fencing included.

use std::time::Duration;

use crate::recipes::{Election, Leadership, LossReason};
use crate::testkit::{eventually, within};
use crate::{Error, KvLeaseStore, KvLeaseStoreExt, PutRequest, TxnRequest};
use futures::StreamExt;
use tokio::time::Instant;

use super::fixture::Fixture;
use super::support::*;

pub async fn campaign_cancelled_by_a_timeout_says_so_and_leaves_no_key(fx: &dyn Fixture) {
    let store = fx.store();
    let (a, b) = (session(fx, &store).await, session(fx, &store).await);
    let _lead = Election::new(&a, "e").campaign("a").await.unwrap();
    let err = Election::new(&b, "e")
        .campaign_timeout("b", Duration::from_millis(500))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Cancelled {
                operation: "campaign"
            }
        ),
        "{err:?}"
    );
    eventually(prompt(fx), "the candidate key to go", || async {
        store.get_prefix("e/").await.unwrap().count == 1
    })
    .await;
}

pub async fn a_crashed_leaders_successor_wins_within_one_ttl(fx: &dyn Fixture) {
    let store = fx.store();
    let (a, b) = (session(fx, &store).await, session(fx, &store).await);
    let lead = Election::new(&a, "e").campaign("a").await.unwrap();
    let eb = Election::new(&b, "e");
    let waiting = tokio::spawn(async move { eb.campaign("b").await });
    tokio::time::sleep(fx.ttl() / 2).await;
    let crash = Instant::now();
    drop(lead);
    drop(a); // renewals stop; nothing is revoked
    let won = within(fx.ttl() * 2 + fx.slack(), "the successor", waiting)
        .await
        .unwrap()
        .unwrap();
    assert!(
        crash.elapsed() <= fx.ttl() + fx.slack(),
        "successor after {:?}",
        crash.elapsed()
    );
    assert!(won.token() > 0);
    drop(b);
}

pub async fn no_phantom_leadership_when_the_candidates_lease_dies_while_waiting(fx: &dyn Fixture) {
    let store = fx.store();
    let (a, b) = (session(fx, &store).await, session(fx, &store).await);
    let lead = Election::new(&a, "e").campaign("a").await.unwrap();
    let eb = Election::new(&b, "e");
    let waiting = tokio::spawn(async move { eb.campaign("b").await });
    eventually(prompt(fx), "b to queue", || async {
        store.get_prefix("e/").await.unwrap().count == 2
    })
    .await;
    store.revoke(b.lease()).await.unwrap();
    lead.resign().await.unwrap();
    let res = within(prompt(fx), "the campaign to end", waiting)
        .await
        .unwrap();
    assert!(matches!(res, Err(Error::CandidacyLost { .. })), "{res:?}");
    assert!(matches!(
        store.leader("e").await,
        Err(Error::NoLeader { .. })
    ));
}

/// Two campaigns of one session in `e`, "one" then "two": the second rejoins the first's key.
async fn rejoined(e: &Election) -> (Leadership, Leadership) {
    let first = e.campaign("one").await.unwrap();
    let second = e.campaign("two").await.unwrap();
    assert_eq!(
        second.token(),
        first.token(),
        "a re-campaign rejoins the key"
    );
    (first, second)
}

/// A campaign again on the same session rejoins the leader's key (`name/<lease>`, its
/// create revision unchanged): the older leadership's resign after that leaves the key to the
/// newer one, and the newer one's resign still deletes it. The same for a try.
pub async fn a_resign_after_a_rejoin_leaves_the_newer_leadership_standing(fx: &dyn Fixture) {
    let store = fx.store();
    let a = session(fx, &store).await;
    let e = Election::new(&a, "e");
    let (first, second) = rejoined(&e).await;
    first.resign().await.unwrap();
    let kv = e.leader().await.unwrap();
    assert_eq!(
        kv.value,
        "two".as_bytes(),
        "the newer campaign's key stands"
    );
    assert_eq!(kv.create_revision, second.token());
    let third = e
        .try_campaign("three")
        .await
        .unwrap()
        .expect("rejoins its own key");
    second.resign().await.unwrap();
    assert_eq!(e.leader().await.unwrap().value, "three".as_bytes());
    third.resign().await.unwrap();
    assert!(matches!(e.leader().await, Err(Error::NoLeader { .. })));
}

/// A newer campaign of the session rejoins a standing leadership's key; when that campaign
/// resigns (or gives up), the key is left to the older leadership, which still leads (its
/// fenced writes go through) and whose own resign then deletes the key. Nothing of a
/// process deposes a leadership the process still holds.
pub async fn a_newer_campaign_that_resigns_leaves_the_key_to_the_older_leadership(
    fx: &dyn Fixture,
) {
    let store = fx.store();
    let a = session(fx, &store).await;
    let e = Election::new(&a, "e");
    let (first, second) = rejoined(&e).await;
    second.resign().await.unwrap();
    let kv = e.leader().await.unwrap();
    assert_eq!(
        kv.create_revision,
        first.token(),
        "the older leadership's key stands"
    );
    first
        .txn(TxnRequest::new().and_then([PutRequest::new("work", "one")]))
        .await
        .expect("the older leadership still leads");
    first.resign().await.unwrap();
    assert!(matches!(e.leader().await, Err(Error::NoLeader { .. })));
}

/// A campaign that gave up before its turn came (its session's earlier campaign in the same
/// election held the turn) took nothing over: the earlier campaign's key is still withdrawn
/// when that campaign is dropped, and no key of the session is left queued.
pub async fn a_campaign_dropped_before_its_turn_leaves_the_earlier_ones_cleanup_alone(
    fx: &dyn Fixture,
) {
    let store = fx.store();
    let (a, b) = (session(fx, &store).await, session(fx, &store).await);
    let lead = Election::new(&b, "e").campaign("b").await.unwrap();
    let e = Election::new(&a, "e");
    let (first, second) = (e.clone(), e.clone());
    let queued = tokio::spawn(async move { first.campaign("a1").await });
    eventually(prompt(fx), "the first campaign to queue", || async {
        store.get_prefix("e/").await.unwrap().count == 2
    })
    .await;
    // Waits for the session's turn, which the queued campaign holds.
    let behind = tokio::spawn(async move { second.campaign("a2").await });
    tokio::task::yield_now().await;
    behind.abort();
    assert!(behind.await.unwrap_err().is_cancelled());
    queued.abort();
    assert!(queued.await.unwrap_err().is_cancelled());
    eventually(prompt(fx), "the dropped campaign's key to go", || async {
        store.get_prefix("e/").await.unwrap().count == 1
    })
    .await;
    assert_eq!(e.leader().await.unwrap().value, "b".as_bytes());
    lead.resign().await.unwrap();
}

/// A leadership whose key was deleted resigns at once while a newer campaign of its session
/// waits in the queue (holding the session's turn in the election): it does not wait for
/// that campaign to lead, and leaves its key, the newer campaign's, queued.
pub async fn a_resign_does_not_wait_for_a_newer_campaign_of_its_session_to_lead(fx: &dyn Fixture) {
    let store = fx.store();
    let (a, b) = (session(fx, &store).await, session(fx, &store).await);
    let e = Election::new(&a, "e");
    let old = e.campaign("a1").await.unwrap();
    let eb = Election::new(&b, "e");
    let b_waits = tokio::spawn(async move { eb.campaign("b").await });
    eventually(prompt(fx), "b to queue", || async {
        store.get_prefix("e/").await.unwrap().count == 2
    })
    .await;
    store
        .delete(crate::DeleteRequest::key(old.key().key.to_vec()))
        .await
        .unwrap();
    let b_leads = within(prompt(fx), "b to lead", b_waits)
        .await
        .unwrap()
        .unwrap();
    let again = e.clone();
    let queued = tokio::spawn(async move { again.campaign("a2").await });
    eventually(prompt(fx), "a's new campaign to queue", || async {
        store.get_prefix("e/").await.unwrap().count == 2
    })
    .await;
    within(prompt(fx), "the old leadership's resign", old.resign())
        .await
        .unwrap();
    assert_eq!(
        store.get_prefix("e/").await.unwrap().count,
        2,
        "the newer campaign's key stays queued"
    );
    b_leads.resign().await.unwrap();
    let a_leads = within(prompt(fx), "a's new campaign to lead", queued)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(e.leader().await.unwrap().value, "a2".as_bytes());
    a_leads.resign().await.unwrap();
}

pub async fn try_campaign_never_blocks(fx: &dyn Fixture) {
    let store = fx.store();
    let (a, b) = (session(fx, &store).await, session(fx, &store).await);
    let lead = Election::new(&a, "e")
        .try_campaign("a")
        .await
        .unwrap()
        .expect("nobody led");
    let before = Instant::now();
    let other = Election::new(&b, "e").try_campaign("b").await.unwrap();
    assert!(other.is_none());
    assert!(
        before.elapsed() <= fx.slack(),
        "took {:?}",
        before.elapsed()
    );
    assert_eq!(
        store.get_prefix("e/").await.unwrap().count,
        1,
        "the loser queued nothing"
    );
    lead.resign().await.unwrap();
    assert!(Election::new(&b, "e")
        .try_campaign("b")
        .await
        .unwrap()
        .is_some());
}

pub async fn leadership_is_lost_at_the_deadline_when_cut_off(fx: &dyn Fixture) {
    let client = fx.client().await;
    let s = session(fx, &client.store).await;
    let lead = Election::new(&s, "e").campaign("a").await.unwrap();
    tokio::time::sleep(fx.ttl() / 2).await;
    client.cut_off(true);
    let deadline = lead.deadline();
    within(fx.ttl() * 2, "the leadership to be lost", lead.lost()).await;
    assert!(!lead.is_leader());
    let now = Instant::now();
    assert!(
        now <= deadline + Duration::from_millis(50) + fx.slack() / 4,
        "stepped down {:?} late",
        now - deadline
    );
    // The rest of the world sees the key until the store expires the lease, which is no
    // earlier than the deadline: no other leader could have been elected before we stepped down.
    client.cut_off(false);
}

pub async fn leadership_is_lost_when_its_key_is_deleted_and_fencing_stops_its_writes(
    fx: &dyn Fixture,
) {
    let store = fx.store();
    let s = session(fx, &store).await;
    let lead = Election::new(&s, "e").campaign("a").await.unwrap();
    let write =
        |v: &'static str| lead.fenced(TxnRequest::new().and_then([PutRequest::new("resource", v)]));
    assert!(store.txn(write("by leader")).await.unwrap().succeeded);
    store.delete_key(lead.key().key.to_vec()).await.unwrap();
    within(prompt(fx), "the loss", lead.lost()).await;
    assert!(!lead.is_leader());
    assert!(!store.txn(write("after loss")).await.unwrap().succeeded);
    assert_eq!(
        store.get_key("resource").await.unwrap().unwrap().value,
        "by leader".as_bytes()
    );
    assert!(matches!(
        lead.proclaim("x").await,
        Err(Error::NotLeader { .. })
    ));
}

async fn next_leader(fx: &dyn Fixture, obs: &mut crate::LeaderStream) -> crate::KeyValue {
    within(prompt(fx), "an observed leader", obs.next())
        .await
        .expect("stream open")
        .expect("no error")
}

pub async fn observe_and_leader_follow_the_election(fx: &dyn Fixture) {
    let store = fx.store();
    let (a, b) = (session(fx, &store).await, session(fx, &store).await);
    let ea = Election::new(&a, "e");
    let lead = ea.campaign("a").await.unwrap();
    let mut obs = ea.observe().await.unwrap();
    assert_eq!(next_leader(fx, &mut obs).await.value, "a".as_bytes());
    lead.proclaim("a2").await.unwrap();
    assert_eq!(next_leader(fx, &mut obs).await.value, "a2".as_bytes());
    let eb = Election::new(&b, "e");
    let waiting = tokio::spawn(async move { eb.campaign("b").await });
    eventually(prompt(fx), "b to queue", || async {
        store.get_prefix("e/").await.unwrap().count == 2
    })
    .await;
    lead.resign().await.unwrap();
    let b_lead = within(prompt(fx), "b to lead", waiting)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(next_leader(fx, &mut obs).await.value, "b".as_bytes());
    assert_eq!(
        Election::new(&a, "e").leader().await.unwrap().value,
        "b".as_bytes()
    );
    b_lead.resign().await.unwrap();
}

pub async fn a_deposed_leaders_write_is_fenced_out_and_ends_its_leadership(fx: &dyn Fixture) {
    let store = fx.store();
    let (a, b) = (session(fx, &store).await, session(fx, &store).await);
    let lead = Election::new(&a, "e").campaign("a").await.unwrap();
    let put = |v: &'static str| TxnRequest::new().and_then([PutRequest::new("resource", v)]);
    assert!(lead.txn(put("by a")).await.unwrap().succeeded);
    // The caller's own compare failing is an ordinary failed transaction: still leading.
    let own = put("never").when([crate::Compare::value(
        "resource",
        crate::CompareOp::Equal,
        "other",
    )]);
    let r = lead.txn(own).await.unwrap();
    assert!(!r.succeeded, "the caller's compare failed");
    assert!(
        lead.is_leader(),
        "a failed compare of the caller's is not a deposition"
    );
    // Deposed: the key deleted and someone else elected, before `a` hears of it.
    store.delete_key(lead.key().key.to_vec()).await.unwrap();
    let next = Election::new(&b, "e").campaign("b").await.unwrap();
    match lead.txn(put("by a, deposed")).await {
        Err(Error::FencedOut { election, token }) => {
            assert_eq!((election.as_str(), token), ("e", lead.token()));
        }
        other => panic!("a deposed leader's write must be fenced out, got {other:?}"),
    }
    assert!(!lead.is_leader(), "the refusal ended the leadership");
    let why = within(prompt(fx), "the loss", lead.lost()).await;
    assert!(
        matches!(why, LossReason::FencedOut | LossReason::KeyDeleted),
        "lost for {why:?}"
    );
    assert_eq!(
        store.get_key("resource").await.unwrap().unwrap().value,
        "by a".as_bytes(),
        "the store refused the deposed leader's write"
    );
    assert!(next.txn(put("by b")).await.unwrap().succeeded);
    next.resign().await.unwrap();
}

/// A `try_campaign` dropped while its key's write is on the way (a caller's timeout) leaves
/// no key behind: written into an empty election, it would be a leader nobody believes in,
/// under a session that lives on, and no one else could lead until that session ended.
pub async fn try_campaign_dropped_mid_write_leaves_no_key(fx: &dyn Fixture) {
    let store = fx.store();
    let client = fx.client().await;
    let b = session(fx, &client.store).await;
    let key = crate::candidate_key("e", b.lease());
    let delay = fx.ttl() / 10;
    client.delay_requests(delay);
    let election = Election::new(&b, "e");
    let dropped = tokio::time::timeout(delay / 2, election.try_campaign("b")).await;
    assert!(
        dropped.is_err(),
        "the try finished within half its write's delay"
    );
    client.delay_requests(Duration::ZERO);
    // Past the write's delay it has landed; the withdrawal follows it.
    tokio::time::sleep(delay).await;
    eventually(prompt(fx), "b's key to be withdrawn", || async {
        !present(&store, &key).await
    })
    .await;
    tokio::time::sleep(delay * 2).await;
    assert!(!present(&store, &key).await, "b's key came back");
    let a = session(fx, &store).await;
    let lead = within(
        prompt(fx),
        "another candidate to lead at once",
        Election::new(&a, "e").campaign("a"),
    )
    .await
    .unwrap();
    assert!(!b.is_done(), "b's session lives on");
    drop(lead);
}

/// A leadership is handed out with at least half its session's TTL left: a campaign won when
/// less is left asks the session's renewer to renew at once, and does not wait for its next
/// regular renewal.
pub async fn a_campaign_won_late_in_its_sessions_ttl_asks_for_a_renewal_at_once(fx: &dyn Fixture) {
    use crate::recipes::{Session, SessionConfig};
    let store = fx.store();
    let ttl = fx.ttl();
    // Renewing only every 9/10 of the TTL, the session has less than half of it left from
    // 1/2 of the TTL after each renewal until the next.
    let config = SessionConfig::default()
        .with_ttl(ttl)
        .with_renew_interval(ttl * 9 / 10);
    let s = Session::new(store.clone(), config).await.unwrap();
    let started = Instant::now();
    tokio::time::sleep(ttl * 6 / 10).await;
    assert!(
        s.deadline().saturating_duration_since(Instant::now()) < ttl / 2,
        "the case needs less than half the TTL left"
    );
    let lead = Election::new(&s, "late").campaign("a").await.unwrap();
    let won = Instant::now();
    // The regular renewal is due at 9/10 of the TTL from the start; the ask comes 3/10
    // before it, and a renewal takes one round trip (slack covers a loaded machine).
    assert!(
        won < started + ttl * 9 / 10,
        "the campaign waited {:?} for the session's regular renewal instead of asking",
        won - started
    );
    assert!(
        s.deadline().saturating_duration_since(won) >= ttl / 2,
        "led with {:?} left of a {ttl:?} TTL",
        s.deadline().saturating_duration_since(won)
    );
    lead.resign().await.unwrap();
    s.stop().await.unwrap();
}
