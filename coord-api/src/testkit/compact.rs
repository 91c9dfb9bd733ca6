//! Cases for compaction. They compact the whole store, so every one is exclusive.

use super::Ctx;
use crate::{Error, GetRequest, KvLeaseStore, KvLeaseStoreExt};

/// After compaction, reads below the compaction point fail with `Compacted`; reads at it and
/// above still work and see the same values.
pub async fn compact_discards_older_revisions(cx: Ctx) {
    let s = cx.store();
    let r1 = s.put_value(cx.key("a"), "1").await.unwrap();
    let r2 = s.put_value(cx.key("a"), "2").await.unwrap();
    let r3 = s.put_value(cx.key("b"), "3").await.unwrap();
    s.compact(r2).await.unwrap();
    let err = s
        .get(GetRequest::key(cx.key("a")).with_revision(r1))
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::Compacted { requested, compact_revision } if requested == r1 && compact_revision == r2),
        "{err:?}"
    );
    let at = s
        .get(GetRequest::key(cx.key("a")).with_revision(r2))
        .await
        .unwrap();
    assert_eq!(at.kvs[0].value, "2".as_bytes());
    let b_before = s
        .get(GetRequest::key(cx.key("b")).with_revision(r2))
        .await
        .unwrap();
    assert!(b_before.kvs.is_empty(), "b did not exist at {r2}");
    assert!(r3 > r2);
}

/// Compaction keeps every current value and its metadata, and does not advance the revision.
pub async fn compact_keeps_current_values(cx: Ctx) {
    let s = cx.store();
    let created = s.put_value(cx.key("a"), "1").await.unwrap();
    let r2 = s.put_value(cx.key("a"), "2").await.unwrap();
    s.put_value(cx.key("b"), "x").await.unwrap();
    s.delete_key(cx.key("b")).await.unwrap();
    let before = s.current_revision().await.unwrap();
    s.compact(before).await.unwrap();
    assert_eq!(s.current_revision().await.unwrap(), before);
    let kv = s.get_key(cx.key("a")).await.unwrap().unwrap();
    assert_eq!(
        (
            kv.value.as_ref(),
            kv.create_revision,
            kv.mod_revision,
            kv.version
        ),
        ("2".as_bytes(), created, r2, 2)
    );
    assert_eq!(s.get_key(cx.key("b")).await.unwrap(), None);
}

/// Compacting at or below the compaction point again fails with `Compacted`.
pub async fn compact_twice_fails(cx: Ctx) {
    let s = cx.store();
    let r1 = s.put_value(cx.key("a"), "1").await.unwrap();
    let r2 = s.put_value(cx.key("a"), "2").await.unwrap();
    s.compact(r2).await.unwrap();
    for rev in [r2, r1] {
        let err = s.compact(rev).await.unwrap_err();
        assert!(
            matches!(err, Error::Compacted { compact_revision, .. } if compact_revision == r2),
            "{err:?}"
        );
    }
}

/// Compacting beyond the current revision fails with `FutureRevision`.
pub async fn compact_future_revision_fails(cx: Ctx) {
    let s = cx.store();
    let r = s.put_value(cx.key("a"), "1").await.unwrap();
    let err = s.compact(r + 100).await.unwrap_err();
    assert!(matches!(err, Error::FutureRevision { .. }), "{err:?}");
    s.compact(r).await.unwrap();
}

/// A key deleted before the compaction point stays deleted, and a key written after it keeps
/// its full history from there on.
pub async fn compact_preserves_history_after_the_point(cx: Ctx) {
    let s = cx.store();
    s.put_value(cx.key("gone"), "v").await.unwrap();
    s.delete_key(cx.key("gone")).await.unwrap();
    let point = s.put_value(cx.key("a"), "1").await.unwrap();
    s.compact(point).await.unwrap();
    let r2 = s.put_value(cx.key("a"), "2").await.unwrap();
    let r3 = s.put_value(cx.key("a"), "3").await.unwrap();
    let at = |rev| s.get(GetRequest::key(cx.key("a")).with_revision(rev));
    assert_eq!(at(point).await.unwrap().kvs[0].value, "1".as_bytes());
    assert_eq!(at(r2).await.unwrap().kvs[0].value, "2".as_bytes());
    assert_eq!(at(r3).await.unwrap().kvs[0].value, "3".as_bytes());
    let gone = s
        .get(GetRequest::key(cx.key("gone")).with_revision(point))
        .await
        .unwrap();
    assert!(gone.kvs.is_empty());
}
