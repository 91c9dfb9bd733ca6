//! etcd and PostgreSQL side by side, through the same `KvLeaseStore`: put latency, concurrent
//! put throughput, and the delay from a put's return to its event at a watch on another
//! connection, under a steady write load. The two backends run interleaved, round by round,
//! in one run, so a busy machine weighs on both alike. Prints the figures; BENCHMARKS.md
//! keeps them by hand.
//!
//! ```text
//! cargo bench -p coord-tests --bench backends
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use coord_api::{DynKvLeaseStore, KvLeaseStore, PutRequest, WatchRequest};
use coord_etcd::testing::EtcdCluster;
use coord_postgres::testing::PostgresServer;
use futures::StreamExt;

const ROUNDS: usize = 5;
const PUTS: usize = 200;
const CONCURRENT: usize = 32;
/// Writes per second while the watch delay is measured.
const LOAD: u64 = 200;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

#[derive(Default)]
struct Figures {
    put: Vec<Duration>,
    per_second: Vec<f64>,
    delay: Vec<Duration>,
}

async fn sequential_puts(store: &DynKvLeaseStore, round: usize, into: &mut Vec<Duration>) {
    for i in 0..PUTS {
        let t = Instant::now();
        store
            .put(PutRequest::new(format!("seq/{round}/{i}"), "v"))
            .await
            .expect("a put");
        into.push(t.elapsed());
    }
}

async fn concurrent_puts(store: Arc<DynKvLeaseStore>, round: usize) -> f64 {
    let start = Instant::now();
    let tasks: Vec<_> = (0..CONCURRENT)
        .map(|t| {
            let store = store.clone();
            tokio::spawn(async move {
                for i in 0..PUTS / 4 {
                    store
                        .put(PutRequest::new(format!("con/{round}/{t}/{i}"), "v"))
                        .await
                        .expect("a put");
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("a writer");
    }
    (CONCURRENT * PUTS / 4) as f64 / start.elapsed().as_secs_f64()
}

/// Puts at `LOAD` per second from `writer`; each put's return to its event at `watcher`'s watch.
async fn watch_delays(
    writer: Arc<DynKvLeaseStore>,
    watcher: &DynKvLeaseStore,
    round: usize,
    into: &mut Vec<Duration>,
) {
    let prefix = format!("load/{round}/");
    let mut watch = watcher
        .watch(WatchRequest::prefix(prefix.clone()))
        .await
        .expect("a watch");
    let (sent_tx, mut sent_rx) = tokio::sync::mpsc::unbounded_channel();
    let writing = tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / LOAD));
        for i in 0..PUTS {
            tick.tick().await;
            let rev = writer
                .put(PutRequest::new(format!("{prefix}{i}"), "v"))
                .await
                .expect("a put")
                .revision;
            sent_tx.send((rev, Instant::now())).expect("the reader");
        }
    });
    let mut arrived = std::collections::HashMap::new();
    while arrived.len() < PUTS {
        let batch = watch.next().await.expect("events").expect("a batch");
        for e in batch.events {
            arrived.insert(e.kv.mod_revision, Instant::now());
        }
    }
    writing.await.expect("the writer");
    while let Ok((rev, returned)) = sent_rx.try_recv() {
        // An event may come before the put's own answer: that is no delay at all.
        into.push(arrived[&rev].saturating_duration_since(returned));
    }
}

async fn round(
    name: &str,
    store: Arc<DynKvLeaseStore>,
    other: Arc<DynKvLeaseStore>,
    r: usize,
    f: &mut Figures,
) {
    sequential_puts(&*store, r, &mut f.put).await;
    f.per_second.push(concurrent_puts(store.clone(), r).await);
    watch_delays(store, &*other, r, &mut f.delay).await;
    println!("  round {r} done: {name}");
}

fn report(name: &str, f: &mut Figures) {
    f.put.sort();
    f.delay.sort();
    f.per_second.sort_by(f64::total_cmp);
    println!(
        "{name:<10} put median {} p99 {} | {CONCURRENT} concurrent: median {:.0} puts/s | \
         watch delay at {LOAD} writes/s: median {} p99 {} max {}",
        ms(percentile(&f.put, 0.5)),
        ms(percentile(&f.put, 0.99)),
        f.per_second[f.per_second.len() / 2],
        ms(percentile(&f.delay, 0.5)),
        ms(percentile(&f.delay, 0.99)),
        ms(*f.delay.last().expect("delays")),
    );
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("backend benchmarks: run them with `cargo bench -p coord-tests --bench backends`");
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let etcd = EtcdCluster::single().await.expect("etcd");
        let pg = PostgresServer::start().await.expect("PostgreSQL");
        let e1: Arc<DynKvLeaseStore> = Arc::new(etcd.store().await);
        let e2: Arc<DynKvLeaseStore> = Arc::new(etcd.store().await);
        let p1: Arc<DynKvLeaseStore> = Arc::new(pg.store().await);
        let p2: Arc<DynKvLeaseStore> = Arc::new(pg.store().await);
        let (mut fe, mut fp) = (Figures::default(), Figures::default());
        for r in 0..ROUNDS {
            // Alternate which goes first, so neither always runs on a warmer machine.
            if r % 2 == 0 {
                round("etcd", e1.clone(), e2.clone(), r, &mut fe).await;
                round("postgres", p1.clone(), p2.clone(), r, &mut fp).await;
            } else {
                round("postgres", p1.clone(), p2.clone(), r, &mut fp).await;
                round("etcd", e1.clone(), e2.clone(), r, &mut fe).await;
            }
        }
        report("etcd", &mut fe);
        report("postgres", &mut fp);
    });
}
