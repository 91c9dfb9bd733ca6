//! The cases of `ClusterWatcher`.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::recipes::{ClusterEvent, ClusterWatcher, ClusterWatcherConfig};
use crate::testkit::within;
use crate::{Bytes, DynKvLeaseStore, KvLeaseStore, KvLeaseStoreExt};
use futures::StreamExt;

use super::fixture::Fixture;
use super::support::*;

/// Applies events to a map, failing on an impossible transition (a duplicate Up, a Down of
/// an unknown host): the gap-free, no-duplicate property.
fn apply(view: &mut BTreeMap<String, Bytes>, e: &ClusterEvent) {
    match e {
        ClusterEvent::HostUp { host, metadata, .. } => {
            assert!(
                view.insert(host.clone(), metadata.clone()).is_none(),
                "HostUp twice for {host}"
            );
        }
        ClusterEvent::HostUpdated { host, metadata, .. } => {
            assert!(
                view.insert(host.clone(), metadata.clone()).is_some(),
                "update of unknown {host}"
            );
        }
        ClusterEvent::HostDown {
            host,
            last_metadata,
            ..
        } => {
            let was = view.remove(host);
            assert_eq!(
                was.as_ref(),
                Some(last_metadata),
                "HostDown for {host} without the last metadata seen"
            );
        }
        ClusterEvent::Resynced { .. } => {}
    }
}

async fn truth(store: &Arc<DynKvLeaseStore>, prefix: &str) -> BTreeMap<String, Bytes> {
    let r = store.get_prefix(prefix).await.unwrap();
    r.kvs
        .iter()
        .map(|kv| (kv.key_str()[prefix.len()..].to_owned(), kv.value.clone()))
        .collect()
}

/// The watcher's promise to a consumer that reads the view when it gets an event: the view
/// is never older than the event, and at the event's own revision it holds the event's
/// change (a newer view may have moved on).
fn assert_view_holds(e: &ClusterEvent, seen: &crate::recipes::ClusterView) {
    assert!(
        seen.explains(e),
        "{e:?} emitted before the view held it: {seen:?}"
    );
}

/// Reads events until the applied view equals the store's, within a bound: a few round
/// trips, plus a request timeout (a watcher that resumed into a partition waits out the
/// request it sent there before it retries).
async fn converge(
    fx: &dyn Fixture,
    w: &mut ClusterWatcher,
    view: &mut BTreeMap<String, Bytes>,
    store: &Arc<DynKvLeaseStore>,
    prefix: &str,
) {
    let want = truth(store, prefix).await;
    within(
        prompt(fx) * 5 + fx.request_timeout(),
        "the watcher to converge",
        async {
            while *view != want {
                let e = w.next().await.expect("watcher running");
                apply(view, &e);
                assert_view_holds(&e, &w.view());
            }
        },
    )
    .await;
    assert_eq!(w.view().to_map(), want, "the readable view agrees");
}

pub async fn watcher_is_gap_free_from_the_snapshot(fx: &dyn Fixture) {
    let store = fx.store();
    store.put_value("h/a", "1").await.unwrap();
    store.put_value("h/b", "1").await.unwrap();
    let mut w = ClusterWatcher::start(store.clone(), ClusterWatcherConfig::new("h/"))
        .await
        .unwrap();
    // Writes racing the start are neither lost nor doubled.
    store.put_value("h/c", "1").await.unwrap();
    store.delete_key("h/a").await.unwrap();
    store.put_value("h/b", "2").await.unwrap();
    store.put_value("h/a", "3").await.unwrap();
    let mut view = BTreeMap::new();
    let mut kinds = Vec::new();
    within(prompt(fx), "six events", async {
        while kinds.len() < 6 {
            let e = w.next().await.unwrap();
            apply(&mut view, &e);
            kinds.push(match e {
                ClusterEvent::HostUp { host, .. } => format!("up {host}"),
                ClusterEvent::HostUpdated { host, .. } => format!("updated {host}"),
                ClusterEvent::HostDown { host, .. } => format!("down {host}"),
                ClusterEvent::Resynced { .. } => "resynced".into(),
            });
        }
    })
    .await;
    assert_eq!(
        kinds,
        ["up a", "up b", "up c", "down a", "updated b", "up a"]
    );
    assert_eq!(view, truth(&store, "h/").await);
}

pub async fn watcher_survives_compaction_without_losing_a_net_change(fx: &dyn Fixture) {
    let store = fx.store();
    let client = fx.client().await;
    for h in ["a", "b", "c"] {
        store.put_value(format!("h/{h}"), "1").await.unwrap();
    }
    let mut w = ClusterWatcher::start(client.store.clone(), ClusterWatcherConfig::new("h/"))
        .await
        .unwrap();
    let mut view = BTreeMap::new();
    converge(fx, &mut w, &mut view, &store, "h/").await;
    // Cut the watcher off, change membership meanwhile, compact past the change: its resume
    // revision is gone and it must re-list and diff.
    client.cut_off(true);
    client.close_streams().await;
    store.delete_key("h/a").await.unwrap();
    store.put_value("h/b", "2").await.unwrap();
    store.put_value("h/d", "1").await.unwrap();
    store.delete_key("h/d").await.unwrap();
    let rev = store.current_revision().await.unwrap();
    store.compact(rev).await.unwrap();
    client.cut_off(false);
    converge(fx, &mut w, &mut view, &store, "h/").await;
    // Afterwards it follows live changes again.
    store.put_value("h/e", "1").await.unwrap();
    converge(fx, &mut w, &mut view, &store, "h/").await;
}

pub async fn watcher_stream_ends_when_stopped_or_dropped(fx: &dyn Fixture) {
    let store = fx.store();
    store.put_value("h/a", "1").await.unwrap();
    let w = ClusterWatcher::start(store.clone(), ClusterWatcherConfig::new("h/"))
        .await
        .unwrap();
    let queued = within(prompt(fx), "the stop", w.stop()).await;
    assert!(
        matches!(queued.as_slice(), [ClusterEvent::HostUp { host, .. }] if host == "a"),
        "stop hands back the events it had queued: {queued:?}"
    );

    let w = ClusterWatcher::start(store.clone(), ClusterWatcherConfig::new("h/"))
        .await
        .unwrap();
    let mut view = w.subscribe_view();
    let mut stream = w.into_stream();
    assert!(stream.next().await.is_some());
    drop(stream);
    // Dropping the stream drops the watcher, which stops its task: the view's publisher goes
    // away with it, so following the view ends.
    within(prompt(fx), "the watcher's task to end", async {
        while view.changed().await.is_ok() {}
    })
    .await;
}

/// Registers 20 hosts under `prefix`; a watcher's configuration for it with room for 4
/// events.
async fn twenty_hosts_for_a_buffer_of_four(
    store: &Arc<DynKvLeaseStore>,
    prefix: &str,
) -> ClusterWatcherConfig {
    for i in 0..20 {
        store
            .put_value(format!("{prefix}h{i:02}"), "m")
            .await
            .unwrap();
    }
    let mut config = ClusterWatcherConfig::new(prefix);
    config.buffer = 4;
    config
}

/// A first listing larger than the event buffer: `start` must return (the events that do
/// not fit are emitted once the consumer reads), and every host still comes up, once.
pub async fn watcher_starts_on_more_hosts_than_its_buffer(fx: &dyn Fixture) {
    let store = fx.store();
    let config = twenty_hosts_for_a_buffer_of_four(&store, "big/").await;
    let mut w = within(
        prompt(fx),
        "start with 20 hosts and a buffer of 4",
        ClusterWatcher::start(store.clone(), config),
    )
    .await
    .unwrap();
    assert_eq!(w.view().len(), 20);
    let mut up = std::collections::BTreeSet::new();
    while up.len() < 20 {
        match within(prompt(fx), "the first listing's HostUp", w.next()).await {
            Some(ClusterEvent::HostUp { host, .. }) => assert!(up.insert(host), "HostUp twice"),
            other => panic!("{other:?}"),
        }
    }
    store.put_value("big/late", "m").await.unwrap();
    assert!(matches!(
        within(prompt(fx), "the next change", w.next()).await,
        Some(ClusterEvent::HostUp { host, .. }) if host == "late"
    ));
}

/// The events a stopped watcher handed back give exactly its last view, applied after
/// those read before the stop (`read`, as a map).
fn assert_stop_completes_the_view(
    mut read: BTreeMap<String, Bytes>,
    queued: &[ClusterEvent],
    last: &crate::recipes::ClusterView,
) {
    for e in queued {
        apply(&mut read, e);
    }
    let view: BTreeMap<String, Bytes> = last
        .hosts()
        .map(|(h, m)| (h.to_string(), m.clone()))
        .collect();
    assert_eq!(read, view, "read and handed back {queued:?}");
}

/// A consumer that reads nothing leaves the task waiting for room in the buffer: a stop
/// must still end it at once, and hand back every event the view holds that the consumer
/// did not read, not just the buffer's worth.
pub async fn watcher_stops_while_its_consumer_reads_nothing(fx: &dyn Fixture) {
    let store = fx.store();
    let config = twenty_hosts_for_a_buffer_of_four(&store, "full/").await;
    let w = ClusterWatcher::start(store.clone(), config).await.unwrap();
    store.put_value("full/late", "m").await.unwrap();
    let view = w.subscribe_view();
    let queued = within(prompt(fx), "the stop of a watcher nobody reads", w.stop()).await;
    assert!(
        queued.len() >= 20,
        "the first listing's 20 HostUp: {queued:?}"
    );
    assert_stop_completes_the_view(BTreeMap::new(), &queued, &view.get());
}

/// A consumer that reads nothing while the watcher re-lists (its resume point compacted
/// away) leaves the task waiting for room in the middle of the re-list's events: a stop must
/// still end it at once, and hand back the rest of the difference with its `Resynced` (the
/// view holds it all).
pub async fn watcher_stops_while_a_relist_waits_for_its_consumer(fx: &dyn Fixture) {
    let store = fx.store();
    let client = fx.client().await;
    store.put_value("wait/h0", "m").await.unwrap();
    let mut config = ClusterWatcherConfig::new("wait/");
    config.buffer = 1;
    let w = ClusterWatcher::start(client.store.clone(), config)
        .await
        .unwrap();
    let mut view = w.subscribe_view();
    // Its buffer holds h0's HostUp; cut it off, add hosts, compact past its resume point.
    client.cut_off(true);
    client.close_streams().await;
    for i in 1..6 {
        store.put_value(format!("wait/h{i}"), "m").await.unwrap();
    }
    let rev = store.current_revision().await.unwrap();
    store.compact(rev).await.unwrap();
    client.cut_off(false);
    // The re-listed view is published before its events, which wait for room. As in
    // `converge`: a few round trips, plus a request sent into the cut waited out.
    within(
        prompt(fx) * 5 + fx.request_timeout(),
        "the re-listed view",
        async {
            while view.get_and_update().len() < 6 {
                view.changed().await.unwrap();
            }
        },
    )
    .await;
    let queued = within(
        prompt(fx),
        "the stop of a watcher blocked in a re-list",
        w.stop(),
    )
    .await;
    assert!(
        matches!(queued.last(), Some(ClusterEvent::Resynced { .. })),
        "the re-list's difference ends in its marker: {queued:?}"
    );
    assert_stop_completes_the_view(BTreeMap::new(), &queued, &view.get());
}

/// Whoever reads an event and then the view finds the event's change in it.
pub async fn watcher_view_already_holds_each_event_it_emits(fx: &dyn Fixture) {
    let store = fx.store();
    let mut w = ClusterWatcher::start(store.clone(), ClusterWatcherConfig::new("v/"))
        .await
        .unwrap();
    for i in 0..10 {
        store.put_value(format!("v/h{i}"), "m").await.unwrap();
        let e = within(prompt(fx), "HostUp", w.next()).await;
        let Some(ClusterEvent::HostUp { host, revision, .. }) = e else {
            panic!("{e:?}")
        };
        let view = w.view();
        assert!(view.contains(&host), "{host} not in the view yet");
        assert!(view.revision() >= revision);
    }
}

/// After a re-list too (compaction overtook the watcher), whoever reads an event and then the
/// view finds the event's change in it. A buffer of one makes the watcher wait for the
/// consumer between two events, so the consumer reads the view in the middle of a re-list's
/// emissions even on one thread.
pub async fn watcher_view_already_holds_each_event_of_a_relist(fx: &dyn Fixture) {
    let store = fx.store();
    let client = fx.client().await;
    for h in ["a", "b", "c"] {
        store.put_value(format!("r/{h}"), "1").await.unwrap();
    }
    let mut config = ClusterWatcherConfig::new("r/");
    config.buffer = 1;
    let mut w = ClusterWatcher::start(client.store.clone(), config)
        .await
        .unwrap();
    let mut view = BTreeMap::new();
    converge(fx, &mut w, &mut view, &store, "r/").await;
    client.cut_off(true);
    client.close_streams().await;
    store.delete_key("r/a").await.unwrap();
    store.put_value("r/b", "2").await.unwrap();
    store.put_value("r/d", "1").await.unwrap();
    store.put_value("r/e", "1").await.unwrap();
    let rev = store.current_revision().await.unwrap();
    store.compact(rev).await.unwrap();
    client.cut_off(false);
    let want = truth(&store, "r/").await;
    within(
        prompt(fx) * 5 + fx.request_timeout(),
        "the re-list's events",
        async {
            while view != want {
                let e = w.next().await.expect("watcher running");
                apply(&mut view, &e);
                assert_view_holds(&e, &w.view());
            }
        },
    )
    .await;
}

/// `changes_since` between each view and the one before it, and between the first and the
/// last, says what a comparison of the two views' hosts says: hosts up, updated, gone, in
/// host order; a write that changes nothing (the same metadata again) is no change.
pub async fn watcher_views_tell_what_changed_between_them(fx: &dyn Fixture) {
    let store = fx.store();
    store.put_value("c/a", "1").await.unwrap();
    let w = ClusterWatcher::start(store.clone(), ClusterWatcherConfig::new("c/"))
        .await
        .unwrap();
    let mut views = vec![w.view()];
    let writes: [(&str, Option<&str>); 7] = [
        ("c/b", Some("1")),
        ("c/a", Some("2")),
        ("c/b", None),
        ("c/c", Some("1")),
        ("c/c", Some("1")),
        ("c/b", Some("3")),
        ("c/a", None),
    ];
    for (key, value) in writes {
        let revision = write(&store, key, value).await;
        views.push(view_reaching(fx, &w, revision).await);
    }
    let told = |later: &crate::recipes::ClusterView, earlier: &crate::recipes::ClusterView| {
        later
            .changes_since(earlier)
            .map(|c| (c.host.to_owned(), c.metadata.cloned()))
            .collect::<Vec<_>>()
    };
    let compared = |later: &crate::recipes::ClusterView, earlier: &crate::recipes::ClusterView| {
        let (l, e) = (later.to_map(), earlier.to_map());
        let hosts: std::collections::BTreeSet<&String> = l.keys().chain(e.keys()).collect();
        hosts
            .into_iter()
            .filter(|h| l.get(*h) != e.get(*h))
            .map(|h| (h.clone(), l.get(h).cloned()))
            .collect::<Vec<_>>()
    };
    for pair in views.windows(2) {
        assert_eq!(
            told(&pair[1], &pair[0]),
            compared(&pair[1], &pair[0]),
            "from revision {} to {}",
            pair[0].revision(),
            pair[1].revision()
        );
    }
    let (first, last) = (&views[0], &views[views.len() - 1]);
    assert_eq!(told(last, first), compared(last, first), "first to last");
    assert_eq!(
        told(last, first),
        vec![
            ("a".to_owned(), None),
            ("b".to_owned(), Some(Bytes::from("3"))),
            ("c".to_owned(), Some(Bytes::from("1"))),
        ]
    );
    assert_eq!(told(first, last), compared(first, last), "last to first");

    // A burst, sent all at once: its deliveries reach the watcher together, and one view
    // takes several writes of one host (up then gone, changed twice, back to what it was).
    let before = last.clone();
    let burst: Vec<(&str, Option<&str>)> = vec![
        ("c/a", Some("5")),
        ("c/a", Some("6")),
        ("c/d", Some("1")),
        ("c/d", None),
        ("c/c", Some("1")),
        ("c/b", Some("4")),
        ("c/b", Some("3")),
    ];
    let revisions = futures::future::join_all(
        burst
            .into_iter()
            .map(|(key, value)| write(&store, key, value)),
    )
    .await;
    let newest = revisions.into_iter().max().expect("writes");
    let after = view_reaching(fx, &w, newest).await;
    assert_eq!(
        told(&after, &before),
        compared(&after, &before),
        "over the burst"
    );
    w.stop().await;
}

/// Puts `value` at `key`, or deletes it; the write's revision.
async fn write(store: &Arc<DynKvLeaseStore>, key: &str, value: Option<&str>) -> crate::Revision {
    match value {
        Some(v) => store.put_value(key, v).await.unwrap(),
        None => {
            store
                .delete(crate::DeleteRequest::key(key))
                .await
                .unwrap()
                .revision
        }
    }
}

/// The first view `w` publishes at `revision` or later.
async fn view_reaching(
    fx: &dyn Fixture,
    w: &ClusterWatcher,
    revision: crate::Revision,
) -> Arc<crate::recipes::ClusterView> {
    let mut sub = w.subscribe_view();
    within(prompt(fx), "the view to reach the write", async {
        loop {
            let v = sub.get_and_update();
            if v.revision() >= revision {
                return v;
            }
            sub.changed().await.unwrap();
        }
    })
    .await
}
