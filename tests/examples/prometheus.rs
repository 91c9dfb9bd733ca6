//! coord's metrics exported for Prometheus. The service installs the exporter; coord only
//! records, through the `metrics` facade (every name is in `coord_api::metrics`).
//!
//! On the embedded simulator (the default), three hosts register, watch and elect a leader
//! in virtual time while a lease is revoked, the leader's key is deleted and the store
//! compacts past a cut-off watcher; then the page Prometheus would scrape is printed, and the
//! run fails unless every metric in coord's table is on it:
//!
//! ```text
//! cargo run -p coord-tests --example prometheus
//! ```
//!
//! On a real etcd, the same hosts in real time, with the page served for Prometheus to scrape
//! until Ctrl-C:
//!
//! ```text
//! cargo run -p coord-tests --example prometheus -- --etcd 127.0.0.1:2379 --listen 127.0.0.1:9000
//! curl -s 127.0.0.1:9000/metrics | grep coord_
//! ```

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use coord_api::recipes::{
    ClusterWatcher, ClusterWatcherConfig, Election, HostRegistration, RegistrationConfig, Session,
    SessionConfig,
};
use coord_api::{DynKvLeaseStore, KvLeaseStore, KvLeaseStoreExt, TxnRequest};
use coord_sim::SimStore;
use metrics_exporter_prometheus::PrometheusBuilder;
use tokio::time::sleep;

const PREFIX: &str = "example/hosts/";
const ELECTION: &str = "example/leader";
const TTL: Duration = Duration::from_secs(5);
const NAMES: [&str; 3] = ["host-a", "host-b", "host-c"];

/// A host: registers, watches the others, campaigns, and writes through its fence while it
/// leads. It runs until the process ends.
async fn host(store: Arc<DynKvLeaseStore>, name: &'static str) {
    let _registration = HostRegistration::start(
        store.clone(),
        RegistrationConfig::new(format!("{PREFIX}{name}"), name).with_ttl(TTL),
    )
    .await
    .expect("register");
    let mut watcher = ClusterWatcher::start(store.clone(), ClusterWatcherConfig::new(PREFIX))
        .await
        .expect("watch");
    tokio::spawn(async move { while watcher.next().await.is_some() {} });
    loop {
        let Ok(session) = Session::new(store.clone(), SessionConfig::default().with_ttl(TTL)).await
        else {
            sleep(Duration::from_secs(1)).await;
            continue;
        };
        let election = Election::new(&session, ELECTION);
        let Ok(leading) = election.campaign(name).await else {
            continue;
        };
        // Work while leading: a fenced write each second, refused once deposed.
        loop {
            let write = TxnRequest::new().and_then([coord_api::PutRequest::new(
                "example/output",
                format!("from {name}"),
            )]);
            if leading.txn(write).await.is_err() {
                break;
            }
            tokio::select! {
                _ = leading.lost() => break,
                _ = sleep(Duration::from_secs(1)) => {}
            }
        }
    }
}

/// The faults, on the simulator: a revoked lease (a registration heals), a registered key
/// deleted (put back), the leader's key deleted (a new leader; the old one's next write is
/// fenced out), a watcher cut off while the store compacts (it re-lists).
async fn faults(sim: &SimStore, hosts: &[SimStore]) {
    let admin = sim.connect();
    sleep(TTL).await;
    let key = format!("{PREFIX}host-a");
    if let Ok(Some(kv)) = admin.get_key(key).await {
        let _ = admin.revoke(kv.lease).await;
    }
    sleep(TTL).await;
    let _ = admin.delete_key(format!("{PREFIX}host-b")).await;
    sleep(TTL).await;
    // The leader's messages held while its key is deleted: its next write, sent before it
    // can learn of the delete, reaches the store after it and is refused.
    if let Ok(leader) = admin.leader(ELECTION).await {
        let i = NAMES
            .iter()
            .position(|n| leader.value == n.as_bytes())
            .expect("a host leads");
        hosts[i].hold();
        let _ = admin.delete_key(leader.key.to_vec()).await;
        sleep(Duration::from_millis(1500)).await;
        hosts[i].release();
    }
    sleep(TTL).await;
    hosts[2].partition();
    let _ = admin.put_value(format!("{PREFIX}visitor"), "v").await;
    if let Ok(now) = admin.current_revision().await {
        let _ = admin.compact(now).await;
    }
    sleep(Duration::from_secs(1)).await;
    hosts[2].repair();
    sleep(TTL * 2).await;
}

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    let i = args.iter().position(|a| a == name)?;
    Some(
        args.get(i + 1)
            .unwrap_or_else(|| panic!("{name} needs a value"))
            .clone(),
    )
}

fn main() {
    match arg("--etcd") {
        None => simulated(),
        Some(endpoints) => real(&endpoints, arg("--listen")),
    }
}

fn simulated() {
    let recorder = PrometheusBuilder::new().build_recorder();
    let page = recorder.handle();
    metrics::set_global_recorder(recorder).expect("the only recorder");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        // Virtual time: the minute below passes as soon as every task waits on the clock.
        .start_paused(true)
        .build()
        .expect("runtime");
    rt.block_on(async {
        // 2 ms each way, so that the renewal latencies on the page are not all zero.
        let sim = SimStore::with_config(
            coord_sim::SimConfig::default().with_latency(Duration::from_millis(2)),
        );
        let clients: Vec<SimStore> = (0..3).map(|_| sim.connect()).collect();
        for (client, name) in clients.iter().zip(NAMES) {
            tokio::spawn(host(Arc::new(client.clone()), name));
        }
        faults(&sim, &clients).await;
    });
    let text = page.render();
    print!("{text}");
    let missing: Vec<&str> = coord_api::metrics::ALL
        .iter()
        .copied()
        .filter(|name| !text.lines().any(|l| l.starts_with(name)))
        .collect();
    if !missing.is_empty() {
        eprintln!("\nmissing from the page: {missing:?}");
        std::process::exit(1);
    }
    eprintln!(
        "\nevery one of coord's {} metrics is on the page",
        coord_api::metrics::ALL.len()
    );
}

fn real(endpoints: &str, listen: Option<String>) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let listen: SocketAddr = listen
            .as_deref()
            .unwrap_or("127.0.0.1:9000")
            .parse()
            .expect("--listen ADDR:PORT");
        PrometheusBuilder::new()
            .with_http_listener(listen)
            .install()
            .expect("install the exporter");
        println!("serving coord's metrics on http://{listen}/metrics; Ctrl-C to stop");
        let config = coord_etcd::EtcdConfig::new(endpoints.split(','));
        let store: Arc<DynKvLeaseStore> = Arc::new(
            coord_etcd::EtcdStore::connect(config)
                .await
                .expect("connect to etcd"),
        );
        for name in NAMES {
            tokio::spawn(host(store.clone(), name));
        }
        tokio::signal::ctrl_c().await.expect("wait for Ctrl-C");
    });
}
