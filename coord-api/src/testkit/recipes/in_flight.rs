//! Every public call that takes a session's key away, run while a write of that key is still
//! on its way: held there (on the simulator the call's own requests pass it, as a request
//! stuck at a stalled member is passed by the next one, sent to another member) and released
//! only after the call had its chance to finish. When the call returns the key is gone, and
//! the held write, landing late, does not bring it back. A call that deletes without waiting
//! for the write to settle, or a write that lands whatever stands, fails here.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::recipes::{
    Candidate, CandidateConfig, Election, ElectionPool, HostRegistration, HostSession, Semaphore,
    SessionConfig, Term,
};
use crate::testkit::{eventually, within};
use crate::{DynKvLeaseStore, Error, Forward, KvLeaseStoreExt, Result, TxnRequest, TxnResponse};

use super::fixture::{Client, Fixture};
use super::support::*;

/// How long the write is on its way before the hold, and how long the hold lasts: well
/// inside the TTL and the request timeout, so nothing but the race is tested.
fn delay(fx: &dyn Fixture) -> Duration {
    fx.ttl() / 10
}

/// Delays `client`'s requests, runs `start` (which sends the write), holds what is on its
/// way half the delay later, runs `call(&started)` with later requests undelayed, and
/// releases the hold one delay after that. Returns what the call returned (within a prompt
/// bound after the release) and what `start` gave.
async fn while_a_write_is_held<S, F>(
    fx: &dyn Fixture,
    client: &Client,
    start: impl FnOnce() -> S,
    call: impl FnOnce(&S) -> F,
) -> (Result<()>, S)
where
    F: Future<Output = Result<()>> + Send + 'static,
{
    let delay = delay(fx);
    client.delay_requests(delay);
    let started = start();
    // The write is on its way.
    tokio::time::sleep(delay / 2).await;
    client.delay_requests(Duration::ZERO);
    client.hold_in_flight(true);
    let call = tokio::spawn(call(&started));
    tokio::time::sleep(delay).await;
    client.hold_in_flight(false);
    let returned = within(prompt(fx) + delay, "the call to return", call)
        .await
        .expect("the call's task");
    (returned, started)
}

/// Whether `key` is gone now, and still gone once whatever was held has landed.
async fn stays_gone(fx: &dyn Fixture, key: &str, call: &str) {
    let store = fx.store();
    assert!(
        !present(&store, key).await,
        "{key} stands after {call} returned"
    );
    tokio::time::sleep(delay(fx) * 2).await;
    assert!(
        !present(&store, key).await,
        "{key} came back after {call} returned: a write held in flight landed after it"
    );
}

/// An election's `leave()` after a dropped campaign whose write is held.
pub async fn a_leave_outlasts_a_held_campaign_write(fx: &dyn Fixture) {
    let store = fx.store();
    let a = session(fx, &store).await;
    let _held = Election::new(&a, "jobs").campaign("a").await.unwrap();
    let client = fx.client().await;
    let b = session(fx, &client.store).await;
    let key = crate::candidate_key("jobs", b.lease());
    let e = Election::new(&b, "jobs");
    let (left, _) = while_a_write_is_held(
        fx,
        &client,
        || {
            let e = e.clone();
            tokio::spawn(async move { e.campaign("b").await.map(|_| ()) })
        },
        |campaign| {
            // Given up while its write is on its way.
            campaign.abort();
            let e = e.clone();
            async move { e.leave().await }
        },
    )
    .await;
    left.unwrap();
    stays_gone(fx, &key, "leave").await;
}

/// A client that gives up on a transaction not answered within `after`, as a backend's
/// request timeout does, while the transaction goes on to the store: its caller is told
/// `Indeterminate`.
#[derive(Debug, Clone)]
struct GivesUp {
    inner: Arc<DynKvLeaseStore>,
    after: Duration,
}

#[async_trait::async_trait]
impl Forward for GivesUp {
    fn inner(&self) -> &DynKvLeaseStore {
        &*self.inner
    }

    async fn txn(&self, req: TxnRequest) -> Result<TxnResponse> {
        let inner = self.inner.clone();
        let sent = tokio::spawn(async move { inner.txn(req).await });
        match tokio::time::timeout(self.after, sent).await {
            Ok(answer) => answer.expect("the transaction's task"),
            Err(_) => Err(Error::Indeterminate {
                backend: "testkit",
                operation: "txn",
                source: format!("no answer within {:?}; given up", self.after).into(),
            }),
        }
    }
}

/// A campaign whose write its client gave up on (`Indeterminate`) while the write was held,
/// then `leave()`: the write lands after both, as a write held by a stalled member lands
/// when the member resumes, and must not bring the key back (`elections::limbo`).
pub async fn a_leave_outlasts_a_campaign_write_of_unknown_outcome(fx: &dyn Fixture) {
    let store = fx.store();
    let a = session(fx, &store).await;
    let _held = Election::new(&a, "jobs").campaign("a").await.unwrap();
    let client = fx.client().await;
    let gives_up: Arc<DynKvLeaseStore> = Arc::new(GivesUp {
        inner: client.store.clone(),
        after: delay(fx),
    });
    let b = session(fx, &gives_up).await;
    let key = crate::candidate_key("jobs", b.lease());
    let e = Election::new(&b, "jobs");
    let (left, campaign) = while_a_write_is_held(
        fx,
        &client,
        || {
            let e = e.clone();
            tokio::spawn(async move { e.campaign("b").await.map(|_| ()) })
        },
        |_| {
            let e = e.clone();
            async move { e.leave().await }
        },
    )
    .await;
    left.unwrap();
    let campaigned = within(prompt(fx), "the campaign to end", campaign)
        .await
        .expect("the campaign's task");
    assert!(
        campaigned.is_err(),
        "a campaign whose write was given up on won"
    );
    stays_gone(fx, &key, "leave").await;
}

/// A leadership's resignation that its client gave up on (`Indeterminate`) while it was
/// held, then a campaign of the same session, which rejoins the key and leads: the
/// resignation lands after both and must not delete the newer campaign's key
/// (`elections::limbo`).
pub async fn a_resign_of_unknown_outcome_leaves_a_newer_campaigns_key(fx: &dyn Fixture) {
    let client = fx.client().await;
    let gives_up: Arc<DynKvLeaseStore> = Arc::new(GivesUp {
        inner: client.store.clone(),
        after: delay(fx),
    });
    let a = session(fx, &gives_up).await;
    let key = crate::candidate_key("jobs", a.lease());
    let e = Election::new(&a, "jobs");
    let first = e.campaign("a").await.unwrap();
    let led = Arc::new(std::sync::Mutex::new(None));
    let (again, _) = while_a_write_is_held(
        fx,
        &client,
        || tokio::spawn(first.resign()),
        |_| {
            let e = e.clone();
            let led = led.clone();
            async move {
                let leadership = e.campaign("a again").await?;
                *led.lock().unwrap() = Some(leadership);
                Ok(())
            }
        },
    )
    .await;
    again.unwrap();
    let store = fx.store();
    tokio::time::sleep(delay(fx) * 2).await;
    assert!(
        present(&store, &key).await,
        "{key} was deleted under the newer campaign's leadership: a resignation given up on landed after it"
    );
    let led = led.lock().unwrap().take().expect("the newer leadership");
    assert!(led.is_leader(), "the newer campaign's leadership was lost");
}

/// A registration's metadata update that its client gave up on (`Indeterminate`) while it
/// was held, then a newer update: the first lands after both and must not bring the older
/// metadata back (`elections::limbo`).
pub async fn an_update_of_unknown_outcome_leaves_the_newer_metadata(fx: &dyn Fixture) {
    let client = fx.client().await;
    let gives_up: Arc<DynKvLeaseStore> = Arc::new(GivesUp {
        inner: client.store.clone(),
        after: delay(fx),
    });
    let host = HostSession::new(gives_up, SessionConfig::default().with_ttl(fx.ttl()));
    let mut r = Arc::new(
        HostRegistration::start_on(&host, reg_on("hosts/h", "v1"))
            .await
            .unwrap(),
    );
    let store = fx.store();
    eventually(prompt(fx), "h to register", || async {
        present(&store, "hosts/h").await
    })
    .await;
    let older = r.clone();
    let newer = r.clone();
    let (newer, _) = while_a_write_is_held(
        fx,
        &client,
        move || tokio::spawn(async move { older.update_metadata("v2").await }),
        |_| async move { newer.update_metadata("v3").await },
    )
    .await;
    newer.unwrap();
    tokio::time::sleep(delay(fx) * 2).await;
    let kv = store.get_key("hosts/h").await.unwrap().expect("h's key");
    assert_eq!(
        kv.value_str(),
        "v3",
        "an update given up on landed after the newer one"
    );
    // A registration started anew on the host session knows nothing of the fence the
    // first one raised, and still registers (turmoil seed 150111: it never did).
    let r = loop {
        match Arc::try_unwrap(r) {
            Ok(r) => break r,
            Err(shared) => {
                r = shared;
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    };
    r.stop().await.unwrap();
    let again = within(
        prompt(fx),
        "a registration started anew",
        HostRegistration::start_on(&host, reg_on("hosts/h", "v4")),
    )
    .await
    .unwrap();
    let kv = store.get_key("hosts/h").await.unwrap().expect("h's key");
    assert_eq!(kv.value_str(), "v4");
    again.stop().await.unwrap();
}

/// A semaphore's `leave()` after a dropped `acquire` whose write is held.
pub async fn a_semaphore_leave_outlasts_a_held_acquire(fx: &dyn Fixture) {
    let store = fx.store();
    let a = session(fx, &store).await;
    let _held = Semaphore::new(&a, "permits", 1).acquire().await.unwrap();
    let client = fx.client().await;
    let b = session(fx, &client.store).await;
    let key = crate::candidate_key("permits", b.lease());
    let s = Semaphore::new(&b, "permits", 1);
    let (left, _) = while_a_write_is_held(
        fx,
        &client,
        || {
            let s = s.clone();
            tokio::spawn(async move { s.acquire().await.map(|_| ()) })
        },
        |acquire| {
            acquire.abort();
            let s = s.clone();
            async move { s.leave().await }
        },
    )
    .await;
    left.unwrap();
    stays_gone(fx, &key, "leave").await;
}

/// A pool's `stop()` while one of its campaigns has its write held.
pub async fn a_pool_stop_outlasts_a_held_campaign_write(fx: &dyn Fixture) {
    let store = fx.store();
    let a = session(fx, &store).await;
    let _held = Election::new(&a, "jobs").campaign("a").await.unwrap();
    let client = fx.client().await;
    let host = HostSession::new(
        client.store.clone(),
        SessionConfig::default().with_ttl(fx.ttl()),
    );
    let key = crate::candidate_key("jobs", host.session().await.unwrap().lease());
    let pool = ElectionPool::on(&host);
    let (stopped, campaign) = while_a_write_is_held(
        fx,
        &client,
        || {
            let pool = pool.clone();
            tokio::spawn(async move { pool.campaign("jobs", "b").await.map(|_| ()) })
        },
        |_| {
            let pool = pool.clone();
            async move { pool.stop().await }
        },
    )
    .await;
    stopped.unwrap();
    let ended = within(prompt(fx), "the campaign to end", campaign)
        .await
        .expect("the campaign's task");
    assert!(ended.is_err(), "a campaign of a stopped pool won");
    stays_gone(fx, &key, "the pool's stop").await;
}

/// A candidate's `stop()` while its campaign's write is held.
pub async fn a_candidate_stop_outlasts_its_held_campaign_write(fx: &dyn Fixture) {
    let store = fx.store();
    let a = session(fx, &store).await;
    let _held = Election::new(&a, "jobs").campaign("a").await.unwrap();
    let client = fx.client().await;
    let host = HostSession::new(
        client.store.clone(),
        SessionConfig::default().with_ttl(fx.ttl()),
    );
    let key = crate::candidate_key("jobs", host.session().await.unwrap().lease());
    let pool = ElectionPool::on(&host);
    let slot = std::sync::Arc::new(std::sync::Mutex::new(None::<Candidate>));
    let (stopped, _) = while_a_write_is_held(
        fx,
        &client,
        || {
            let b = Candidate::spawn(
                &pool,
                CandidateConfig::new("jobs", "b"),
                |term: Term| async move { term.over().await },
            );
            *slot.lock().unwrap() = Some(b);
        },
        |_| {
            let b = slot.lock().unwrap().take().expect("the candidate");
            async move { b.stop().await }
        },
    )
    .await;
    stopped.unwrap();
    stays_gone(fx, &key, "the candidate's stop").await;
}

/// A leadership's `resign()` while a proclamation of it is held.
pub async fn a_resign_outlasts_a_held_proclamation(fx: &dyn Fixture) {
    let client = fx.client().await;
    let a = session(fx, &client.store).await;
    let key = crate::candidate_key("jobs", a.lease());
    let leadership = std::sync::Arc::new(Election::new(&a, "jobs").campaign("a").await.unwrap());
    let (resigned, proclaimed) = while_a_write_is_held(
        fx,
        &client,
        || {
            let l = leadership.clone();
            tokio::spawn(async move { l.proclaim("a again").await })
        },
        |_| {
            let l = leadership.clone();
            async move { l.hand_over().await }
        },
    )
    .await;
    resigned.unwrap();
    // Before the resignation (through one connection) or after it (the key gone, refused):
    // either way it is answered, and it must not have brought the key back.
    within(prompt(fx), "the proclamation's answer", proclaimed)
        .await
        .expect("the proclamation's task")
        .ok();
    stays_gone(fx, &key, "resign").await;
}

/// A registration's `stop()`, on a host session whose lease lives on, right after a metadata
/// update was given up with its write held (a service shutting down mid-update).
pub async fn a_registration_stop_outlasts_a_held_update(fx: &dyn Fixture) {
    let client = fx.client().await;
    let host = HostSession::new(
        client.store.clone(),
        SessionConfig::default().with_ttl(fx.ttl()),
    );
    let r = std::sync::Arc::new(
        HostRegistration::start_on(&host, reg_on("hosts/h", "v1"))
            .await
            .unwrap(),
    );
    let store = fx.store();
    eventually(prompt(fx), "h to register", || async {
        present(&store, "hosts/h").await
    })
    .await;
    let updating = r.clone();
    let (stopped, _) = while_a_write_is_held(
        fx,
        &client,
        move || tokio::spawn(async move { updating.update_metadata("v2").await }),
        |update| {
            update.abort();
            async move {
                // The update's task lets go of its handle once it is aborted.
                let mut r = r;
                let r = loop {
                    match std::sync::Arc::try_unwrap(r) {
                        Ok(r) => break r,
                        Err(shared) => {
                            r = shared;
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        }
                    }
                };
                r.stop().await
            }
        },
    )
    .await;
    stopped.unwrap();
    stays_gone(fx, "hosts/h", "the registration's stop").await;
    assert!(
        host.current().is_some_and(|s| !s.is_done()),
        "the host's lease lives on"
    );
}
