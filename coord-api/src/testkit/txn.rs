//! Cases for transactions: every compare target and operator, branches, atomicity.

use std::time::Duration;

use super::Ctx;
use crate::{
    Compare, CompareOp, DeleteRequest, Error, GetRequest, KvLeaseStore, KvLeaseStoreExt, LeaseId,
    PutRequest, TxnOp, TxnOpResponse, TxnRequest,
};

async fn holds(cx: &Ctx, compare: Compare) -> bool {
    cx.store()
        .txn(TxnRequest::new().when([compare]))
        .await
        .unwrap()
        .succeeded
}

/// A value compare that holds runs the `success` branch; one that does not runs `failure`.
pub async fn txn_value_compare_picks_the_branch(cx: Ctx) {
    let s = cx.store();
    s.put_value(cx.key("k"), "v1").await.unwrap();
    let t = |expected: &str| {
        TxnRequest::new()
            .when([Compare::value(cx.key("k"), CompareOp::Equal, expected)])
            .and_then([PutRequest::new(cx.key("then"), "ran")])
            .or_else([PutRequest::new(cx.key("else"), "ran")])
    };
    let ok = s.txn(t("v1")).await.unwrap();
    assert!(ok.succeeded);
    assert_eq!(ok.responses.len(), 1);
    assert!(s.get_key(cx.key("then")).await.unwrap().is_some());
    assert!(s.get_key(cx.key("else")).await.unwrap().is_none());
    let no = s.txn(t("other")).await.unwrap();
    assert!(!no.succeeded);
    assert!(s.get_key(cx.key("else")).await.unwrap().is_some());
}

/// Value compares order bytewise with every operator.
pub async fn txn_value_compare_operators(cx: Ctx) {
    cx.store().put_value(cx.key("k"), "m").await.unwrap();
    let k = cx.key("k");
    assert!(holds(&cx, Compare::value(k.clone(), CompareOp::Greater, "a")).await);
    assert!(!holds(&cx, Compare::value(k.clone(), CompareOp::Greater, "z")).await);
    assert!(holds(&cx, Compare::value(k.clone(), CompareOp::Less, "z")).await);
    assert!(!holds(&cx, Compare::value(k.clone(), CompareOp::Less, "m")).await);
    assert!(holds(&cx, Compare::value(k.clone(), CompareOp::NotEqual, "x")).await);
    assert!(!holds(&cx, Compare::value(k.clone(), CompareOp::NotEqual, "m")).await);
}

/// A value compare on a missing key fails whatever the operator, `NotEqual` included.
pub async fn txn_value_compare_on_missing_key_fails(cx: Ctx) {
    let k = cx.key("missing");
    for op in [
        CompareOp::Equal,
        CompareOp::NotEqual,
        CompareOp::Greater,
        CompareOp::Less,
    ] {
        assert!(
            !holds(&cx, Compare::value(k.clone(), op, "")).await,
            "{op:?}"
        );
    }
}

/// Version 0 means "absent": the create-if-absent idiom succeeds once.
pub async fn txn_version_zero_means_absent(cx: Ctx) {
    let s = cx.store();
    let create = || {
        TxnRequest::new()
            .when([Compare::version(cx.key("k"), CompareOp::Equal, 0)])
            .and_then([PutRequest::new(cx.key("k"), "mine")])
            .or_else([GetRequest::key(cx.key("k"))])
    };
    assert!(s.txn(create()).await.unwrap().succeeded);
    let second = s.txn(create()).await.unwrap();
    assert!(!second.succeeded);
    let got = second.responses[0].as_get().expect("a get response");
    assert_eq!(got.kvs[0].value, "mine".as_bytes());
    s.put_value(cx.key("k"), "again").await.unwrap();
    assert!(holds(&cx, Compare::version(cx.key("k"), CompareOp::Equal, 2)).await);
    assert!(holds(&cx, Compare::version(cx.key("k"), CompareOp::Greater, 1)).await);
}

/// Create-revision compares: equal to the key's, 0 for a missing key.
pub async fn txn_create_revision_compare(cx: Ctx) {
    let s = cx.store();
    let created = s.put_value(cx.key("k"), "1").await.unwrap();
    s.put_value(cx.key("k"), "2").await.unwrap();
    let k = cx.key("k");
    assert!(
        holds(
            &cx,
            Compare::create_revision(k.clone(), CompareOp::Equal, created)
        )
        .await
    );
    assert!(
        !holds(
            &cx,
            Compare::create_revision(k.clone(), CompareOp::Equal, created + 1)
        )
        .await
    );
    assert!(
        holds(
            &cx,
            Compare::create_revision(k, CompareOp::Less, created + 1)
        )
        .await
    );
    assert!(
        holds(
            &cx,
            Compare::create_revision(cx.key("missing"), CompareOp::Equal, 0)
        )
        .await
    );
}

/// Mod-revision compares: the compare-and-swap idiom fails once someone else wrote.
pub async fn txn_mod_revision_compare_is_a_cas(cx: Ctx) {
    let s = cx.store();
    let read_at = s.put_value(cx.key("k"), "1").await.unwrap();
    let cas = |value: &'static str| {
        TxnRequest::new()
            .when([Compare::mod_revision(
                cx.key("k"),
                CompareOp::Equal,
                read_at,
            )])
            .and_then([PutRequest::new(cx.key("k"), value)])
    };
    s.put_value(cx.key("k"), "someone else").await.unwrap();
    assert!(!s.txn(cas("mine")).await.unwrap().succeeded);
    assert_eq!(
        s.get_key(cx.key("k")).await.unwrap().unwrap().value,
        "someone else".as_bytes()
    );
    assert!(
        holds(
            &cx,
            Compare::mod_revision(cx.key("k"), CompareOp::Greater, read_at)
        )
        .await
    );
}

/// Lease compares see the attached lease, and `NONE` for a detached or missing key.
pub async fn txn_lease_compare(cx: Ctx) {
    let s = cx.store();
    let lease = s.grant(cx.long_ttl()).await.unwrap();
    s.put(PutRequest::new(cx.key("leased"), "v").with_lease(lease.id))
        .await
        .unwrap();
    s.put_value(cx.key("plain"), "v").await.unwrap();
    assert!(
        holds(
            &cx,
            Compare::lease(cx.key("leased"), CompareOp::Equal, lease.id)
        )
        .await
    );
    assert!(
        holds(
            &cx,
            Compare::lease(cx.key("plain"), CompareOp::Equal, LeaseId::NONE)
        )
        .await
    );
    assert!(
        holds(
            &cx,
            Compare::lease(cx.key("missing"), CompareOp::Equal, LeaseId::NONE)
        )
        .await
    );
    assert!(
        !holds(
            &cx,
            Compare::lease(cx.key("plain"), CompareOp::Equal, lease.id)
        )
        .await
    );
    s.revoke(lease.id).await.unwrap();
}

/// Every compare must hold: one false compare among true ones runs `failure`.
pub async fn txn_all_compares_must_hold(cx: Ctx) {
    let s = cx.store();
    s.put_value(cx.key("a"), "1").await.unwrap();
    s.put_value(cx.key("b"), "2").await.unwrap();
    let both = TxnRequest::new().when([
        Compare::value(cx.key("a"), CompareOp::Equal, "1"),
        Compare::value(cx.key("b"), CompareOp::Equal, "2"),
    ]);
    assert!(s.txn(both).await.unwrap().succeeded);
    let one_off = TxnRequest::new().when([
        Compare::value(cx.key("a"), CompareOp::Equal, "1"),
        Compare::value(cx.key("b"), CompareOp::Equal, "3"),
    ]);
    assert!(!s.txn(one_off).await.unwrap().succeeded);
}

/// All writes of a branch share one revision, one past the revision before it.
pub async fn txn_writes_share_one_revision(cx: Ctx) {
    let s = cx.store();
    s.put_value(cx.key("gone"), "v").await.unwrap();
    let before = s.current_revision().await.unwrap();
    let resp = s
        .txn(TxnRequest::new().and_then([
            TxnOp::Put(PutRequest::new(cx.key("a"), "1")),
            TxnOp::Put(PutRequest::new(cx.key("b"), "2")),
            TxnOp::Delete(DeleteRequest::key(cx.key("gone"))),
        ]))
        .await
        .unwrap();
    assert_eq!(resp.revision, before + 1);
    for r in &resp.responses {
        match r {
            TxnOpResponse::Put(p) => assert_eq!(p.revision, before + 1),
            TxnOpResponse::Delete(d) => {
                assert_eq!(d.revision, before + 1);
                assert_eq!(d.deleted, 1);
            }
            TxnOpResponse::Get(_) => unreachable!(),
        }
    }
    let a = s.get_key(cx.key("a")).await.unwrap().unwrap();
    let b = s.get_key(cx.key("b")).await.unwrap().unwrap();
    assert_eq!(a.mod_revision, before + 1);
    assert_eq!(b.mod_revision, before + 1);
}

/// A transaction that only reads, or whose branch is empty, leaves the revision alone.
pub async fn txn_without_writes_keeps_revision(cx: Ctx) {
    let s = cx.store();
    s.put_value(cx.key("a"), "1").await.unwrap();
    let before = s.current_revision().await.unwrap();
    let read = s
        .txn(TxnRequest::new().and_then([GetRequest::key(cx.key("a"))]))
        .await
        .unwrap();
    assert_eq!(read.revision, before);
    let empty = s.txn(TxnRequest::new()).await.unwrap();
    assert!(empty.succeeded, "no compares means success");
    assert!(empty.responses.is_empty());
    assert_eq!(empty.revision, before);
    assert_eq!(s.current_revision().await.unwrap(), before);
}

/// A read later in a branch sees the branch's earlier writes.
pub async fn txn_reads_see_earlier_writes_of_the_branch(cx: Ctx) {
    let s = cx.store();
    s.put_value(cx.key("a"), "old").await.unwrap();
    let resp = s
        .txn(TxnRequest::new().and_then([
            TxnOp::Put(PutRequest::new(cx.key("a"), "new")),
            TxnOp::Get(GetRequest::key(cx.key("a"))),
        ]))
        .await
        .unwrap();
    let got = resp.responses[1].as_get().expect("a get response");
    assert_eq!(got.kvs[0].value, "new".as_bytes());
    assert_eq!(got.kvs[0].version, 2);
    assert_eq!(got.kvs[0].mod_revision, resp.revision);
}

/// A branch that writes the same key twice is refused, and nothing is applied.
pub async fn txn_duplicate_key_is_invalid(cx: Ctx) {
    let s = cx.store();
    let err = s
        .txn(TxnRequest::new().and_then([
            PutRequest::new(cx.key("a"), "1"),
            PutRequest::new(cx.key("a"), "2"),
        ]))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");
    assert_eq!(s.get_key(cx.key("a")).await.unwrap(), None);
}

/// A transaction whose put names a missing lease fails whole: none of its writes apply.
pub async fn txn_with_unknown_lease_applies_nothing(cx: Ctx) {
    let s = cx.store();
    let bogus = LeaseId(0x7eed_beef_0002);
    let err = s
        .txn(TxnRequest::new().and_then([
            PutRequest::new(cx.key("a"), "1"),
            PutRequest::new(cx.key("b"), "2").with_lease(bogus),
        ]))
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::LeaseNotFound { lease } if lease == bogus),
        "{err:?}"
    );
    assert_eq!(s.get_key(cx.key("a")).await.unwrap(), None);
}

/// A prefix delete inside a transaction deletes the prefix and reports it.
pub async fn txn_delete_prefix_in_branch(cx: Ctx) {
    let s = cx.store();
    s.put_value(cx.key("d/1"), "v").await.unwrap();
    s.put_value(cx.key("d/2"), "v").await.unwrap();
    let resp = s
        .txn(TxnRequest::new().and_then([DeleteRequest::prefix(cx.key("d/")).with_prev_kv()]))
        .await
        .unwrap();
    match &resp.responses[0] {
        TxnOpResponse::Delete(d) => {
            assert_eq!(d.deleted, 2);
            assert_eq!(d.prev_kvs.len(), 2);
        }
        other => panic!("expected a delete response, got {other:?}"),
    }
    assert_eq!(s.get_prefix(cx.key("d/")).await.unwrap().count, 0);
}

/// A put with a lease inside a transaction attaches the key to it.
pub async fn txn_put_with_lease_attaches(cx: Ctx) {
    let s = cx.store();
    let lease = s.grant(Duration::from_secs(60)).await.unwrap();
    s.txn(TxnRequest::new().and_then([PutRequest::new(cx.key("a"), "v").with_lease(lease.id)]))
        .await
        .unwrap();
    assert_eq!(
        s.get_key(cx.key("a")).await.unwrap().unwrap().lease,
        lease.id
    );
    s.revoke(lease.id).await.unwrap();
    assert_eq!(s.get_key(cx.key("a")).await.unwrap(), None);
}

/// A prefix compare holds only if it holds for every key under the prefix; with none, it is
/// judged as on a missing key, so `create_revision == 0` means "the prefix is empty".
pub async fn txn_prefix_compare_covers_every_key(cx: Ctx) {
    let s = cx.store();
    let p = cx.key("p/");
    let empty = Compare::create_revision(p.clone(), CompareOp::Equal, 0).with_prefix();
    assert!(
        holds(&cx, empty.clone()).await,
        "an empty prefix is like a missing key"
    );
    s.put_value(cx.key("p/a"), "1").await.unwrap();
    assert!(!holds(&cx, empty).await);
    s.put_value(cx.key("p/b"), "1").await.unwrap();
    let all_one = Compare::value(p.clone(), CompareOp::Equal, "1").with_prefix();
    assert!(holds(&cx, all_one.clone()).await, "every key has value 1");
    s.put_value(cx.key("p/c"), "2").await.unwrap();
    assert!(!holds(&cx, all_one).await, "one key differs");
    s.put_value(cx.key("p0"), "outside").await.unwrap();
    let versions = Compare::version(p, CompareOp::Equal, 1).with_prefix();
    assert!(
        holds(&cx, versions).await,
        "keys outside the prefix do not count"
    );
}
