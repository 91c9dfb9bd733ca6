//! The cases of `Semaphore` and `Permit`.

use std::time::Duration;

use crate::recipes::{LossReason, Semaphore};
use crate::testkit::{eventually, within, PROMPT};
use crate::{Error, ErrorClass, KvLeaseStoreExt, PutRequest, TxnRequest};

use super::fixture::Fixture;
use super::support::*;

const SEM: &str = "sem";

async fn queued(store: &std::sync::Arc<crate::DynKvLeaseStore>) -> u64 {
    store.get_prefix("sem/").await.unwrap().count
}

pub async fn semaphore_admits_n_and_hands_over_in_queue_order(fx: &dyn Fixture) {
    let store = fx.store();
    let mut s = Vec::new();
    for _ in 0..5 {
        s.push(session(fx, &store).await);
    }
    let a = Semaphore::new(&s[0], SEM, 2).acquire().await.unwrap();
    let b = Semaphore::new(&s[1], SEM, 2).try_acquire().await.unwrap();
    let b = b.expect("a second permit is free");
    assert!(b.token() > a.token());
    let (c_sem, d_sem) = (Semaphore::new(&s[2], SEM, 2), Semaphore::new(&s[3], SEM, 2));
    let c_waits = tokio::spawn(async move { c_sem.acquire().await });
    eventually(PROMPT, "c to queue", || async { queued(&store).await == 3 }).await;
    let d_waits = tokio::spawn(async move { d_sem.acquire().await });
    eventually(PROMPT, "d to queue", || async { queued(&store).await == 4 }).await;
    assert!(
        Semaphore::new(&s[4], SEM, 2)
            .try_acquire()
            .await
            .unwrap()
            .is_none(),
        "try_acquire took a third permit"
    );
    assert_eq!(
        queued(&store).await,
        4,
        "a refused try_acquire left its key"
    );
    // c gives up: d is still behind the two holders and must not take a permit.
    c_waits.abort();
    eventually(PROMPT, "c's key to go", || async {
        queued(&store).await == 3
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !d_waits.is_finished(),
        "d took a permit while two were held"
    );
    let holders = Semaphore::new(&s[4], SEM, 2).holders().await.unwrap();
    let keys: Vec<_> = holders.iter().map(|kv| kv.key.clone()).collect();
    assert_eq!(keys, [a.key().key.clone(), b.key().key.clone()]);
    let a_token = a.token();
    a.release().await.unwrap();
    let d = within(prompt(fx), "d to get the released permit", d_waits)
        .await
        .unwrap()
        .unwrap();
    assert!(d.token() > a_token, "a later key has a larger token");
    assert!(b.is_held(), "releasing one permit ended another");
}

pub async fn semaphore_permit_dropped_releases(fx: &dyn Fixture) {
    let store = fx.store();
    let (a, b, c) = (
        session(fx, &store).await,
        session(fx, &store).await,
        session(fx, &store).await,
    );
    let first = Semaphore::new(&a, SEM, 2).acquire().await.unwrap();
    let _second = Semaphore::new(&b, SEM, 2).acquire().await.unwrap();
    let c_sem = Semaphore::new(&c, SEM, 2);
    let c_waits = tokio::spawn(async move { c_sem.acquire().await });
    eventually(PROMPT, "c to queue", || async { queued(&store).await == 3 }).await;
    drop(first);
    let _third = within(prompt(fx), "c to get the dropped permit", c_waits)
        .await
        .unwrap()
        .unwrap();
    // Acquiring again on the session whose permit was dropped queues it anew.
    assert!(Semaphore::new(&a, SEM, 2)
        .try_acquire()
        .await
        .unwrap()
        .is_none());
}

pub async fn semaphore_holder_whose_key_is_deleted_is_fenced_out(fx: &dyn Fixture) {
    let store = fx.store();
    let (a, b, c) = (
        session(fx, &store).await,
        session(fx, &store).await,
        session(fx, &store).await,
    );
    let old = Semaphore::new(&a, SEM, 2).acquire().await.unwrap();
    let other = Semaphore::new(&b, SEM, 2).acquire().await.unwrap();
    // An operator deletes a holder's key: its permit passes on while it may not know yet.
    store.delete_key(old.key().key.to_vec()).await.unwrap();
    let new = within(
        prompt(fx),
        "c to get the permit",
        Semaphore::new(&c, SEM, 2).acquire(),
    )
    .await
    .unwrap();
    let write = |by: &str| TxnRequest::new().and_then([PutRequest::new(format!("work/{by}"), by)]);
    let err = old.txn(write("a")).await.unwrap_err();
    assert!(matches!(err, Error::FencedOut { .. }), "{err:?}");
    assert!(!old.is_held());
    assert!(matches!(
        old.lost().await,
        LossReason::KeyDeleted | LossReason::FencedOut
    ));
    other.txn(write("b")).await.unwrap();
    new.txn(write("c")).await.unwrap();
    assert!(store.get_key("work/a").await.unwrap().is_none());
}

pub async fn semaphore_without_permits_is_refused_and_writes_nothing(fx: &dyn Fixture) {
    let store = fx.store();
    let a = session(fx, &store).await;
    let none = Semaphore::new(&a, SEM, 0);
    let err = none.acquire().await.unwrap_err();
    assert_eq!(err.class(), ErrorClass::InvalidArgument, "{err:?}");
    assert!(err.to_string().contains("zero permits"), "{err}");
    let err = none.try_acquire().await.unwrap_err();
    assert_eq!(err.class(), ErrorClass::InvalidArgument, "{err:?}");
    assert_eq!(queued(&store).await, 0);
}

/// A release wakes the waiter next in line, not the whole queue: each waiter follows only the
/// keys just ahead of it, so the others make no read. (Waking every waiter, each reading the
/// queue, costs a release time quadratic in the queue's length: at a thousand waiters, a
/// million keys read.)
pub async fn semaphore_release_wakes_only_the_waiter_next_in_line(fx: &dyn Fixture) {
    const WAITERS: usize = 5;
    let store = fx.store();
    let (a, b) = (session(fx, &store).await, session(fx, &store).await);
    let held = Semaphore::new(&a, SEM, 2).acquire().await.unwrap();
    let _other = Semaphore::new(&b, SEM, 2).acquire().await.unwrap();
    let mut waiters = Vec::new();
    for i in 0..WAITERS {
        let counted = CountingTxns::new(store.clone());
        let s = crate::recipes::Session::new(
            std::sync::Arc::new(counted.clone()),
            crate::recipes::SessionConfig::default().with_ttl(fx.ttl()),
        )
        .await
        .unwrap();
        let sem = Semaphore::new(&s, SEM, 2);
        let task = tokio::spawn(async move { sem.acquire().await });
        eventually(PROMPT, "the waiter to queue", || async {
            queued(&store).await == 3 + i as u64
        })
        .await;
        waiters.push((s, counted, task));
    }
    // Each waiter has put its key and read the queue once (two transactions) and now waits.
    eventually(PROMPT, "every waiter to read the queue", || async {
        waiters.iter().all(|(_, c, _)| c.txns() >= 2)
    })
    .await;
    let before: Vec<u64> = waiters.iter().map(|(_, c, _)| c.txns()).collect();
    held.release().await.unwrap();
    let first = within(
        prompt(fx),
        "the first waiter to get the released permit",
        &mut waiters[0].2,
    )
    .await
    .unwrap()
    .unwrap();
    // A waiter woken by the same delete would read at once; give it a prompt's time to.
    tokio::time::sleep(prompt(fx)).await;
    let woken: Vec<usize> = (1..WAITERS)
        .filter(|&i| waiters[i].1.txns() != before[i])
        .collect();
    assert!(
        woken.is_empty(),
        "a release woke waiters {woken:?} (of 1..{WAITERS}) that were not next in line: {:?} transactions before, {:?} after",
        before,
        waiters.iter().map(|(_, c, _)| c.txns()).collect::<Vec<_>>()
    );
    assert!(first.is_held());
    for (_, _, task) in &waiters {
        task.abort();
    }
}

/// A `try_acquire` right after the session's own waiter gave up (its key still queued, its
/// withdrawal not yet through) takes nothing and leaves the withdrawal to happen. A try that
/// called the withdrawal off, or kept the key's turn, left the key queued, unbelieved, until
/// the lease ended, and a seat that reached it went unused.
pub async fn semaphore_try_behind_its_own_waiter_leaves_the_key_to_it(fx: &dyn Fixture) {
    let store = fx.store();
    let (b, c, a) = (
        session(fx, &store).await,
        session(fx, &store).await,
        session(fx, &store).await,
    );
    let _held = (
        Semaphore::new(&b, SEM, 2).acquire().await.unwrap(),
        Semaphore::new(&c, SEM, 2).acquire().await.unwrap(),
    );
    let sem = Semaphore::new(&a, SEM, 2);
    let waiting = tokio::spawn({
        let sem = sem.clone();
        async move { sem.acquire().await }
    });
    eventually(PROMPT, "a's waiter to queue", || async {
        queued(&store).await == 3
    })
    .await;
    // Given up, and tried again at once: the try waits for the session's turn, which the
    // waiter's end hands it before its withdrawal's.
    waiting.abort();
    assert!(
        sem.try_acquire().await.unwrap().is_none(),
        "no seat is free"
    );
    eventually(
        prompt(fx),
        "the given-up waiter's key withdrawn",
        || async { queued(&store).await == 2 },
    )
    .await;
}

pub async fn semaphore_refuses_a_user_passing_another_count(fx: &dyn Fixture) {
    let store = fx.store();
    let (a, b, c) = (
        session(fx, &store).await,
        session(fx, &store).await,
        session(fx, &store).await,
    );
    let held = Semaphore::new(&a, SEM, 1).acquire().await.unwrap();
    // Three permits where the holder counts one: it would take a second seat at once.
    for refused in [
        Semaphore::new(&b, SEM, 3).acquire().await.map(|_| ()),
        Semaphore::new(&b, SEM, 3).try_acquire().await.map(|_| ()),
    ] {
        match refused {
            Err(Error::InvalidArgument { reason }) => {
                assert!(
                    reason.contains("permits=1"),
                    "names the count recorded: {reason}"
                )
            }
            other => panic!("a user passing another count got {other:?}"),
        }
    }
    eventually(PROMPT, "the refused user's key to go", || async {
        queued(&store).await == 1
    })
    .await;
    assert!(held.is_held(), "the refusal ended the holder's permit");
    // A user passing the same count queues behind the holder as ever.
    let same = Semaphore::new(&c, SEM, 1);
    assert!(same.try_acquire().await.unwrap().is_none());
    held.release().await.unwrap();
    let permit = within(prompt(fx), "the next permit", same.acquire())
        .await
        .unwrap();
    permit.release().await.unwrap();
}
