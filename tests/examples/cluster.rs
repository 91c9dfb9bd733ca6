//! A small cluster: four hosts register under leases (self-healing), each watches the others,
//! and they elect a leader with a fencing token. Along the way every stream is closed, the
//! store is compacted, and the leader crashes; the timeline shows what each host saw.
//!
//! On the embedded simulator (the default) it runs in virtual time, so 40 simulated seconds
//! take milliseconds:
//!
//! ```text
//! cargo run -p coord-tests --example cluster
//! ```
//!
//! On a real etcd (the same code, in real time; the stream-close fault is simulator-only):
//!
//! ```text
//! cargo run -p coord-tests --example cluster -- --etcd 127.0.0.1:2379
//! ```

use std::sync::Arc;
use std::time::Duration;

use coord_api::recipes::{
    ClusterEvent, ClusterWatcher, ClusterWatcherConfig, Election, HostRegistration,
    RegistrationConfig, Session, SessionConfig,
};
use coord_api::{DynKvLeaseStore, KvLeaseStore, KvLeaseStoreExt};
use coord_sim::SimStore;
use tokio::task::JoinHandle;
use tokio::time::{sleep, Instant};

const PREFIX: &str = "example/hosts/";
const ELECTION: &str = "example/leader";
const TTL: Duration = Duration::from_secs(5);

/// Prints a line stamped with the time since the start.
fn say(start: Instant, who: &str, what: impl std::fmt::Display) {
    let t = start.elapsed().as_secs_f64();
    println!("[{t:7.3}s] {who:<8} {what}");
}

/// A host: registers itself, watches the cluster, and campaigns. Aborting its task is a
/// crash: renewals stop, nothing is revoked, its key and leadership expire after the TTL.
fn spawn_host(store: Arc<DynKvLeaseStore>, start: Instant, name: &'static str) -> JoinHandle<()> {
    tokio::spawn(async move {
        let reg = HostRegistration::start(
            store.clone(),
            RegistrationConfig::new(format!("{PREFIX}{name}"), format!("{name}.example:8080"))
                .with_ttl(TTL),
        )
        .await
        .expect("register");
        say(
            start,
            name,
            format_args!("registered under lease {}", reg.lease_id()),
        );

        let mut watcher = ClusterWatcher::start(store.clone(), ClusterWatcherConfig::new(PREFIX))
            .await
            .expect("watch");
        let session = Session::new(store.clone(), SessionConfig::default().with_ttl(TTL))
            .await
            .expect("session");
        let election = Election::new(&session, ELECTION);
        let campaign = election.campaign(name);
        tokio::pin!(campaign);
        let mut leading = None;
        loop {
            tokio::select! {
                won = &mut campaign, if leading.is_none() => {
                    let l = won.expect("campaign");
                    say(start, name, format_args!("became leader (fencing token {})", l.token()));
                    leading = Some(l);
                }
                event = watcher.next() => match event {
                    Some(ClusterEvent::HostUp { host, .. }) if host != name => say(start, name, format_args!("sees {host} up")),
                    Some(ClusterEvent::HostDown { host, .. }) if host != name => say(start, name, format_args!("sees {host} down")),
                    Some(ClusterEvent::Resynced { revision }) => say(start, name, format_args!("watcher re-listed at revision {revision}")),
                    Some(_) => {}
                    None => return,
                },
            }
        }
    })
}

async fn store_from_args() -> (Arc<DynKvLeaseStore>, Option<SimStore>) {
    let args: Vec<String> = std::env::args().collect();
    match args.iter().position(|a| a == "--etcd") {
        None => {
            let sim = SimStore::new();
            (Arc::new(sim.clone()), Some(sim))
        }
        Some(i) => {
            let endpoints = args
                .get(i + 1)
                .expect("--etcd needs ENDPOINTS (host:port,...)");
            (etcd(endpoints).await, None)
        }
    }
}

async fn etcd(endpoints: &str) -> Arc<DynKvLeaseStore> {
    let config = coord_etcd::EtcdConfig::new(endpoints.split(','));
    Arc::new(
        coord_etcd::EtcdStore::connect(config)
            .await
            .expect("connect to etcd"),
    )
}

async fn run(store: Arc<DynKvLeaseStore>, sim: Option<SimStore>) {
    let start = Instant::now();
    let on = if sim.is_some() {
        "the embedded simulator (virtual time)"
    } else {
        "etcd (real time)"
    };
    println!("coord example: 4 hosts on {on}; lease TTL {TTL:?}\n");

    let mut hosts = vec![("node-a", spawn_host(store.clone(), start, "node-a"))];
    sleep(Duration::from_millis(50)).await;
    for name in ["node-b", "node-c"] {
        hosts.push((name, spawn_host(store.clone(), start, name)));
        sleep(Duration::from_millis(50)).await;
    }

    sleep(Duration::from_secs(5)).await;
    match &sim {
        Some(sim) => {
            say(
                start,
                "chaos",
                "every keep-alive and watch stream is closed",
            );
            sim.close_streams();
        }
        None => say(start, "chaos", "(stream closes are simulator-only)"),
    }

    sleep(Duration::from_secs(5)).await;
    let rev = store.current_revision().await.expect("revision");
    store.compact(rev).await.expect("compact");
    say(
        start,
        "chaos",
        format_args!("store compacted at revision {rev}"),
    );
    hosts.push(("node-d", spawn_host(store.clone(), start, "node-d")));

    sleep(Duration::from_secs(5)).await;
    let leader = store.leader(ELECTION).await.expect("a leader");
    let name = leader.value_str().into_owned();
    say(
        start,
        "chaos",
        format_args!("the leader, {name}, crashes: no revoke, its lease must expire"),
    );
    if let Some(i) = hosts.iter().position(|(n, _)| *n == name) {
        hosts.remove(i).1.abort();
    }

    sleep(TTL * 3).await;
    let left = store.get_prefix(PREFIX).await.expect("final listing");
    let leader = store
        .leader(ELECTION)
        .await
        .map(|kv| kv.value_str().into_owned());
    println!(
        "\nsummary: {:.1} s; {} hosts registered; leader {}; store at revision {}",
        start.elapsed().as_secs_f64(),
        left.count,
        leader.unwrap_or_else(|e| e.to_string()),
        left.revision
    );
    for (_, h) in hosts {
        h.abort();
    }
}

fn main() {
    let etcd = std::env::args().any(|a| a == "--etcd");
    let mut rt = tokio::runtime::Builder::new_current_thread();
    rt.enable_all();
    if !etcd {
        // Virtual time: sleeps and TTLs pass as soon as every task waits on the clock.
        rt.start_paused(true);
    }
    let rt = rt.build().expect("runtime");
    rt.block_on(async {
        let (store, sim) = store_from_args().await;
        run(store, sim).await;
    });
}
