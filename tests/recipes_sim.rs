//! The recipes' promises, each a named test, on `SimStore` in virtual time: deterministic, and
//! a 10 s TTL passes in no wall time.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use coord_api::recipes::{
    ClusterEvent, ClusterWatcher, ClusterWatcherConfig, Election, ElectionPool, HostRegistration,
    RegistrationConfig, RegistrationStatus, Session, SessionConfig, SessionEnd,
};
use coord_api::testkit::{eventually, within};
use coord_api::{
    Bytes, DynKvLeaseStore, Error, KvLeaseStore, KvLeaseStoreExt, PutRequest, TxnRequest,
};
use coord_sim::SimStore;
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(10);
const PROMPT: Duration = Duration::from_secs(1);

fn sim() -> (SimStore, Arc<DynKvLeaseStore>) {
    let s = SimStore::new();
    let d: Arc<DynKvLeaseStore> = Arc::new(s.clone());
    (s, d)
}

fn reg(key: &str, md: &str) -> RegistrationConfig {
    RegistrationConfig::new(key, md.to_owned()).with_ttl(TTL)
}

async fn present(store: &Arc<DynKvLeaseStore>, key: &str) -> bool {
    store.get_key(key).await.unwrap().is_some()
}

// ---- Session ------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn session_renews_and_outlives_its_ttl() {
    let (_, store) = sim();
    let s = Session::new(store.clone(), SessionConfig::default().with_ttl(TTL))
        .await
        .unwrap();
    tokio::time::sleep(TTL * 5).await;
    assert!(!s.is_done());
    assert!(store.time_to_live(s.lease()).await.is_ok());
    s.close().await.unwrap();
    assert!(matches!(
        store.time_to_live(s.lease()).await,
        Err(Error::LeaseNotFound { .. })
    ));
    assert_eq!(s.done().await, SessionEnd::Closed);
}

#[tokio::test(start_paused = true)]
async fn session_done_fires_at_the_local_deadline_when_cut_off() {
    let (sim, _) = sim();
    let client = sim.connect();
    let store: Arc<DynKvLeaseStore> = Arc::new(client.clone());
    let s = Session::new(store, SessionConfig::default().with_ttl(TTL))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let deadline = s.deadline();
    client.set_cut_off(true);
    let end = within(TTL * 2, "the session to end", s.done()).await;
    assert_eq!(end, SessionEnd::Expired);
    // Not a moment after the deadline: the local deadline is the promise.
    assert!(Instant::now() <= deadline + Duration::from_millis(1));
    // And never before the server could have expired the lease.
    assert!(deadline <= Instant::now());
}

#[tokio::test(start_paused = true)]
async fn session_reports_a_revoked_lease() {
    let (_, store) = sim();
    let s = Session::new(store.clone(), SessionConfig::default().with_ttl(TTL))
        .await
        .unwrap();
    store.revoke(s.lease()).await.unwrap();
    let end = within(TTL, "the session to notice", s.done()).await;
    assert_eq!(end, SessionEnd::LeaseLost);
}

// ---- HostRegistration ---------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn registration_heals_after_a_stream_close_on_the_same_lease() {
    let (sim, store) = sim();
    let r = HostRegistration::start(store.clone(), reg("hosts/a", "m"))
        .await
        .unwrap();
    let lease = r.lease_id();
    for _ in 0..3 {
        tokio::time::sleep(TTL / 2).await;
        sim.close_streams();
    }
    tokio::time::sleep(TTL * 2).await;
    assert_eq!(
        r.lease_id(),
        lease,
        "the same lease: the channel was re-opened, not re-granted"
    );
    assert_eq!(r.status(), RegistrationStatus::Registered { lease });
    assert!(present(&store, "hosts/a").await);
}

#[tokio::test(start_paused = true)]
async fn registration_heals_after_an_external_revoke() {
    let (_, store) = sim();
    let r = HostRegistration::start(store.clone(), reg("hosts/a", "meta"))
        .await
        .unwrap();
    let old = r.lease_id();
    store.revoke(old).await.unwrap();
    assert!(!present(&store, "hosts/a").await);
    let mut status = r.subscribe();
    let start = Instant::now();
    within(
        TTL,
        "the heal",
        status.wait_for(|s| matches!(s, RegistrationStatus::Registered { lease } if *lease != old)),
    )
    .await
    .unwrap();
    let kv = store
        .get_key("hosts/a")
        .await
        .unwrap()
        .expect("the key is back");
    assert_eq!(kv.value, "meta".as_bytes(), "with the cached metadata");
    assert_eq!(kv.lease, r.lease_id());
    assert!(
        start.elapsed() <= Duration::from_millis(100),
        "first retry after at most 100 ms: {:?}",
        start.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn registration_stop_removes_the_key_immediately() {
    let (_, store) = sim();
    let r = HostRegistration::start(store.clone(), reg("hosts/a", "m"))
        .await
        .unwrap();
    let lease = r.lease_id();
    let before = Instant::now();
    r.stop().await.unwrap();
    assert_eq!(
        before.elapsed(),
        Duration::ZERO,
        "no waiting in virtual time"
    );
    assert!(!present(&store, "hosts/a").await);
    assert!(matches!(
        store.time_to_live(lease).await,
        Err(Error::LeaseNotFound { .. })
    ));
    assert_eq!(r.status(), RegistrationStatus::Stopped);
    r.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn registration_crash_leaves_the_key_for_one_ttl() {
    let (_, store) = sim();
    let r = HostRegistration::start(store.clone(), reg("hosts/a", "m"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    drop(r);
    let dropped = Instant::now();
    tokio::time::sleep(TTL - Duration::from_secs(4)).await;
    assert!(
        present(&store, "hosts/a").await,
        "still there within the TTL"
    );
    eventually(TTL, "the key to expire", || async {
        !present(&store, "hosts/a").await
    })
    .await;
    assert!(
        dropped.elapsed() <= TTL,
        "gone within one TTL of the crash: {:?}",
        dropped.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn registration_stop_during_a_heal_leaves_no_phantom_key() {
    use futures::StreamExt;
    // Calls take 5 ms, so a heal (grant, publish, put) spans time and stop() can land in
    // the middle of it, at every offset tried here.
    let sim = SimStore::with_config(
        coord_sim::SimConfig::default().with_latency(Duration::from_millis(5)),
    );
    let store: Arc<DynKvLeaseStore> = Arc::new(sim.clone());
    for offset_ms in (0u64..130).step_by(3) {
        let key = format!("hosts/{offset_ms}");
        let r = HostRegistration::start(
            store.clone(),
            reg(&key, "m").with_backoff(Duration::from_millis(100), Duration::from_secs(1)),
        )
        .await
        .unwrap();
        store.revoke(r.lease_id()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(offset_ms)).await;
        r.stop().await.unwrap();
        let after = store.current_revision().await.unwrap();
        assert!(
            !present(&store, &key).await,
            "key present right after stop ({offset_ms} ms)"
        );
        // Nothing may write the key after stop returned: watch it for two TTLs.
        let mut w = store
            .watch(coord_api::WatchRequest::key(key.clone()).with_start_revision(after + 1))
            .await
            .unwrap();
        let quiet = tokio::time::timeout(TTL * 2, async {
            while let Some(Ok(batch)) = w.next().await {
                assert!(
                    batch
                        .events
                        .iter()
                        .all(|e| e.kind == coord_api::EventKind::Delete),
                    "a heal wrote the key after stop returned ({offset_ms} ms): {batch:?}"
                );
            }
        })
        .await;
        assert!(quiet.is_err(), "the watch ended early");
    }
}

#[tokio::test(start_paused = true)]
async fn registration_updates_metadata_in_place() {
    let (_, store) = sim();
    let r = HostRegistration::start(store.clone(), reg("hosts/a", "v1"))
        .await
        .unwrap();
    let created = store
        .get_key("hosts/a")
        .await
        .unwrap()
        .unwrap()
        .create_revision;
    r.update_metadata("v2").await.unwrap();
    let kv = store.get_key("hosts/a").await.unwrap().unwrap();
    assert_eq!(
        (kv.value.as_ref(), kv.create_revision, kv.lease),
        ("v2".as_bytes(), created, r.lease_id())
    );
    // A heal writes the latest metadata, not the first.
    store.revoke(r.lease_id()).await.unwrap();
    eventually(TTL, "the heal", || async {
        present(&store, "hosts/a").await
    })
    .await;
    assert_eq!(
        store.get_key("hosts/a").await.unwrap().unwrap().value,
        "v2".as_bytes()
    );
}

#[tokio::test(start_paused = true)]
async fn registration_puts_back_a_key_deleted_under_its_live_lease() {
    let (_, store) = sim();
    let r = HostRegistration::start(store.clone(), reg("hosts/a", "m"))
        .await
        .unwrap();
    store.delete_key("hosts/a").await.unwrap();
    eventually(PROMPT, "the key to be put back", || async {
        present(&store, "hosts/a").await
    })
    .await;
    assert_eq!(
        store.get_key("hosts/a").await.unwrap().unwrap().lease,
        r.lease_id()
    );
}

// ---- ClusterWatcher -----------------------------------------------------------------------

/// Applies events to a map, failing on an impossible transition (a duplicate Up, a Down of
/// an unknown host): the gap-free, no-duplicate property.
fn apply(view: &mut BTreeMap<String, Bytes>, e: &ClusterEvent) {
    match e {
        ClusterEvent::HostUp { host, metadata, .. } => {
            assert!(
                view.insert(host.clone(), metadata.clone()).is_none(),
                "HostUp twice for {host}"
            );
        }
        ClusterEvent::HostUpdated { host, metadata, .. } => {
            assert!(
                view.insert(host.clone(), metadata.clone()).is_some(),
                "update of unknown {host}"
            );
        }
        ClusterEvent::HostDown {
            host,
            last_metadata,
            ..
        } => {
            let was = view.remove(host);
            assert_eq!(
                was.as_ref(),
                Some(last_metadata),
                "HostDown for {host} without the last metadata seen"
            );
        }
        ClusterEvent::Resynced { .. } => {}
    }
}

async fn truth(store: &Arc<DynKvLeaseStore>, prefix: &str) -> BTreeMap<String, Bytes> {
    let r = store.get_prefix(prefix).await.unwrap();
    r.kvs
        .iter()
        .map(|kv| (kv.key_str()[prefix.len()..].to_owned(), kv.value.clone()))
        .collect()
}

/// Reads events until the applied view equals the store's, within a bound.
async fn converge(
    w: &mut ClusterWatcher,
    view: &mut BTreeMap<String, Bytes>,
    store: &Arc<DynKvLeaseStore>,
    prefix: &str,
) {
    let want = truth(store, prefix).await;
    within(PROMPT * 5, "the watcher to converge", async {
        while *view != want {
            let e = w.next().await.expect("watcher running");
            apply(view, &e);
        }
    })
    .await;
    assert_eq!(w.view().hosts, want, "the readable view agrees");
}

#[tokio::test(start_paused = true)]
async fn watcher_is_gap_free_from_the_snapshot() {
    let (_, store) = sim();
    store.put_value("h/a", "1").await.unwrap();
    store.put_value("h/b", "1").await.unwrap();
    let mut w = ClusterWatcher::start(store.clone(), ClusterWatcherConfig::new("h/"))
        .await
        .unwrap();
    // Writes racing the start are neither lost nor doubled.
    store.put_value("h/c", "1").await.unwrap();
    store.delete_key("h/a").await.unwrap();
    store.put_value("h/b", "2").await.unwrap();
    store.put_value("h/a", "3").await.unwrap();
    let mut view = BTreeMap::new();
    let mut events = Vec::new();
    within(PROMPT, "six events", async {
        while events.len() < 6 {
            let e = w.next().await.unwrap();
            apply(&mut view, &e);
            events.push(e);
        }
    })
    .await;
    let kinds: Vec<String> = events
        .iter()
        .map(|e| match e {
            ClusterEvent::HostUp { host, .. } => format!("up {host}"),
            ClusterEvent::HostUpdated { host, .. } => format!("updated {host}"),
            ClusterEvent::HostDown { host, .. } => format!("down {host}"),
            ClusterEvent::Resynced { .. } => "resynced".into(),
        })
        .collect();
    assert_eq!(
        kinds,
        ["up a", "up b", "up c", "down a", "updated b", "up a"]
    );
    assert_eq!(view, truth(&store, "h/").await);
}

#[tokio::test(start_paused = true)]
async fn watcher_survives_compaction_without_losing_a_net_change() {
    let (sim, store) = sim();
    for h in ["a", "b", "c"] {
        store.put_value(format!("h/{h}"), "1").await.unwrap();
    }
    let mut w = ClusterWatcher::start(store.clone(), ClusterWatcherConfig::new("h/"))
        .await
        .unwrap();
    let mut view = BTreeMap::new();
    converge(&mut w, &mut view, &store, "h/").await;
    // Break the watch, change membership while it is down, compact past the change: the
    // watcher's resume revision is gone and it must re-list and diff.
    sim.close_streams();
    store.delete_key("h/a").await.unwrap();
    store.put_value("h/b", "2").await.unwrap();
    store.put_value("h/d", "1").await.unwrap();
    store.delete_key("h/d").await.unwrap();
    let rev = store.current_revision().await.unwrap();
    store.compact(rev).await.unwrap();
    converge(&mut w, &mut view, &store, "h/").await;
    // Afterwards it follows live changes again.
    store.put_value("h/e", "1").await.unwrap();
    converge(&mut w, &mut view, &store, "h/").await;
}

#[tokio::test(start_paused = true)]
async fn watcher_stream_ends_when_stopped_or_dropped() {
    let (_, store) = sim();
    store.put_value("h/a", "1").await.unwrap();
    let mut w = ClusterWatcher::start(store.clone(), ClusterWatcherConfig::new("h/"))
        .await
        .unwrap();
    w.stop().await;
    assert!(
        matches!(w.next().await, Some(ClusterEvent::HostUp { .. })),
        "queued events still read"
    );
    assert_eq!(
        within(PROMPT, "the end of the stream", w.next()).await,
        None
    );

    let w = ClusterWatcher::start(store.clone(), ClusterWatcherConfig::new("h/"))
        .await
        .unwrap();
    let mut stream = w.into_stream();
    use futures::StreamExt;
    assert!(stream.next().await.is_some());
    drop(stream);
}

// ---- Election -----------------------------------------------------------------------------

async fn session(store: &Arc<DynKvLeaseStore>) -> Session {
    Session::new(store.clone(), SessionConfig::default().with_ttl(TTL))
        .await
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn campaign_cancelled_by_a_timeout_says_so_and_leaves_no_key() {
    let (_, store) = sim();
    let (a, b) = (session(&store).await, session(&store).await);
    let _lead = Election::new(&a, "e").campaign("a").await.unwrap();
    let err = Election::new(&b, "e")
        .campaign_timeout("b", Duration::from_secs(1))
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
    eventually(PROMPT, "the candidate key to go", || async {
        store.get_prefix("e/").await.unwrap().count == 1
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_crashed_leaders_successor_wins_within_one_ttl() {
    let (_, store) = sim();
    let (a, b) = (session(&store).await, session(&store).await);
    let lead = Election::new(&a, "e").campaign("a").await.unwrap();
    let eb = Election::new(&b, "e");
    let waiting = tokio::spawn(async move { eb.campaign("b").await });
    tokio::time::sleep(Duration::from_secs(1)).await;
    let crash = Instant::now();
    drop(lead);
    drop(a); // renewals stop; nothing is revoked
    let won = within(TTL * 2, "the successor", waiting)
        .await
        .unwrap()
        .unwrap();
    assert!(
        crash.elapsed() <= TTL,
        "successor after {:?}",
        crash.elapsed()
    );
    assert!(won.token() > 0);
    drop(b);
}

#[tokio::test(start_paused = true)]
async fn no_phantom_leadership_when_the_candidates_lease_dies_while_waiting() {
    let (_, store) = sim();
    let (a, b) = (session(&store).await, session(&store).await);
    let lead = Election::new(&a, "e").campaign("a").await.unwrap();
    let eb = Election::new(&b, "e");
    let waiting = tokio::spawn(async move { eb.campaign("b").await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    store.revoke(b.lease()).await.unwrap();
    lead.resign().await.unwrap();
    let res = within(PROMPT, "the campaign to end", waiting)
        .await
        .unwrap();
    assert!(matches!(res, Err(Error::CandidacyLost { .. })), "{res:?}");
    assert!(matches!(
        store.leader("e").await,
        Err(Error::NoLeader { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn try_campaign_never_blocks() {
    let (_, store) = sim();
    let (a, b) = (session(&store).await, session(&store).await);
    let lead = Election::new(&a, "e")
        .try_campaign("a")
        .await
        .unwrap()
        .expect("nobody led");
    let before = Instant::now();
    let other = Election::new(&b, "e").try_campaign("b").await.unwrap();
    assert!(other.is_none());
    assert_eq!(before.elapsed(), Duration::ZERO);
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

#[tokio::test(start_paused = true)]
async fn leadership_is_lost_at_the_deadline_when_cut_off() {
    let (sim, _) = sim();
    let client = sim.connect();
    let store: Arc<DynKvLeaseStore> = Arc::new(client.clone());
    let s = session(&store).await;
    let lead = Election::new(&s, "e").campaign("a").await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    client.set_cut_off(true);
    let deadline = lead.deadline();
    within(TTL * 2, "the leadership to be lost", lead.lost()).await;
    assert!(!lead.is_leader());
    assert!(Instant::now() <= deadline, "stepped down by the deadline");
    // The store expires the lease no earlier: another candidate could not have led sooner.
    let other: Arc<DynKvLeaseStore> = Arc::new(sim.clone());
    assert!(
        other
            .get_key(lead.key().key.to_vec())
            .await
            .unwrap()
            .is_none()
            || Instant::now() <= deadline
    );
}

#[tokio::test(start_paused = true)]
async fn leadership_is_lost_when_its_key_is_deleted_and_fencing_stops_its_writes() {
    let (_, store) = sim();
    let s = session(&store).await;
    let lead = Election::new(&s, "e").campaign("a").await.unwrap();
    let write =
        |v: &'static str| lead.fence(TxnRequest::new().and_then([PutRequest::new("resource", v)]));
    assert!(store.txn(write("by leader")).await.unwrap().succeeded);
    store.delete_key(lead.key().key.to_vec()).await.unwrap();
    within(PROMPT, "the loss", lead.lost()).await;
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

#[tokio::test(start_paused = true)]
async fn observe_and_leader_follow_the_election() {
    let (_, store) = sim();
    let (a, b) = (session(&store).await, session(&store).await);
    let ea = Election::new(&a, "e");
    let lead = ea.campaign("a").await.unwrap();
    let mut obs = ea.observe().await.unwrap();
    use futures::StreamExt;
    assert_eq!(obs.next().await.unwrap().unwrap().value, "a".as_bytes());
    lead.proclaim("a2").await.unwrap();
    assert_eq!(obs.next().await.unwrap().unwrap().value, "a2".as_bytes());
    let eb = Election::new(&b, "e");
    let waiting = tokio::spawn(async move { eb.campaign("b").await });
    tokio::time::sleep(Duration::from_millis(10)).await;
    lead.resign().await.unwrap();
    let b_lead = waiting.await.unwrap().unwrap();
    assert_eq!(obs.next().await.unwrap().unwrap().value, "b".as_bytes());
    assert_eq!(
        Election::new(&a, "e").leader().await.unwrap().value,
        "b".as_bytes()
    );
    b_lead.resign().await.unwrap();
}

// ---- ElectionPool -------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn pool_close_drops_every_leadership_at_once() {
    let (_, store) = sim();
    let pool = ElectionPool::new(store.clone(), SessionConfig::default().with_ttl(TTL));
    let mut held = Vec::new();
    for i in 0..5 {
        held.push(pool.campaign(&format!("shard/{i}"), "me").await.unwrap());
    }
    assert_eq!(pool.stats().sessions, 1, "one shared session");
    assert_eq!(pool.stats().leaderships, 5);
    let before = Instant::now();
    pool.close().await.unwrap();
    for l in &held {
        within(PROMPT, "every leadership to end", l.lost()).await;
    }
    assert_eq!(before.elapsed(), Duration::ZERO, "at once");
    for i in 0..5 {
        assert!(matches!(
            store.leader(&format!("shard/{i}")).await,
            Err(Error::NoLeader { .. })
        ));
    }
    drop(held);
    assert_eq!(pool.stats().leaderships, 0);
}

#[tokio::test(start_paused = true)]
async fn pool_evicts_a_dead_session_before_the_next_campaign() {
    let (_, store) = sim();
    let pool = ElectionPool::new(store.clone(), SessionConfig::default().with_ttl(TTL));
    let first = pool.campaign("shard/1", "me").await.unwrap();
    let dead = first.key().lease;
    store.revoke(dead).await.unwrap();
    within(PROMPT, "the loss", first.lost()).await;
    let second = pool.campaign("shard/2", "me").await.unwrap();
    assert_ne!(
        second.key().lease,
        dead,
        "a fresh session, not the dead one"
    );
    let stats = pool.stats();
    assert_eq!((stats.sessions, stats.evictions), (2, 1));
    assert!(second.is_leader());
}
