//! A notification lost while the watching store's connections were cut: the write it
//! announced must still reach the watch, by the store's poll of the revision, with no later
//! write to wake it. A watch fed by notifications alone (the planted
//! `postgres-watch-fed-by-notifications`) never delivers it.

use std::time::{Duration, Instant};

use coord_api::testkit::{eventually, within};
use coord_api::{KvLeaseStore, PutRequest, WatchRequest};
use coord_postgres::testing::{PostgresServer, ProxyMode, TcpProxy};
use coord_postgres::{PostgresConfig, PostgresStore};
use futures::StreamExt;

/// The store's poll interval (its default): the latency a lost notification may cost.
const POLL: Duration = Duration::from_secs(1);
/// The bound asserted: the poll, the listener's reconnection and the watch's read of the
/// revision, with slack for a loaded 2-core machine. The defect never delivers.
const BOUND: Duration = Duration::from_secs(10);

/// The watching store's sessions, its listener's among them, by their name.
const WATCHING: &str = "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'watching'";

/// Runs the case on a server of its own; panics if the write is not delivered in time.
pub(crate) async fn a_write_whose_notification_was_lost_reaches_the_watch() {
    let server = PostgresServer::start().await.expect("PostgreSQL");
    let target = format!("127.0.0.1:{}", server.port())
        .parse()
        .expect("an address");
    let proxy = TcpProxy::start(target).await.expect("a proxy");
    let config =
        PostgresConfig::new(server.connection_to(proxy.port()) + " application_name=watching");
    assert_eq!(config.poll_interval(), POLL, "the default poll interval");
    let watching = PostgresStore::connect(config).await.expect("a store");
    let mut watch = watching
        .watch(WatchRequest::prefix("n/"))
        .await
        .expect("a watch");
    let writer = server.store().await;
    let admin = server.admin().await.expect("an admin session");
    let sessions = || async {
        let row = admin
            .query_one(WATCHING, &[])
            .await
            .expect("pg_stat_activity");
        row.get::<_, i64>(0)
    };

    // Connected, a write comes.
    writer
        .put(PutRequest::new("n/1", "v"))
        .await
        .expect("a put");
    let first = within(BOUND, "n/1 on the watch", watch.next()).await;
    assert!(first.is_some_and(|r| r.is_ok_and(|r| r.events[0].kv.key == "n/1")));

    // Cut off: the store's sessions end, the listener's with them, and the write's
    // notification goes to nobody.
    proxy.set_mode(ProxyMode::Reset);
    eventually(BOUND, "the watching store's sessions gone", || async {
        sessions().await == 0
    })
    .await;
    let put = writer
        .put(PutRequest::new("n/2", "v"))
        .await
        .expect("a put");
    proxy.set_mode(ProxyMode::Pass);
    let healed = Instant::now();
    let got = within(BOUND, "n/2 on the watch, with no later write", watch.next())
        .await
        .expect("the watch open")
        .expect("a batch");
    assert_eq!(got.events[0].kv.key, "n/2");
    assert_eq!(got.events[0].kv.mod_revision, put.revision);
    println!(
        "measured: a write whose notification was lost reached the watch {:?} after the link healed (poll {POLL:?})",
        healed.elapsed()
    );
}
