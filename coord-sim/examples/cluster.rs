//! A small cluster on the embedded simulator: four hosts register under leases, a watcher
//! follows who is up, and the hosts elect a leader. Along the way one host crashes (its lease
//! is left to expire), the leader steps down gracefully, the store is compacted, and a new
//! host joins. Everything runs in virtual time, so 40 simulated seconds take milliseconds.
//!
//! Run it with `cargo run -p coord-sim --example cluster`.

use std::sync::Arc;
use std::time::Duration;

use coord_api::{
    Bytes, DynKvLeaseStore, EventKind, GetRequest, KvLeaseStore, KvLeaseStoreExt, PutRequest,
    WatchRequest,
};
use coord_sim::SimStore;
use futures::StreamExt;
use tokio::task::JoinHandle;
use tokio::time::{sleep, Instant};

const HOSTS: &str = "cluster/hosts/";
const ELECTION: &str = "cluster/leader";
const TTL: Duration = Duration::from_secs(5);

/// Prints a line stamped with the simulated time since the start.
fn say(start: Instant, who: &str, what: impl std::fmt::Display) {
    let t = start.elapsed().as_secs_f64();
    println!("[{t:7.3}s] {who:<8} {what}");
}

/// A host: registers under a lease, renews it every TTL/3, and campaigns for leadership.
/// Aborting its task is a crash: renewals stop and the lease is left to expire.
fn spawn_host(
    store: Arc<DynKvLeaseStore>,
    start: Instant,
    name: &'static str,
) -> (JoinHandle<()>, tokio::sync::oneshot::Sender<()>) {
    let (stop_tx, mut stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let lease = store.grant(TTL).await.expect("grant");
        store
            .put(
                PutRequest::new(format!("{HOSTS}{name}"), format!("{name}.example:8080"))
                    .with_lease(lease.id),
            )
            .await
            .expect("register");
        say(
            start,
            name,
            format_args!("registered under lease {} (TTL {:?})", lease.id, lease.ttl),
        );

        // Renewals run in this task, so aborting it (a crash) stops them too.
        let mut channel = store.keep_alive(lease.id).await.expect("keep-alive");
        let mut renew = tokio::time::interval_at(Instant::now() + TTL / 3, TTL / 3);
        let campaign = store.campaign(ELECTION, Bytes::from(name), lease.id);
        tokio::pin!(campaign);
        let mut leader = None;
        loop {
            tokio::select! {
                biased;
                _ = &mut stop_rx => break,
                _ = renew.tick() => {
                    if let Err(err) = channel.renew().await {
                        say(start, name, format_args!("lease lost: {err}"));
                        return;
                    }
                }
                won = &mut campaign, if leader.is_none() => {
                    let key = won.expect("campaign");
                    say(start, name, format_args!("became leader (fencing token {})", key.revision));
                    leader = Some(key);
                }
            }
        }
        // Graceful stop: resign, then revoke; the key disappears at once.
        if let Some(key) = &leader {
            store.resign(key).await.expect("resign");
            say(start, name, "resigned");
        }
        store.revoke(lease.id).await.expect("revoke");
        say(start, name, "stopped: lease revoked");
    });
    (task, stop_tx)
}

/// The membership watcher: snapshot, then watch from the snapshot's revision + 1.
fn spawn_watcher(store: Arc<DynKvLeaseStore>, start: Instant) -> JoinHandle<()> {
    tokio::spawn(async move {
        let snapshot = store
            .get(GetRequest::prefix(HOSTS))
            .await
            .expect("snapshot");
        let names: Vec<_> = snapshot.kvs.iter().map(|kv| host_name(&kv.key)).collect();
        say(
            start,
            "watcher",
            format_args!("snapshot at revision {}: {names:?}", snapshot.revision),
        );
        let mut events = store
            .watch(
                WatchRequest::prefix(HOSTS)
                    .with_start_revision(snapshot.revision + 1)
                    .with_prev_kv(),
            )
            .await
            .expect("watch");
        while let Some(Ok(batch)) = events.next().await {
            for e in batch.events {
                let host = host_name(&e.kv.key);
                match (e.kind, &e.prev_kv) {
                    (EventKind::Put, None) => say(
                        start,
                        "watcher",
                        format_args!(
                            "HostUp   {host} at {} (revision {})",
                            e.kv.value_str(),
                            e.kv.mod_revision
                        ),
                    ),
                    (EventKind::Put, Some(_)) => {
                        say(start, "watcher", format_args!("HostUpdated {host}"))
                    }
                    (EventKind::Delete, _) => say(
                        start,
                        "watcher",
                        format_args!("HostDown {host} (revision {})", e.kv.mod_revision),
                    ),
                }
            }
        }
    })
}

/// Follows the election and prints each leader.
fn spawn_observer(store: Arc<DynKvLeaseStore>, start: Instant) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut leaders = store.observe(ELECTION).await.expect("observe");
        while let Some(Ok(kv)) = leaders.next().await {
            say(
                start,
                "observer",
                format_args!(
                    "leader is now {} (token {})",
                    kv.value_str(),
                    kv.create_revision
                ),
            );
        }
    })
}

fn host_name(key: &[u8]) -> String {
    String::from_utf8_lossy(&key[HOSTS.len()..]).into_owned()
}

#[tokio::main(flavor = "current_thread", start_paused = true)]
async fn main() {
    let store: Arc<DynKvLeaseStore> = Arc::new(SimStore::new());
    let start = Instant::now();
    println!("coord example: a 4-host cluster on the embedded simulator (virtual time, lease TTL {TTL:?})\n");

    let (a, _stop_a) = spawn_host(store.clone(), start, "node-a");
    sleep(Duration::from_millis(10)).await;
    let (_b, stop_b) = spawn_host(store.clone(), start, "node-b");
    sleep(Duration::from_millis(10)).await;
    let (_c, stop_c) = spawn_host(store.clone(), start, "node-c");
    sleep(Duration::from_secs(1)).await;
    let watcher = spawn_watcher(store.clone(), start);
    let observer = spawn_observer(store.clone(), start);

    sleep(Duration::from_secs(9)).await;
    say(
        start,
        "chaos",
        "node-a crashes: no more renewals, no revoke; its lease must expire",
    );
    a.abort();

    sleep(Duration::from_secs(10)).await;
    say(start, "chaos", "node-b (now leader) stops gracefully");
    stop_b.send(()).ok();

    sleep(Duration::from_secs(5)).await;
    let rev = store.current_revision().await.expect("revision");
    store.compact(rev).await.expect("compact");
    say(
        start,
        "chaos",
        format_args!("store compacted at revision {rev}: the live watcher is unaffected"),
    );
    let (_d, stop_d) = spawn_host(store.clone(), start, "node-d");

    sleep(Duration::from_secs(10)).await;
    say(
        start,
        "chaos",
        "shutting down: node-c and node-d stop gracefully",
    );
    stop_c.send(()).ok();
    sleep(Duration::from_millis(100)).await;
    stop_d.send(()).ok();
    sleep(Duration::from_millis(100)).await;

    let left = store.get_prefix(HOSTS).await.expect("final read");
    println!(
        "\nsummary: {:.1} s simulated; {} hosts registered at the end; store at revision {}",
        start.elapsed().as_secs_f64(),
        left.count,
        left.revision
    );
    watcher.abort();
    observer.abort();
}
