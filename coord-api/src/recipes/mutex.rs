//! [`Mutex`]: a distributed lock on a [`Session`](super::Session), with a fencing token.
//!
//! etcd's Go `concurrency.Mutex` and `concurrency.Election` share one algorithm and one key
//! layout: a key `<name>/<lease hex>` under the session's lease, queued by create revision,
//! each waiter waiting for the key just before it to go. So a lock is an election whose
//! candidates carry no value, and this one is coord's [`Election`] underneath: what it
//! promises (a holder is never handed a key that is already gone, a dropped wait leaves no
//! key behind, a holder's belief ends no later than the store could hand the lock on) holds
//! here too, and coord, Go programs and `etcdctl lock` exclude each other on one name.
//!
//! A lock held across a process pause or a partition can outlive its holder's belief on the
//! store side; the guard's fencing token is what keeps such a holder's writes out: write
//! through [`MutexGuard::txn`] (or [`MutexGuard::fenced`]) and the store refuses a write once
//! the lock may have passed on.

use std::time::Duration;

use bytes::Bytes;

use super::election::{Election, Leadership};
use super::hold::HeldKey;
use super::session::SessionHandle;
use crate::error::{Error, Result};
use crate::types::KeyValue;

/// A named lock, taken under one session's lease.
///
/// ```
/// # async fn run(store: std::sync::Arc<coord_api::DynKvLeaseStore>) -> coord_api::Result<()> {
/// use coord_api::recipes::{Mutex, Session, SessionConfig};
/// use coord_api::{PutRequest, TxnRequest};
///
/// let session = Session::new(store, SessionConfig::default()).await?;
/// let lock = Mutex::new(&session, "locks/report");
/// let guard = lock.lock().await?;
/// // Writes through the guard are refused by the store once the lock may have passed on.
/// guard
///     .txn(TxnRequest::new().and_then([PutRequest::new("reports/today", "done")]))
///     .await?;
/// guard.unlock().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Mutex {
    election: Election,
}

impl Mutex {
    /// The lock `name`, under `session`'s lease (a [`&Session`](super::Session) or a
    /// [`SessionHandle`]). Its keys are `name/<lease hex>`, as with Go's `NewMutex(s, name)`
    /// and `etcdctl lock name`.
    pub fn new(session: impl Into<SessionHandle>, name: impl Into<String>) -> Self {
        Mutex {
            election: Election::new(session, name),
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.election.name()
    }

    /// Waits until this session holds the lock.
    ///
    /// Dropping the future stops waiting and deletes the waiter's key. Locking again under a
    /// session that already holds the lock returns it again (same key, same token), and the
    /// key is then the newer guard's: the older guard's unlock leaves it standing.
    ///
    /// # Errors
    /// [`Error::CandidacyLost`] when the session ends or the waiter's key is deleted while
    /// waiting; whatever the store fails with.
    pub async fn lock(&self) -> Result<MutexGuard> {
        let held = self.election.campaign(Bytes::new()).await?;
        tracing::info!(lock = %self.name(), token = %held.token(), "lock acquired");
        Ok(MutexGuard::new(held))
    }

    /// Waits at most `timeout` for the lock.
    ///
    /// # Errors
    /// [`Error::Cancelled`] when the time runs out (the waiter's key is deleted); otherwise as
    /// [`lock`](Self::lock).
    pub async fn lock_timeout(&self, timeout: Duration) -> Result<MutexGuard> {
        match tokio::time::timeout(timeout, self.lock()).await {
            Ok(r) => r,
            Err(_) => Err(Error::Cancelled { operation: "lock" }),
        }
    }

    /// Takes this session's key out of the lock's queue, waiting or holding, once any
    /// `lock` of this session's that was writing it has settled; see [`Election::leave`].
    ///
    /// # Errors
    /// As [`Election::leave`].
    pub async fn leave(&self) -> Result<()> {
        self.election.leave().await
    }

    /// Takes the lock if nobody holds it or waits for it, in one transaction; never waits
    /// and never queues. `Ok(None)` when someone else holds it.
    ///
    /// # Errors
    /// Whatever the store fails with.
    pub async fn try_lock(&self) -> Result<Option<MutexGuard>> {
        let held = self.election.try_campaign(Bytes::new()).await?;
        if let Some(h) = &held {
            tracing::info!(lock = %self.name(), token = %h.token(), "lock acquired (try)");
        }
        Ok(held.map(MutexGuard::new))
    }

    /// The holder's key (`name/<lease hex>`), or `None` when the lock is free.
    ///
    /// # Errors
    /// Whatever the store fails with.
    pub async fn holder(&self) -> Result<Option<KeyValue>> {
        match self.election.leader().await {
            Ok(kv) => Ok(Some(kv)),
            Err(Error::NoLeader { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// A held lock: its key, its fencing token, and a signal for when it is over.
///
/// Dropping the guard unlocks in the background (on the runtime it was dropped in, retrying
/// until the key is gone; locking again on the same session meanwhile takes the key over);
/// [`unlock`](Self::unlock) does it in the caller and says whether it worked. Either way the
/// lock also ends with the session.
#[must_use = "dropping the guard unlocks at once"]
#[derive(Debug)]
pub struct MutexGuard(HeldKey);

impl MutexGuard {
    fn new(held: Leadership) -> Self {
        MutexGuard(HeldKey::new(held, "lock"))
    }

    /// Releases the lock: deletes its key if it is still this one, and this guard's (not
    /// taken over by a newer `lock` on the same session). Idempotent.
    ///
    /// # Errors
    /// Whatever the delete fails with; the lock then ends with the session's lease.
    pub async fn unlock(self) -> Result<()> {
        if crate::hooks::planted::enabled(crate::hooks::planted::Bug::UnlockReturnsBeforeDelete) {
            self.0.release_in_background();
            return Ok(());
        }
        self.0.release().await
    }
}

/// The held key's token, loss signal and fenced transactions.
impl std::ops::Deref for MutexGuard {
    type Target = HeldKey;

    fn deref(&self) -> &HeldKey {
        &self.0
    }
}
