//! The cases of `ElectionPool`.

use crate::recipes::{ElectionPool, SessionConfig};
use crate::testkit::within;
use crate::{Error, KvLeaseStore};
use tokio::time::Instant;

use super::fixture::Fixture;
use super::support::*;

pub async fn pool_stop_drops_every_leadership_at_once(fx: &dyn Fixture) {
    let store = fx.store();
    let pool = ElectionPool::new(store.clone(), SessionConfig::default().with_ttl(fx.ttl()));
    let mut held = Vec::new();
    for i in 0..5 {
        held.push(pool.campaign(&format!("shard/{i}"), "me").await.unwrap());
    }
    assert_eq!(pool.stats().sessions, 1, "one shared session");
    assert_eq!(pool.stats().leaderships, 5);
    let before = Instant::now();
    let handle = pool.clone();
    pool.stop().await.unwrap();
    for l in &held {
        within(prompt(fx), "every leadership to end", l.lost()).await;
    }
    assert!(
        before.elapsed() <= fx.slack(),
        "took {:?}",
        before.elapsed()
    );
    for i in 0..5 {
        assert!(matches!(
            store.leader(&format!("shard/{i}")).await,
            Err(Error::NoLeader { .. })
        ));
    }
    drop(held);
    assert_eq!(handle.stats().leaderships, 0);
    assert!(
        matches!(
            handle.campaign("shard/0", "me").await,
            Err(Error::Cancelled { .. })
        ),
        "a stopped pool campaigns no more"
    );
}

pub async fn pool_evicts_a_dead_session_before_the_next_campaign(fx: &dyn Fixture) {
    let store = fx.store();
    let pool = ElectionPool::new(store.clone(), SessionConfig::default().with_ttl(fx.ttl()));
    let first = pool.campaign("shard/1", "me").await.unwrap();
    let dead = first.key().lease;
    store.revoke(dead).await.unwrap();
    within(prompt(fx), "the loss", first.lost()).await;
    let second = pool.campaign("shard/2", "me").await.unwrap();
    assert_ne!(
        second.key().lease,
        dead,
        "a fresh session, not the dead one"
    );
    let stats = pool.stats();
    assert_eq!((stats.sessions, stats.evictions), (2, 1));
    assert!(second.is_leader());
}

/// A pool on a shared host session, stopped while one of its campaigns has its key's write
/// on the way: when `stop` returns the key is gone, and nothing brings it back. (Deleted
/// directly, the key would be overtaken by the write and stand under the host's lease, which
/// lives on: a candidate nobody runs, at the head of the queue once the holder goes.)
pub async fn pool_stop_with_a_campaign_in_flight_leaves_no_key(fx: &dyn Fixture) {
    use crate::recipes::{Election, HostSession};
    let store = fx.store();
    let a = session(fx, &store).await;
    let _held = Election::new(&a, "jobs").campaign("a").await.unwrap();
    let client = fx.client().await;
    let host = HostSession::new(
        client.store.clone(),
        SessionConfig::default().with_ttl(fx.ttl()),
    );
    let lease = host.session().await.unwrap().lease();
    let key = crate::candidate_key("jobs", lease);
    let pool = ElectionPool::on(&host);
    let delay = fx.ttl() / 10;
    client.delay_requests(delay);
    let campaigning = tokio::spawn({
        let pool = pool.clone();
        async move { pool.campaign("jobs", "b").await.map(|_| ()) }
    });
    // The write of b's key is on its way.
    tokio::time::sleep(delay / 2).await;
    client.delay_requests(std::time::Duration::ZERO);
    within(prompt(fx) + delay, "the pool to stop", pool.stop())
        .await
        .unwrap();
    assert!(!present(&store, &key).await, "b's key stands after stop");
    let outcome = within(prompt(fx), "the campaign to end", campaigning)
        .await
        .expect("the campaign's task");
    assert!(
        matches!(outcome, Err(Error::Cancelled { .. })),
        "{outcome:?}"
    );
    // Whatever was in flight has landed by now; nothing brought the key back.
    tokio::time::sleep(delay * 2).await;
    assert!(
        !present(&store, &key).await,
        "b's key came back after the pool stopped"
    );
    assert!(
        host.current().is_some_and(|s| !s.is_done()),
        "the host's session lives on"
    );
    host.stop().await.unwrap();
}
