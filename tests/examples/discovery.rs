//! A tonic client that balances over the hosts registered in coord, following membership.
//!
//! Two gRPC servers (tonic's health service, so no protobuf of our own) register their
//! addresses under `discovery/hosts/`; the client's channel is fed by `coord_api::recipes::
//! discover` over a `ClusterWatcher`. Server `a` answers `who/a`, server `b` does not, so each
//! call says who served it. The client sees both; `a` deregisters and every call goes to `b`
//! (while `a`'s server still runs: the balancer dropped it because its key went); `a`
//! registers again and gets calls again.
//!
//! On the embedded simulator (in real time, as tonic's sockets are real):
//!
//! ```text
//! cargo run -p coord-tests --example discovery
//! ```
//!
//! On a real etcd:
//!
//! ```text
//! cargo run -p coord-tests --example discovery -- --etcd 127.0.0.1:2379
//! ```

use std::sync::Arc;
use std::time::Duration;

use coord_api::recipes::{
    discover, ClusterWatcher, ClusterWatcherConfig, HostRegistration, RegistrationConfig,
};
use coord_api::DynKvLeaseStore;
use coord_sim::SimStore;
use futures::StreamExt;
use tokio::time::{sleep, Instant};
use tonic::transport::channel::Change;
use tonic::transport::{Channel, Endpoint, Server};
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::ServingStatus;

const PREFIX: &str = "discovery/hosts/";
/// Bound on each wait for the client to see a change, in real time: a watch delivery and a
/// balancer update take milliseconds; the slack is for a loaded machine.
const WITHIN: Duration = Duration::from_secs(15);

/// Starts a health server on a free loopback port that answers `who/<name>`; returns its URL.
async fn server(name: &str) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("address");
    let (reporter, service) = tonic_health::server::health_reporter();
    reporter
        .set_service_status(format!("who/{name}"), ServingStatus::Serving)
        .await;
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    tokio::spawn(async move {
        Server::builder()
            .add_service(service)
            .serve_with_incoming(incoming)
            .await
            .expect("serve");
    });
    format!("http://{addr}")
}

fn registration(name: &str, url: &str) -> RegistrationConfig {
    RegistrationConfig::new(format!("{PREFIX}{name}"), url.to_owned())
        .with_ttl(Duration::from_secs(5))
}

/// Who served one call: `a` knows `who/a`, `b` answers it with NotFound.
async fn who(client: &mut HealthClient<Channel>) -> Option<&'static str> {
    let call = client.check(HealthCheckRequest {
        service: "who/a".into(),
    });
    match tokio::time::timeout(Duration::from_secs(2), call).await {
        Ok(Ok(_)) => Some("a"),
        Ok(Err(status)) if status.code() == tonic::Code::NotFound => Some("b"),
        _ => None,
    }
}

/// Calls until `done` says the answers so far show what it waits for, at most [`WITHIN`].
async fn calls_until(
    client: &mut HealthClient<Channel>,
    what: &str,
    mut done: impl FnMut(&[&'static str]) -> bool,
) {
    let start = Instant::now();
    let mut answers = Vec::new();
    while !done(&answers) {
        if start.elapsed() > WITHIN {
            eprintln!("FAILED: {what}: not within {WITHIN:?}; answers {answers:?}");
            std::process::exit(1);
        }
        if let Some(w) = who(client).await {
            answers.push(w);
        }
        sleep(Duration::from_millis(10)).await;
    }
    let a = answers.iter().filter(|w| **w == "a").count();
    println!(
        "[{:>6.3}s] {what}: {} calls, {a} to a, {} to b",
        start.elapsed().as_secs_f64(),
        answers.len(),
        answers.len() - a
    );
}

async fn run(store: Arc<DynKvLeaseStore>) {
    let (url_a, url_b) = (server("a").await, server("b").await);
    let reg_a = HostRegistration::start(store.clone(), registration("a", &url_a))
        .await
        .expect("register a");
    let _reg_b = HostRegistration::start(store.clone(), registration("b", &url_b))
        .await
        .expect("register b");
    println!("a serves at {url_a}, b at {url_b}; both registered");

    let watcher = ClusterWatcher::start(store.clone(), ClusterWatcherConfig::new(PREFIX))
        .await
        .expect("watch");
    let mut changes = discover(watcher, |_, metadata| {
        Endpoint::from_shared(metadata.to_vec()).ok()
    });
    let (channel, tx) = Channel::balance_channel::<String>(16);
    tokio::spawn(async move {
        while let Some(Ok(change)) = changes.next().await {
            // tonic's channel takes its own copy of tower's `Change`.
            let change = match change {
                tower::discover::Change::Insert(host, endpoint) => Change::Insert(host, endpoint),
                tower::discover::Change::Remove(host) => Change::Remove(host),
            };
            if tx.send(change).await.is_err() {
                return;
            }
        }
    });
    let mut client = HealthClient::new(channel);

    calls_until(&mut client, "both hosts get calls", |w| {
        w.contains(&"a") && w.contains(&"b")
    })
    .await;

    reg_a.stop().await.expect("deregister a");
    println!("a deregistered (its server still runs)");
    // Calls already balanced to a may finish there; then 50 in a row go to b.
    calls_until(&mut client, "only b gets calls", |w| {
        w.len() >= 50 && w[w.len() - 50..].iter().all(|x| *x == "b")
    })
    .await;

    let _reg_a = HostRegistration::start(store.clone(), registration("a", &url_a))
        .await
        .expect("register a again");
    println!("a registered again");
    calls_until(&mut client, "a gets calls again", |w| w.contains(&"a")).await;
    println!("ok: the client's calls followed membership");
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let store: Arc<DynKvLeaseStore> = match args.iter().position(|a| a == "--etcd") {
            None => Arc::new(SimStore::new()),
            Some(i) => {
                let endpoints = args.get(i + 1).expect("--etcd needs ENDPOINTS");
                Arc::new(
                    coord_etcd::EtcdStore::connect(coord_etcd::EtcdConfig::new(
                        endpoints.split(','),
                    ))
                    .await
                    .expect("connect to etcd"),
                )
            }
        };
        run(store).await;
    });
}
