//! etcd and PostgreSQL side by side, through the same `KvLeaseStore`: put latency, concurrent
//! put throughput, the delay from a put's return to its event at a watch on another
//! connection under a steady write load, and an election's failover (resign to successor; a
//! crashed leader to successor, from its last renewal, TTL 2 s). The two backends run interleaved, round by round,
//! in one run, so a busy machine weighs on both alike. Prints the figures; BENCHMARKS.md
//! keeps them by hand.
//!
//! ```text
//! cargo bench -p coord-tests --bench backends
//! ```

#[path = "shared/leaders.rs"]
mod leaders;

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

/// The crashed leader's TTL: the store expires its lease that long after its last renewal.
const TTL: Duration = Duration::from_secs(2);

#[derive(Default)]
struct Figures {
    put: Vec<Duration>,
    per_second: Vec<f64>,
    delay: Vec<Duration>,
    resign: Vec<Duration>,
    crash: Vec<Duration>,
}

/// One resignation and one crash of a leader, each timed to its successor's leadership.
async fn failover(store: &Arc<DynKvLeaseStore>, round: usize, f: &mut Figures) {
    let (_a, _b, lead, waiting) =
        leaders::leader_and_waiting(store, &format!("fo/resign/{round}"), TTL).await;
    let t = Instant::now();
    lead.resign().await.expect("a resignation");
    let _successor = waiting.await.expect("the successor").expect("a leadership");
    f.resign.push(t.elapsed());
    let (a, _b, lead, waiting) =
        leaders::leader_and_waiting(store, &format!("fo/crash/{round}"), TTL).await;
    // From the last renewal: the store expires the lease TTL after it, whenever in the
    // renewal period the crash came. Dropped, nothing is revoked.
    let renewed = (a.deadline() + a.clock_margin() - TTL).into_std();
    drop(lead);
    drop(a);
    let _successor = waiting.await.expect("the successor").expect("a leadership");
    f.crash.push(renewed.elapsed());
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
    watch_delays(store.clone(), &*other, r, &mut f.delay).await;
    failover(&store, r, f).await;
    println!("  round {r} done: {name}");
}

fn report(name: &str, f: &mut Figures) {
    f.put.sort();
    f.delay.sort();
    f.resign.sort();
    f.crash.sort();
    f.per_second.sort_by(f64::total_cmp);
    println!(
        "{name:<10} put median {} p99 {} | {CONCURRENT} concurrent: median {:.0} puts/s | \
         watch delay at {LOAD} writes/s: median {} p99 {} max {} | \
         resign to successor: median {} max {} | crash to successor (TTL {TTL:?}): median {} max {}",
        ms(percentile(&f.put, 0.5)),
        ms(percentile(&f.put, 0.99)),
        f.per_second[f.per_second.len() / 2],
        ms(percentile(&f.delay, 0.5)),
        ms(percentile(&f.delay, 0.99)),
        ms(*f.delay.last().expect("delays")),
        ms(percentile(&f.resign, 0.5)),
        ms(*f.resign.last().expect("resignations")),
        ms(percentile(&f.crash, 0.5)),
        ms(*f.crash.last().expect("crashes")),
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
