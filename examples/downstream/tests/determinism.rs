//! A scenario on `SimStore` as a user's test writes it (a current-thread runtime with paused
//! time and no seed, what `#[tokio::test(start_paused = true)]` builds), run 20 times: every
//! history is the same, in a build without `--cfg tokio_unstable`. Three ticker nodes (each a
//! registration and a candidate on one lease), a watcher, and two writes of one client held and released together (which used to commit in
//! either order, as tokio woke a watch channel's waiters in a random order).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use coord_api::recipes::{ClusterWatcher, ClusterWatcherConfig};
use coord_api::{DynKvLeaseStore, KvLeaseStoreExt};
use coord_downstream::{Ticker, HOSTS};
use coord_sim::SimStore;
use tokio::time::Instant;

fn scenario() -> Vec<String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let sim = SimStore::new();
        let start = Instant::now();
        let log = Arc::new(Mutex::new(Vec::new()));
        let sink = log.clone();
        sim.on_journal(move |at, entry| {
            sink.lock()
                .unwrap()
                .push(format!("{:?} {entry:?}", at - start));
        });
        let clients: Vec<SimStore> = (0..3).map(|_| sim.connect()).collect();
        let stores: Vec<Arc<DynKvLeaseStore>> = clients
            .iter()
            .map(|c| Arc::new(c.clone()) as Arc<DynKvLeaseStore>)
            .collect();
        let ttl = Duration::from_secs(3);
        let mut nodes = Vec::new();
        for (i, s) in stores.iter().enumerate() {
            let ticker = Ticker {
                store: s.clone(),
                fenced: true,
                every: ttl / 5,
            };
            let log = log.clone();
            nodes.push(ticker.start(&format!("n{i}"), ttl, move |ticker, term| {
                let log = log.clone();
                async move {
                    log.lock()
                        .unwrap()
                        .push(format!("n{i} leads {}", term.token()));
                    ticker.term(&term).await;
                }
            }));
        }
        let mut watcher =
            ClusterWatcher::start(stores[0].clone(), ClusterWatcherConfig::new(HOSTS))
                .await
                .unwrap();
        let watched = log.clone();
        tokio::spawn(async move {
            while let Some(e) = watcher.next().await {
                watched.lock().unwrap().push(format!("watcher {e:?}"));
            }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        // Two writes of one client, held, then released together.
        clients[1].hold();
        let (x, y) = (stores[1].clone(), stores[1].clone());
        let wx = tokio::spawn(async move { x.put_value("x", "1").await });
        let wy = tokio::spawn(async move { y.put_value("y", "1").await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        clients[1].release();
        let _ = (wx.await, wy.await);
        // A partition longer than the TTL, and every stream closed.
        clients[0].partition();
        tokio::time::sleep(Duration::from_secs(4)).await;
        clients[0].repair();
        sim.close_streams();
        tokio::time::sleep(Duration::from_secs(10)).await;
        for node in nodes {
            let _ = node.stop().await;
        }
        let out = log.lock().unwrap().clone();
        out
    })
}

#[test]
fn twenty_runs_give_one_history_without_build_flags() {
    #[cfg(tokio_unstable)]
    panic!("built with --cfg tokio_unstable: the test proves nothing");
    let first = scenario();
    assert!(first.len() > 50, "the scenario does things: {first:#?}");
    for run in 1..20 {
        let again = scenario();
        assert_eq!(again, first, "run {run} differs from the first");
    }
}
