//! The cases of the handle table ([`Handle`](crate::recipes::Handle)): what each handle
//! leaves behind when it is dropped. The rows not covered here have cases of their own: a
//! guard and a permit release (`mutex::mutex_guard_dropped_unlocks`,
//! `semaphore::semaphore_permit_dropped_releases`), a watcher stops
//! (`watcher::watcher_stream_ends_when_stopped_or_dropped`), a registration with
//! `revoke_on_drop` removes its key (`host::a_registration_with_revoke_on_drop_removes_its_key_when_dropped`).

use crate::recipes::{
    Candidate, CandidateConfig, CandidateStatus, Election, ElectionPool, HostRegistration,
    SessionConfig, Term,
};
use crate::testkit::{eventually, within};
use crate::{KvLeaseStore, KvLeaseStoreExt};

use super::fixture::Fixture;
use super::support::*;

pub async fn every_handle_dropped_leaves_what_the_table_says(fx: &dyn Fixture) {
    let store = fx.store();
    let pool_config = || SessionConfig::default().with_ttl(fx.ttl());

    // What should end as a crash ends: a session's lease, a registration's key, a pool's keys.
    let dropped_session = session(fx, &store).await;
    let session_lease = dropped_session.lease();
    let registration = HostRegistration::start(store.clone(), reg(fx, "hosts/dropped", "m"))
        .await
        .unwrap();
    let registration_lease = registration.lease_id();
    let pool = ElectionPool::new(store.clone(), pool_config());
    let pooled = pool.campaign("handles/pool", "p").await.unwrap();
    let pooled_key = pooled.key().key.clone();
    // A leadership belongs to its session: the key stays while the session lives.
    let owner = session(fx, &store).await;
    let leader = Election::new(&owner, "handles/leader")
        .campaign("l")
        .await
        .unwrap();
    let leader_key = leader.key().key.clone();
    // What others queue behind goes at once: a candidate's key, in the background.
    let candidates = ElectionPool::new(store.clone(), pool_config());
    let candidate = Candidate::spawn(
        &candidates,
        CandidateConfig::new("handles/candidate", "c"),
        |term: Term| async move { term.over().await },
    );
    let mut status = candidate.subscribe();
    within(
        prompt(fx),
        "the candidate's term",
        status.wait_for(|s| matches!(s, CandidateStatus::Leading { .. })),
    )
    .await
    .unwrap();

    // All dropped together; the candidate's clean-up, done in the background, shows that
    // the others' would have run by then too (within a TTL's first third, before any lease
    // could end on its own).
    drop((
        dropped_session,
        registration,
        pooled,
        pool,
        leader,
        candidate,
    ));
    eventually(
        prompt(fx),
        "the dropped candidate's key deleted",
        || async {
            store
                .get_prefix("handles/candidate/")
                .await
                .unwrap()
                .kvs
                .is_empty()
        },
    )
    .await;
    assert!(
        store.time_to_live(session_lease).await.is_ok(),
        "a dropped session's lease is not revoked"
    );
    assert!(
        present(&store, "hosts/dropped").await,
        "a dropped registration's key stays with its lease"
    );
    assert!(
        store.get_key(pooled_key).await.unwrap().is_some(),
        "a dropped pool's keys stay with its lease"
    );
    assert!(
        store.get_key(leader_key).await.unwrap().is_some(),
        "a dropped leadership's key stays while its session lives"
    );

    owner.stop().await.unwrap();
    candidates.stop().await.unwrap();
    for lease in [session_lease, registration_lease] {
        let _ = store.revoke(lease).await;
    }
}
