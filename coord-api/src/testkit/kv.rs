//! Cases for get, put and delete.

use super::Ctx;
use crate::{
    DeleteRequest, Error, GetRequest, KvLeaseStore, KvLeaseStoreExt, LeaseId, PutRequest,
    SortOrder, SortTarget,
};

/// A put creates the key with version 1, create = mod = the put's revision, and no lease.
pub async fn kv_put_then_get_reports_metadata(cx: Ctx) {
    let s = cx.store();
    let put = s.put(PutRequest::new(cx.key("a"), "one")).await.unwrap();
    assert!(put.revision > 0);
    assert_eq!(put.prev_kv, None);
    let kv = s.get_key(cx.key("a")).await.unwrap().expect("key exists");
    assert_eq!(kv.key, cx.key("a").as_bytes());
    assert_eq!(kv.value, "one".as_bytes());
    assert_eq!(kv.create_revision, put.revision);
    assert_eq!(kv.mod_revision, put.revision);
    assert_eq!(kv.version, 1);
    assert_eq!(kv.lease, LeaseId::NONE);
}

/// Overwriting keeps the create revision, moves the mod revision, and bumps the version.
pub async fn kv_overwrite_bumps_version_and_mod_revision(cx: Ctx) {
    let s = cx.store();
    let r1 = s.put_value(cx.key("a"), "1").await.unwrap();
    let r2 = s.put_value(cx.key("a"), "2").await.unwrap();
    let r3 = s.put_value(cx.key("a"), "3").await.unwrap();
    assert!(r1 < r2 && r2 < r3);
    let kv = s.get_key(cx.key("a")).await.unwrap().unwrap();
    assert_eq!(kv.value, "3".as_bytes());
    assert_eq!(kv.create_revision, r1);
    assert_eq!(kv.mod_revision, r3);
    assert_eq!(kv.version, 3);
}

/// Each write advances the store revision by exactly one; reads do not advance it.
pub async fn kv_each_write_advances_revision_by_one(cx: Ctx) {
    let s = cx.store();
    let start = s.current_revision().await.unwrap();
    let r1 = s.put_value(cx.key("a"), "1").await.unwrap();
    let r2 = s.put_value(cx.key("b"), "2").await.unwrap();
    let r3 = s.put_value(cx.key("a"), "3").await.unwrap();
    assert_eq!((r1, r2, r3), (start + 1, start + 2, start + 3));
    let got = s.get(GetRequest::prefix(cx.prefix())).await.unwrap();
    assert_eq!(
        got.revision,
        start + 3,
        "a get reports the current revision"
    );
    let del = s.delete(DeleteRequest::key(cx.key("a"))).await.unwrap();
    assert_eq!(del.revision, start + 4);
    assert_eq!(s.current_revision().await.unwrap(), start + 4);
}

/// A missing key reads as empty (not an error), with the current revision.
pub async fn kv_get_missing_key_is_empty(cx: Ctx) {
    let s = cx.store();
    let r = s.put_value(cx.key("other"), "x").await.unwrap();
    let got = s.get(GetRequest::key(cx.key("missing"))).await.unwrap();
    assert!(got.kvs.is_empty());
    assert_eq!(got.count, 0);
    assert!(!got.more);
    assert!(got.revision >= r);
}

/// A prefix read returns exactly the keys under the prefix, in byte order.
pub async fn kv_get_prefix_returns_keys_in_order(cx: Ctx) {
    let s = cx.store();
    for k in ["p/c", "p/a", "p/b/x", "p0", "p", "q/a"] {
        s.put_value(cx.key(k), k).await.unwrap();
    }
    let got = s.get(GetRequest::prefix(cx.key("p/"))).await.unwrap();
    let keys: Vec<_> = got.kvs.iter().map(|kv| kv.key.clone()).collect();
    let want: Vec<_> = ["p/a", "p/b/x", "p/c"]
        .iter()
        .map(|k| bytes::Bytes::from(cx.key(k)))
        .collect();
    assert_eq!(keys, want);
    assert_eq!(got.count, 3);
}

/// Keys are ordered as bytes, not as text: 0xff sorts after every ASCII byte.
pub async fn kv_keys_are_ordered_as_bytes(cx: Ctx) {
    let s = cx.store();
    let mut high = cx.key("b/").into_bytes();
    high.push(0xff);
    let mut low = cx.key("b/").into_bytes();
    low.push(b'Z');
    s.put(PutRequest::new(high.clone(), "high")).await.unwrap();
    s.put(PutRequest::new(low.clone(), "low")).await.unwrap();
    let got = s.get(GetRequest::prefix(cx.key("b/"))).await.unwrap();
    let keys: Vec<Vec<u8>> = got.kvs.iter().map(|kv| kv.key.to_vec()).collect();
    assert_eq!(keys, vec![low, high]);
}

/// A limit returns the first keys in order, with `count` of them all and `more` set.
pub async fn kv_get_prefix_with_limit_reports_more(cx: Ctx) {
    let s = cx.store();
    for k in ["l/1", "l/2", "l/3", "l/4"] {
        s.put_value(cx.key(k), "v").await.unwrap();
    }
    let got = s
        .get(GetRequest::prefix(cx.key("l/")).with_limit(2))
        .await
        .unwrap();
    assert_eq!(got.kvs.len(), 2);
    assert_eq!(got.kvs[0].key, cx.key("l/1").as_bytes());
    assert_eq!(got.kvs[1].key, cx.key("l/2").as_bytes());
    assert_eq!(got.count, 4);
    assert!(got.more);
    let all = s
        .get(GetRequest::prefix(cx.key("l/")).with_limit(4))
        .await
        .unwrap();
    assert_eq!(all.kvs.len(), 4);
    assert!(!all.more);
}

/// Sorting by create revision, mod revision or key, either way, orders the whole range
/// before the limit.
pub async fn kv_get_sorts_by_revision_or_key_before_the_limit(cx: Ctx) {
    let s = cx.store();
    // Created in the order c, a, b; then a modified last.
    let c = s.put_value(cx.key("s/c"), "3").await.unwrap();
    let a = s.put_value(cx.key("s/a"), "1").await.unwrap();
    let b = s.put_value(cx.key("s/b"), "2").await.unwrap();
    let a2 = s.put_value(cx.key("s/a"), "1'").await.unwrap();
    let keys = |r: &crate::GetResponse| -> Vec<String> {
        r.kvs
            .iter()
            .map(|kv| kv.key_str().rsplit('/').next().unwrap().to_owned())
            .collect()
    };
    let get = |target, order| GetRequest::prefix(cx.key("s/")).with_sort(target, order);
    let by_create = s
        .get(get(SortTarget::Create, SortOrder::Descend))
        .await
        .unwrap();
    assert_eq!(keys(&by_create), ["b", "a", "c"], "newest created first");
    let by_mod = s
        .get(get(SortTarget::Mod, SortOrder::Ascend))
        .await
        .unwrap();
    assert_eq!(
        keys(&by_mod),
        ["c", "b", "a"],
        "least recently modified first"
    );
    let by_key = s
        .get(get(SortTarget::Key, SortOrder::Descend))
        .await
        .unwrap();
    assert_eq!(keys(&by_key), ["c", "b", "a"]);
    let first = s
        .get(get(SortTarget::Create, SortOrder::Ascend).with_limit(1))
        .await
        .unwrap();
    assert_eq!(keys(&first), ["c"], "the limit applies after the sort");
    assert_eq!((first.count, first.more), (3, true));
    assert_eq!(first.kvs[0].create_revision, c);
    assert!(c < a && a < b && b < a2);
}

/// The revision filters keep the keys created or modified within bounds, before the limit;
/// `count` still counts the whole range, and `more` the filtered keys the limit cut off.
pub async fn kv_get_filters_by_create_and_mod_revision(cx: Ctx) {
    let s = cx.store();
    let r1 = s.put_value(cx.key("f/1"), "v").await.unwrap();
    let r2 = s.put_value(cx.key("f/2"), "v").await.unwrap();
    let r3 = s.put_value(cx.key("f/3"), "v").await.unwrap();
    let r4 = s.put_value(cx.key("f/1"), "w").await.unwrap();
    let names = |r: &crate::GetResponse| -> Vec<String> {
        r.kvs
            .iter()
            .map(|kv| kv.key_str().rsplit('/').next().unwrap().to_owned())
            .collect()
    };
    let range = || GetRequest::prefix(cx.key("f/"));
    let created_before_3 = s.get(range().with_max_create_revision(r2)).await.unwrap();
    assert_eq!(names(&created_before_3), ["1", "2"]);
    assert_eq!(
        created_before_3.count, 3,
        "count is the whole range, unfiltered"
    );
    let created_from_2 = s.get(range().with_min_create_revision(r2)).await.unwrap();
    assert_eq!(names(&created_from_2), ["2", "3"]);
    let modified_last = s.get(range().with_min_mod_revision(r4)).await.unwrap();
    assert_eq!(names(&modified_last), ["1"]);
    let untouched = s
        .get(range().with_min_mod_revision(r2).with_max_mod_revision(r3))
        .await
        .unwrap();
    assert_eq!(names(&untouched), ["2", "3"]);
    let limited = s
        .get(range().with_max_create_revision(r2).with_limit(1))
        .await
        .unwrap();
    assert_eq!(names(&limited), ["1"]);
    assert!(limited.more, "a second filtered key was cut off");
    let exact = s
        .get(range().with_max_create_revision(r1).with_limit(1))
        .await
        .unwrap();
    assert!(
        !exact.more,
        "one key passes the filter, and the limit is one"
    );
    // The query a campaign makes: the newest candidate created before revision r3.
    let ahead = s
        .get(
            range()
                .with_max_create_revision(r3.prev())
                .with_sort(SortTarget::Create, SortOrder::Descend)
                .with_limit(1),
        )
        .await
        .unwrap();
    assert_eq!(names(&ahead), ["2"]);
}

/// A read at a past revision sees the value as it was then, with its metadata then.
pub async fn kv_get_at_past_revision_sees_old_value(cx: Ctx) {
    let s = cx.store();
    let r1 = s.put_value(cx.key("a"), "old").await.unwrap();
    let r2 = s.put_value(cx.key("a"), "new").await.unwrap();
    let then = s
        .get(GetRequest::key(cx.key("a")).with_revision(r1))
        .await
        .unwrap();
    assert_eq!(then.kvs.len(), 1);
    assert_eq!(then.kvs[0].value, "old".as_bytes());
    assert_eq!(then.kvs[0].version, 1);
    assert_eq!(then.kvs[0].mod_revision, r1);
    assert!(
        then.revision >= r2,
        "the header carries the current revision"
    );
    let now = s.get_key(cx.key("a")).await.unwrap().unwrap();
    assert_eq!(now.value, "new".as_bytes());
}

/// A read at a revision before the key existed, or after it was deleted, finds nothing;
/// one in between finds it.
pub async fn kv_get_at_revision_outside_lifetime_is_empty(cx: Ctx) {
    let s = cx.store();
    let before = s.put_value(cx.key("marker"), "m").await.unwrap();
    let created = s.put_value(cx.key("a"), "v").await.unwrap();
    let deleted = s
        .delete(DeleteRequest::key(cx.key("a")))
        .await
        .unwrap()
        .revision;
    let at = |rev| s.get(GetRequest::key(cx.key("a")).with_revision(rev));
    assert!(at(before).await.unwrap().kvs.is_empty());
    assert_eq!(at(created).await.unwrap().kvs.len(), 1);
    assert!(at(deleted).await.unwrap().kvs.is_empty());
}

/// A read at a revision not yet written fails with `FutureRevision`.
pub async fn kv_get_at_future_revision_fails(cx: Ctx) {
    let s = cx.store();
    let r = s.put_value(cx.key("a"), "v").await.unwrap();
    let err = s
        .get(GetRequest::key(cx.key("a")).with_revision(r + 1_000_000))
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::FutureRevision { requested, current } if requested == r + 1_000_000 && current >= r),
        "{err:?}"
    );
}

/// `prev_kv` on a put returns the key as it was; on a new key, nothing.
pub async fn kv_put_returns_previous_value(cx: Ctx) {
    let s = cx.store();
    let first = s
        .put(PutRequest::new(cx.key("a"), "1").with_prev_kv())
        .await
        .unwrap();
    assert_eq!(first.prev_kv, None);
    let second = s
        .put(PutRequest::new(cx.key("a"), "2").with_prev_kv())
        .await
        .unwrap();
    let prev = second.prev_kv.expect("previous value returned");
    assert_eq!(prev.value, "1".as_bytes());
    assert_eq!(prev.mod_revision, first.revision);
    assert_eq!(prev.version, 1);
    let third = s.put(PutRequest::new(cx.key("a"), "3")).await.unwrap();
    assert_eq!(third.prev_kv, None, "not returned unless asked for");
}

/// Deleting a key returns the count and the delete's revision; the key is gone.
pub async fn kv_delete_key_removes_it(cx: Ctx) {
    let s = cx.store();
    let put = s.put_value(cx.key("a"), "v").await.unwrap();
    let del = s.delete(DeleteRequest::key(cx.key("a"))).await.unwrap();
    assert_eq!(del.deleted, 1);
    assert!(del.revision > put);
    assert!(del.prev_kvs.is_empty(), "not returned unless asked for");
    assert_eq!(s.get_key(cx.key("a")).await.unwrap(), None);
}

/// Deleting nothing is not an error and does not advance the revision.
pub async fn kv_delete_missing_key_changes_nothing(cx: Ctx) {
    let s = cx.store();
    let before = s.current_revision().await.unwrap();
    let del = s
        .delete(DeleteRequest::key(cx.key("missing")))
        .await
        .unwrap();
    assert_eq!(del.deleted, 0);
    assert_eq!(del.revision, before);
    let del = s
        .delete(DeleteRequest::prefix(cx.key("none/")))
        .await
        .unwrap();
    assert_eq!(del.deleted, 0);
    assert_eq!(s.current_revision().await.unwrap(), before);
}

/// A prefix delete removes every key under the prefix, and only those, in one revision.
pub async fn kv_delete_prefix_is_one_revision(cx: Ctx) {
    let s = cx.store();
    for k in ["d/1", "d/2", "d/3", "d0", "e"] {
        s.put_value(cx.key(k), "v").await.unwrap();
    }
    let before = s.current_revision().await.unwrap();
    let del = s
        .delete(DeleteRequest::prefix(cx.key("d/")).with_prev_kv())
        .await
        .unwrap();
    assert_eq!(del.deleted, 3);
    assert_eq!(del.revision, before + 1);
    let prev: Vec<_> = del.prev_kvs.iter().map(|kv| kv.key.clone()).collect();
    let want: Vec<_> = ["d/1", "d/2", "d/3"]
        .iter()
        .map(|k| bytes::Bytes::from(cx.key(k)))
        .collect();
    assert_eq!(prev, want);
    let left = s.get(GetRequest::prefix(cx.prefix())).await.unwrap();
    let left: Vec<_> = left.kvs.iter().map(|kv| kv.key.clone()).collect();
    assert_eq!(
        left,
        vec![
            bytes::Bytes::from(cx.key("d0")),
            bytes::Bytes::from(cx.key("e"))
        ]
    );
}

/// A key re-created after a delete starts over: version 1, a new create revision.
pub async fn kv_recreated_key_starts_over(cx: Ctx) {
    let s = cx.store();
    s.put_value(cx.key("a"), "1").await.unwrap();
    s.put_value(cx.key("a"), "2").await.unwrap();
    s.delete_key(cx.key("a")).await.unwrap();
    let again = s.put_value(cx.key("a"), "3").await.unwrap();
    let kv = s.get_key(cx.key("a")).await.unwrap().unwrap();
    assert_eq!(kv.version, 1);
    assert_eq!(kv.create_revision, again);
}

/// Empty values are values: the key exists with an empty value.
pub async fn kv_empty_value_is_stored(cx: Ctx) {
    let s = cx.store();
    s.put_value(cx.key("a"), "").await.unwrap();
    let kv = s.get_key(cx.key("a")).await.unwrap().expect("key exists");
    assert!(kv.value.is_empty());
    assert_eq!(kv.version, 1);
}

/// Empty keys and prefixes are refused with `InvalidArgument`, for every operation.
pub async fn kv_empty_key_is_invalid(cx: Ctx) {
    let s = cx.store();
    let invalid = |r: Result<(), Error>| matches!(r, Err(Error::InvalidArgument { .. }));
    assert!(invalid(s.put(PutRequest::new("", "v")).await.map(drop)));
    assert!(invalid(s.get(GetRequest::key("")).await.map(drop)));
    assert!(invalid(s.get(GetRequest::prefix("")).await.map(drop)));
    assert!(invalid(s.delete(DeleteRequest::key("")).await.map(drop)));
    assert!(invalid(s.delete(DeleteRequest::prefix("")).await.map(drop)));
}

/// A value over the store's request limit is refused with `InvalidArgument` and not stored;
/// a value of 1 MiB is stored intact.
pub async fn kv_oversized_value_is_invalid(cx: Ctx) {
    let s = cx.store();
    let limit = cx.limits().max_request_bytes;
    let err = s
        .put(PutRequest::new(cx.key("big"), vec![b'x'; limit + 1]))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument { reason } if reason.contains("exceeds")),
        "{err:?}"
    );
    assert_eq!(s.get_key(cx.key("big")).await.unwrap(), None);
    let mib = vec![b'y'; 1024 * 1024];
    s.put(PutRequest::new(cx.key("mib"), mib.clone()))
        .await
        .unwrap();
    let kv = s.get_key(cx.key("mib")).await.unwrap().unwrap();
    assert_eq!(kv.value.len(), mib.len());
}

/// A put with a lease that does not exist fails with `LeaseNotFound` and writes nothing.
pub async fn kv_put_with_unknown_lease_fails(cx: Ctx) {
    let s = cx.store();
    let bogus = LeaseId(0x7eed_beef_0001);
    let err = s
        .put(PutRequest::new(cx.key("a"), "v").with_lease(bogus))
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::LeaseNotFound { lease } if lease == bogus),
        "{err:?}"
    );
    assert_eq!(s.get_key(cx.key("a")).await.unwrap(), None);
}

/// A negative revision is refused with `InvalidArgument`.
pub async fn kv_negative_revision_is_invalid(cx: Ctx) {
    let err = cx
        .store()
        .get(GetRequest::key(cx.key("a")).with_revision(-1))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");
}
