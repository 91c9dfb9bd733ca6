//! The cases of `Session`.

use std::future::Future;
use std::time::Duration;

use crate::recipes::{Session, SessionConfig, SessionEnd};
use crate::testkit::within;
use crate::{Error, KvLeaseStore};
use tokio::time::Instant;

use super::fixture::Fixture;
use super::support::*;

pub async fn session_renews_and_outlives_its_ttl(fx: &dyn Fixture) {
    let store = fx.store();
    let s = session(fx, &store).await;
    tokio::time::sleep(fx.ttl() * 3).await;
    assert!(!s.is_done());
    assert!(store.time_to_live(s.lease()).await.is_ok());
    let (lease, handle) = (s.lease(), s.handle());
    s.stop().await.unwrap();
    assert!(matches!(
        store.time_to_live(lease).await,
        Err(Error::LeaseNotFound { .. })
    ));
    assert_eq!(handle.done().await, SessionEnd::Closed);
}

/// A renewal moves the deadline on without waking the tasks that wait for the session's end:
/// a service with a thousand campaigns on one session would otherwise poll each of them (and
/// everything it waits on beside) on every renewal.
pub async fn session_renewals_wake_no_waiter_of_its_end(fx: &dyn Fixture) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let store = fx.store();
    let s = session(fx, &store).await;
    let polls = Arc::new(AtomicUsize::new(0));
    let handle = s.handle();
    let mut done = Box::pin(async move { handle.done().await });
    let counted = polls.clone();
    let waiter = tokio::spawn(futures::future::poll_fn(move |cx| {
        counted.fetch_add(1, Ordering::SeqCst);
        done.as_mut().poll(cx)
    }));
    // Six renewals or more (every TTL/3).
    tokio::time::sleep(fx.ttl() * 2 + fx.ttl() / 3).await;
    let renewed = s.health().last_renewal.expect("renewed");
    assert!(
        renewed.elapsed() < fx.ttl() / 3 + fx.slack(),
        "the session must have been renewing"
    );
    assert_eq!(
        polls.load(Ordering::SeqCst),
        1,
        "the waiter of the session's end was polled again while the session was only renewed"
    );
    s.stop().await.unwrap();
    let end = within(fx.slack(), "the waiter to see the end", waiter)
        .await
        .unwrap();
    assert_eq!(end, SessionEnd::Closed);
}

pub async fn session_done_fires_at_the_local_deadline_when_cut_off(fx: &dyn Fixture) {
    let client = fx.client().await;
    let s = session(fx, &client.store).await;
    tokio::time::sleep(fx.ttl() / 2).await;
    client.cut_off(true);
    let cut = Instant::now();
    let deadline = s.deadline();
    let end = within(fx.ttl() * 2, "the session to end", s.done()).await;
    assert_eq!(end, SessionEnd::Expired);
    // Not after the deadline (the promise)...
    let now = Instant::now();
    assert!(
        now <= deadline + Duration::from_millis(50) + fx.slack() / 4,
        "{:?} late",
        now - deadline
    );
    // ...and not before it: renewed every TTL/3 until the cut, the session had at least
    // TTL − TTL/3 left then (the renewal sent a third of a TTL before the cut, at worst).
    assert!(
        now >= cut + fx.ttl() - fx.ttl() / 3,
        "ended {:?} after the cut, before the lease could have run out",
        now - cut
    );
}

/// The local deadline keeps a clock margin ahead of the store's expiry: a session cut off ends
/// while the store still holds its lease, even at zero latency, where without the margin both
/// fall on one instant and the store may go first. The margin is the most a session allows
/// (10% of the TTL: 200 ms on the real servers' 2 s TTL, the time the store's answer has
/// to arrive in, besides the store's own expiry granularity); the default is 1%.
pub async fn session_ends_a_clock_margin_before_its_lease_expires(fx: &dyn Fixture) {
    assert_eq!(
        SessionConfig::default().clock_drift_ppm,
        10_000,
        "1% by default"
    );
    let client = fx.client().await;
    let observer = fx.store();
    let config = SessionConfig::default()
        .with_ttl(fx.ttl())
        .with_clock_drift_ppm(1_000_000);
    let s = Session::new(client.store.clone(), config).await.unwrap();
    let granted = Instant::now();
    assert_eq!(s.clock_margin(), fx.ttl() / 10, "capped at 10% of the TTL");
    // The store counts the TTL from when the grant reached it, before its answer came back:
    // the deadline is the margin ahead of the earliest the store could end the lease.
    assert!(
        s.deadline() + s.clock_margin() <= granted + fx.ttl(),
        "deadline {:?} after the grant's answer, TTL {:?}, margin {:?}",
        s.deadline() - granted,
        fx.ttl(),
        s.clock_margin()
    );
    let lease = s.lease();
    client.cut_off(true);
    let end = within(fx.ttl() * 2, "the session to end", s.done()).await;
    assert_eq!(end, SessionEnd::Expired);
    assert!(
        observer.time_to_live(lease).await.is_ok(),
        "the store let the lease go before the session stopped believing in it"
    );
}

/// A grant answered late (a stalled etcd, a slow disk): the lease is older than its reply
/// says. The session must renew before its deadline (counted from the grant's send), not a
/// renewal period after the reply; and a new session has at least TTL − TTL/3 left.
pub async fn session_survives_a_grant_answered_late(fx: &dyn Fixture) {
    let client = fx.client().await;
    let ttl = fx.ttl();
    let late = ttl * 7 / 10;
    client.delay_requests(late);
    let store = client.store.clone();
    let sent = Instant::now();
    let pending =
        tokio::spawn(
            async move { Session::new(store, SessionConfig::default().with_ttl(ttl)).await },
        );
    // Only the grant is slow: what follows it goes at once.
    tokio::time::sleep(Duration::from_millis(50)).await;
    client.delay_requests(Duration::ZERO);
    let s = within(ttl + fx.slack(), "the grant", pending)
        .await
        .unwrap()
        .unwrap();
    assert!(
        sent.elapsed() >= late,
        "the grant took {:?}, not the {late:?} the test needs",
        sent.elapsed()
    );
    assert!(
        s.health().remaining >= ttl - ttl / 3 - fx.slack(),
        "a new session with {:?} left",
        s.health().remaining
    );
    // Watched for more than a TTL after the slow grant: no expiry, the lease lives.
    let quiet = tokio::time::timeout(ttl + Duration::from_secs(1), s.done()).await;
    assert!(quiet.is_err(), "the session ended: {quiet:?}");
    assert!(client.store.time_to_live(s.lease()).await.is_ok());
    s.stop().await.unwrap();
}

pub async fn session_reports_a_revoked_lease(fx: &dyn Fixture) {
    let store = fx.store();
    let s = session(fx, &store).await;
    store.revoke(s.lease()).await.unwrap();
    let end = within(fx.ttl(), "the session to notice", s.done()).await;
    assert_eq!(end, SessionEnd::LeaseLost);
}
