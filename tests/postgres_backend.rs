//! `PostgresStore` against a real PostgreSQL server under the faults the conformance suite does
//! not make: every client connection killed by the server (`pg_terminate_backend`, as an
//! operator or a failover does), and the server killed with SIGKILL and restarted.

use std::time::Duration;

use coord_api::testkit::{eventually, within};
use coord_api::{
    Error, GetRequest, KvLeaseStore, KvLeaseStoreExt, PutRequest, TxnRequest, WatchRequest,
};
use coord_postgres::testing::PostgresServer;
use coord_postgres::PostgresStore;
use futures::StreamExt;

#[path = "postgres/commit.rs"]
mod commit;
#[path = "postgres/notifications.rs"]
mod notifications;
#[path = "postgres/ordering.rs"]
mod ordering;

/// A commit held past the request timeout: `Indeterminate`, applied once, never sent again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_commit_is_indeterminate_and_not_sent_again() {
    commit::a_held_commit_is_indeterminate_and_not_sent_again().await;
}

/// A notification lost while the watching store was cut off costs the poll, not the event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_whose_notification_was_lost_reaches_the_watch() {
    notifications::a_write_whose_notification_was_lost_reaches_the_watch().await;
}

/// Four writers at once, one watch: every write, once, in revision order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writes_reach_a_watch_in_revision_order() {
    ordering::concurrent_writes_reach_a_watch_in_revision_order().await;
}

/// A write retried until it is known to have applied: `Unavailable` is safe to retry, and an
/// `Indeterminate` put is re-read before it is sent again.
async fn put_surely(store: &dyn KvLeaseStore, key: &str, value: &str) {
    loop {
        match store.put(PutRequest::new(key, value)).await {
            Ok(_) => return,
            Err(Error::Unavailable { .. }) => {}
            Err(Error::Indeterminate { .. }) => {
                if let Ok(Some(kv)) = store.get_key(key).await {
                    if kv.value == value.as_bytes() {
                        return;
                    }
                }
            }
            Err(e) => panic!("put {key}: {e:?}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The watch's listener connection and every pooled connection are killed by the server while
/// writes go on: the notifications for those writes are lost with the listener, and the watch
/// still delivers every event, in order, once (the history table is the truth; a
/// notification only wakes it, and the 1 s poll wakes it without one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_loses_no_event_when_its_notifications_are_lost() {
    let server = PostgresServer::start().await.expect("PostgreSQL");
    let watching = server.store().await;
    let writing = server.store().await;
    let mut watch = watching
        .watch(WatchRequest::prefix("w/"))
        .await
        .expect("a watch");
    let mut killed = 0;
    for i in 0..30 {
        if i % 10 == 5 {
            killed += server.terminate_backends().await.expect("terminate");
        }
        put_surely(&writing, &format!("w/{i:02}"), "v").await;
    }
    assert!(
        killed > 0,
        "the fault must have acted: no backend was terminated"
    );
    let mut seen = Vec::new();
    within(Duration::from_secs(10), "every event", async {
        while seen.len() < 30 {
            match watch.next().await {
                Some(Ok(batch)) => seen.extend(batch.events.into_iter().map(|e| e.kv.key)),
                // A killed pooled connection is replaced, not passed on: the server is up.
                Some(Err(e)) => panic!("the watch failed after {} events: {e:?}", seen.len()),
                None => panic!("the watch ended after {} events", seen.len()),
            }
        }
    })
    .await;
    let want: Vec<String> = (0..30).map(|i| format!("w/{i:02}")).collect();
    let got: Vec<String> = seen
        .iter()
        .map(|k| String::from_utf8_lossy(k).into_owned())
        .collect();
    assert_eq!(got, want, "every put once, in order");
}

/// kill -9 of the server and a restart on the same data: every committed write is still
/// there, the revision goes on from where it was, and the same store (its pool reconnecting)
/// writes again once the server is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_writes_again_after_the_server_is_killed_and_restarted() {
    let server = PostgresServer::start().await.expect("PostgreSQL");
    let store = server.store().await;
    for i in 0..5 {
        put_surely(&store, &format!("k/{i}"), "before").await;
    }
    let before = store.current_revision().await.unwrap();
    server.kill();
    let err = store.get_key("k/0").await.unwrap_err();
    assert!(
        matches!(err, Error::Unavailable { .. }),
        "a read with the server down is Unavailable: {err:?}"
    );
    server.restart().await.expect("restart");
    eventually(
        Duration::from_secs(10),
        "the store to read again",
        || async { store.get_key("k/0").await.is_ok() },
    )
    .await;
    assert_eq!(store.current_revision().await.unwrap(), before);
    assert_eq!(store.get_prefix("k/").await.unwrap().count, 5);
    put_surely(&store, "k/after", "after").await;
    assert_eq!(store.current_revision().await.unwrap(), before.next());
}

/// A watch on a quiet key gets its progress notifications (every second on the harness's
/// servers) while the rest of the store is busy: the writes elsewhere wake the watch, and
/// must not put its next notification off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_watch_gets_progress_notifications_while_others_write() {
    let server = PostgresServer::start().await.expect("PostgreSQL");
    let store = server.store().await;
    let mut watch = store
        .watch(WatchRequest::key("quiet").with_progress_notify())
        .await
        .expect("a watch");
    let writer = server.store().await;
    let busy = tokio::spawn(async move {
        for i in 0.. {
            put_surely(&writer, &format!("busy/{i}"), "v").await;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    // Three intervals: a notification is due after one; the rest is slack for a loaded machine.
    let batch = within(
        Duration::from_secs(3),
        "a progress notification",
        watch.next(),
    )
    .await
    .expect("the watch goes on")
    .expect("a batch");
    busy.abort();
    assert!(
        batch.events.is_empty() && !batch.is_progress_answer(),
        "the quiet key's watch got {batch:?}"
    );
}

/// A compaction moves the points under the writers' lock and the rows it made unreadable go
/// after, in batches of their own: 2,400 superseded rows of 100 keys go, the 100 current
/// ones stay, and a read at the compaction revision still sees every key's value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compaction_purges_superseded_history_in_batches() {
    const KEYS: usize = 100;
    const ROUNDS: usize = 25;
    let server = PostgresServer::start().await.expect("PostgreSQL");
    // No retention: the rows go at this compaction, not a minute later.
    let store = PostgresStore::connect(server.config().with_history_retention(Duration::ZERO))
        .await
        .expect("a store");
    for round in 0..ROUNDS {
        let puts = (0..KEYS).map(|k| PutRequest::new(format!("p/{k:03}"), round.to_string()));
        store
            .txn(TxnRequest::new().and_then(puts))
            .await
            .expect("a round of puts");
    }
    let compacted = store.current_revision().await.expect("the revision");
    store.compact(compacted).await.expect("a compaction");
    let admin = server.admin().await.expect("an admin session");
    eventually(
        Duration::from_secs(30),
        "the superseded rows purged",
        || async {
            let row = admin
                .query_one("SELECT count(*) FROM coord_history", &[])
                .await
                .expect("a count");
            row.get::<_, i64>(0) == KEYS as i64
        },
    )
    .await;
    let at = store
        .get(GetRequest::prefix("p/").with_revision(compacted))
        .await
        .expect("a read at the compaction revision");
    assert_eq!(at.kvs.len(), KEYS);
    let last = (ROUNDS - 1).to_string();
    assert!(at.kvs.iter().all(|kv| kv.value == last.as_bytes()));
}
