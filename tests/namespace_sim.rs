//! `Namespaced` beyond the suites it passes: what crosses the prefix and what does not, seen
//! from both sides of it, on `SimStore`.

use std::sync::Arc;
use std::time::Duration;

use coord_api::{
    Bytes, DynKvLeaseStore, Error, KvLeaseStore, KvLeaseStoreExt, Namespaced, PutRequest,
    WatchRequest,
};
use coord_sim::SimStore;
use futures::StreamExt;

fn stores() -> (Arc<DynKvLeaseStore>, Arc<DynKvLeaseStore>) {
    let root: Arc<DynKvLeaseStore> = Arc::new(SimStore::new());
    let ns: Arc<DynKvLeaseStore> = Arc::new(Namespaced::new(root.clone(), "a/"));
    (root, ns)
}

#[tokio::test(start_paused = true)]
async fn keys_live_under_the_prefix_and_come_back_without_it() {
    let (root, ns) = stores();
    root.put_value("k", "outside").await.unwrap();
    ns.put_value("k", "inside").await.unwrap();
    assert_eq!(
        root.get_key("a/k").await.unwrap().unwrap().value_str(),
        "inside"
    );
    assert_eq!(
        root.get_key("k").await.unwrap().unwrap().value_str(),
        "outside"
    );
    let inside = ns.get_prefix("k").await.unwrap();
    assert_eq!(inside.count, 1);
    assert_eq!(inside.kvs[0].key.as_ref(), b"k");
    // Nested: b/ inside a/ is a/b/ outside.
    let nested = Namespaced::new(ns.clone(), "b/");
    nested.put_value("k", "nested").await.unwrap();
    assert!(root.get_key("a/b/k").await.unwrap().is_some());
    assert_eq!(
        nested.get_key("k").await.unwrap().unwrap().key.as_ref(),
        b"k"
    );
}

#[tokio::test(start_paused = true)]
async fn a_watch_sees_its_namespace_only_with_keys_stripped() {
    let (root, ns) = stores();
    let mut watch = ns
        .watch(WatchRequest::prefix("h/").with_prev_kv())
        .await
        .unwrap();
    root.put_value("h/outside", "x").await.unwrap();
    ns.put_value("h/1", "v1").await.unwrap();
    ns.put(PutRequest::new("h/1", "v2")).await.unwrap();
    let first = watch.next().await.unwrap().unwrap();
    assert_eq!(first.events[0].kv.key.as_ref(), b"h/1");
    let second = watch.next().await.unwrap().unwrap();
    assert_eq!(second.events[0].kv.key.as_ref(), b"h/1");
    let prev = second.events[0].prev_kv.as_ref().expect("prev kv");
    assert_eq!(prev.key.as_ref(), b"h/1");
}

#[tokio::test(start_paused = true)]
async fn elections_queue_under_the_prefix_and_errors_name_them_as_the_caller_does() {
    let (root, ns) = stores();
    let lease = ns.grant(Duration::from_secs(10)).await.unwrap().id;
    let leader = ns
        .campaign("jobs", Bytes::from_static(b"me"), lease)
        .await
        .unwrap();
    assert_eq!(leader.name, "jobs");
    assert!(leader.key.starts_with(b"jobs/"), "{:?}", leader.key);
    // Outside, the candidate key is under the prefix, and no election "jobs" exists.
    let outside = [b"a/".as_slice(), &leader.key].concat();
    assert!(root.get_key(outside).await.unwrap().is_some());
    assert!(matches!(
        root.leader("jobs").await,
        Err(Error::NoLeader { .. })
    ));
    assert_eq!(ns.leader("jobs").await.unwrap().key, leader.key);
    let ttl = ns.time_to_live(lease).await.unwrap();
    assert_eq!(ttl.keys, vec![leader.key.clone()]);
    ns.proclaim(&leader, Bytes::from_static(b"still me"))
        .await
        .unwrap();
    ns.resign(&leader).await.unwrap();
    let err = ns
        .proclaim(&leader, Bytes::from_static(b"gone"))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::NotLeader { election } if election == "jobs"),
        "{err:?}"
    );
    let err = ns.leader("jobs").await.unwrap_err();
    assert!(
        matches!(&err, Error::NoLeader { election } if election == "jobs"),
        "{err:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn an_empty_key_is_refused_even_though_the_prefix_would_make_it_one() {
    let (_, ns) = stores();
    let err = ns.put_value("", "v").await.unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");
}
