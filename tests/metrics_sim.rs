//! The recipes' metrics, on `SimStore` in virtual time: each fault the metrics are there to
//! show (a lost lease, a heal, a deleted key, a compaction under a watcher, a deposed leader's
//! write) moves exactly the figures the table in `coord_api::metrics` says it does.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use coord_api::metrics as m;
use coord_api::recipes::{
    ClusterWatcher, ClusterWatcherConfig, Election, HostRegistration, LossReason,
    RegistrationConfig, Session, SessionConfig, SessionEnd,
};
use coord_api::{DynKvLeaseStore, Error, KvLeaseStore, KvLeaseStoreExt, PutRequest, TxnRequest};
use coord_sim::SimStore;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use tokio::time::{sleep, timeout, Instant};

const TTL: Duration = Duration::from_secs(5);
/// Bound on every wait for a condition, in virtual time.
const WITHIN: Duration = Duration::from_secs(30);

/// One metric's value, by name and its labels as `k=v` pairs.
type Figures = BTreeMap<(String, Vec<String>), Figure>;

#[derive(Debug, Clone, PartialEq)]
enum Figure {
    Counter(u64),
    Gauge(f64),
    Histogram(Vec<f64>),
}

/// Runs `scenario` on a fresh current-thread runtime in virtual time, with a recorder of
/// its own (so tests in parallel do not see each other's figures); returns what it recorded.
fn recorded<F: std::future::Future<Output = ()>>(scenario: impl FnOnce() -> F) -> Figures {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("runtime");
    metrics::with_local_recorder(&recorder, || rt.block_on(scenario()));
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let (_, key) = key.into_parts();
            let mut labels: Vec<String> = key
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            labels.sort();
            let figure = match value {
                DebugValue::Counter(c) => Figure::Counter(c),
                DebugValue::Gauge(g) => Figure::Gauge(g.into_inner()),
                DebugValue::Histogram(h) => {
                    Figure::Histogram(h.into_iter().map(|v| v.into_inner()).collect())
                }
            };
            ((key.name().to_owned(), labels), figure)
        })
        .collect()
}

fn get<'a>(figures: &'a Figures, name: &str, labels: &[&str]) -> Option<&'a Figure> {
    let mut labels: Vec<String> = labels.iter().map(|l| l.to_string()).collect();
    labels.sort();
    figures.get(&(name.to_owned(), labels))
}

fn counter(figures: &Figures, name: &str, labels: &[&str]) -> u64 {
    match get(figures, name, labels) {
        Some(Figure::Counter(c)) => *c,
        None => 0,
        Some(other) => panic!("{name} {labels:?} is not a counter: {other:?}"),
    }
}

fn gauge(figures: &Figures, name: &str, labels: &[&str]) -> f64 {
    match get(figures, name, labels) {
        Some(Figure::Gauge(g)) => *g,
        other => panic!("{name} {labels:?}: expected a gauge, found {other:?}"),
    }
}

fn histogram<'a>(figures: &'a Figures, name: &str, labels: &[&str]) -> &'a [f64] {
    match get(figures, name, labels) {
        Some(Figure::Histogram(h)) => h,
        other => panic!("{name} {labels:?}: expected a histogram, found {other:?}"),
    }
}

/// Waits, in virtual time and at most [`WITHIN`], until `cond` holds.
async fn until<F: std::future::Future<Output = bool>>(what: &str, mut cond: impl FnMut() -> F) {
    let start = Instant::now();
    while !cond().await {
        assert!(start.elapsed() < WITHIN, "{what}: not within {WITHIN:?}");
        sleep(Duration::from_millis(50)).await;
    }
}

fn store(sim: &SimStore) -> Arc<DynKvLeaseStore> {
    Arc::new(sim.clone())
}

async fn sessions_and_registrations() {
    let sim = SimStore::new();
    let admin = store(&sim.connect());

    // A registration whose lease an operator revokes: one loss, one heal.
    let reg = HostRegistration::start(
        store(&sim.connect()),
        RegistrationConfig::new("m/hosts/a", "a").with_ttl(TTL),
    )
    .await
    .expect("register");
    sleep(TTL).await;
    let first = reg.lease_id();
    admin.revoke(first).await.expect("revoke");
    until("healed under a new lease", || {
        let now = reg.lease_id();
        async move { now != first && now.0 != 0 }
    })
    .await;
    until("key back", || async {
        admin.get_key("m/hosts/a").await.expect("get").is_some()
    })
    .await;

    // Its key deleted under the live lease: put back, no heal.
    admin.delete_key("m/hosts/a").await.expect("delete");
    until("key put back", || async {
        admin.get_key("m/hosts/a").await.expect("get").is_some()
    })
    .await;
    assert_eq!(reg.lease_id(), admin_lease(&admin, "m/hosts/a").await);
    reg.stop().await.expect("stop");

    // A session cut off from the store: its renewals fail until the deadline passes.
    let cut = sim.connect();
    let s = Session::new(store(&cut), SessionConfig::default().with_ttl(TTL))
        .await
        .expect("session");
    cut.partition();
    let end = timeout(WITHIN, s.handle().done()).await.expect("expires");
    assert_eq!(end, SessionEnd::Expired);
    cut.repair();

    // A session closed by its owner.
    let s = Session::new(
        store(&sim.connect()),
        SessionConfig::default().with_ttl(TTL),
    )
    .await
    .expect("session");
    s.stop().await.expect("close");
}

#[test]
fn sessions_and_registrations_count_renewals_losses_and_heals() {
    let figures = recorded(sessions_and_registrations);

    // The registration's first session, its heal's, the cut one and the closed one.
    assert_eq!(counter(&figures, m::SESSIONS_STARTED, &[]), 4);
    assert_eq!(counter(&figures, m::REGISTRATION_LOSSES, &[]), 1);
    assert_eq!(counter(&figures, m::REGISTRATION_HEALS, &[]), 1);
    assert_eq!(counter(&figures, m::REGISTRATION_REPAIRS, &[]), 1);
    assert_eq!(
        counter(&figures, m::SESSIONS_ENDED, &["reason=lease_lost"]),
        1
    );
    assert_eq!(counter(&figures, m::SESSIONS_ENDED, &["reason=expired"]), 1);
    // The registration's stop and the owner's close.
    assert_eq!(counter(&figures, m::SESSIONS_ENDED, &["reason=closed"]), 2);
    let ok = counter(&figures, m::SESSION_RENEWALS, &["outcome=ok"]);
    let failed = counter(&figures, m::SESSION_RENEWALS, &["outcome=failed"]);
    // A TTL of 5 s renews every 5/3 s: at least two renewals in the TTL before the revoke.
    // The cut session (last renewal acknowledged at t, sent every 5/3 s, answered within
    // half that): the next renewal is abandoned at t + 2.5 s (failed), re-sent at once and
    // abandoned at t + 3.33 s (failed), re-sent after the backoff and abandoned near t + 4.5 s
    // (failed); the one after is outstanding at the deadline, t + 5 s (the session expires;
    // not counted as failed).
    assert!(ok >= 2, "{ok} renewals acknowledged");
    assert_eq!(failed, 3, "renewals failed");
    let latencies = histogram(&figures, m::SESSION_RENEWAL_SECONDS, &[]);
    assert_eq!(
        latencies.len() as u64,
        ok,
        "one latency per acknowledged renewal"
    );
    assert!(
        latencies.iter().all(|s| (0.0..1.0).contains(s)),
        "{latencies:?}"
    );
}

async fn admin_lease(admin: &Arc<DynKvLeaseStore>, key: &str) -> coord_api::LeaseId {
    admin.get_key(key).await.expect("get").expect("key").lease
}

async fn a_watcher() {
    let sim = SimStore::new();
    let admin = store(&sim.connect());
    let client = sim.connect();
    let watcher = ClusterWatcher::start(store(&client), ClusterWatcherConfig::new("m/w/"))
        .await
        .expect("watch");
    admin.put_value("m/w/a", "a").await.expect("put");
    until("a seen", || async { watcher.view().contains("a") }).await;

    // Cut off while the prefix changes and the store compacts past the watcher: its
    // stream ends once repaired, the resume finds the history gone, and it re-lists.
    client.partition();
    admin.put_value("m/w/b", "b").await.expect("put");
    admin.put_value("m/w/c", "c").await.expect("put");
    let now = admin.current_revision().await.expect("revision");
    admin.compact(now).await.expect("compact");
    sleep(Duration::from_secs(1)).await;
    client.repair();
    until("b and c seen", || async {
        let v = watcher.view();
        v.contains("b") && v.contains("c")
    })
    .await;

    // A stream closed with nothing missed: resumed, no re-list.
    sim.close_streams();
    admin.put_value("m/w/d", "d").await.expect("put");
    until("d seen", || async { watcher.view().contains("d") }).await;
    watcher.stop().await;
}

#[test]
fn watchers_count_resumes_relists_lag_and_hosts() {
    let figures = recorded(a_watcher);

    let prefix = "prefix=m/w/";
    assert_eq!(
        counter(&figures, m::WATCHER_RELISTS, &[prefix, "reason=compacted"]),
        1
    );
    assert_eq!(
        counter(&figures, m::WATCHER_RELISTS, &[prefix, "reason=silent"]),
        0
    );
    // The repaired cut's stream end, then the close.
    assert_eq!(
        counter(&figures, m::WATCHER_RESUMES, &[prefix, "reason=closed"]),
        2
    );
    assert_eq!(
        counter(&figures, m::WATCHER_RESUMES, &[prefix, "reason=stuck"]),
        0
    );
    assert_eq!(gauge(&figures, m::WATCHER_HOSTS, &[prefix]), 4.0);
    // The last batch was d's put, sent as it was made.
    assert_eq!(gauge(&figures, m::WATCHER_LAG_REVISIONS, &[prefix]), 0.0);
}

async fn an_idle_prefix() {
    let sim = SimStore::new();
    let admin = store(&sim.connect());
    let watcher = ClusterWatcher::start(store(&sim.connect()), ClusterWatcherConfig::new("m/i/"))
        .await
        .expect("watch");
    admin.put_value("m/i/a", "a").await.expect("put");
    until("a seen", || async { watcher.view().contains("a") }).await;
    // Ten minutes in which nothing under the prefix changes while the store's revision moves.
    let quiet_until = Instant::now() + Duration::from_secs(600);
    while Instant::now() < quiet_until {
        admin.put_value("m/elsewhere", "x").await.expect("put");
        sleep(Duration::from_secs(20)).await;
    }
    // Still live: the next change is seen as it is made.
    admin.put_value("m/i/b", "b").await.expect("put");
    timeout(Duration::from_millis(100), async {
        while !watcher.view().contains("b") {
            sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("b seen at once after ten quiet minutes");
    watcher.stop().await;
}

#[test]
fn an_idle_prefix_costs_no_relist_and_no_resume_in_ten_minutes() {
    let figures = recorded(an_idle_prefix);
    let prefix = "prefix=m/i/";
    assert_eq!(
        counter(&figures, m::WATCHER_RELISTS, &[prefix, "reason=compacted"]),
        0
    );
    for reason in ["reason=closed", "reason=stuck"] {
        assert_eq!(counter(&figures, m::WATCHER_RESUMES, &[prefix, reason]), 0);
    }
    assert_eq!(gauge(&figures, m::WATCHER_HOSTS, &[prefix]), 2.0);
}

async fn a_stalled_stream() {
    let sim = SimStore::new();
    let admin = store(&sim.connect());
    let client = sim.connect();
    let config = ClusterWatcherConfig::new("m/s/");
    let watcher = ClusterWatcher::start(store(&client), config.clone())
        .await
        .expect("watch");
    admin.put_value("m/s/a", "a").await.expect("put");
    until("a seen", || async { watcher.view().contains("a") }).await;
    // Every message of the watcher's connection stalls (as a stopped member's do) for less
    // than a request timeout, with a change made meanwhile.
    client.hold();
    admin.put_value("m/s/b", "b").await.expect("put");
    sleep(config.silence + Duration::from_millis(500)).await;
    client.release();
    until("b seen", || async { watcher.view().contains("b") }).await;
    watcher.stop().await;
}

#[test]
fn a_stalled_stream_is_given_up_and_resumed_without_a_relist() {
    let figures = recorded(a_stalled_stream);
    let prefix = "prefix=m/s/";
    assert_eq!(
        counter(&figures, m::WATCHER_RESUMES, &[prefix, "reason=stuck"]),
        1
    );
    assert_eq!(
        counter(&figures, m::WATCHER_RESUMES, &[prefix, "reason=closed"]),
        0
    );
    assert_eq!(
        counter(&figures, m::WATCHER_RELISTS, &[prefix, "reason=compacted"]),
        0
    );
}

async fn an_election() {
    let sim = SimStore::new();
    let admin = store(&sim.connect());
    let cfg = SessionConfig::default().with_ttl(TTL);
    let a = Session::new(store(&sim.connect()), cfg.clone())
        .await
        .expect("session");
    let b = Session::new(store(&sim.connect()), cfg.clone())
        .await
        .expect("session");
    let leading = Election::new(&a, "m/leader")
        .campaign("a")
        .await
        .expect("a leads");
    let fence = leading.fence();

    // b queues behind a for 2 s; an operator deletes a's key; b leads.
    let election_b = Election::new(&b, "m/leader");
    let waiting = tokio::spawn(async move { election_b.campaign("b").await });
    sleep(Duration::from_secs(2)).await;
    admin
        .delete_key(leading.key().key.to_vec())
        .await
        .expect("delete");
    let b_leads = waiting.await.expect("join").expect("b leads");
    assert_eq!(leading.lost().await, LossReason::KeyDeleted);

    // The deposed leader's write is refused by the store.
    let write = TxnRequest::new().and_then([PutRequest::new("m/out", "from a")]);
    assert!(matches!(
        fence.txn(write).await,
        Err(Error::FencedOut { .. })
    ));
    drop(leading);

    // b hands over; a try finds nobody and takes it, then drops it.
    b_leads.resign().await.expect("resign");
    let again = Election::new(&a, "m/leader")
        .try_campaign("a")
        .await
        .expect("try")
        .expect("free");
    drop(again);
}

#[test]
fn elections_count_campaigns_changes_and_fenced_out_writes() {
    let figures = recorded(an_election);

    let e = "election=m/leader";
    // a's campaign, b's, a's try.
    assert_eq!(counter(&figures, m::CAMPAIGNS, &[e]), 3);
    assert_eq!(counter(&figures, m::LEADERSHIP_ACQUIRED, &[e]), 3);
    for (reason, n) in [
        ("key_deleted", 1),
        ("resigned", 1),
        ("dropped", 1),
        ("fenced_out", 0),
    ] {
        let label = format!("reason={reason}");
        assert_eq!(
            counter(&figures, m::LEADERSHIP_ENDED, &[e, &label]),
            n,
            "{reason}"
        );
    }
    assert_eq!(counter(&figures, m::FENCED_OUT_WRITES, &[e]), 1);
    // Every leadership acquired was ended exactly once.
    assert_eq!(gauge(&figures, m::LEADERSHIPS_HELD, &[e]), 0.0);
    // Waiting campaigns: a's at once, b's after a's key went about 2 s later.
    let waits = histogram(&figures, m::CAMPAIGN_WAIT_SECONDS, &[e]);
    assert_eq!(waits.len(), 2, "{waits:?}");
    assert!(waits[0] < 0.1, "{waits:?}");
    assert!((2.0..2.5).contains(&waits[1]), "{waits:?}");
}

/// Every name in the table is recorded by one of the scenarios above, so none is dead.
#[test]
fn every_metric_in_the_table_is_recorded() {
    let mut seen = std::collections::BTreeSet::new();
    seen.extend(
        recorded(sessions_and_registrations)
            .into_keys()
            .map(|k| k.0),
    );
    seen.extend(recorded(a_watcher).into_keys().map(|k| k.0));
    seen.extend(recorded(an_election).into_keys().map(|k| k.0));
    let missing: Vec<_> = m::ALL.iter().filter(|n| !seen.contains(**n)).collect();
    assert!(missing.is_empty(), "never recorded: {missing:?}");
}
