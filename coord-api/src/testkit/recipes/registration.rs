//! The cases of `HostRegistration`.

use std::time::Duration;

use crate::recipes::{HostRegistration, RegistrationStatus};
use crate::testkit::{eventually, within};
use crate::{Error, EventKind, KvLeaseStore, KvLeaseStoreExt, PutRequest, WatchRequest};
use futures::StreamExt;
use tokio::time::Instant;

use super::fixture::Fixture;
use super::support::*;

pub async fn registration_heals_after_a_stream_close_on_the_same_lease(fx: &dyn Fixture) {
    let client = fx.client().await;
    let r = HostRegistration::start(client.store.clone(), reg(fx, "hosts/a", "m"))
        .await
        .unwrap();
    let lease = r.lease_id();
    for _ in 0..3 {
        tokio::time::sleep(fx.ttl() / 2).await;
        client.close_streams().await;
    }
    tokio::time::sleep(fx.ttl() * 2).await;
    assert_eq!(
        r.lease_id(),
        lease,
        "the same lease: the channel was re-opened, not re-granted"
    );
    assert_eq!(r.status(), RegistrationStatus::Registered { lease });
    assert!(present(&fx.store(), "hosts/a").await);
}

pub async fn registration_heals_after_an_external_revoke(fx: &dyn Fixture) {
    let store = fx.store();
    let r = HostRegistration::start(store.clone(), reg(fx, "hosts/a", "meta"))
        .await
        .unwrap();
    let old = r.lease_id();
    store.revoke(old).await.unwrap();
    let mut status = r.subscribe();
    let start = Instant::now();
    within(
        fx.ttl(),
        "the heal",
        status.wait_for(|s| matches!(s, RegistrationStatus::Registered { lease } if *lease != old)),
    )
    .await
    .unwrap();
    let kv = store
        .get_key("hosts/a")
        .await
        .unwrap()
        .expect("the key is back");
    assert_eq!(kv.value, "meta".as_bytes(), "with the cached metadata");
    assert_eq!(kv.lease, r.lease_id());
    let bound = Duration::from_millis(100) + fx.slack();
    assert!(
        start.elapsed() <= bound,
        "healed after {:?}; the first retry comes within 100 ms",
        start.elapsed()
    );
}

pub async fn registration_stop_removes_the_key_immediately(fx: &dyn Fixture) {
    let store = fx.store();
    let r = HostRegistration::start(store.clone(), reg(fx, "hosts/a", "m"))
        .await
        .unwrap();
    let lease = r.lease_id();
    let status = r.subscribe();
    let before = Instant::now();
    r.stop().await.unwrap();
    assert!(
        before.elapsed() <= fx.slack(),
        "stop took {:?}",
        before.elapsed()
    );
    assert!(!present(&store, "hosts/a").await);
    assert!(matches!(
        store.time_to_live(lease).await,
        Err(Error::LeaseNotFound { .. })
    ));
    assert_eq!(status.get(), RegistrationStatus::Stopped);
}

pub async fn registration_crash_leaves_the_key_for_one_ttl(fx: &dyn Fixture) {
    let store = fx.store();
    let r = HostRegistration::start(store.clone(), reg(fx, "hosts/a", "m"))
        .await
        .unwrap();
    tokio::time::sleep(fx.ttl() / 2).await;
    drop(r);
    let crashed = Instant::now();
    // The last renewal was at most TTL/3 before the crash: the key lives at least 2/3 TTL on.
    tokio::time::sleep(fx.ttl() / 2).await;
    assert!(
        present(&store, "hosts/a").await,
        "still there within the TTL"
    );
    eventually(fx.ttl() + fx.slack(), "the key to expire", || async {
        !present(&store, "hosts/a").await
    })
    .await;
    assert!(
        crashed.elapsed() <= fx.ttl() + fx.slack(),
        "gone {:?} after the crash",
        crashed.elapsed()
    );
}

pub async fn registration_stop_during_a_heal_leaves_no_phantom_key(fx: &dyn Fixture) {
    // Calls take time here, so a heal (grant, publish, put) spans time and stop() lands in
    // the middle of it at the offsets tried.
    let store = fx.slow_store().await;
    for offset_ms in fx.stop_offsets() {
        let key = format!("hosts/{offset_ms}");
        let r = HostRegistration::start(
            store.clone(),
            reg(fx, &key, "m").with_backoff(Duration::from_millis(100), Duration::from_secs(1)),
        )
        .await
        .unwrap();
        store.revoke(r.lease_id()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(offset_ms)).await;
        r.stop().await.unwrap();
        // Observed from the rest of the world, not through the slow client.
        let world = fx.store();
        let after = world.current_revision().await.unwrap();
        assert!(
            !present(&world, &key).await,
            "key present right after stop ({offset_ms} ms)"
        );
        // Nothing may write the key after stop returned: watch it past a TTL.
        let mut w = world
            .watch(WatchRequest::key(key.clone()).with_start_revision(after + 1))
            .await
            .unwrap();
        let quiet = tokio::time::timeout(fx.ttl() + fx.slack(), async {
            loop {
                match w.next().await {
                    Some(Ok(batch)) => assert!(
                        batch.events.iter().all(|e| e.kind == EventKind::Delete),
                        "a heal wrote the key after stop returned ({offset_ms} ms): {batch:?}"
                    ),
                    other => return other,
                }
            }
        })
        .await;
        assert!(quiet.is_err(), "the watch ended early: {quiet:?}");
    }
}

/// A rolling restart: the new incarnation holds the name while the old one heals its lost
/// lease, and the old one is stopped while its heal's grant is on its way. The stop ends the
/// heal before it writes anything: the new incarnation's key is neither overwritten nor
/// removed.
pub async fn registration_stopped_while_its_heal_is_granted_writes_nothing(fx: &dyn Fixture) {
    let world = fx.store();
    let client = fx.client().await;
    let old = HostRegistration::start(
        client.store.clone(),
        reg(fx, "hosts/a", "old").with_backoff(Duration::from_millis(10), Duration::from_secs(1)),
    )
    .await
    .unwrap();
    let new = HostRegistration::start(world.clone(), reg(fx, "hosts/a", "new"))
        .await
        .unwrap();
    let registered = world.get_key("hosts/a").await.unwrap().unwrap();
    assert_eq!(registered.lease, new.lease_id());
    // Every request of the old incarnation now takes `delay` to arrive (a proxy delays the
    // replies as much), its heal's grant among them; the stop comes while that grant is on
    // its way. A round trip stays short of a renewal's timeout (a third of the TTL), so the
    // sessions work on, only slowly.
    let delay = fx.ttl() / 8;
    client.delay_requests(delay);
    world.revoke(old.lease_id()).await.unwrap();
    let mut status = old.subscribe();
    within(
        fx.ttl() + delay + fx.slack(),
        "the old incarnation's heal",
        async {
            status
                .wait_for(|s| matches!(s, RegistrationStatus::Healing { attempt } if *attempt >= 1))
                .await
                .unwrap()
        },
    )
    .await;
    // Past the first attempt's backoff (about 10 ms): its grant is on the wire.
    tokio::time::sleep(delay / 2).await;
    old.stop().await.unwrap();
    // The delayed grant lands (if it has not yet); nothing writes the key under it, before
    // the stop returned or after.
    client.delay_requests(Duration::ZERO);
    let mut w = world
        .watch(WatchRequest::key("hosts/a").with_start_revision(registered.mod_revision.next()))
        .await
        .unwrap();
    let quiet = tokio::time::timeout(delay + fx.ttl() + fx.slack(), w.next()).await;
    assert!(
        quiet.is_err(),
        "the stopped incarnation wrote over the new one's key (or removed it): {quiet:?}"
    );
    new.stop().await.unwrap();
}

pub async fn registration_updates_metadata_in_place(fx: &dyn Fixture) {
    let store = fx.store();
    let r = HostRegistration::start(store.clone(), reg(fx, "hosts/a", "v1"))
        .await
        .unwrap();
    let created = store
        .get_key("hosts/a")
        .await
        .unwrap()
        .unwrap()
        .create_revision;
    r.update_metadata("v2").await.unwrap();
    let kv = store.get_key("hosts/a").await.unwrap().unwrap();
    assert_eq!(
        (kv.value.as_ref(), kv.create_revision, kv.lease),
        ("v2".as_bytes(), created, r.lease_id())
    );
    // A heal writes the latest metadata, not the first.
    store.revoke(r.lease_id()).await.unwrap();
    eventually(fx.ttl(), "the heal", || async {
        present(&store, "hosts/a").await
    })
    .await;
    assert_eq!(
        store.get_key("hosts/a").await.unwrap().unwrap().value,
        "v2".as_bytes()
    );
}

pub async fn registration_puts_back_a_key_deleted_under_its_live_lease(fx: &dyn Fixture) {
    let store = fx.store();
    let r = HostRegistration::start(store.clone(), reg(fx, "hosts/a", "m"))
        .await
        .unwrap();
    store.delete_key("hosts/a").await.unwrap();
    eventually(prompt(fx), "the key to be put back", || async {
        present(&store, "hosts/a").await
    })
    .await;
    assert_eq!(
        store.get_key("hosts/a").await.unwrap().unwrap().lease,
        r.lease_id()
    );
}

/// While a registration puts back a key deleted under its live lease, it is not
/// `Registered` (a readiness probe must not read "registered" while the key is gone), and it
/// is again, on the same lease, once the key is back. The client's traffic is delayed TTL/10
/// each way, so the put-back takes at least a round trip of that; renewals, answered within
/// TTL/3, still land in time (a round trip of TTL/5, with TTL/7 to spare).
pub async fn registration_is_not_registered_while_its_key_is_put_back(fx: &dyn Fixture) {
    let client = fx.client().await;
    let store = fx.store();
    let r = HostRegistration::start(client.store.clone(), reg(fx, "hosts/a", "m"))
        .await
        .unwrap();
    let lease = r.lease_id();
    let mut status = r.subscribe();
    let delay = fx.ttl() / 10;
    client.delay_requests(delay);
    store.delete_key("hosts/a").await.unwrap();
    // The registration's watch of its key may still be on its way (delayed too), and then
    // re-reads the key when it opens.
    within(
        prompt(fx) + delay * 3,
        "the registration to say it is healing",
        status.wait_for(|s| matches!(s, RegistrationStatus::Healing { .. })),
    )
    .await
    .unwrap();
    within(
        fx.ttl(),
        "the registration to be back on its lease",
        status.wait_for(|s| *s == RegistrationStatus::Registered { lease }),
    )
    .await
    .unwrap();
    client.delay_requests(Duration::ZERO);
    // Registered is said only once the key is back.
    let kv = store
        .get_key("hosts/a")
        .await
        .unwrap()
        .expect("the key is back");
    assert_eq!(kv.lease, lease);
    r.stop().await.unwrap();
}

/// A registration whose key another lease takes (a newer incarnation of the host registering
/// under the same name) says it is not registered, without fighting for the key, and takes
/// the key back once it is freed. (`--defaults` seed 2337074: an old incarnation believed
/// itself registered on a key a newer one had taken, past an operator's revoke of its lease,
/// which no event of its key could tell it.)
pub async fn registration_whose_key_another_lease_takes_is_not_registered(fx: &dyn Fixture) {
    let client = fx.client().await;
    let store = fx.store();
    let r = HostRegistration::start(client.store.clone(), reg(fx, "hosts/a", "old"))
        .await
        .unwrap();
    let lease = r.lease_id();
    let mut status = r.subscribe();
    // Long enough to outlive the watch below without renewals.
    let newer = store.grant(fx.ttl() * 3).await.unwrap().id;
    store
        .put(PutRequest::new("hosts/a", "new").with_lease(newer))
        .await
        .unwrap();
    within(
        prompt(fx),
        "the registration to say it is not registered",
        status.wait_for(|s| matches!(s, RegistrationStatus::Healing { .. })),
    )
    .await
    .unwrap();
    // No fight: the newer owner keeps the key, for a TTL.
    tokio::time::sleep(fx.ttl()).await;
    let kv = store
        .get_key("hosts/a")
        .await
        .unwrap()
        .expect("the newer key");
    assert_eq!((kv.lease, kv.value.as_ref()), (newer, &b"new"[..]));
    assert!(matches!(r.status(), RegistrationStatus::Healing { .. }));
    // The newer owner leaves: the key is put back under the registration's lease.
    store.revoke(newer).await.unwrap();
    within(
        fx.ttl(),
        "the registration to be back on its lease",
        status.wait_for(|s| *s == RegistrationStatus::Registered { lease }),
    )
    .await
    .unwrap();
    let kv = store
        .get_key("hosts/a")
        .await
        .unwrap()
        .expect("the key is back");
    assert_eq!((kv.lease, kv.value.as_ref()), (lease, &b"old"[..]));
    r.stop().await.unwrap();
}

/// A registration healing after its lease is gone leaves the key to a lease that registered
/// it meanwhile (a newer incarnation of the host), and takes it once that lease lets go.
/// (Turmoil seed 130454: an old incarnation's heal took the key from the new one in the
/// instant it registered, and held it through the old one's stop.)
pub async fn registration_heal_leaves_a_key_another_lease_holds(fx: &dyn Fixture) {
    let store = fx.store();
    let r = HostRegistration::start(store.clone(), reg(fx, "hosts/a", "old"))
        .await
        .unwrap();
    let old = r.lease_id();
    let mut status = r.subscribe();
    let newer = store.grant(fx.ttl() * 3).await.unwrap().id;
    store
        .put(PutRequest::new("hosts/a", "new").with_lease(newer))
        .await
        .unwrap();
    within(
        prompt(fx),
        "the registration to say it is not registered",
        status.wait_for(|s| matches!(s, RegistrationStatus::Healing { .. })),
    )
    .await
    .unwrap();
    // Its lease goes too: it heals onto a new one, and finds the key taken.
    store.revoke(old).await.unwrap();
    tokio::time::sleep(fx.ttl()).await;
    let kv = store
        .get_key("hosts/a")
        .await
        .unwrap()
        .expect("the newer key");
    assert_eq!(
        (kv.lease, kv.value.as_ref()),
        (newer, &b"new"[..]),
        "a heal took the key from the lease that registered it meanwhile"
    );
    assert!(matches!(r.status(), RegistrationStatus::Healing { .. }));
    store.revoke(newer).await.unwrap();
    within(
        fx.ttl(),
        "the heal to take the freed key",
        status.wait_for(|s| matches!(s, RegistrationStatus::Registered { lease } if *lease != old)),
    )
    .await
    .unwrap();
    let kv = store
        .get_key("hosts/a")
        .await
        .unwrap()
        .expect("the key is back");
    assert_eq!((kv.lease, kv.value.as_ref()), (r.lease_id(), &b"old"[..]));
    r.stop().await.unwrap();
}
