//! [`Semaphore`]: at most N holders at a time, each [`Permit`] with a fencing token the store
//! checks.
//!
//! The queue is the election's: a key `<name>/<lease hex>` under the session's lease, ordered
//! by create revision, and a session holds a permit while its key is among the N oldest. Keys
//! only leave the queue and new ones join at its end, so a key among the N oldest stays there
//! until it is deleted: the permit's fence ("my key still stands as created") is all the store
//! needs to refuse the writes of a permit that may have passed on, and the fenced writes it
//! accepts at any revision come from at most N permits.
//!
//! A waiter follows the N keys just ahead of it (of the keys ahead, one of those must go
//! before it can hold a permit), so a release wakes the N waiters behind the released key,
//! each with one read, not the whole queue.
//! Everything the election promises holds for a permit: never handed out on a key already
//! gone, nor with less than half the session's TTL left; a dropped wait leaves no key behind.
//!
//! Every key records the count its user passed (its value, `permits=N`). A permit is handed
//! out only on a read that finds the keys ahead of its own recording the same count (the
//! reads that decide the seat, no other): a user queued behind keys recording another count
//! is refused with [`Error::InvalidArgument`] and its key released, rather than take more than
//! its share. (A user of one permit shares no seat: it waits until its key is the oldest, and
//! any user queued behind it with another count is refused then.)

use std::time::Duration;

use bytes::Bytes;

use super::election::{Election, Leadership};
use super::hold::HeldKey;
use super::session::SessionHandle;
use crate::error::{Error, Result};
use crate::request::{GetRequest, SortOrder, SortTarget};
use crate::types::KeyValue;

/// A named semaphore of `permits` permits, taken under one session's lease (one permit per
/// session and name).
///
/// ```
/// # async fn run(store: std::sync::Arc<coord_api::DynKvLeaseStore>) -> coord_api::Result<()> {
/// use coord_api::recipes::{Semaphore, Session, SessionConfig};
/// use coord_api::{PutRequest, TxnRequest};
///
/// let session = Session::new(store, SessionConfig::default()).await?;
/// // At most three reindexing jobs at a time, cluster-wide.
/// let jobs = Semaphore::new(&session, "semaphores/reindex", 3);
/// let permit = jobs.acquire().await?;
/// // Refused by the store once this permit may have passed on.
/// permit
///     .txn(TxnRequest::new().and_then([PutRequest::new("reindex/progress", "10%")]))
///     .await?;
/// permit.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Semaphore {
    election: Election,
    permits: u32,
}

impl Semaphore {
    /// The semaphore `name` with `permits` permits, under `session`'s lease (a
    /// [`&Session`](super::Session) or a [`SessionHandle`]). Its keys are `name/<lease hex>`.
    /// A count of zero is refused by every call with [`Error::InvalidArgument`].
    pub fn new(session: impl Into<SessionHandle>, name: impl Into<String>, permits: u32) -> Self {
        let mut seats = permits.max(1) as usize;
        if crate::hooks::planted::enabled(crate::hooks::planted::Bug::SemaphoreOneTooMany) {
            seats += 1;
        }
        Semaphore {
            election: Election::new(session, name).with_seats(seats),
            permits,
        }
    }

    /// The semaphore's name.
    pub fn name(&self) -> &str {
        self.election.name()
    }

    /// How many permits it has.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    fn valid(&self) -> Result<()> {
        if self.permits == 0 {
            return Err(Error::invalid(format!(
                "semaphore {:?}: zero permits; at least one is needed",
                self.name()
            )));
        }
        crate::validate::election_name(self.name())
    }

    /// Waits until this session holds a permit.
    ///
    /// Dropping the future stops waiting and deletes the waiter's key. Acquiring again under
    /// a session that already holds a permit returns it again (same key, same token), and the
    /// key is then the newer permit's: the older permit's release leaves it standing.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for zero permits, a bad name, or a count other than the one
    /// the keys ahead record; [`Error::CandidacyLost`] when
    /// the session ends or the waiter's key is deleted while waiting; whatever the store
    /// fails with.
    pub async fn acquire(&self) -> Result<Permit> {
        self.valid()?;
        let held = self.election.campaign(self.recorded()).await?;
        tracing::info!(semaphore = %self.name(), token = %held.token(), "permit acquired");
        Ok(Permit::new(held))
    }

    /// Waits at most `timeout` for a permit.
    ///
    /// # Errors
    /// [`Error::Cancelled`] when the time runs out (the waiter's key is deleted); otherwise as
    /// [`acquire`](Self::acquire).
    pub async fn acquire_timeout(&self, timeout: Duration) -> Result<Permit> {
        match tokio::time::timeout(timeout, self.acquire()).await {
            Ok(r) => r,
            Err(_) => Err(Error::Cancelled {
                operation: "acquire",
            }),
        }
    }

    /// Takes this session's key out of the semaphore's queue, waiting or holding, once any
    /// `acquire` of this session's that was writing it has settled; see [`Election::leave`].
    ///
    /// # Errors
    /// As [`Election::leave`].
    pub async fn leave(&self) -> Result<()> {
        self.election.leave().await
    }

    /// Takes a permit if one is free; never waits. `Ok(None)` when all are held (or
    /// waited for by older waiters). One transaction writes the key and reads the keys before
    /// it; when no permit was free the key is deleted again before this returns.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire), without the waiting.
    pub async fn try_acquire(&self) -> Result<Option<Permit>> {
        self.valid()?;
        let held = self.election.try_campaign(self.recorded()).await?;
        if let Some(h) = &held {
            tracing::info!(semaphore = %self.name(), token = %h.token(), "permit acquired (try)");
        }
        Ok(held.map(Permit::new))
    }

    /// What each key of this user records: the count it passed.
    fn recorded(&self) -> Bytes {
        Bytes::from(format!("permits={}", self.permits))
    }

    /// The keys holding permits now (the oldest `permits` keys), oldest first.
    ///
    /// # Errors
    /// Whatever the store fails with.
    pub async fn holders(&self) -> Result<Vec<KeyValue>> {
        self.valid()?;
        let read = GetRequest::prefix(format!("{}/", self.name()))
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(u64::from(self.permits));
        Ok(self.election.store().get(read).await?.kvs)
    }
}

/// A held permit: its key, its fencing token, and a signal for when it is over.
///
/// Dropping it releases in the background (on the runtime it was dropped in, retrying until
/// the key is gone; acquiring again on the same session meanwhile takes the key over);
/// [`release`](Self::release) does it in the caller and says whether it worked. Either way
/// the permit also ends with the session.
#[must_use = "dropping a permit releases it at once"]
#[derive(Debug)]
pub struct Permit(HeldKey);

impl Permit {
    fn new(held: Leadership) -> Self {
        Permit(HeldKey::new(held, "permit"))
    }

    /// Releases the permit: deletes its key if it is still this one, and this permit's (not
    /// taken over by a newer `acquire` on the same session). Idempotent.
    ///
    /// # Errors
    /// Whatever the delete fails with; the permit then ends with the session's lease.
    pub async fn release(self) -> Result<()> {
        self.0.release().await
    }
}

/// The held key's token, loss signal and fenced transactions.
impl std::ops::Deref for Permit {
    type Target = HeldKey;

    fn deref(&self) -> &HeldKey {
        &self.0
    }
}
