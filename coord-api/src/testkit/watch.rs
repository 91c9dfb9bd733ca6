//! Cases for watches: order, atomicity, history, previous values, progress, compaction.

use futures::StreamExt;

use super::{assert_no_events, collect_events, next_events, within, Ctx, PROMPT};
use crate::{
    DeleteRequest, Error, EventKind, KvLeaseStore, KvLeaseStoreExt, LeaseId, PutRequest,
    TxnRequest, WatchRequest,
};

/// A watch from now sees later puts and deletes, with etcd's event shapes.
pub async fn watch_sees_puts_and_deletes(cx: Ctx) {
    let s = cx.store();
    let mut w = s.watch(WatchRequest::key(cx.key("a"))).await.unwrap();
    let put = s.put_value(cx.key("a"), "v").await.unwrap();
    let del = s
        .delete(DeleteRequest::key(cx.key("a")))
        .await
        .unwrap()
        .revision;
    let events = collect_events(&mut w, 2).await;
    assert_eq!(events[0].kind, EventKind::Put);
    assert_eq!(events[0].kv.value, "v".as_bytes());
    assert_eq!(events[0].kv.mod_revision, put);
    assert_eq!(events[0].kv.create_revision, put);
    assert_eq!(events[0].kv.version, 1);
    assert_eq!(events[1].kind, EventKind::Delete);
    assert_eq!(events[1].kv.key, cx.key("a").as_bytes());
    assert!(events[1].kv.value.is_empty(), "a delete event has no value");
    assert_eq!(events[1].kv.mod_revision, del);
    assert_eq!(events[1].kv.version, 0);
    assert_eq!(events[1].kv.create_revision, 0);
}

/// A key watch sees only that key; a prefix watch sees only keys under the prefix.
pub async fn watch_range_is_respected(cx: Ctx) {
    let s = cx.store();
    let mut key = s.watch(WatchRequest::key(cx.key("k"))).await.unwrap();
    let mut prefix = s.watch(WatchRequest::prefix(cx.key("p/"))).await.unwrap();
    for k in ["k2", "k", "p0", "p/1", "q", "p/2"] {
        s.put_value(cx.key(k), "v").await.unwrap();
    }
    let ev = collect_events(&mut key, 1).await;
    assert_eq!(ev[0].kv.key, cx.key("k").as_bytes());
    let ev = collect_events(&mut prefix, 2).await;
    assert_eq!(ev[0].kv.key, cx.key("p/1").as_bytes());
    assert_eq!(ev[1].kv.key, cx.key("p/2").as_bytes());
    s.put_value(cx.key("k3"), "v").await.unwrap();
    s.put_value(cx.key("p1"), "v").await.unwrap();
    assert_no_events(&mut key, std::time::Duration::from_millis(500)).await;
    assert_no_events(&mut prefix, std::time::Duration::from_millis(500)).await;
}

/// A watch from a past revision replays history from that revision on, then goes live.
pub async fn watch_from_past_replays_history(cx: Ctx) {
    let s = cx.store();
    let r1 = s.put_value(cx.key("a"), "1").await.unwrap();
    let r2 = s.put_value(cx.key("a"), "2").await.unwrap();
    let r3 = s.put_value(cx.key("b"), "3").await.unwrap();
    let mut w = s
        .watch(WatchRequest::prefix(cx.prefix()).with_start_revision(r2))
        .await
        .unwrap();
    let r4 = s.put_value(cx.key("a"), "4").await.unwrap();
    let events = collect_events(&mut w, 3).await;
    let revs: Vec<_> = events.iter().map(|e| e.kv.mod_revision).collect();
    assert_eq!(revs, vec![r2, r3, r4]);
    assert!(r1 < r2);
    assert_eq!(events[0].kv.version, 2);
}

/// Every event of a transaction arrives in one batch, in the order written.
pub async fn watch_batches_whole_revisions(cx: Ctx) {
    let s = cx.store();
    let mut w = s.watch(WatchRequest::prefix(cx.prefix())).await.unwrap();
    let resp = s
        .txn(TxnRequest::new().and_then([
            PutRequest::new(cx.key("x"), "1"),
            PutRequest::new(cx.key("y"), "2"),
            PutRequest::new(cx.key("z"), "3"),
        ]))
        .await
        .unwrap();
    let batch = next_events(&mut w).await;
    assert_eq!(batch.events.len(), 3, "{batch:?}");
    for (e, k) in batch.events.iter().zip(["x", "y", "z"]) {
        assert_eq!(e.kv.key, cx.key(k).as_bytes());
        assert_eq!(e.kv.mod_revision, resp.revision);
    }
}

/// Many writes arrive in revision order, each once, none skipped.
pub async fn watch_is_ordered_unique_and_complete(cx: Ctx) {
    let s = cx.store();
    let mut w = s.watch(WatchRequest::prefix(cx.prefix())).await.unwrap();
    let mut revs = Vec::new();
    for i in 0..50 {
        let key = cx.key(&format!("k{}", i % 7));
        revs.push(s.put_value(key, format!("{i}")).await.unwrap());
    }
    let events = collect_events(&mut w, 50).await;
    let got: Vec<_> = events.iter().map(|e| e.kv.mod_revision).collect();
    assert_eq!(got, revs);
    assert_no_events(&mut w, std::time::Duration::from_millis(500)).await;
}

/// With previous values, a put carries the overwritten key and a delete the deleted one.
pub async fn watch_prev_kv_is_attached(cx: Ctx) {
    let s = cx.store();
    let first = s.put_value(cx.key("a"), "1").await.unwrap();
    let mut w = s
        .watch(WatchRequest::key(cx.key("a")).with_prev_kv())
        .await
        .unwrap();
    s.put_value(cx.key("a"), "2").await.unwrap();
    s.delete_key(cx.key("a")).await.unwrap();
    s.put_value(cx.key("a"), "3").await.unwrap();
    let events = collect_events(&mut w, 3).await;
    let prev = events[0]
        .prev_kv
        .as_ref()
        .expect("put has a previous value");
    assert_eq!(prev.value, "1".as_bytes());
    assert_eq!(prev.mod_revision, first);
    let prev = events[1]
        .prev_kv
        .as_ref()
        .expect("delete has a previous value");
    assert_eq!(prev.value, "2".as_bytes());
    assert_eq!(prev.version, 2);
    assert_eq!(events[2].prev_kv, None, "a creation has no previous value");
}

/// Without previous values, events carry none.
pub async fn watch_without_prev_kv_has_none(cx: Ctx) {
    let s = cx.store();
    s.put_value(cx.key("a"), "1").await.unwrap();
    let mut w = s.watch(WatchRequest::key(cx.key("a"))).await.unwrap();
    s.put_value(cx.key("a"), "2").await.unwrap();
    s.delete_key(cx.key("a")).await.unwrap();
    let events = collect_events(&mut w, 2).await;
    assert!(events.iter().all(|e| e.prev_kv.is_none()));
}

/// A prefix delete arrives as one batch of deletes at one revision.
pub async fn watch_prefix_delete_is_one_batch(cx: Ctx) {
    let s = cx.store();
    for k in ["d/1", "d/2", "d/3"] {
        s.put_value(cx.key(k), "v").await.unwrap();
    }
    let mut w = s.watch(WatchRequest::prefix(cx.key("d/"))).await.unwrap();
    let rev = s
        .delete(DeleteRequest::prefix(cx.key("d/")))
        .await
        .unwrap()
        .revision;
    let batch = next_events(&mut w).await;
    assert_eq!(batch.events.len(), 3);
    assert!(batch
        .events
        .iter()
        .all(|e| e.kind == EventKind::Delete && e.kv.mod_revision == rev));
}

/// A leased key's put event carries its lease.
pub async fn watch_put_event_carries_lease(cx: Ctx) {
    let s = cx.store();
    let lease = s.grant(cx.long_ttl()).await.unwrap();
    let mut w = s.watch(WatchRequest::key(cx.key("a"))).await.unwrap();
    s.put(PutRequest::new(cx.key("a"), "v").with_lease(lease.id))
        .await
        .unwrap();
    let events = collect_events(&mut w, 1).await;
    assert_eq!(events[0].kv.lease, lease.id);
    assert_ne!(lease.id, LeaseId::NONE);
    s.revoke(lease.id).await.unwrap();
}

/// An idle watch that asked for progress gets an empty batch at the current revision.
pub async fn watch_progress_notify_reports_revision(cx: Ctx) {
    let s = cx.store();
    let rev = s.put_value(cx.key("a"), "v").await.unwrap();
    let mut w = s
        .watch(
            WatchRequest::key(cx.key("quiet"))
                .with_progress_notify()
                .with_start_revision(rev + 1),
        )
        .await
        .unwrap();
    let bound = cx.limits().progress_notify_interval * 3;
    let batch = within(bound, "a progress notification", w.next())
        .await
        .expect("stream open")
        .expect("no error");
    assert!(batch.is_progress_notify(), "{batch:?}");
    assert!(batch.revision >= rev);
}

/// A progress request on a quiet watch is answered at once: an empty batch marked as the
/// answer, at the store's revision, however long the watch has been quiet.
pub async fn watch_answers_progress_requests(cx: Ctx) {
    let s = cx.store();
    let mut w = s.watch(WatchRequest::key(cx.key("quiet"))).await.unwrap();
    let rev = s.put_value(cx.key("elsewhere"), "v").await.unwrap();
    for _ in 0..2 {
        w.request_progress().expect("the stream is open");
        let answer = within(PROMPT, "a progress answer", w.next())
            .await
            .expect("stream open")
            .expect("no error");
        assert!(answer.is_progress_answer(), "{answer:?}");
        assert!(!answer.is_progress_notify(), "{answer:?}");
        assert!(answer.events.is_empty(), "{answer:?}");
        assert!(answer.revision >= rev, "{answer:?} before {rev}");
    }
}

/// A progress request on a watch still catching up on history is answered, and the history
/// still arrives whole, in order, once (etcd 3.4 may answer ahead of it).
pub async fn watch_progress_answer_loses_no_history(cx: Ctx) {
    let s = cx.store();
    let mut revs = Vec::new();
    for i in 0..20 {
        revs.push(s.put_value(cx.key(&format!("h/{i}")), "v").await.unwrap());
    }
    let mut w = s
        .watch(WatchRequest::prefix(cx.key("h/")).with_start_revision(revs[0]))
        .await
        .unwrap();
    w.request_progress().expect("the stream is open");
    let mut seen = Vec::new();
    let mut answers = 0;
    while seen.len() < revs.len() || answers == 0 {
        let batch = within(PROMPT, "history and an answer", w.next())
            .await
            .expect("stream open")
            .expect("no error");
        if batch.is_progress_answer() {
            assert!(batch.events.is_empty(), "{batch:?}");
            assert!(batch.revision >= revs[revs.len() - 1], "{batch:?}");
            answers += 1;
        } else {
            seen.extend(batch.events.iter().map(|e| e.kv.mod_revision));
        }
    }
    assert_eq!(seen, revs, "the history, in order, once");
    assert_eq!(answers, 1);
}

/// Two watches on one key see the same events in the same order.
pub async fn watch_concurrent_watchers_agree(cx: Ctx) {
    let s = cx.store();
    let mut a = s.watch(WatchRequest::prefix(cx.prefix())).await.unwrap();
    let mut b = s.watch(WatchRequest::prefix(cx.prefix())).await.unwrap();
    for i in 0..10 {
        s.put_value(cx.key(&format!("k{}", i % 3)), "v")
            .await
            .unwrap();
    }
    let ea = collect_events(&mut a, 10).await;
    let eb = collect_events(&mut b, 10).await;
    assert_eq!(ea, eb);
}

/// A watch from a compacted revision ends with `Compacted`, naming the compaction point.
pub async fn watch_from_compacted_revision_fails(cx: Ctx) {
    let s = cx.store();
    let r1 = s.put_value(cx.key("a"), "1").await.unwrap();
    s.put_value(cx.key("a"), "2").await.unwrap();
    let r3 = s.put_value(cx.key("a"), "3").await.unwrap();
    s.compact(r3).await.unwrap();
    let mut w = s
        .watch(WatchRequest::key(cx.key("a")).with_start_revision(r1))
        .await
        .unwrap();
    let item = within(PROMPT, "the compaction error", w.next()).await;
    match item {
        Some(Err(Error::Compacted {
            compact_revision, ..
        })) => assert_eq!(compact_revision, r3),
        other => panic!("expected Compacted, got {other:?}"),
    }
    let end = within(PROMPT, "the stream to end", w.next()).await;
    assert!(end.is_none(), "the stream ends after Compacted: {end:?}");
}

/// A watch from the compaction revision itself still works and sees that revision.
pub async fn watch_from_compact_revision_works(cx: Ctx) {
    let s = cx.store();
    s.put_value(cx.key("a"), "1").await.unwrap();
    let r2 = s.put_value(cx.key("b"), "2").await.unwrap();
    s.compact(r2).await.unwrap();
    let mut w = s
        .watch(WatchRequest::prefix(cx.prefix()).with_start_revision(r2))
        .await
        .unwrap();
    let r3 = s.put_value(cx.key("c"), "3").await.unwrap();
    let events = collect_events(&mut w, 2).await;
    let revs: Vec<_> = events.iter().map(|e| e.kv.mod_revision).collect();
    assert_eq!(revs, vec![r2, r3]);
}

/// An empty key or prefix is refused with `InvalidArgument`.
pub async fn watch_empty_key_is_invalid(cx: Ctx) {
    let s = cx.store();
    let err = s.watch(WatchRequest::key("")).await.expect_err("refused");
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");
    let err = s
        .watch(WatchRequest::prefix(""))
        .await
        .expect_err("refused");
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");
}

/// A watch from a future revision delivers nothing until that revision is written.
pub async fn watch_from_future_revision_waits(cx: Ctx) {
    let s = cx.store();
    let now = s.put_value(cx.key("a"), "0").await.unwrap();
    let mut w = s
        .watch(WatchRequest::key(cx.key("a")).with_start_revision(now + 2))
        .await
        .unwrap();
    s.put_value(cx.key("a"), "1").await.unwrap();
    let r2 = s.put_value(cx.key("a"), "2").await.unwrap();
    let events = collect_events(&mut w, 1).await;
    assert_eq!(events[0].kv.mod_revision, r2);
    assert_eq!(events[0].kv.value, "2".as_bytes());
}

/// A watch from the past that a compaction overtakes delivers either its whole history or
/// `Compacted`, never part of it: etcd catches such watches up asynchronously, so which one
/// happens depends on timing, but a gap never does.
pub async fn watch_from_past_overtaken_by_compaction_is_all_or_nothing(cx: Ctx) {
    let s = cx.store();
    let r1 = s.put_value(cx.key("a"), "1").await.unwrap();
    let r2 = s.put_value(cx.key("a"), "2").await.unwrap();
    let r3 = s.put_value(cx.key("a"), "3").await.unwrap();
    let mut w = s
        .watch(WatchRequest::key(cx.key("a")).with_start_revision(r1))
        .await
        .unwrap();
    s.compact(r3).await.unwrap();
    let first = within(PROMPT, "history or Compacted", w.next()).await;
    match first {
        Some(Err(Error::Compacted {
            compact_revision, ..
        })) => assert_eq!(compact_revision, r3),
        Some(Ok(batch)) => {
            let mut events = batch.events;
            while events.len() < 3 {
                events.extend(next_events(&mut w).await.events);
            }
            let revs: Vec<_> = events.iter().map(|e| e.kv.mod_revision).collect();
            assert_eq!(revs, vec![r1, r2, r3], "the whole history, in order");
        }
        other => panic!("expected history or Compacted, got {other:?}"),
    }
}

/// An event whose previous revision is compacted comes without its previous value, even when
/// the watch asked for previous values (etcd reads them at `mod_revision - 1` when sending).
pub async fn watch_prev_kv_is_dropped_below_the_compaction_point(cx: Ctx) {
    let s = cx.store();
    s.put_value(cx.key("a"), "1").await.unwrap();
    let r2 = s.put_value(cx.key("a"), "2").await.unwrap();
    let r3 = s.put_value(cx.key("a"), "3").await.unwrap();
    s.compact(r2).await.unwrap();
    let mut w = s
        .watch(
            WatchRequest::key(cx.key("a"))
                .with_start_revision(r2)
                .with_prev_kv(),
        )
        .await
        .unwrap();
    let events = collect_events(&mut w, 2).await;
    assert_eq!(events[0].kv.mod_revision, r2);
    assert_eq!(
        events[0].prev_kv, None,
        "its previous revision is compacted"
    );
    assert_eq!(events[1].kv.mod_revision, r3);
    let prev = events[1]
        .prev_kv
        .as_ref()
        .expect("its previous revision is kept");
    assert_eq!(prev.value, "2".as_bytes());
}

/// A progress request on a watch that has ended (here, cancelled by compaction) is refused
/// with `StreamClosed`, not lost.
pub async fn watch_progress_request_on_an_ended_watch_is_refused(cx: Ctx) {
    let s = cx.store();
    let first = s.put_value(cx.key("a"), "1").await.unwrap();
    s.put_value(cx.key("a"), "2").await.unwrap();
    let now = s.put_value(cx.key("a"), "3").await.unwrap();
    s.compact(now).await.unwrap();
    let mut w = match s
        .watch(WatchRequest::key(cx.key("a")).with_start_revision(first))
        .await
    {
        Ok(w) => w,
        // Refused at once: nothing to ask.
        Err(Error::Compacted { .. }) => return,
        Err(e) => panic!("{e}"),
    };
    let ended = within(PROMPT, "the watch to end", async {
        loop {
            match w.next().await {
                Some(Ok(_)) => continue,
                Some(Err(e)) => break Some(e),
                None => break None,
            }
        }
    })
    .await;
    assert!(matches!(ended, Some(Error::Compacted { .. })), "{ended:?}");
    within(PROMPT, "the stream to finish", async {
        while w.next().await.is_some() {}
    })
    .await;
    let refused = w
        .request_progress()
        .expect_err("a progress request on an ended watch");
    assert!(matches!(refused, Error::StreamClosed { .. }), "{refused:?}");
}
