//! The cases of `HostSession`: one lease shared by a host's recipes.

use std::time::Duration;

use crate::recipes::{
    ElectionPool, HostRegistration, HostSession, RegistrationStatus, SessionConfig,
};
use crate::testkit::{eventually, within};
use crate::{Error, KvLeaseStore, KvLeaseStoreExt, WatchRequest};

use super::fixture::Fixture;
use super::support::*;

pub async fn a_host_session_shares_one_lease_and_heals_it(fx: &dyn Fixture) {
    let store = fx.store();
    let host = HostSession::new(store.clone(), SessionConfig::default().with_ttl(fx.ttl()));
    let r = HostRegistration::start_on(&host, reg_on("hosts/a", "m"))
        .await
        .unwrap();
    let pool = ElectionPool::on(&host);
    let lead = pool.campaign("e", "a").await.unwrap();
    let first = r.lease_id();
    assert_eq!(
        lead.key().lease,
        first,
        "one lease for the registration and the election"
    );
    assert_eq!(host.stats().sessions, 1);

    // The shared lease is lost: the registration heals onto a new one, the leadership ends,
    // and the next campaign uses the new lease too.
    store.revoke(first).await.unwrap();
    within(prompt(fx), "the leadership's loss", lead.lost()).await;
    let mut status = r.subscribe();
    within(
        fx.ttl(),
        "the registration's heal",
        status
            .wait_for(|s| matches!(s, RegistrationStatus::Registered { lease } if *lease != first)),
    )
    .await
    .unwrap();
    let again = pool.campaign("e", "a").await.unwrap();
    assert_eq!(
        again.key().lease,
        r.lease_id(),
        "still one lease after the heal"
    );
    assert_eq!(host.stats().sessions, 2);

    // The pool's stop takes its keys and leaves the registration's.
    pool.stop().await.unwrap();
    within(prompt(fx), "the leadership's end", again.lost()).await;
    assert!(matches!(
        store.leader("e").await,
        Err(Error::NoLeader { .. })
    ));
    assert!(
        present(&store, "hosts/a").await,
        "the registration is untouched"
    );
    // The registration's stop takes its key and leaves the host's lease.
    let lease = r.lease_id();
    r.stop().await.unwrap();
    assert!(!present(&store, "hosts/a").await);
    assert!(
        store.time_to_live(lease).await.is_ok(),
        "the host's lease lives on"
    );
    host.stop().await.unwrap();
    assert!(matches!(
        store.time_to_live(lease).await,
        Err(Error::LeaseNotFound { .. })
    ));
}

pub async fn a_registration_spawned_while_cut_off_registers_when_the_store_answers(
    fx: &dyn Fixture,
) {
    let client = fx.client().await;
    client.cut_off(true);
    let r = HostRegistration::spawn(client.store.clone(), reg(fx, "hosts/a", "m")).unwrap();
    // Cut off for a while: it cannot register, and must not give up.
    tokio::time::sleep(fx.request_timeout() + fx.ttl()).await;
    assert_eq!(r.status(), RegistrationStatus::Registering);
    assert!(!present(&fx.store(), "hosts/a").await);
    client.cut_off(false);
    let mut status = r.subscribe();
    // The backoff has grown to a few seconds by now; it is capped at 30 s.
    let bound = fx.request_timeout() + Duration::from_secs(30) + fx.slack();
    within(
        bound,
        "the registration",
        status.wait_for(|s| matches!(s, RegistrationStatus::Registered { .. })),
    )
    .await
    .unwrap();
    let kv = fx
        .store()
        .get_key("hosts/a")
        .await
        .unwrap()
        .expect("registered");
    assert_eq!(kv.lease, r.lease_id());
    r.stop().await.unwrap();
    assert!(!present(&fx.store(), "hosts/a").await);
}

pub async fn a_registration_with_revoke_on_drop_removes_its_key_when_dropped(fx: &dyn Fixture) {
    let store = fx.store();
    let own = HostRegistration::start(
        store.clone(),
        reg(fx, "hosts/own", "m").with_revoke_on_drop(true),
    )
    .await
    .unwrap();
    let host = HostSession::new(store.clone(), SessionConfig::default().with_ttl(fx.ttl()));
    let shared =
        HostRegistration::start_on(&host, reg_on("hosts/shared", "m").with_revoke_on_drop(true))
            .await
            .unwrap();
    let lease = shared.lease_id();
    drop(own);
    drop(shared);
    eventually(prompt(fx), "both keys removed", || async {
        !present(&store, "hosts/own").await && !present(&store, "hosts/shared").await
    })
    .await;
    assert!(
        store.time_to_live(lease).await.is_ok(),
        "the host's lease lives on"
    );
    host.stop().await.unwrap();
}

/// A registration started again on a host session whose lease still holds the key from an
/// earlier one (dropped without a stop, as a component that restarts with new settings
/// does) writes its own metadata: the key found under the lease carries an older value.
pub async fn a_registration_started_over_its_own_key_writes_its_metadata(fx: &dyn Fixture) {
    let store = fx.store();
    let host = HostSession::new(store.clone(), SessionConfig::default().with_ttl(fx.ttl()));
    let first = HostRegistration::start_on(&host, reg_on("hosts/a", "v1"))
        .await
        .unwrap();
    let lease = first.lease_id();
    drop(first);
    let left = store
        .get_key("hosts/a")
        .await
        .unwrap()
        .expect("left standing");
    assert_eq!((left.value.as_ref(), left.lease), ("v1".as_bytes(), lease));
    let again = HostRegistration::start_on(&host, reg_on("hosts/a", "v2"))
        .await
        .unwrap();
    assert_eq!(again.lease_id(), lease, "the host's lease");
    let kv = store.get_key("hosts/a").await.unwrap().expect("registered");
    assert_eq!(
        (kv.value.as_ref(), kv.lease, kv.create_revision),
        ("v2".as_bytes(), lease, left.create_revision),
        "the new registration's metadata, in place under the host's lease"
    );
    again.stop().await.unwrap();
    assert!(!present(&store, "hosts/a").await);
    host.stop().await.unwrap();
}

/// A registration stopped while cut off cannot remove its key and says so; its removal is
/// retried in the background. A registration of the same key started on the same host
/// session once the store answers again writes the key under the same lease: no retry of the
/// old removal may take it away (each writes in the key's turn, and the new write calls the
/// retries off).
pub async fn a_failed_stops_retried_removal_spares_the_next_registration(fx: &dyn Fixture) {
    use futures::StreamExt;
    let store = fx.store();
    let client = fx.client().await;
    let host = HostSession::new(
        client.store.clone(),
        SessionConfig::default().with_ttl(fx.ttl()),
    );
    let registered = |r: &HostRegistration| {
        let mut status = r.subscribe();
        async move {
            within(
                prompt(fx) + fx.request_timeout(),
                "registered",
                status.wait_for(|s| matches!(s, RegistrationStatus::Registered { .. })),
            )
            .await
            .unwrap();
        }
    };
    let first = HostRegistration::spawn_on(&host, reg_on("hosts/a", "first")).unwrap();
    registered(&first).await;
    client.cut_off(true);
    assert!(
        first.stop().await.is_err(),
        "a stop that could not reach the store says so"
    );
    // The first retry goes out while still cut off, and is lost: the next comes a request
    // timeout later, after the next registration has written the key.
    tokio::time::sleep(prompt(fx) / 10).await;
    client.cut_off(false);
    let second = HostRegistration::spawn_on(&host, reg_on("hosts/a", "second")).unwrap();
    registered(&second).await;
    let written = store.get_key("hosts/a").await.unwrap().expect("registered");
    // The old removal's lost attempt fails at its request timeout, and the next goes out
    // within a second of that: past both, nothing may have changed the key.
    let mut w = store
        .watch(WatchRequest::key("hosts/a").with_start_revision(written.mod_revision.next()))
        .await
        .unwrap();
    let window = fx.request_timeout() + Duration::from_secs(2) + fx.slack();
    let quiet = tokio::time::timeout(window, w.next()).await;
    assert!(
        quiet.is_err(),
        "the key of the registration started since changed: {quiet:?}"
    );
    second.stop().await.unwrap();
    host.stop().await.unwrap();
}

pub async fn a_registration_on_a_host_session_refuses_a_ttl_of_its_own(fx: &dyn Fixture) {
    let store = fx.store();
    let host = HostSession::new(store.clone(), SessionConfig::default().with_ttl(fx.ttl()));
    // The host's lease is shared: a TTL of the registration's own would be ignored, so it
    // is refused, by both constructors, before anything is written.
    let own_ttl = || reg_on("hosts/a", "m").with_ttl(fx.ttl() * 2);
    for refused in [
        HostRegistration::start_on(&host, own_ttl()).await.err(),
        HostRegistration::spawn_on(&host, own_ttl()).err(),
    ] {
        match refused {
            Some(Error::InvalidArgument { reason }) => assert!(
                reason.contains("HostSession") && reason.contains("hosts/a"),
                "the refusal says what to do: {reason}"
            ),
            other => panic!("a TTL on a host session's registration must be refused: {other:?}"),
        }
    }
    assert!(!present(&store, "hosts/a").await, "nothing written");
    // Without one, the host's TTL applies.
    let r = HostRegistration::start_on(&host, reg_on("hosts/a", "m"))
        .await
        .unwrap();
    let ttl = store.time_to_live(r.lease_id()).await.unwrap();
    assert_eq!(ttl.granted_ttl, fx.ttl(), "the host session's TTL");
    r.stop().await.unwrap();
    host.stop().await.unwrap();
}

/// A host session says where its lease stands the moment that changes: granted, ended by the
/// store (with why), granted again for the recipes that heal onto it, stopped.
pub async fn a_host_session_reports_its_lease_as_it_changes(fx: &dyn Fixture) {
    use crate::recipes::{HostLease, SessionEnd};
    let store = fx.store();
    let host = HostSession::new(store.clone(), SessionConfig::default().with_ttl(fx.ttl()));
    let mut lease = host.subscribe();
    assert_eq!(lease.get(), HostLease::None, "nothing asked for yet");
    let r = HostRegistration::start_on(&host, reg_on("hosts/a", "m"))
        .await
        .unwrap();
    let first = r.lease_id();
    assert_eq!(
        lease.get(),
        HostLease::Live {
            lease: first,
            generation: 1
        }
    );
    store.revoke(first).await.unwrap();
    let seen = within(
        prompt(fx),
        "the lease reported ended",
        lease.wait_for(|l| !matches!(l, HostLease::Live { generation: 1, .. })),
    )
    .await
    .unwrap();
    assert!(
        seen == HostLease::Ended {
            lease: first,
            end: SessionEnd::LeaseLost
        } || matches!(seen, HostLease::Live { generation: 2, .. }),
        "the revoked lease is reported lost (or already replaced): {seen:?}"
    );
    within(
        fx.ttl(),
        "the registration's heal onto a new lease",
        lease.wait_for(|l| matches!(l, HostLease::Live { generation: 2, .. })),
    )
    .await
    .unwrap();
    let HostLease::Live { lease: second, .. } = lease.get() else {
        unreachable!()
    };
    assert_ne!(second, first);
    r.stop().await.unwrap();
    host.stop().await.unwrap();
    assert_eq!(lease.get(), HostLease::Stopped);
}
