//! Every verb that ends a hold keeps L7's promise: once it returns `Ok` the hold's key is
//! gone, read at once from another client, with nothing left for a background task or a
//! later expiry to finish. A caller told "released" may exit the next instant.

use crate::recipes::{
    Candidate, CandidateConfig, Election, ElectionPool, Mutex, Semaphore, SessionConfig, Term,
};
use crate::testkit::within;
use crate::KvLeaseStoreExt;

use super::fixture::Fixture;
use super::support::*;

/// An unlock that returned `Ok` left no key.
pub async fn an_unlock_that_returned_ok_left_no_key(fx: &dyn Fixture) {
    let store = fx.store();
    let client = fx.client().await;
    let a = session(fx, &client.store).await;
    let key = crate::candidate_key("lock", a.lease());
    let guard = Mutex::new(&a, "lock").lock().await.unwrap();
    guard.unlock().await.unwrap();
    assert!(
        !present(&store, &key).await,
        "the key stands after unlock returned Ok"
    );
}

/// A permit's release that returned `Ok` left no key.
pub async fn a_release_that_returned_ok_left_no_key(fx: &dyn Fixture) {
    let store = fx.store();
    let client = fx.client().await;
    let a = session(fx, &client.store).await;
    let key = crate::candidate_key("permits", a.lease());
    let permit = Semaphore::new(&a, "permits", 2).acquire().await.unwrap();
    permit.release().await.unwrap();
    assert!(
        !present(&store, &key).await,
        "the key stands after release returned Ok"
    );
}

/// A resignation that returned `Ok` left no key.
pub async fn a_resign_that_returned_ok_left_no_key(fx: &dyn Fixture) {
    let store = fx.store();
    let client = fx.client().await;
    let a = session(fx, &client.store).await;
    let key = crate::candidate_key("jobs", a.lease());
    let leadership = Election::new(&a, "jobs").campaign("a").await.unwrap();
    leadership.resign().await.unwrap();
    assert!(
        !present(&store, &key).await,
        "the key stands after resign returned Ok"
    );
}

/// A resignation that returned `Ok` left no key, after a newer campaign of the same session
/// failed without writing (refused for its size): the key is the standing leadership's
/// again, not the failed campaign's, and the resignation deletes it.
pub async fn a_resign_after_a_failed_newer_campaign_left_no_key(fx: &dyn Fixture) {
    let store = fx.store();
    let client = fx.client().await;
    let a = session(fx, &client.store).await;
    let key = crate::candidate_key("jobs", a.lease());
    let election = Election::new(&a, "jobs");
    let leadership = election.campaign("a").await.unwrap();
    let too_big = vec![b'x'; client.store.limits().max_request_bytes + 1];
    let tried = election.try_campaign(too_big.clone()).await;
    assert!(
        matches!(tried, Err(crate::Error::InvalidArgument { .. })),
        "an oversized try_campaign is refused: {tried:?}"
    );
    let campaigned = election.campaign(too_big).await;
    assert!(
        matches!(campaigned, Err(crate::Error::InvalidArgument { .. })),
        "an oversized campaign is refused: {campaigned:?}"
    );
    assert!(present(&store, &key).await, "the leader's key stands");
    leadership.resign().await.unwrap();
    assert!(
        !present(&store, &key).await,
        "the key stands after resign returned Ok: left to the failed campaigns"
    );
}

/// A leading candidate's stop that returned `Ok` left no key of the election.
pub async fn a_candidate_stop_that_returned_ok_left_no_key(fx: &dyn Fixture) {
    let store = fx.store();
    let client = fx.client().await;
    let pool = ElectionPool::new(
        client.store.clone(),
        SessionConfig::default().with_ttl(fx.ttl()),
    );
    let a = Candidate::spawn(
        &pool,
        CandidateConfig::new("jobs", "a"),
        |term: Term| async move {
            term.over().await;
        },
    );
    let mut status = a.subscribe();
    within(prompt(fx), "a term", status.wait_for(|_| a.is_leader()))
        .await
        .unwrap();
    a.stop().await.unwrap();
    let left = store.get_prefix("jobs/").await.unwrap();
    assert_eq!(
        left.count, 0,
        "keys stand after the candidate's stop returned Ok: {:?}",
        left.kvs
    );
}
