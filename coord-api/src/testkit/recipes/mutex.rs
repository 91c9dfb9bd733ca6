//! The cases of `Mutex` and `MutexGuard`.

use crate::recipes::{LossReason, Mutex};
use crate::testkit::{within, PROMPT};
use crate::{Error, KvLeaseStoreExt, PutRequest, TxnRequest};

use super::fixture::Fixture;
use super::support::*;

pub async fn mutex_excludes_and_hands_over_in_queue_order(fx: &dyn Fixture) {
    let store = fx.store();
    let (a, b, c) = (
        session(fx, &store).await,
        session(fx, &store).await,
        session(fx, &store).await,
    );
    let first = Mutex::new(&a, "lock").lock().await.unwrap();
    let b_lock = Mutex::new(&b, "lock");
    let b_waits = tokio::spawn(async move { b_lock.lock().await });
    crate::testkit::eventually(PROMPT, "b to queue", || async {
        store.get_prefix("lock/").await.unwrap().count == 2
    })
    .await;
    assert!(!b_waits.is_finished(), "b got the lock while a held it");
    assert!(
        Mutex::new(&c, "lock").try_lock().await.unwrap().is_none(),
        "try_lock took a held lock"
    );
    assert_eq!(
        store.get_prefix("lock/").await.unwrap().count,
        2,
        "try_lock queued a key"
    );
    let token = first.token();
    first.unlock().await.unwrap();
    let second = within(PROMPT, "b to get the lock", b_waits)
        .await
        .unwrap()
        .unwrap();
    assert!(second.token() > token, "tokens must grow");
    assert_eq!(
        Mutex::new(&a, "lock")
            .holder()
            .await
            .unwrap()
            .map(|kv| kv.key),
        Some(second.key().key.clone())
    );
}

pub async fn mutex_guard_dropped_unlocks(fx: &dyn Fixture) {
    let store = fx.store();
    let (a, b) = (session(fx, &store).await, session(fx, &store).await);
    let guard = Mutex::new(&a, "lock")
        .try_lock()
        .await
        .unwrap()
        .expect("free");
    drop(guard);
    let _held = within(
        PROMPT,
        "b to get the dropped lock",
        Mutex::new(&b, "lock").lock(),
    )
    .await
    .unwrap();
}

pub async fn mutex_holder_whose_key_is_deleted_is_fenced_out(fx: &dyn Fixture) {
    let store = fx.store();
    let (a, b) = (session(fx, &store).await, session(fx, &store).await);
    let old = Mutex::new(&a, "lock").lock().await.unwrap();
    // An operator deletes the key: the lock passes on while the old holder may not know yet.
    store.delete_key(old.key().key.to_vec()).await.unwrap();
    let new = within(PROMPT, "b to get the lock", Mutex::new(&b, "lock").lock())
        .await
        .unwrap();
    let write = TxnRequest::new().and_then([PutRequest::new("locked/by", "a")]);
    let err = old.txn(write).await.unwrap_err();
    assert!(matches!(err, Error::FencedOut { .. }), "{err:?}");
    assert!(!old.is_held());
    assert!(matches!(
        old.lost().await,
        LossReason::KeyDeleted | LossReason::FencedOut
    ));
    new.txn(TxnRequest::new().and_then([PutRequest::new("locked/by", "b")]))
        .await
        .unwrap();
    assert_eq!(
        store
            .get_key("locked/by")
            .await
            .unwrap()
            .unwrap()
            .value_str(),
        "b"
    );
}

/// A `lock()` dropped while its key's write is in flight, then `leave()`: once `leave`
/// returns the key is gone and stays gone. On the simulator the client's delay is lifted
/// between the two, so a delete sent after the drop would overtake the write (what a second
/// connection, or a busy server, can do); `leave` waits for the write to settle. Through
/// etcd's one connection the order holds anyway, and the case checks the outcome.
pub async fn mutex_leave_after_a_dropped_lock_leaves_no_key(fx: &dyn Fixture) {
    let store = fx.store();
    let a = session(fx, &store).await;
    let _held = Mutex::new(&a, "lock").lock().await.unwrap();
    let client = fx.client().await;
    let b = session(fx, &client.store).await;
    let key = crate::candidate_key("lock", b.lease());
    let delay = fx.ttl() / 10;
    client.delay_requests(delay);
    let waiting = Mutex::new(&b, "lock");
    // Dropped half-way through the write's delay: the write is on its way.
    let dropped = tokio::time::timeout(delay / 2, waiting.lock()).await;
    assert!(dropped.is_err(), "b got a held lock");
    client.delay_requests(std::time::Duration::ZERO);
    within(prompt(fx) + delay, "b to leave", waiting.leave())
        .await
        .unwrap();
    assert!(!present(&store, &key).await, "b's key stands after leave");
    // Whatever was in flight has landed by now; nothing brought the key back.
    tokio::time::sleep(delay * 2).await;
    assert!(
        !present(&store, &key).await,
        "b's key came back after leave returned"
    );
}

/// A `try_lock` right after the session's own waiter gave up (its key still queued, its
/// withdrawal not yet through) takes nothing and leaves the withdrawal to happen; see the
/// semaphore's case of the same name.
pub async fn mutex_try_behind_its_own_waiter_leaves_the_key_to_it(fx: &dyn Fixture) {
    let store = fx.store();
    let (b, a) = (session(fx, &store).await, session(fx, &store).await);
    let _held = Mutex::new(&b, "lock").lock().await.unwrap();
    let lock = Mutex::new(&a, "lock");
    let queued = || async { store.get_prefix("lock/").await.unwrap().count };
    let waiting = tokio::spawn({
        let lock = lock.clone();
        async move { lock.lock().await }
    });
    crate::testkit::eventually(PROMPT, "a's waiter to queue", || async {
        queued().await == 2
    })
    .await;
    waiting.abort();
    assert!(lock.try_lock().await.unwrap().is_none(), "the lock is held");
    crate::testkit::eventually(
        prompt(fx),
        "the given-up waiter's key withdrawn",
        || async { queued().await == 1 },
    )
    .await;
}
