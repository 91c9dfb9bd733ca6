//! Cases for leases: grant, revoke, time-to-live, keep-alive, expiry.

use std::time::Duration;

use super::{eventually, Ctx};
use crate::{Error, EventKind, KvLeaseStore, KvLeaseStoreExt, LeaseId, PutRequest, WatchRequest};

/// A grant returns a non-zero id and the TTL asked for, when it is above the minimum.
pub async fn lease_grant_returns_id_and_ttl(cx: Ctx) {
    let s = cx.store();
    let a = s.grant(Duration::from_secs(30)).await.unwrap();
    let b = s.grant(Duration::from_secs(30)).await.unwrap();
    assert_ne!(a.id, LeaseId::NONE);
    assert!(a.id.0 > 0, "etcd lease ids are positive");
    assert_ne!(a.id, b.id, "lease ids are unique");
    assert_eq!(a.ttl, Duration::from_secs(30));
    s.revoke(a.id).await.unwrap();
    s.revoke(b.id).await.unwrap();
}

/// A TTL below the store's minimum is raised to it; fractions round up to whole seconds.
pub async fn lease_grant_raises_ttl_to_minimum(cx: Ctx) {
    let s = cx.store();
    let min = cx.limits().min_lease_ttl;
    let tiny = s.grant(Duration::from_millis(10)).await.unwrap();
    assert_eq!(tiny.ttl, min);
    let frac = s.grant(min + Duration::from_millis(300)).await.unwrap();
    assert_eq!(frac.ttl, min + Duration::from_secs(1));
    s.revoke(tiny.id).await.unwrap();
    s.revoke(frac.id).await.unwrap();
}

/// A zero TTL, or one above the store's maximum, is refused with `InvalidArgument`.
pub async fn lease_grant_invalid_ttl_is_refused(cx: Ctx) {
    let s = cx.store();
    let zero = s.grant(Duration::ZERO).await.unwrap_err();
    assert!(matches!(zero, Error::InvalidArgument { .. }), "{zero:?}");
    let huge = s
        .grant(cx.limits().max_lease_ttl + Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(matches!(huge, Error::InvalidArgument { .. }), "{huge:?}");
}

/// Lease calls do not advance the store revision; neither does revoking a lease with no keys.
pub async fn lease_calls_do_not_advance_revision(cx: Ctx) {
    let s = cx.store();
    let before = s.current_revision().await.unwrap();
    let lease = s.grant(cx.long_ttl()).await.unwrap();
    let mut ka = s.keep_alive(lease.id).await.unwrap();
    ka.renew().await.unwrap();
    s.time_to_live(lease.id).await.unwrap();
    let after_revoke = s.revoke(lease.id).await.unwrap();
    assert_eq!(after_revoke, before);
    assert_eq!(s.current_revision().await.unwrap(), before);
}

/// Time-to-live reports the remaining TTL (whole seconds, at most the granted TTL), the
/// granted TTL, and the attached keys.
pub async fn lease_time_to_live_reports_keys(cx: Ctx) {
    let s = cx.store();
    let lease = s.grant(Duration::from_secs(30)).await.unwrap();
    s.put(PutRequest::new(cx.key("b"), "v").with_lease(lease.id))
        .await
        .unwrap();
    s.put(PutRequest::new(cx.key("a"), "v").with_lease(lease.id))
        .await
        .unwrap();
    let ttl = s.time_to_live(lease.id).await.unwrap();
    assert_eq!(ttl.id, lease.id);
    assert_eq!(ttl.granted_ttl, Duration::from_secs(30));
    assert!(ttl.ttl <= Duration::from_secs(30) && ttl.ttl >= Duration::from_secs(28));
    assert_eq!(ttl.ttl.subsec_nanos(), 0, "whole seconds");
    let keys: Vec<_> = ttl.keys.iter().map(|k| k.to_vec()).collect();
    assert_eq!(
        keys,
        vec![cx.key("a").into_bytes(), cx.key("b").into_bytes()]
    );
    s.revoke(lease.id).await.unwrap();
}

/// Time-to-live of a revoked or never-granted lease is `LeaseNotFound`.
pub async fn lease_time_to_live_of_dead_lease_is_not_found(cx: Ctx) {
    let s = cx.store();
    let lease = s.grant(cx.long_ttl()).await.unwrap();
    s.revoke(lease.id).await.unwrap();
    let err = s.time_to_live(lease.id).await.unwrap_err();
    assert!(
        matches!(err, Error::LeaseNotFound { lease: l } if l == lease.id),
        "{err:?}"
    );
    let never = s.time_to_live(LeaseId(0x7eed_beef_0003)).await.unwrap_err();
    assert!(matches!(never, Error::LeaseNotFound { .. }), "{never:?}");
}

/// Revoking deletes every attached key in one revision, and only those.
pub async fn lease_revoke_deletes_keys_in_one_revision(cx: Ctx) {
    let s = cx.store();
    let lease = s.grant(cx.long_ttl()).await.unwrap();
    for k in ["a", "b", "c"] {
        s.put(PutRequest::new(cx.key(k), "v").with_lease(lease.id))
            .await
            .unwrap();
    }
    s.put_value(cx.key("free"), "v").await.unwrap();
    let from = s.current_revision().await.unwrap() + 1;
    let mut w = s
        .watch(WatchRequest::prefix(cx.prefix()).with_start_revision(from))
        .await
        .unwrap();
    let rev = s.revoke(lease.id).await.unwrap();
    assert_eq!(rev, from, "one revision for all the keys");
    let events = super::collect_events(&mut w, 3).await;
    for e in &events {
        assert_eq!(e.kind, EventKind::Delete);
        assert_eq!(e.kv.mod_revision, rev);
    }
    let left = s.get_prefix(cx.prefix()).await.unwrap();
    assert_eq!(left.count, 1);
    assert_eq!(left.kvs[0].key, cx.key("free").as_bytes());
}

/// Revoking a lease that is already gone is `LeaseNotFound`.
pub async fn lease_revoke_unknown_is_not_found(cx: Ctx) {
    let s = cx.store();
    let lease = s.grant(cx.long_ttl()).await.unwrap();
    s.revoke(lease.id).await.unwrap();
    let err = s.revoke(lease.id).await.unwrap_err();
    assert!(
        matches!(err, Error::LeaseNotFound { lease: l } if l == lease.id),
        "{err:?}"
    );
}

/// An unrenewed lease expires within its TTL plus the store's granularity, deleting its keys;
/// it is still there well before its TTL.
pub async fn lease_expiry_deletes_keys(cx: Ctx) {
    let s = cx.store();
    let ttl = cx.short_ttl();
    let lease = s.grant(ttl).await.unwrap();
    let start = tokio::time::Instant::now();
    s.put(PutRequest::new(cx.key("a"), "v").with_lease(lease.id))
        .await
        .unwrap();
    tokio::time::sleep(ttl / 2).await;
    assert!(
        s.get_key(cx.key("a")).await.unwrap().is_some(),
        "the key outlived half its TTL"
    );
    eventually(cx.expiry_bound(ttl), "the leased key to expire", || async {
        s.get_key(cx.key("a")).await.unwrap().is_none()
    })
    .await;
    assert!(
        start.elapsed() >= ttl - Duration::from_millis(100),
        "expired after {:?}, before its TTL of {ttl:?}",
        start.elapsed()
    );
    let err = s.time_to_live(lease.id).await.unwrap_err();
    assert!(matches!(err, Error::LeaseNotFound { .. }), "{err:?}");
}

/// Expiry emits one delete event per key, all at one revision.
pub async fn lease_expiry_emits_delete_events(cx: Ctx) {
    let s = cx.store();
    let lease = s.grant(cx.short_ttl()).await.unwrap();
    for k in ["a", "b"] {
        s.put(PutRequest::new(cx.key(k), "v").with_lease(lease.id))
            .await
            .unwrap();
    }
    let mut w = s
        .watch(WatchRequest::prefix(cx.prefix()).with_prev_kv())
        .await
        .unwrap();
    let batch = super::within(
        cx.expiry_bound(cx.short_ttl()),
        "the expiry's delete events",
        super::next_events(&mut w),
    )
    .await;
    assert_eq!(batch.events.len(), 2, "{batch:?}");
    let rev = batch.events[0].kv.mod_revision;
    for e in &batch.events {
        assert_eq!(e.kind, EventKind::Delete);
        assert_eq!(e.kv.mod_revision, rev);
        assert_eq!(e.prev_kv.as_ref().map(|p| p.lease), Some(lease.id));
    }
}

/// Renewing resets the TTL: a lease renewed every third of its TTL outlives it by far.
pub async fn lease_keep_alive_extends_the_lease(cx: Ctx) {
    let s = cx.store();
    let ttl = cx.short_ttl();
    let lease = s.grant(ttl).await.unwrap();
    s.put(PutRequest::new(cx.key("a"), "v").with_lease(lease.id))
        .await
        .unwrap();
    let mut ka = s.keep_alive(lease.id).await.unwrap();
    assert_eq!(ka.lease(), lease.id);
    for _ in 0..6 {
        tokio::time::sleep(ttl / 3).await;
        let granted = ka.renew().await.unwrap();
        assert_eq!(granted, ttl, "a renewal answers with the full TTL");
    }
    assert!(
        s.get_key(cx.key("a")).await.unwrap().is_some(),
        "alive after 2 TTLs"
    );
    s.revoke(lease.id).await.unwrap();
}

/// Renewing a revoked lease is `LeaseNotFound`, on a channel opened before or after.
pub async fn lease_keep_alive_on_revoked_lease_is_not_found(cx: Ctx) {
    let s = cx.store();
    let lease = s.grant(cx.long_ttl()).await.unwrap();
    let mut before = s.keep_alive(lease.id).await.unwrap();
    before.renew().await.unwrap();
    s.revoke(lease.id).await.unwrap();
    let err = before.renew().await.unwrap_err();
    assert!(
        matches!(err, Error::LeaseNotFound { lease: l } if l == lease.id),
        "{err:?}"
    );
    let err = before.renew().await.unwrap_err();
    assert!(
        matches!(err, Error::LeaseNotFound { .. }),
        "still lost: {err:?}"
    );
    assert_keep_alive_finds_it_gone(s, lease.id).await;
}

/// A channel opened on a lease that is gone says so: when it opens (if opening asks the
/// store) or at its first renewal.
async fn assert_keep_alive_finds_it_gone(s: &crate::DynKvLeaseStore, lease: LeaseId) {
    let err = match s.keep_alive(lease).await {
        Ok(mut channel) => channel.renew().await.unwrap_err(),
        Err(e) => e,
    };
    assert!(
        matches!(err, Error::LeaseNotFound { lease: l } if l == lease),
        "{err:?}"
    );
}

/// Renewing an expired lease is `LeaseNotFound`: a renewal cannot bring it back.
pub async fn lease_keep_alive_after_expiry_is_not_found(cx: Ctx) {
    let s = cx.store();
    let ttl = cx.short_ttl();
    let lease = s.grant(ttl).await.unwrap();
    s.put(PutRequest::new(cx.key("a"), "v").with_lease(lease.id))
        .await
        .unwrap();
    let mut ka = s.keep_alive(lease.id).await.unwrap();
    eventually(cx.expiry_bound(ttl), "the lease to expire", || async {
        s.get_key(cx.key("a")).await.unwrap().is_none()
    })
    .await;
    let err = ka.renew().await.unwrap_err();
    assert!(matches!(err, Error::LeaseNotFound { .. }), "{err:?}");
}

/// Putting a leased key again without a lease detaches it: revoking no longer deletes it.
pub async fn lease_put_without_lease_detaches_key(cx: Ctx) {
    let s = cx.store();
    let lease = s.grant(cx.long_ttl()).await.unwrap();
    s.put(PutRequest::new(cx.key("a"), "1").with_lease(lease.id))
        .await
        .unwrap();
    s.put_value(cx.key("a"), "2").await.unwrap();
    assert_eq!(
        s.get_key(cx.key("a")).await.unwrap().unwrap().lease,
        LeaseId::NONE
    );
    assert!(s.time_to_live(lease.id).await.unwrap().keys.is_empty());
    s.revoke(lease.id).await.unwrap();
    assert!(s.get_key(cx.key("a")).await.unwrap().is_some());
}

/// Putting a key under another lease moves it: it lives and dies with the new lease only.
pub async fn lease_put_moves_key_between_leases(cx: Ctx) {
    let s = cx.store();
    let first = s.grant(cx.long_ttl()).await.unwrap();
    let second = s.grant(cx.long_ttl()).await.unwrap();
    s.put(PutRequest::new(cx.key("a"), "1").with_lease(first.id))
        .await
        .unwrap();
    s.put(PutRequest::new(cx.key("a"), "2").with_lease(second.id))
        .await
        .unwrap();
    s.revoke(first.id).await.unwrap();
    let kv = s
        .get_key(cx.key("a"))
        .await
        .unwrap()
        .expect("survives the old lease");
    assert_eq!(kv.lease, second.id);
    s.revoke(second.id).await.unwrap();
    assert_eq!(s.get_key(cx.key("a")).await.unwrap(), None);
}

/// Keys deleted by hand leave the lease alive, and it no longer lists them.
pub async fn lease_survives_deletion_of_its_keys(cx: Ctx) {
    let s = cx.store();
    let lease = s.grant(cx.long_ttl()).await.unwrap();
    s.put(PutRequest::new(cx.key("a"), "v").with_lease(lease.id))
        .await
        .unwrap();
    s.delete_key(cx.key("a")).await.unwrap();
    let ttl = s.time_to_live(lease.id).await.unwrap();
    assert!(ttl.keys.is_empty());
    s.revoke(lease.id).await.unwrap();
}
