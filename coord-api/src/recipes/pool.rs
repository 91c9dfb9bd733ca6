//! [`ElectionPool`]: many elections on one host's session.
//!
//! **One shared session, not one per election** (go-coord pools one per key). Every election
//! a process holds then costs one lease and one renewal every TTL/3 instead of N, and the
//! failure domain does not change: the sessions of one process talk to the same etcd over the
//! same connection, so when one cannot renew, none can. What the pool must get right, and
//! go-coord's did not, is noticing that the session died: a dead session is replaced before
//! the next campaign, never reused. The session is a [`HostSession`]'s: the pool's own, or one
//! the host's registration shares.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use super::election::{Election, Leadership};
use super::host::HostSession;
use super::session::SessionConfig;
use crate::elections::candidate_key;
use crate::error::{Error, Result};
use crate::request::DeleteRequest;
use crate::store::DynKvLeaseStore;
use crate::sync::Stop;

/// What an [`ElectionPool`] has done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct PoolStats {
    /// Sessions (leases) its host session granted.
    pub sessions: u64,
    /// Leaderships handed out and not yet resigned or dropped.
    pub leaderships: usize,
    /// Dead sessions found and replaced.
    pub evictions: u64,
}

/// Many elections over one self-replacing session. See the module docs.
///
/// Cheap to clone; every clone is the same pool, and [`stop`](Self::stop) stops it for all.
///
/// ```no_run
/// # async fn run(store: std::sync::Arc<coord_api::DynKvLeaseStore>) -> coord_api::Result<()> {
/// use coord_api::recipes::{ElectionPool, SessionConfig};
/// let pool = ElectionPool::new(store, SessionConfig::default());
/// let shard_7 = pool.campaign("shards/7", "node-a").await?;
/// println!("leading shard 7 with token {}", shard_7.token());
/// pool.stop().await?; // every leadership of the pool ends now
/// # Ok(()) }
/// ```
#[must_use = "dropping every handle leaves the pool's keys until its lease expires; stop it to hand over"]
#[derive(Debug, Clone)]
pub struct ElectionPool {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    host: HostSession,
    /// Whether the host session is the pool's own: stopping the pool revokes it.
    owned: bool,
    /// The elections campaigned in, whose candidate keys `stop` removes.
    names: Mutex<BTreeSet<String>>,
    stopped: AtomicBool,
    /// Set by `stop`: ends the pool's campaigns still running.
    stopping: Stop,
    held: Arc<AtomicUsize>,
}

impl ElectionPool {
    /// A pool with a session of its own, kept with `config`. No lease is granted until the
    /// first campaign.
    pub fn new(store: Arc<DynKvLeaseStore>, config: SessionConfig) -> Self {
        Self::with_host(HostSession::new(store, config), true)
    }

    /// A pool on `host`'s session, shared with the host's other recipes (its registration).
    pub fn on(host: &HostSession) -> Self {
        Self::with_host(host.clone(), false)
    }

    fn with_host(host: HostSession, owned: bool) -> Self {
        ElectionPool {
            inner: Arc::new(Inner {
                host,
                owned,
                names: Mutex::default(),
                stopped: AtomicBool::new(false),
                stopping: Stop::new(),
                held: Arc::new(AtomicUsize::new(0)),
            }),
        }
    }

    /// The host session the pool campaigns on.
    pub fn host(&self) -> &HostSession {
        &self.inner.host
    }

    /// The election `name` on the live session (granted, or replaced if dead, first).
    ///
    /// # Errors
    /// Whatever the grant fails with; [`Error::Cancelled`] once the pool is stopped.
    pub async fn election(&self, name: impl Into<String>) -> Result<Election> {
        if self.inner.stopped.load(Ordering::SeqCst) {
            return Err(Error::Cancelled {
                operation: "election pool (stopped)",
            });
        }
        let name = name.into();
        // Known before any key is written: `stop` deletes the host's candidate keys in every
        // election the pool was asked about (an earlier pool's on this host included).
        self.inner
            .names
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.clone());
        let session = self.inner.host.session().await?;
        Ok(Election::new(session, name).counting(self.inner.held.clone()))
    }

    /// Campaigns in `name` until leading; see [`Election::campaign`].
    ///
    /// A session can die between renewals without knowing it yet; a campaign that finds its
    /// lease gone replaces the session and tries once more on a fresh one.
    ///
    /// # Errors
    /// As [`election`](Self::election) and [`Election::campaign`].
    pub async fn campaign(&self, name: &str, value: impl Into<Bytes>) -> Result<Leadership> {
        let value = value.into();
        self.until_stopped(async {
            let election = self.election(name).await?;
            match election.campaign(value.clone()).await {
                Err(Error::LeaseNotFound { lease }) => {
                    self.inner.host.evict(lease).await;
                    self.election(name).await?.campaign(value).await
                }
                other => other,
            }
        })
        .await
    }

    /// Runs `campaign` until the pool stops; a campaign the stop ends is dropped (its key is
    /// withdrawn once its write settles) and returns [`Error::Cancelled`].
    async fn until_stopped<T>(&self, campaign: impl Future<Output = Result<T>>) -> Result<T> {
        tokio::select! {
            biased;
            _ = self.inner.stopping.stopped() => Err(Error::Cancelled {
                operation: "campaign (election pool stopped)",
            }),
            r = campaign => r,
        }
    }

    /// Takes `name` if nobody leads it; see [`Election::try_campaign`]. Replaces a dead
    /// session as [`campaign`](Self::campaign) does.
    ///
    /// # Errors
    /// As [`election`](Self::election) and [`Election::try_campaign`].
    pub async fn try_campaign(
        &self,
        name: &str,
        value: impl Into<Bytes>,
    ) -> Result<Option<Leadership>> {
        let value = value.into();
        self.until_stopped(async {
            let election = self.election(name).await?;
            match election.try_campaign(value.clone()).await {
                Err(Error::LeaseNotFound { lease }) => {
                    self.inner.host.evict(lease).await;
                    self.election(name).await?.try_campaign(value).await
                }
                other => other,
            }
        })
        .await
    }

    /// Takes the pool's key out of election `name` on its current session, once the write of
    /// a campaign just dropped there has settled; see [`Election::leave`]. A pool without a
    /// session has no key to take out.
    pub(crate) async fn leave(&self, name: &str) -> Result<()> {
        if crate::hooks::planted::enabled(
            crate::hooks::planted::Bug::CandidateStopLeavesItsQueuedKey,
        ) {
            return Ok(());
        }
        match self.inner.host.current() {
            Some(session) => Election::new(session, name.to_owned()).leave().await,
            None => Ok(()),
        }
    }

    /// Counters.
    pub fn stats(&self) -> PoolStats {
        let host = self.inner.host.stats();
        PoolStats {
            sessions: host.sessions,
            leaderships: self.inner.held.load(Ordering::SeqCst),
            evictions: host.replaced,
        }
    }

    /// Ends every leadership and candidacy of the pool at once, and campaigns no more: its
    /// campaigns still running return [`Error::Cancelled`]. On a session of its own, the pool
    /// revokes it (and any lease it gave up at its deadline that the store may still hold);
    /// on a shared [`HostSession`], it deletes its candidate keys under the host's leases,
    /// each once any write of it still in flight has settled, and the host's lease lives on.
    /// Either way the keys go, and every leadership's `lost()` fires.
    ///
    /// # Errors
    /// Whatever a revoke or delete fails with (a lease already gone is success). A revoke is
    /// then retried in the background until it lands; keys a delete could not reach go with
    /// the host's lease.
    pub async fn stop(self) -> Result<()> {
        let inner = &self.inner;
        inner.stopped.store(true, Ordering::SeqCst);
        inner.stopping.stop();
        if inner.owned {
            return inner.host.clone().stop().await;
        }
        let names: Vec<String> = inner
            .names
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect();
        // The current session's keys are left in each election's turn, after the write of a
        // campaign just cancelled has settled; a delete sent sooner could be overtaken by it.
        let current = inner.host.current();
        if let Some(session) = &current {
            for name in &names {
                Election::new(session.clone(), name.clone()).leave().await?;
            }
        }
        let store = inner.host.store();
        let earlier = inner
            .host
            .leases()
            .into_iter()
            .filter(|l| current.as_ref().is_none_or(|s| s.lease() != *l));
        for lease in earlier {
            for name in &names {
                store
                    .delete(DeleteRequest::key(candidate_key(name, lease)))
                    .await?;
            }
        }
        Ok(())
    }
}
