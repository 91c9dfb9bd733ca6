//! [`ElectionPool`]: many elections on one pooled session.
//!
//! **One shared session, not one per election** (go-coord pools one per key). Every election
//! a process holds then costs one lease and one renewal every TTL/3 instead of N, and the
//! failure domain does not change: the sessions of one process talk to the same etcd over the
//! same connection, so when one cannot renew, none can. What the pool must get right, and
//! go-coord's did not, is noticing that the session died: a dead session is evicted and
//! replaced before the next campaign, never reused.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;

use super::leadership::{Election, Leadership};
use super::session::{Session, SessionConfig};
use crate::error::{Error, Result};
use crate::store::DynKvLeaseStore;
use crate::types::LeaseId;

/// What an [`ElectionPool`] has done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolStats {
    /// Sessions (leases) created over the pool's life.
    pub sessions: u64,
    /// Leaderships handed out and not yet resigned or dropped.
    pub leaderships: usize,
    /// Dead sessions found and replaced.
    pub evictions: u64,
}

/// Many elections over one pooled, self-replacing session. See the module docs.
///
/// ```no_run
/// # async fn run(store: std::sync::Arc<coord_api::DynKvLeaseStore>) -> coord_api::Result<()> {
/// use coord_api::recipes::{ElectionPool, SessionConfig};
/// let pool = ElectionPool::new(store, SessionConfig::default());
/// let shard_7 = pool.campaign("shards/7", "node-a").await?;
/// println!("leading shard 7 with token {}", shard_7.token());
/// pool.close().await?; // every leadership of the pool ends now
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct ElectionPool {
    store: Arc<DynKvLeaseStore>,
    config: SessionConfig,
    session: tokio::sync::Mutex<Option<Arc<Session>>>,
    /// Leases of evicted sessions that ended at their deadline: the store may still hold
    /// them, and candidate keys under them, until a revoke confirms them gone.
    abandoned: std::sync::Mutex<Vec<LeaseId>>,
    sessions: AtomicU64,
    evictions: AtomicU64,
    held: Arc<AtomicUsize>,
}

impl ElectionPool {
    /// A pool whose session uses `config`. No lease is granted until the first campaign.
    pub fn new(store: Arc<DynKvLeaseStore>, config: SessionConfig) -> Self {
        ElectionPool {
            store,
            config,
            session: tokio::sync::Mutex::new(None),
            abandoned: std::sync::Mutex::new(Vec::new()),
            sessions: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            held: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// The live session, replacing a dead one first.
    async fn session(&self) -> Result<Arc<Session>> {
        let mut slot = self.session.lock().await;
        if let Some(s) = slot.as_ref() {
            if !s.is_done() {
                return Ok(s.clone());
            }
            tracing::warn!(lease_id = %s.lease(), "pooled session is dead; evicting it");
            self.evictions.fetch_add(1, Ordering::Relaxed);
            self.abandon(s);
            *slot = None;
        }
        let s = Arc::new(Session::new(self.store.clone(), self.config.clone()).await?);
        self.sessions.fetch_add(1, Ordering::Relaxed);
        *slot = Some(s.clone());
        Ok(s)
    }

    /// The election `name` on the pool's live session.
    pub async fn election(&self, name: impl Into<String>) -> Result<Election> {
        let session = self.session().await?;
        Ok(Election::new(&session, name).counting(self.held.clone()))
    }

    /// Evicts the pooled session if it is still the one with `lease`.
    async fn evict(&self, lease: LeaseId) {
        let mut slot = self.session.lock().await;
        if slot.as_ref().is_some_and(|s| s.lease() == lease) {
            tracing::warn!(lease_id = %lease, "pooled session's lease is gone; evicting it");
            self.evictions.fetch_add(1, Ordering::Relaxed);
            *slot = None;
        }
    }

    /// Campaigns in `name` until leading; see [`Election::campaign`].
    ///
    /// A session can die between renewals without knowing it yet; a campaign that finds its
    /// lease gone evicts the session and tries once more on a fresh one.
    pub async fn campaign(&self, name: &str, value: impl Into<Bytes>) -> Result<Leadership> {
        let value = value.into();
        let election = self.election(name).await?;
        match election.campaign(value.clone()).await {
            Err(Error::LeaseNotFound { lease }) => {
                self.evict(lease).await;
                self.election(name).await?.campaign(value).await
            }
            other => other,
        }
    }

    /// Takes `name` if nobody leads it; see [`Election::try_campaign`]. Evicts a dead session
    /// as [`campaign`](Self::campaign) does.
    pub async fn try_campaign(
        &self,
        name: &str,
        value: impl Into<Bytes>,
    ) -> Result<Option<Leadership>> {
        let value = value.into();
        let election = self.election(name).await?;
        match election.try_campaign(value.clone()).await {
            Err(Error::LeaseNotFound { lease }) => {
                self.evict(lease).await;
                self.election(name).await?.try_campaign(value).await
            }
            other => other,
        }
    }

    /// Counters.
    pub fn stats(&self) -> PoolStats {
        PoolStats {
            sessions: self.sessions.load(Ordering::Relaxed),
            leaderships: self.held.load(Ordering::SeqCst),
            evictions: self.evictions.load(Ordering::Relaxed),
        }
    }

    /// Remembers an evicted session's lease if the store may still hold it.
    fn abandon(&self, session: &Session) {
        if session.health().ended == Some(super::SessionEnd::Expired) {
            self.abandoned
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(session.lease());
        }
    }

    /// Revokes the pooled session, and every lease the pool gave up at its deadline that the
    /// store may still hold: every leadership and candidacy of the pool ends at once (their
    /// keys go with the leases, and their `lost()` fires). The pool can be used again
    /// afterwards; it grants a new session.
    ///
    /// # Errors
    /// Whatever a revoke fails with (a lease already gone is success); the revoke is then
    /// retried in the background until it lands.
    pub async fn close(&self) -> Result<()> {
        let session = self.session.lock().await.take();
        let abandoned =
            std::mem::take(&mut *self.abandoned.lock().unwrap_or_else(|p| p.into_inner()));
        let mut result = match session {
            Some(s) => s.close().await,
            None => Ok(()),
        };
        for lease in abandoned {
            match self.store.revoke(lease).await {
                Ok(_) | Err(Error::LeaseNotFound { .. }) => {}
                Err(e) => {
                    super::session::release_lease(self.store.clone(), lease);
                    if result.is_ok() {
                        result = Err(e);
                    }
                }
            }
        }
        result
    }
}
