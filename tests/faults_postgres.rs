//! The recipes through the faults a PostgreSQL deployment suffers, on a real server each test
//! starts (issue 42): kill -9 and restart, SIGSTOP past the TTL, every client backend killed
//! by the server (`pg_terminate_backend`, as an operator or a failover does), a client cut off
//! through a proxy (shorter and longer than the TTL; connections frozen without a reset), and
//! more requests at once than the store's pool has connections.
//!
//! Each test runs hosts registering, a watcher, and candidates that write their token through
//! their fence while they lead, all at the library's defaults; asserts the bounds of
//! docs/INVARIANTS.md; and prints what it measured. Real time: TTL 3 s; slack 1 s for the
//! store's 200 ms sweep and a loaded 2-core machine. Each holds its whole history to the
//! chaos runner's checkers (`witness.rs`: S1 with the fence, S2, S3, S4/S5, C1), observed
//! through a store of the witness's own, straight to the server.

// The etcd fault tests use the rest of both (an operator deposing a leader, re-lists, the
// witness's etcd observers).
#[allow(dead_code)]
#[path = "faults/parts.rs"]
mod parts;
#[allow(dead_code)]
#[path = "witness.rs"]
mod witness;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use coord_api::recipes::{HostRegistration, Session, SessionConfig};
use coord_api::testkit::eventually;
use coord_api::{DynKvLeaseStore, KvLeaseStore, KvLeaseStoreExt, PutRequest, Revision};
use coord_chaos::{Emitted, Happening};
use coord_postgres::testing::{PostgresServer, TcpProxy};
use coord_postgres::{PostgresConfig, PostgresStore};
use parts::{
    all_registered, assert_ridden_through, hosts_and_an_election, observe, register, standing,
    Leaders, Partitionable, ELECTION, SLACK, TTL, WORK,
};
use tokio::time::Instant;
use witness::Witness;

/// The store's lease sweep (its default interval): how late after its deadline an expired
/// lease's keys go.
const SWEEP: Duration = Duration::from_millis(200);

async fn single() -> (PostgresServer, Arc<DynKvLeaseStore>, Arc<Witness>) {
    let server = PostgresServer::start()
        .await
        .unwrap_or_else(|e| panic!("cannot start PostgreSQL: {e}"));
    let observer: Arc<DynKvLeaseStore> = Arc::new(server.store().await);
    let witness =
        Arc::new(Witness::on_store(observer, &["hosts/", "jobs/", "work/", "load/"], TTL).await);
    let store: Arc<DynKvLeaseStore> = Arc::new(server.store().await);
    (server, store, witness)
}

/// A client of the server through a proxy of its own (so a test can cut it off alone), at
/// the library's defaults.
async fn proxied(server: &PostgresServer) -> (Arc<DynKvLeaseStore>, TcpProxy) {
    let target = format!("127.0.0.1:{}", server.port())
        .parse()
        .expect("a socket address");
    let proxy = TcpProxy::start(target).await.expect("a proxy");
    let config = PostgresConfig::new(server.connection_to(proxy.port()))
        .with_progress_notify_interval(Duration::from_secs(1));
    let store: Arc<DynKvLeaseStore> = Arc::new(
        PostgresStore::connect(config)
            .await
            .expect("connect through the proxy"),
    );
    (store, proxy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_and_restart_of_the_server() {
    let (server, store, witness) = single().await;
    let seen = observe(&store, &witness).await;
    let (regs, leaders, _candidates) = hosts_and_an_election(&store, &witness).await;

    server.kill();
    tokio::time::sleep(Duration::from_secs(1)).await;
    server.restart().await.expect("PostgreSQL restarted");
    let back = Instant::now();
    // Leases live in the server's tables, on its clock: an outage shorter than the TTL costs
    // none of them; the recipes' next renewals and requests find the server back.
    let bound = TTL + SLACK;
    eventually(bound, "every registration healthy again", || {
        all_registered(&regs, &store)
    })
    .await;
    let healed = back.elapsed();
    eventually(bound, "a leader", || async { leaders.current().is_some() }).await;
    let led = back.elapsed();
    // Watch after recovery: a host registered now reaches the watcher.
    let after = HostRegistration::start(store.clone(), register("after"))
        .await
        .expect("a registration after the restart");
    eventually(
        bound,
        "the watcher to see a host registered after",
        || async { !seen.ups("after").is_empty() },
    )
    .await;
    let seen_after = back.elapsed();
    drop(after);
    // Watch after recovery: a TTL and a second with nothing changing.
    let before = standing(&regs, &seen, &leaders);
    assert_ridden_through("the restart", &store, &regs, &seen, &leaders, before).await;
    witness.check().await;
    println!(
        "measured: kill -9 of PostgreSQL, restarted 1 s later: registrations healthy {healed:?}, a leader {led:?}, a new host on the watcher {seen_after:?} after it answered; {} leaderships in all",
        leaders.count()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigstop_of_the_server_longer_than_the_ttl() {
    let (server, store, witness) = single().await;
    let seen = observe(&store, &witness).await;
    let regs = vec![HostRegistration::start(store.clone(), register("a"))
        .await
        .unwrap()];
    let leaders = Leaders::new(&witness);
    let _c1 = leaders.candidate(store.clone(), "x");
    let _c2 = leaders.candidate(store.clone(), "y");
    eventually(SLACK * 3, "a leader", || async {
        leaders.current().is_some()
    })
    .await;

    let stall = TTL + Duration::from_secs(2);
    server.pause();
    // Sessions asked for during the stall: granted only after SIGCONT, on the server's clock
    // then, so none is born expired.
    let stalled = Instant::now();
    let mut asked = Vec::new();
    for into in [1000, 2900, 4500].map(Duration::from_millis) {
        tokio::time::sleep_until(stalled + into).await;
        let store = store.clone();
        asked.push(tokio::spawn(async move {
            Session::new(store, SessionConfig::default().with_ttl(TTL)).await
        }));
    }
    tokio::time::sleep_until(stalled + stall).await;
    // Every session's local deadline has passed: nobody may believe it leads.
    assert_eq!(
        leaders.current(),
        None,
        "a leadership outlived its deadline while PostgreSQL was stopped"
    );
    server.resume();
    let back = Instant::now();
    // The server's clock ran on while it was stopped: every lease is past its deadline, and
    // the first sweep after SIGCONT expires them; the recipes start over.
    let bound = TTL + SWEEP + SLACK * 2;
    eventually(bound, "the registration healthy again", || {
        all_registered(&regs, &store)
    })
    .await;
    let healed = back.elapsed();
    eventually(bound, "a leader", || async { leaders.current().is_some() }).await;
    let led = back.elapsed();
    let created = store
        .get_key("hosts/a")
        .await
        .unwrap()
        .unwrap()
        .create_revision;
    eventually(bound, "the watcher to converge", || async {
        seen.up_since("a", created)
            && seen.replayed() == ["a"].map(String::from).into_iter().collect()
    })
    .await;
    let mut sessions = Vec::new();
    for s in asked {
        sessions.push(
            s.await
                .unwrap()
                .expect("a session asked for during the stall"),
        );
    }
    // A TTL and a second of quiet after recovery: nothing changes.
    let before = standing(&regs, &seen, &leaders);
    assert_ridden_through("recovery", &store, &regs, &seen, &leaders, before).await;
    for s in &sessions {
        assert!(
            !s.is_done(),
            "session {} ended after recovery: {:?}",
            s.lease(),
            s.health()
        );
    }
    witness.check().await;
    println!(
        "measured: SIGSTOP {stall:?} then SIGCONT: registration healthy {healed:?}, a leader {led:?} after; then {:?} without a change",
        TTL + SLACK
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_client_backend_killed_is_ridden_through() {
    let (server, store, witness) = single().await;
    let seen = observe(&store, &witness).await;
    let (regs, leaders, _candidates) = hosts_and_an_election(&store, &witness).await;
    let before = standing(&regs, &seen, &leaders);
    let mut killed = 0;
    for _ in 0..3 {
        killed += server.terminate_backends().await.expect("backends killed");
        tokio::time::sleep(TTL / 3).await;
    }
    assert!(killed > 0, "no backend was there to kill");
    // Watch after recovery: a host registered now reaches the watcher.
    let after = HostRegistration::start(store.clone(), register("after"))
        .await
        .expect("a registration after the kills");
    eventually(
        TTL,
        "the watcher to see a host registered after",
        || async { !seen.ups("after").is_empty() },
    )
    .await;
    drop(after);
    assert_ridden_through(
        "every backend killed, three times",
        &store,
        &regs,
        &seen,
        &leaders,
        before,
    )
    .await;
    witness.check().await;
    println!(
        "measured: {killed} client backends killed in three waves {:?} apart: no HostDown, no leader change, the watcher current",
        TTL / 3
    );
}

/// Host p through a proxy of its own (see [`parts::partitionable`]).
async fn partitionable() -> (PostgresServer, Partitionable) {
    let (server, store, witness) = single().await;
    let (client, proxy) = proxied(&server).await;
    (
        server,
        parts::partitionable(store, client, proxy, witness).await,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_shorter_than_the_ttl_is_ridden_through() {
    let (_server, setup) = partitionable().await;
    parts::a_partition_shorter_than_the_ttl_is_ridden_through(&setup).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_longer_than_the_ttl_expires_then_heals() {
    let (_server, setup) = partitionable().await;
    parts::a_partition_longer_than_the_ttl_expires_then_heals(&setup, SWEEP).await;
}

/// See [`parts::connections_that_die_without_a_reset_are_replaced`]: the session abandons an
/// unanswered renewal, which closes its connection, and the listener's own poll finds its
/// connection dead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_die_without_a_reset_are_replaced_within_the_ttl() {
    let (server, store, witness) = single().await;
    let (client, proxy) = proxied(&server).await;
    parts::connections_that_die_without_a_reset_are_replaced(store, client, &[proxy], witness)
        .await;
}

/// Far more requests at once than the store's pool has connections (16 by default), on the
/// same store as the sessions, for two TTLs: renewals wait their turn behind them and still
/// come in time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_requests_than_the_pool_holds_are_ridden_through() {
    const WRITERS: usize = 200;
    let (_server, store, witness) = single().await;
    let seen = observe(&store, &witness).await;
    let (regs, leaders, _candidates) = hosts_and_an_election(&store, &witness).await;
    let before = standing(&regs, &seen, &leaders);
    let until = Instant::now() + TTL * 2;
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let store = store.clone();
            tokio::spawn(async move {
                let (mut ok, mut failed) = (0u64, 0u64);
                while Instant::now() < until {
                    match store.put(PutRequest::new(format!("load/{w}"), "x")).await {
                        Ok(_) => ok += 1,
                        Err(_) => failed += 1,
                    }
                }
                (ok, failed)
            })
        })
        .collect();
    let (mut ok, mut failed) = (0, 0);
    for w in writers {
        let (o, f) = w.await.expect("a writer");
        ok += o;
        failed += f;
    }
    assert!(ok > 0, "no write went through");
    assert_ridden_through(
        &format!("{WRITERS} writers at once"),
        &store,
        &regs,
        &seen,
        &leaders,
        before,
    )
    .await;
    witness.check().await;
    println!(
        "measured: {WRITERS} writers at once on a pool of 16 for {:?}: {ok} writes ({:.0}/s), {failed} failed; no HostDown, no leader change",
        TTL * 2,
        ok as f64 / (TTL * 2).as_secs_f64()
    );
}

/// The witness is only as good as what it catches: wrong beliefs planted into a real run
/// (a rogue leader, a watcher's HostDown for a live host) and a write of the fenced key that
/// bypasses the fence with a stale token must each break an invariant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_witness_catches_planted_wrong_beliefs_and_an_unfenced_write() {
    let (_server, store, witness) = single().await;
    let seen = observe(&store, &witness).await;
    let (regs, leaders, _candidates) = hosts_and_an_election(&store, &witness).await;
    eventually(SLACK, "the watcher to see a, b and c", || async {
        seen.replayed().len() == 3
    })
    .await;
    let (_, token) = leaders.current().expect("a leader");
    let rogue = Revision(token.0 + 1_000_000);
    witness.leader_start("rogue", ELECTION, rogue);
    tokio::time::sleep(Duration::from_millis(200)).await;
    witness.leader_end("rogue", ELECTION, rogue);
    let watcher = witness.who("watcher");
    let revision = store.current_revision().await.unwrap();
    witness.record(Happening::Emitted(
        watcher,
        Emitted::Down("a".into(), revision),
    ));
    store
        .put(PutRequest::new(WORK, Revision(token.0 - 1).to_string()))
        .await
        .expect("the unfenced write");
    let (violations, _) = witness.violations().await;
    let broken: BTreeSet<&str> = violations.iter().map(|v| v.invariant.as_str()).collect();
    for expected in ["S1", "S2", "S3", "S5"] {
        assert!(
            broken.contains(expected),
            "{expected} not caught; caught: {violations:#?}"
        );
    }
    drop(regs);
    println!(
        "measured: planted wrong beliefs and an unfenced write caught on PostgreSQL as {broken:?}"
    );
}
