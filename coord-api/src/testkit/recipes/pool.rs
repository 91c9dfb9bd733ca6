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
