//! The recipes' promises, each a named case, written once and run on every backend
//! (`recipes_sim.rs` in virtual time, `recipes_etcd.rs` on real etcd).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use coord_api::recipes::{
    Candidate, CandidateConfig, CandidateStatus, ClusterEvent, ClusterWatcher,
    ClusterWatcherConfig, Election, ElectionPool, HostRegistration, HostSession, LossReason,
    RegistrationConfig, RegistrationStatus, Session, SessionConfig, SessionEnd, Term,
};
use coord_api::testkit::{eventually, within};
use coord_api::{
    Bytes, DynKvLeaseStore, Error, EventKind, KvLeaseStore, KvLeaseStoreExt, PutRequest,
    TxnRequest, WatchRequest,
};
use futures::StreamExt;
use tokio::time::Instant;

use super::fixture::Fixture;

/// How long something prompt may take: a round trip and a watch delivery, plus the
/// backend's slack.
fn prompt(fx: &dyn Fixture) -> Duration {
    Duration::from_secs(1) + fx.slack()
}

fn reg(fx: &dyn Fixture, key: &str, md: &str) -> RegistrationConfig {
    RegistrationConfig::new(key, md.to_owned()).with_ttl(fx.ttl())
}

async fn present(store: &Arc<DynKvLeaseStore>, key: &str) -> bool {
    store.get_key(key).await.unwrap().is_some()
}

async fn session(fx: &dyn Fixture, store: &Arc<DynKvLeaseStore>) -> Session {
    Session::new(store.clone(), SessionConfig::default().with_ttl(fx.ttl()))
        .await
        .unwrap()
}

// ---- Session ------------------------------------------------------------------------------

pub(crate) async fn session_renews_and_outlives_its_ttl(fx: &dyn Fixture) {
    let store = fx.store();
    let s = session(fx, &store).await;
    tokio::time::sleep(fx.ttl() * 3).await;
    assert!(!s.is_done());
    assert!(store.time_to_live(s.lease()).await.is_ok());
    let (lease, handle) = (s.lease(), s.handle());
    s.stop().await.unwrap();
    assert!(matches!(
        store.time_to_live(lease).await,
        Err(Error::LeaseNotFound { .. })
    ));
    assert_eq!(handle.done().await, SessionEnd::Closed);
}

pub(crate) async fn session_done_fires_at_the_local_deadline_when_cut_off(fx: &dyn Fixture) {
    let client = fx.client().await;
    let s = session(fx, &client.store).await;
    tokio::time::sleep(fx.ttl() / 2).await;
    client.cut_off(true);
    let deadline = s.deadline();
    let end = within(fx.ttl() * 2, "the session to end", s.done()).await;
    assert_eq!(end, SessionEnd::Expired);
    // Not after the deadline (the promise), and not before it (it was renewed until cut).
    let now = Instant::now();
    assert!(
        now <= deadline + Duration::from_millis(50) + fx.slack() / 4,
        "{:?} late",
        now - deadline
    );
    assert!(deadline <= now);
}

/// A grant answered late (a stalled etcd, a slow disk): the lease is older than its reply
/// says. The session must renew before its deadline (counted from the grant's send), not a
/// renewal period after the reply; and a new session has at least TTL − TTL/3 left.
pub(crate) async fn session_survives_a_grant_answered_late(fx: &dyn Fixture) {
    let client = fx.client().await;
    let ttl = fx.ttl();
    let late = ttl * 7 / 10;
    client.delay_requests(late);
    let store = client.store.clone();
    let sent = Instant::now();
    let pending =
        tokio::spawn(
            async move { Session::new(store, SessionConfig::default().with_ttl(ttl)).await },
        );
    // Only the grant is slow: what follows it goes at once.
    tokio::time::sleep(Duration::from_millis(50)).await;
    client.delay_requests(Duration::ZERO);
    let s = within(ttl + fx.slack(), "the grant", pending)
        .await
        .unwrap()
        .unwrap();
    assert!(
        sent.elapsed() >= late,
        "the grant took {:?}, not the {late:?} the test needs",
        sent.elapsed()
    );
    assert!(
        s.health().remaining >= ttl - ttl / 3 - fx.slack(),
        "a new session with {:?} left",
        s.health().remaining
    );
    // Watched for more than a TTL after the slow grant: no expiry, the lease lives.
    let quiet = tokio::time::timeout(ttl + Duration::from_secs(1), s.done()).await;
    assert!(quiet.is_err(), "the session ended: {quiet:?}");
    assert!(client.store.time_to_live(s.lease()).await.is_ok());
    s.stop().await.unwrap();
}

pub(crate) async fn session_reports_a_revoked_lease(fx: &dyn Fixture) {
    let store = fx.store();
    let s = session(fx, &store).await;
    store.revoke(s.lease()).await.unwrap();
    let end = within(fx.ttl(), "the session to notice", s.done()).await;
    assert_eq!(end, SessionEnd::LeaseLost);
}

// ---- HostRegistration ---------------------------------------------------------------------

pub(crate) async fn registration_heals_after_a_stream_close_on_the_same_lease(fx: &dyn Fixture) {
    let client = fx.client().await;
    let r = HostRegistration::start(client.store.clone(), reg(fx, "hosts/a", "m"))
        .await
        .unwrap();
    let lease = r.lease_id();
    for _ in 0..3 {
        tokio::time::sleep(fx.ttl() / 2).await;
        client.close_streams().await;
    }
    tokio::time::sleep(fx.ttl() * 2).await;
    assert_eq!(
        r.lease_id(),
        lease,
        "the same lease: the channel was re-opened, not re-granted"
    );
    assert_eq!(r.status(), RegistrationStatus::Registered { lease });
    assert!(present(&fx.store(), "hosts/a").await);
}

pub(crate) async fn registration_heals_after_an_external_revoke(fx: &dyn Fixture) {
    let store = fx.store();
    let r = HostRegistration::start(store.clone(), reg(fx, "hosts/a", "meta"))
        .await
        .unwrap();
    let old = r.lease_id();
    store.revoke(old).await.unwrap();
    let mut status = r.subscribe();
    let start = Instant::now();
    within(
        fx.ttl(),
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
    let bound = Duration::from_millis(100) + fx.slack();
    assert!(
        start.elapsed() <= bound,
        "healed after {:?}; the first retry comes within 100 ms",
        start.elapsed()
    );
}

pub(crate) async fn registration_stop_removes_the_key_immediately(fx: &dyn Fixture) {
    let store = fx.store();
    let r = HostRegistration::start(store.clone(), reg(fx, "hosts/a", "m"))
        .await
        .unwrap();
    let lease = r.lease_id();
    let status = r.subscribe();
    let before = Instant::now();
    r.stop().await.unwrap();
    assert!(
        before.elapsed() <= fx.slack(),
        "stop took {:?}",
        before.elapsed()
    );
    assert!(!present(&store, "hosts/a").await);
    assert!(matches!(
        store.time_to_live(lease).await,
        Err(Error::LeaseNotFound { .. })
    ));
    assert_eq!(status.get(), RegistrationStatus::Stopped);
}

pub(crate) async fn registration_crash_leaves_the_key_for_one_ttl(fx: &dyn Fixture) {
    let store = fx.store();
    let r = HostRegistration::start(store.clone(), reg(fx, "hosts/a", "m"))
        .await
        .unwrap();
    tokio::time::sleep(fx.ttl() / 2).await;
    drop(r);
    let crashed = Instant::now();
    // The last renewal was at most TTL/3 before the crash: the key lives at least 2/3 TTL on.
    tokio::time::sleep(fx.ttl() / 2).await;
    assert!(
        present(&store, "hosts/a").await,
        "still there within the TTL"
    );
    eventually(fx.ttl() + fx.slack(), "the key to expire", || async {
        !present(&store, "hosts/a").await
    })
    .await;
    assert!(
        crashed.elapsed() <= fx.ttl() + fx.slack(),
        "gone {:?} after the crash",
        crashed.elapsed()
    );
}

pub(crate) async fn registration_stop_during_a_heal_leaves_no_phantom_key(fx: &dyn Fixture) {
    // Calls take time here, so a heal (grant, publish, put) spans time and stop() lands in
    // the middle of it at the offsets tried.
    let store = fx.slow_store().await;
    for offset_ms in fx.stop_offsets() {
        let key = format!("hosts/{offset_ms}");
        let r = HostRegistration::start(
            store.clone(),
            reg(fx, &key, "m").with_backoff(Duration::from_millis(100), Duration::from_secs(1)),
        )
        .await
        .unwrap();
        store.revoke(r.lease_id()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(offset_ms)).await;
        r.stop().await.unwrap();
        // Observed from the rest of the world, not through the slow client.
        let world = fx.store();
        let after = world.current_revision().await.unwrap();
        assert!(
            !present(&world, &key).await,
            "key present right after stop ({offset_ms} ms)"
        );
        // Nothing may write the key after stop returned: watch it past a TTL.
        let mut w = world
            .watch(WatchRequest::key(key.clone()).with_start_revision(after + 1))
            .await
            .unwrap();
        let quiet = tokio::time::timeout(fx.ttl() + fx.slack(), async {
            loop {
                match w.next().await {
                    Some(Ok(batch)) => assert!(
                        batch.events.iter().all(|e| e.kind == EventKind::Delete),
                        "a heal wrote the key after stop returned ({offset_ms} ms): {batch:?}"
                    ),
                    other => return other,
                }
            }
        })
        .await;
        assert!(quiet.is_err(), "the watch ended early: {quiet:?}");
    }
}

pub(crate) async fn registration_updates_metadata_in_place(fx: &dyn Fixture) {
    let store = fx.store();
    let r = HostRegistration::start(store.clone(), reg(fx, "hosts/a", "v1"))
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
    eventually(fx.ttl(), "the heal", || async {
        present(&store, "hosts/a").await
    })
    .await;
    assert_eq!(
        store.get_key("hosts/a").await.unwrap().unwrap().value,
        "v2".as_bytes()
    );
}

pub(crate) async fn registration_puts_back_a_key_deleted_under_its_live_lease(fx: &dyn Fixture) {
    let store = fx.store();
    let r = HostRegistration::start(store.clone(), reg(fx, "hosts/a", "m"))
        .await
        .unwrap();
    store.delete_key("hosts/a").await.unwrap();
    eventually(prompt(fx), "the key to be put back", || async {
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

/// The watcher's promise to a consumer that reads the view when it gets an event: the view
/// is never older than the event, and at the event's own revision it holds the event's
/// change (a newer view may have moved on).
fn assert_view_holds(e: &ClusterEvent, seen: &coord_api::recipes::ClusterView) {
    let (revision, holds) = match e {
        ClusterEvent::HostUp {
            host,
            metadata,
            revision,
        }
        | ClusterEvent::HostUpdated {
            host,
            metadata,
            revision,
        } => (*revision, seen.hosts.get(host) == Some(metadata)),
        ClusterEvent::HostDown { host, revision, .. } => {
            (*revision, !seen.hosts.contains_key(host))
        }
        ClusterEvent::Resynced { revision } => (*revision, true),
    };
    assert!(
        seen.revision >= revision,
        "{e:?} newer than the view {seen:?}"
    );
    assert!(
        seen.revision > revision || holds,
        "{e:?} emitted before the view held it: {seen:?}"
    );
}

/// Reads events until the applied view equals the store's, within a bound: a few round
/// trips, plus a request timeout (a watcher that resumed into a partition waits out the
/// request it sent there before it retries).
async fn converge(
    fx: &dyn Fixture,
    w: &mut ClusterWatcher,
    view: &mut BTreeMap<String, Bytes>,
    store: &Arc<DynKvLeaseStore>,
    prefix: &str,
) {
    let want = truth(store, prefix).await;
    within(
        prompt(fx) * 5 + fx.request_timeout(),
        "the watcher to converge",
        async {
            while *view != want {
                let e = w.next().await.expect("watcher running");
                apply(view, &e);
                assert_view_holds(&e, &w.view());
            }
        },
    )
    .await;
    assert_eq!(w.view().hosts, want, "the readable view agrees");
}

pub(crate) async fn watcher_is_gap_free_from_the_snapshot(fx: &dyn Fixture) {
    let store = fx.store();
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
    let mut kinds = Vec::new();
    within(prompt(fx), "six events", async {
        while kinds.len() < 6 {
            let e = w.next().await.unwrap();
            apply(&mut view, &e);
            kinds.push(match e {
                ClusterEvent::HostUp { host, .. } => format!("up {host}"),
                ClusterEvent::HostUpdated { host, .. } => format!("updated {host}"),
                ClusterEvent::HostDown { host, .. } => format!("down {host}"),
                ClusterEvent::Resynced { .. } => "resynced".into(),
            });
        }
    })
    .await;
    assert_eq!(
        kinds,
        ["up a", "up b", "up c", "down a", "updated b", "up a"]
    );
    assert_eq!(view, truth(&store, "h/").await);
}

pub(crate) async fn watcher_survives_compaction_without_losing_a_net_change(fx: &dyn Fixture) {
    let store = fx.store();
    let client = fx.client().await;
    for h in ["a", "b", "c"] {
        store.put_value(format!("h/{h}"), "1").await.unwrap();
    }
    let mut w = ClusterWatcher::start(client.store.clone(), ClusterWatcherConfig::new("h/"))
        .await
        .unwrap();
    let mut view = BTreeMap::new();
    converge(fx, &mut w, &mut view, &store, "h/").await;
    // Cut the watcher off, change membership meanwhile, compact past the change: its resume
    // revision is gone and it must re-list and diff.
    client.cut_off(true);
    client.close_streams().await;
    store.delete_key("h/a").await.unwrap();
    store.put_value("h/b", "2").await.unwrap();
    store.put_value("h/d", "1").await.unwrap();
    store.delete_key("h/d").await.unwrap();
    let rev = store.current_revision().await.unwrap();
    store.compact(rev).await.unwrap();
    client.cut_off(false);
    converge(fx, &mut w, &mut view, &store, "h/").await;
    // Afterwards it follows live changes again.
    store.put_value("h/e", "1").await.unwrap();
    converge(fx, &mut w, &mut view, &store, "h/").await;
}

pub(crate) async fn watcher_stream_ends_when_stopped_or_dropped(fx: &dyn Fixture) {
    let store = fx.store();
    store.put_value("h/a", "1").await.unwrap();
    let w = ClusterWatcher::start(store.clone(), ClusterWatcherConfig::new("h/"))
        .await
        .unwrap();
    let queued = within(prompt(fx), "the stop", w.stop()).await;
    assert!(
        matches!(queued.as_slice(), [ClusterEvent::HostUp { host, .. }] if host == "a"),
        "stop hands back the events it had queued: {queued:?}"
    );

    let w = ClusterWatcher::start(store.clone(), ClusterWatcherConfig::new("h/"))
        .await
        .unwrap();
    let mut view = w.subscribe_view();
    let mut stream = w.into_stream();
    assert!(stream.next().await.is_some());
    drop(stream);
    // Dropping the stream drops the watcher, which stops its task: the view's publisher goes
    // away with it, so following the view ends.
    within(prompt(fx), "the watcher's task to end", async {
        while view.changed().await.is_ok() {}
    })
    .await;
}

/// A first listing larger than the event buffer: `start` must return (the events that do
/// not fit are emitted once the consumer reads), and every host still comes up, once.
pub(crate) async fn watcher_starts_on_more_hosts_than_its_buffer(fx: &dyn Fixture) {
    let store = fx.store();
    for i in 0..20 {
        store.put_value(format!("big/h{i:02}"), "m").await.unwrap();
    }
    let mut config = ClusterWatcherConfig::new("big/");
    config.buffer = 4;
    let mut w = within(
        prompt(fx),
        "start with 20 hosts and a buffer of 4",
        ClusterWatcher::start(store.clone(), config),
    )
    .await
    .unwrap();
    assert_eq!(w.view().hosts.len(), 20);
    let mut up = std::collections::BTreeSet::new();
    while up.len() < 20 {
        match within(prompt(fx), "the first listing's HostUp", w.next()).await {
            Some(ClusterEvent::HostUp { host, .. }) => assert!(up.insert(host), "HostUp twice"),
            other => panic!("{other:?}"),
        }
    }
    store.put_value("big/late", "m").await.unwrap();
    assert!(matches!(
        within(prompt(fx), "the next change", w.next()).await,
        Some(ClusterEvent::HostUp { host, .. }) if host == "late"
    ));
}

/// Whoever reads an event and then the view finds the event's change in it.
pub(crate) async fn watcher_view_already_holds_each_event_it_emits(fx: &dyn Fixture) {
    let store = fx.store();
    let mut w = ClusterWatcher::start(store.clone(), ClusterWatcherConfig::new("v/"))
        .await
        .unwrap();
    for i in 0..10 {
        store.put_value(format!("v/h{i}"), "m").await.unwrap();
        let e = within(prompt(fx), "HostUp", w.next()).await;
        let Some(ClusterEvent::HostUp { host, revision, .. }) = e else {
            panic!("{e:?}")
        };
        let view = w.view();
        assert!(view.hosts.contains_key(&host), "{host} not in the view yet");
        assert!(view.revision >= revision);
    }
}

/// After a re-list too (compaction overtook the watcher), whoever reads an event and then the
/// view finds the event's change in it. A buffer of one makes the watcher wait for the
/// consumer between two events, so the consumer reads the view in the middle of a re-list's
/// emissions even on one thread.
pub(crate) async fn watcher_view_already_holds_each_event_of_a_relist(fx: &dyn Fixture) {
    let store = fx.store();
    let client = fx.client().await;
    for h in ["a", "b", "c"] {
        store.put_value(format!("r/{h}"), "1").await.unwrap();
    }
    let mut config = ClusterWatcherConfig::new("r/");
    config.buffer = 1;
    let mut w = ClusterWatcher::start(client.store.clone(), config)
        .await
        .unwrap();
    let mut view = BTreeMap::new();
    converge(fx, &mut w, &mut view, &store, "r/").await;
    client.cut_off(true);
    client.close_streams().await;
    store.delete_key("r/a").await.unwrap();
    store.put_value("r/b", "2").await.unwrap();
    store.put_value("r/d", "1").await.unwrap();
    store.put_value("r/e", "1").await.unwrap();
    let rev = store.current_revision().await.unwrap();
    store.compact(rev).await.unwrap();
    client.cut_off(false);
    let want = truth(&store, "r/").await;
    within(
        prompt(fx) * 5 + fx.request_timeout(),
        "the re-list's events",
        async {
            while view != want {
                let e = w.next().await.expect("watcher running");
                apply(&mut view, &e);
                assert_view_holds(&e, &w.view());
            }
        },
    )
    .await;
}

// ---- Election -----------------------------------------------------------------------------

pub(crate) async fn campaign_cancelled_by_a_timeout_says_so_and_leaves_no_key(fx: &dyn Fixture) {
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

pub(crate) async fn a_crashed_leaders_successor_wins_within_one_ttl(fx: &dyn Fixture) {
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

pub(crate) async fn no_phantom_leadership_when_the_candidates_lease_dies_while_waiting(
    fx: &dyn Fixture,
) {
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

pub(crate) async fn try_campaign_never_blocks(fx: &dyn Fixture) {
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

pub(crate) async fn leadership_is_lost_at_the_deadline_when_cut_off(fx: &dyn Fixture) {
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

pub(crate) async fn leadership_is_lost_when_its_key_is_deleted_and_fencing_stops_its_writes(
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

async fn next_leader(fx: &dyn Fixture, obs: &mut coord_api::LeaderStream) -> coord_api::KeyValue {
    within(prompt(fx), "an observed leader", obs.next())
        .await
        .expect("stream open")
        .expect("no error")
}

pub(crate) async fn observe_and_leader_follow_the_election(fx: &dyn Fixture) {
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

// ---- ElectionPool -------------------------------------------------------------------------

pub(crate) async fn pool_stop_drops_every_leadership_at_once(fx: &dyn Fixture) {
    let store = fx.store();
    let pool = ElectionPool::new(store.clone(), SessionConfig::default().with_ttl(fx.ttl()));
    let mut held = Vec::new();
    for i in 0..5 {
        held.push(pool.campaign(&format!("shard/{i}"), "me").await.unwrap());
    }
    assert_eq!(pool.stats().sessions, 1, "one shared session");
    assert_eq!(pool.stats().leaderships, 5);
    let before = Instant::now();
    let handle = pool.clone();
    pool.stop().await.unwrap();
    for l in &held {
        within(prompt(fx), "every leadership to end", l.lost()).await;
    }
    assert!(
        before.elapsed() <= fx.slack(),
        "took {:?}",
        before.elapsed()
    );
    for i in 0..5 {
        assert!(matches!(
            store.leader(&format!("shard/{i}")).await,
            Err(Error::NoLeader { .. })
        ));
    }
    drop(held);
    assert_eq!(handle.stats().leaderships, 0);
    assert!(
        matches!(
            handle.campaign("shard/0", "me").await,
            Err(Error::Cancelled { .. })
        ),
        "a stopped pool campaigns no more"
    );
}

pub(crate) async fn pool_evicts_a_dead_session_before_the_next_campaign(fx: &dyn Fixture) {
    let store = fx.store();
    let pool = ElectionPool::new(store.clone(), SessionConfig::default().with_ttl(fx.ttl()));
    let first = pool.campaign("shard/1", "me").await.unwrap();
    let dead = first.key().lease;
    store.revoke(dead).await.unwrap();
    within(prompt(fx), "the loss", first.lost()).await;
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

// ---- Fencing ------------------------------------------------------------------------------

pub(crate) async fn a_deposed_leaders_write_is_fenced_out_and_ends_its_leadership(
    fx: &dyn Fixture,
) {
    let store = fx.store();
    let (a, b) = (session(fx, &store).await, session(fx, &store).await);
    let lead = Election::new(&a, "e").campaign("a").await.unwrap();
    let put = |v: &'static str| TxnRequest::new().and_then([PutRequest::new("resource", v)]);
    assert!(lead.txn(put("by a")).await.unwrap().succeeded);
    // The caller's own compare failing is an ordinary failed transaction: still leading.
    let own = put("never").when([coord_api::Compare::value(
        "resource",
        coord_api::CompareOp::Equal,
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

// ---- HostSession --------------------------------------------------------------------------

pub(crate) async fn a_host_session_shares_one_lease_and_heals_it(fx: &dyn Fixture) {
    let store = fx.store();
    let host = HostSession::new(store.clone(), SessionConfig::default().with_ttl(fx.ttl()));
    let r = HostRegistration::start_on(&host, reg(fx, "hosts/a", "m"))
        .await
        .unwrap();
    let pool = ElectionPool::on(&host);
    let lead = pool.campaign("e", "a").await.unwrap();
    let first = r.lease_id();
    assert_eq!(
        lead.key().lease,
        first,
        "one lease for the registration and the election"
    );
    assert_eq!(host.stats().sessions, 1);

    // The shared lease is lost: the registration heals onto a new one, the leadership ends,
    // and the next campaign uses the new lease too.
    store.revoke(first).await.unwrap();
    within(prompt(fx), "the leadership's loss", lead.lost()).await;
    let mut status = r.subscribe();
    within(
        fx.ttl(),
        "the registration's heal",
        status
            .wait_for(|s| matches!(s, RegistrationStatus::Registered { lease } if *lease != first)),
    )
    .await
    .unwrap();
    let again = pool.campaign("e", "a").await.unwrap();
    assert_eq!(
        again.key().lease,
        r.lease_id(),
        "still one lease after the heal"
    );
    assert_eq!(host.stats().sessions, 2);

    // The pool's stop takes its keys and leaves the registration's.
    pool.stop().await.unwrap();
    within(prompt(fx), "the leadership's end", again.lost()).await;
    assert!(matches!(
        store.leader("e").await,
        Err(Error::NoLeader { .. })
    ));
    assert!(
        present(&store, "hosts/a").await,
        "the registration is untouched"
    );
    // The registration's stop takes its key and leaves the host's lease.
    let lease = r.lease_id();
    r.stop().await.unwrap();
    assert!(!present(&store, "hosts/a").await);
    assert!(
        store.time_to_live(lease).await.is_ok(),
        "the host's lease lives on"
    );
    host.stop().await.unwrap();
    assert!(matches!(
        store.time_to_live(lease).await,
        Err(Error::LeaseNotFound { .. })
    ));
}

pub(crate) async fn a_registration_spawned_while_cut_off_registers_when_the_store_answers(
    fx: &dyn Fixture,
) {
    let client = fx.client().await;
    client.cut_off(true);
    let r = HostRegistration::spawn(client.store.clone(), reg(fx, "hosts/a", "m")).unwrap();
    // Cut off for a while: it cannot register, and must not give up.
    tokio::time::sleep(fx.request_timeout() + fx.ttl()).await;
    assert_eq!(r.status(), RegistrationStatus::Registering);
    assert!(!present(&fx.store(), "hosts/a").await);
    client.cut_off(false);
    let mut status = r.subscribe();
    // The backoff has grown to a few seconds by now; it is capped at 30 s.
    let bound = fx.request_timeout() + Duration::from_secs(30) + fx.slack();
    within(
        bound,
        "the registration",
        status.wait_for(|s| matches!(s, RegistrationStatus::Registered { .. })),
    )
    .await
    .unwrap();
    let kv = fx
        .store()
        .get_key("hosts/a")
        .await
        .unwrap()
        .expect("registered");
    assert_eq!(kv.lease, r.lease_id());
    r.stop().await.unwrap();
    assert!(!present(&fx.store(), "hosts/a").await);
}

pub(crate) async fn a_registration_with_revoke_on_drop_removes_its_key_when_dropped(
    fx: &dyn Fixture,
) {
    let store = fx.store();
    let own = HostRegistration::start(
        store.clone(),
        reg(fx, "hosts/own", "m").with_revoke_on_drop(true),
    )
    .await
    .unwrap();
    let host = HostSession::new(store.clone(), SessionConfig::default().with_ttl(fx.ttl()));
    let shared = HostRegistration::start_on(
        &host,
        reg(fx, "hosts/shared", "m").with_revoke_on_drop(true),
    )
    .await
    .unwrap();
    let lease = shared.lease_id();
    drop(own);
    drop(shared);
    eventually(prompt(fx), "both keys removed", || async {
        !present(&store, "hosts/own").await && !present(&store, "hosts/shared").await
    })
    .await;
    assert!(
        store.time_to_live(lease).await.is_ok(),
        "the host's lease lives on"
    );
    host.stop().await.unwrap();
}

// ---- Candidate ----------------------------------------------------------------------------

/// The work of each term a candidate won: its token, when it began, when it stopped.
#[derive(Debug, Clone)]
struct Worked {
    who: &'static str,
    token: coord_api::Revision,
    from: Instant,
    until: Option<Instant>,
}

type Log = Arc<std::sync::Mutex<Vec<Worked>>>;

/// Records the end of a term's work when the work returns or is dropped.
struct Ends(Log, usize);

impl Drop for Ends {
    fn drop(&mut self) {
        self.0.lock().unwrap()[self.1].until = Some(Instant::now());
    }
}

/// Work that runs until its term is over (or, if `stubborn`, forever), recording itself.
fn logged(
    who: &'static str,
    log: &Log,
    stubborn: bool,
) -> impl FnMut(Term) -> futures::future::BoxFuture<'static, ()> + Send + 'static {
    let log = log.clone();
    move |term: Term| {
        let log = log.clone();
        Box::pin(async move {
            let i = {
                let mut l = log.lock().unwrap();
                l.push(Worked {
                    who,
                    token: term.token(),
                    from: Instant::now(),
                    until: None,
                });
                l.len() - 1
            };
            let _ends = Ends(log, i);
            if stubborn {
                std::future::pending::<()>().await;
            }
            term.over().await;
        })
    }
}

fn assert_no_overlap(log: &Log) {
    let l = log.lock().unwrap().clone();
    for (i, a) in l.iter().enumerate() {
        for b in &l[i + 1..] {
            let a_end = a.until.expect("every term's work ended");
            assert!(
                b.from >= a_end,
                "the work of {} (token {}) ran until {:?} after {} (token {}) began: {l:?}",
                a.who,
                a.token,
                a_end - b.from,
                b.who,
                b.token
            );
        }
    }
}

async fn leading(c: &Candidate, bound: Duration) -> coord_api::Revision {
    let mut status = c.subscribe();
    let s = within(
        bound,
        "a term",
        status.wait_for(|s| matches!(s, CandidateStatus::Leading { .. })),
    )
    .await
    .unwrap();
    match s {
        CandidateStatus::Leading { token } => token,
        _ => unreachable!(),
    }
}

pub(crate) async fn a_candidate_hands_over_only_once_its_work_stopped(fx: &dyn Fixture) {
    let store = fx.store();
    let log = Log::default();
    let config = |v: &str| CandidateConfig::new("jobs", v.to_owned());
    let pa = ElectionPool::new(store.clone(), SessionConfig::default().with_ttl(fx.ttl()));
    let pb = ElectionPool::new(store.clone(), SessionConfig::default().with_ttl(fx.ttl()));
    let a = Candidate::spawn(&pa, config("a"), logged("a", &log, false));
    let first = leading(&a, prompt(fx)).await;
    let b = Candidate::spawn(&pb, config("b"), logged("b", &log, false));
    // b waits behind a; a's stop ends a's work, then resigns, and b leads.
    tokio::time::sleep(prompt(fx)).await;
    assert!(!b.is_leader());
    a.stop().await.unwrap();
    let second = leading(&b, prompt(fx)).await;
    assert!(second > first);
    b.stop().await.unwrap();
    assert_no_overlap(&log);
    assert_eq!(log.lock().unwrap().len(), 2);
    assert!(matches!(
        store.leader("jobs").await,
        Err(Error::NoLeader { .. })
    ));
}

pub(crate) async fn a_cut_off_candidate_stops_its_work_before_anyone_else_leads(fx: &dyn Fixture) {
    let store = fx.store();
    let log = Log::default();
    let client = fx.client().await;
    let pa = ElectionPool::new(
        client.store.clone(),
        SessionConfig::default().with_ttl(fx.ttl()),
    );
    let pb = ElectionPool::new(store.clone(), SessionConfig::default().with_ttl(fx.ttl()));
    // a's work ignores the end of its term: the candidate must drop it by the deadline.
    let a = Candidate::spawn(
        &pa,
        CandidateConfig::new("jobs", "a"),
        logged("a", &log, true),
    );
    leading(&a, prompt(fx)).await;
    let b = Candidate::spawn(
        &pb,
        CandidateConfig::new("jobs", "b"),
        logged("b", &log, false),
    );
    client.cut_off(true);
    // b leads once a's lease expires at the store; a's work is gone by then.
    leading(&b, fx.ttl() * 2 + fx.slack()).await;
    assert_no_overlap(&log);
    client.cut_off(false);
    b.stop().await.unwrap();
    a.stop().await.unwrap();
}

pub(crate) async fn a_candidate_rests_between_terms_and_counts_them(fx: &dyn Fixture) {
    let store = fx.store();
    let pool = ElectionPool::new(store.clone(), SessionConfig::default().with_ttl(fx.ttl()));
    let terms = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = terms.clone();
    let rest = Duration::from_millis(300);
    // Each term's work returns at once: the candidate resigns, rests, and campaigns again.
    let c = Candidate::spawn(
        &pool,
        CandidateConfig::new("jobs", "a").with_rest(rest),
        move |term: Term| {
            seen.lock()
                .unwrap()
                .push((term.number(), term.token(), Instant::now()));
            async {}
        },
    );
    eventually(prompt(fx) * 4, "three terms", || async {
        terms.lock().unwrap().len() >= 3
    })
    .await;
    c.stop().await.unwrap();
    let terms = terms.lock().unwrap().clone();
    for pair in terms.windows(2) {
        let ((n0, t0, at0), (n1, t1, at1)) = (pair[0], pair[1]);
        assert_eq!(n1, n0 + 1, "terms are counted");
        assert!(t1 > t0, "each term's token is larger");
        assert!(at1 - at0 >= rest, "rested {:?} between terms", at1 - at0);
    }
    assert!(matches!(
        store.leader("jobs").await,
        Err(Error::NoLeader { .. })
    ));
}
