//! Concurrent writers, readers and one watch: a read at revision R shows every write up to R,
//! and every committed write reaches the watch, once, in revision order. What breaks when
//! revisions are not taken in commit order (the planted `postgres-revision-from-a-sequence`):
//! a read at a later revision misses an earlier write still uncommitted, and a watch that has
//! read up to the later revision never sees the earlier one.

use std::collections::BTreeSet;
use std::time::Duration;

use coord_api::{GetRequest, KvLeaseStore, PutRequest, Revision, WatchRequest};
use coord_postgres::testing::PostgresServer;
use futures::StreamExt;

const WRITERS: usize = 4;
const PUTS: usize = 60;

/// Runs the case on a server of its own; panics if a write is missing from the watch.
pub(crate) async fn concurrent_writes_reach_a_watch_in_revision_order() {
    let server = PostgresServer::start().await.expect("PostgreSQL");
    let watching = server.store().await;
    let mut watch = watching
        .watch(WatchRequest::prefix("c/"))
        .await
        .expect("a watch");
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let store = server.store().await;
        writers.push(tokio::spawn(async move {
            let mut revisions = Vec::new();
            for i in 0..PUTS {
                let put = PutRequest::new(format!("c/{w}/{i:03}"), "v");
                revisions.push(store.put(put).await.expect("a put").revision);
            }
            revisions
        }));
    }
    // Readers poll while the writers write: each read's header revision against the keys it
    // saw, to be judged once every write is known.
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut readers = Vec::new();
    for _ in 0..2 {
        let store = server.store().await;
        let done = done.clone();
        readers.push(tokio::spawn(async move {
            let mut reads = Vec::new();
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let got = store.get(GetRequest::prefix("c/")).await.expect("a read");
                reads.push((got.revision, got.kvs.len()));
            }
            reads
        }));
    }
    let mut written = BTreeSet::new();
    for w in writers {
        written.extend(w.await.expect("a writer"));
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    for r in readers {
        for (at, saw) in r.await.expect("a reader") {
            // Every key is written once: the writes up to `at` are the keys a read at `at`
            // must show.
            let due = written.iter().filter(|w| **w <= at).count();
            assert_eq!(
                saw, due,
                "a read at revision {at} showed {saw} keys of the {due} written up to it: a \
                 revision became visible before an earlier one"
            );
        }
    }
    let mut seen: Vec<Revision> = Vec::new();
    let all = async {
        while seen.len() < written.len() {
            match watch.next().await {
                Some(Ok(batch)) => seen.extend(batch.events.iter().map(|e| e.kv.mod_revision)),
                other => return Err(format!("the watch ended: {other:?}")),
            }
        }
        Ok::<(), String>(())
    };
    // A watch that skipped a revision waits for it forever: give it the bound, then judge.
    let waited = tokio::time::timeout(Duration::from_secs(10), all).await;
    let missing: Vec<&Revision> = written.iter().filter(|r| !seen.contains(r)).collect();
    if let Ok(Err(ended)) = &waited {
        panic!("{ended}");
    }
    assert!(
        missing.is_empty() && waited.is_ok(),
        "{} of {} writes never reached the watch (revisions {:?}...)",
        missing.len(),
        written.len(),
        &missing[..missing.len().min(5)]
    );
    assert!(
        seen.windows(2).all(|p| p[0] < p[1]),
        "the watch delivered revisions out of order"
    );
}
