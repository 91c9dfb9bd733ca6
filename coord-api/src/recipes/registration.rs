//! [`HostRegistration`]: a host's key, kept present under a lease, healing itself.
//!
//! The promise: while the handle lives and the store is reachable, the key exists with the
//! latest metadata. When the keep-alive channel breaks, the session re-opens it on the same
//! lease; when the lease is gone (expired, revoked, lost in an etcd restart), the
//! registration re-grants and re-puts under a fresh lease, with jittered exponential backoff.
//! When the key alone is deleted, it is put back under the same lease.
//!
//! The other promise, which go-coord and Curator both broke: when [`stop`] returns `Ok`, the
//! key is gone and nothing brings it back. `stop` cancels the loop and waits for it to finish
//! before revoking, and the loop publishes a new lease before it writes the key under it, so
//! the revoke always hits the lease the key lives under. A lease given up at its local
//! deadline may still live at the store (its renewals arrived, their replies did not), and the
//! key with it until a heal moves the key; `stop` revokes such leases too, and says so when
//! it could not reach the store.
//!
//! [`stop`]: HostRegistration::stop

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::follow::{Change, Follow};
use super::retry::{self, Backoff};
use super::session::{Session, SessionConfig, SessionEnd, SessionHandle};
use crate::error::{Error, Result};
use crate::request::PutRequest;
use crate::store::DynKvLeaseStore;
use crate::sync::watch;
use crate::types::{LeaseId, Revision};

/// What to register and how.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RegistrationConfig {
    /// The host's key (for example `cluster/hosts/<id>`).
    pub key: String,
    /// The value stored at the key.
    pub metadata: Bytes,
    /// The lease TTL (default 10 s): how long the key outlives a crash.
    pub ttl: Duration,
    /// First delay before re-granting after the lease is lost (default 100 ms); it doubles.
    pub initial_backoff: Duration,
    /// Largest delay between re-grant attempts (default 30 s).
    pub max_backoff: Duration,
    /// Mixed into the seed of the backoff's jitter (which is otherwise drawn from the key, so
    /// hosts differ and a simulation replays).
    pub backoff_seed: u64,
}

impl RegistrationConfig {
    /// Register `metadata` at `key`, with the defaults above.
    pub fn new(key: impl Into<String>, metadata: impl Into<Bytes>) -> Self {
        RegistrationConfig {
            key: key.into(),
            metadata: metadata.into(),
            ttl: Duration::from_secs(10),
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(30),
            backoff_seed: 0,
        }
    }

    /// Use this lease TTL.
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Mix this seed into the backoff's jitter.
    pub fn with_backoff_seed(mut self, seed: u64) -> Self {
        self.backoff_seed = seed;
        self
    }

    /// Back off from `initial` to at most `max`.
    pub fn with_backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.initial_backoff = initial;
        self.max_backoff = max;
        self
    }
}

/// Where a registration stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegistrationStatus {
    /// Writing the key for the first time.
    Registering,
    /// The key is present under this lease.
    Registered {
        /// The live lease.
        lease: LeaseId,
    },
    /// The lease was lost; re-granting (this many attempts so far).
    Healing {
        /// Attempts made since the loss.
        attempt: u32,
    },
    /// Stopped: the key was revoked ([`HostRegistration::stop`]) or left to expire (drop).
    Stopped,
}

/// Whether a registration is working, for a readiness probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RegistrationHealth {
    /// Where it stands.
    pub status: RegistrationStatus,
    /// When its lease's last renewal was acknowledged (`None` before the first, or while
    /// healing).
    pub last_renewal: Option<Instant>,
    /// How long its lease is known to live (zero while healing).
    pub remaining: Duration,
}

impl RegistrationHealth {
    /// Registered, with renewals working (at least half of `ttl` left).
    pub fn is_healthy(&self, ttl: Duration) -> bool {
        matches!(self.status, RegistrationStatus::Registered { .. }) && self.remaining >= ttl / 2
    }
}

#[derive(Debug)]
struct Shared {
    store: Arc<DynKvLeaseStore>,
    config: RegistrationConfig,
    /// The lease the key is (or is about to be) written under; 0 when none.
    lease: AtomicI64,
    /// The session of that lease, for health.
    session: Mutex<Option<SessionHandle>>,
    /// Leases given up at their deadline that may still hold the key at the store, until a
    /// revoke confirms them gone.
    abandoned: Mutex<Vec<LeaseId>>,
    status: watch::Sender<RegistrationStatus>,
    /// Writes of the key (heal, re-put, update) go one at a time, so an update never loses
    /// to a heal writing the old metadata.
    writes: tokio::sync::Mutex<Bytes>,
}

impl Shared {
    /// Writes the key under `lease`; returns its create and mod revisions.
    async fn put(&self, lease: LeaseId) -> Result<(Revision, Revision)> {
        let latest = self.writes.lock().await;
        let metadata = if crate::planted::enabled(crate::planted::Bug::HealWritesFirstMetadata) {
            &self.config.metadata
        } else {
            &*latest
        };
        let req = PutRequest::new(self.config.key.clone(), metadata.to_vec())
            .with_lease(lease)
            .with_prev_kv();
        let r = self.store.put(req).await?;
        let created = r.prev_kv.map_or(r.revision, |kv| kv.create_revision);
        Ok((created, r.revision))
    }

    fn abandoned(&self) -> std::sync::MutexGuard<'_, Vec<LeaseId>> {
        self.abandoned.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn set_session(&self, session: Option<SessionHandle>) {
        *self.session.lock().unwrap_or_else(|p| p.into_inner()) = session;
    }

    /// Revokes an abandoned lease in the background until it is gone.
    fn release(self: &Arc<Self>, lease: LeaseId) {
        let shared = self.clone();
        tokio::spawn(
            async move {
                let mut backoff = retry::store_backoff(retry::seed(&[&lease.0.to_le_bytes()]));
                loop {
                    match shared.store.revoke(lease).await {
                        Ok(_) | Err(Error::LeaseNotFound { .. }) => break,
                        Err(_) => backoff.wait().await,
                    }
                }
                shared.abandoned().retain(|l| *l != lease);
                tracing::debug!(lease_id = %lease, "abandoned lease revoked");
            }
            .in_current_span(),
        );
    }
}

/// A host registered under a lease, healing itself. See the module docs.
///
/// # Stop and drop
/// [`stop`](HostRegistration::stop) removes the key at once and says whether it could.
/// Dropping the handle stops the registration without revoking: the key expires after its
/// TTL, which is what a crash looks like.
///
/// ```no_run
/// # async fn run(store: std::sync::Arc<coord_api::DynKvLeaseStore>) -> coord_api::Result<()> {
/// use coord_api::recipes::{HostRegistration, RegistrationConfig};
/// let reg = HostRegistration::start(
///     store,
///     RegistrationConfig::new("cluster/hosts/web-1", "10.0.0.7:8080"),
/// ).await?;
/// println!("registered under lease {}", reg.lease_id());
/// reg.stop().await?;
/// # Ok(()) }
/// ```
#[must_use = "dropping the handle stops the registration"]
#[derive(Debug)]
pub struct HostRegistration {
    shared: Arc<Shared>,
    cancel: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl HostRegistration {
    /// Registers the key and keeps it. Returns once the first registration succeeded.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty key; whatever the first grant or put fails
    /// with (later failures are healed, and show in [`status`](Self::status)).
    pub async fn start(store: Arc<DynKvLeaseStore>, config: RegistrationConfig) -> Result<Self> {
        if config.key.is_empty() {
            return Err(Error::invalid("registration: empty key"));
        }
        let shared = Arc::new(Shared {
            store: store.clone(),
            lease: AtomicI64::new(0),
            session: Mutex::new(None),
            abandoned: Mutex::new(Vec::new()),
            status: watch::Sender::new(RegistrationStatus::Registering),
            writes: tokio::sync::Mutex::new(config.metadata.clone()),
            config,
        });
        let first = register(&shared).await?;
        let cancel = CancellationToken::new();
        let span = tracing::info_span!("host_registration", key = %shared.config.key);
        let task = tokio::spawn(run(shared.clone(), first, cancel.clone()).instrument(span));
        Ok(HostRegistration {
            shared,
            cancel,
            task: Some(task),
        })
    }

    /// The lease the key lives under now ([`LeaseId::NONE`] between a loss and the heal).
    pub fn lease_id(&self) -> LeaseId {
        LeaseId(self.shared.lease.load(Ordering::SeqCst))
    }

    /// The current status.
    pub fn status(&self) -> RegistrationStatus {
        self.shared.status.get()
    }

    /// Follows status changes.
    pub fn subscribe(&self) -> watch::Receiver<RegistrationStatus> {
        self.shared.status.subscribe()
    }

    /// Whether renewals are working: the status, the last acknowledged renewal, the time the
    /// lease is known to live.
    pub fn health(&self) -> RegistrationHealth {
        let status = self.status();
        let session = self
            .shared
            .session
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(SessionHandle::health)
            .filter(|_| matches!(status, RegistrationStatus::Registered { .. }));
        RegistrationHealth {
            status,
            last_renewal: session.and_then(|h| h.last_renewal),
            remaining: session.map_or(Duration::ZERO, |h| h.remaining),
        }
    }

    /// The key.
    pub fn key(&self) -> &str {
        &self.shared.config.key
    }

    /// Replaces the metadata, in place (same key, same lease). While healing, the new value is
    /// what the heal writes.
    ///
    /// # Errors
    /// Whatever the put fails with, except a lost lease (the heal then writes the new value).
    pub async fn update_metadata(&self, metadata: impl Into<Bytes>) -> Result<()> {
        let mut current = self.shared.writes.lock().await;
        *current = metadata.into();
        let lease = self.lease_id();
        if lease.is_none() {
            return Ok(());
        }
        let req =
            PutRequest::new(self.shared.config.key.clone(), current.to_vec()).with_lease(lease);
        match self.shared.store.put(req).await {
            Ok(_) | Err(Error::LeaseNotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Stops healing and revokes every lease the key may live under: when this returns `Ok`
    /// the key is gone and no heal can bring it back.
    ///
    /// # Errors
    /// Whatever a revoke fails with (a lease already gone is success). The registration is
    /// stopped either way, and the revoke is retried in the background until it lands; until
    /// then the key may stand, at most until its lease expires.
    pub async fn stop(mut self) -> Result<()> {
        self.cancel.cancel();
        // Wait for the loop: after this, nothing can publish a new lease or write the key.
        if let Some(task) = self.task.take() {
            if !crate::planted::enabled(crate::planted::Bug::StopSkipsTheHeal) {
                let _ = task.await;
            }
        }
        let shared = &self.shared;
        shared.status.send_replace(RegistrationStatus::Stopped);
        let mut leases: Vec<LeaseId> = shared.abandoned().clone();
        let current = LeaseId(shared.lease.swap(0, Ordering::SeqCst));
        if !current.is_none() {
            leases.push(current);
        }
        if crate::planted::enabled(crate::planted::Bug::StopDeletesUnconditionally) {
            let key = crate::DeleteRequest::key(shared.config.key.clone());
            shared.store.delete(key).await?;
        }
        let mut failed = None;
        for lease in leases {
            match shared.store.revoke(lease).await {
                Ok(_) | Err(Error::LeaseNotFound { .. }) => {
                    shared.abandoned().retain(|l| *l != lease)
                }
                Err(e) => {
                    shared.release(lease);
                    failed.get_or_insert(e);
                }
            }
        }
        match failed {
            None => {
                tracing::info!(key = %shared.config.key, "registration stopped; key revoked");
                Ok(())
            }
            Some(e) => {
                tracing::warn!(
                    key = %shared.config.key,
                    error = &e as &dyn std::error::Error,
                    "registration stopped, but its key could not be revoked yet; retrying in the background"
                );
                Err(e)
            }
        }
    }
}

impl Drop for HostRegistration {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// A registered key: its session, and the key's create and mod revisions.
type Held = (Session, (Revision, Revision));

/// Grants a lease, publishes it, then writes the key under it.
async fn register(shared: &Shared) -> Result<Held> {
    // The heal re-puts the key, then revokes the old lease itself (see `run`); a revoke at
    // expiry could delete the key just before the heal writes it, a flap for every watcher.
    let session = Session::new(
        shared.store.clone(),
        SessionConfig::default()
            .with_ttl(shared.config.ttl)
            .with_revoke_on_expiry(false),
    )
    .await?;
    // Published before the put, so that a stop() that comes later revokes the lease the key
    // is written under (see the module docs).
    shared.lease.store(session.lease().0, Ordering::SeqCst);
    match shared.put(session.lease()).await {
        Ok(revisions) => {
            shared.set_session(Some(session.handle()));
            shared.status.send_replace(RegistrationStatus::Registered {
                lease: session.lease(),
            });
            crate::sync::explore::point().await;
            Ok((session, revisions))
        }
        Err(e) => {
            shared.lease.store(0, Ordering::SeqCst);
            // A revoke that fails is retried in the background (see Session::stop).
            let _ = session.stop().await;
            Err(e)
        }
    }
}

/// Keeps the key while the session lives; heals when it dies.
async fn run(shared: Arc<Shared>, first: Held, cancel: CancellationToken) {
    let cfg = &shared.config;
    let seed = cfg.backoff_seed ^ retry::seed(&[cfg.key.as_bytes()]);
    let mut backoff = Backoff::new(cfg.initial_backoff, cfg.max_backoff, seed);
    let (mut session, mut revisions) = first;
    tracing::info!(lease_id = %session.lease(), "registered");
    loop {
        // Hold the key until the session ends (or the registration stops).
        let end = tokio::select! {
            biased;
            _ = cancel.cancelled() => {
                session.orphan().await;
                return;
            }
            end = hold(&shared, &session, revisions) => end,
        };
        tracing::warn!(lease_id = %session.lease(), reason = %end, "registration lost; healing");
        // A lease given up at its deadline may live on at the store, and the key with it: it
        // goes once the key is under the new lease (or at stop, if that comes first).
        if end == SessionEnd::Expired {
            shared.abandoned().push(session.lease());
        }
        shared.lease.store(0, Ordering::SeqCst);
        shared.set_session(None);
        let lost = session.lease();
        session.end(end);
        if crate::planted::enabled(crate::planted::Bug::RegistrationGivesUpOnLoss) {
            shared
                .status
                .send_replace(RegistrationStatus::Healing { attempt: 0 });
            cancel.cancelled().await;
            return;
        }
        // Heal: a fresh lease and the key under it, backing off between attempts.
        let mut attempt = 0;
        (session, revisions) = loop {
            attempt += 1;
            shared
                .status
                .send_replace(RegistrationStatus::Healing { attempt });
            crate::sync::explore::point().await;
            let delay = backoff.next_delay();
            tokio::select! {
                biased;
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(delay) => {}
            }
            // A cancel that lands during the attempt waits for it: the attempt has published
            // its lease first, so stop() revokes whatever it wrote.
            match register(&shared).await {
                Ok(held) => break held,
                Err(e) => tracing::debug!(
                    attempt,
                    backoff_ms = delay.as_millis() as u64,
                    error = &e as &dyn std::error::Error,
                    "heal attempt failed"
                ),
            }
        };
        if !crate::planted::enabled(crate::planted::Bug::BackoffNeverResets) {
            backoff.reset();
        }
        if end == SessionEnd::Expired {
            shared.release(lost);
        }
        tracing::info!(lease_id = %session.lease(), attempts = attempt, "registration healed");
    }
}

/// Follows the key while the session lives, putting it back if it is deleted under a live
/// lease. Returns why the session ended.
async fn hold(
    shared: &Shared,
    session: &Session,
    (created, modified): (Revision, Revision),
) -> SessionEnd {
    let mut follow = Follow::new(
        shared.store.clone(),
        shared.config.key.clone().into_bytes(),
        modified.next(),
        Some((created, modified)),
    );
    loop {
        let change = tokio::select! {
            biased;
            end = session.done() => return end,
            change = follow.next() => change,
        };
        if let Change::Deleted(_) = change {
            if session.is_done() {
                continue;
            }
            if let Some(end) = put_back(shared, session).await {
                return end;
            }
        }
    }
}

/// Puts the key back after it was deleted, retrying until it is back or the session ends. A
/// lease that turns out to be gone (the delete was its expiry or revocation) ends the hold at
/// once, so the heal starts now rather than at the session's next renewal.
async fn put_back(shared: &Shared, session: &Session) -> Option<SessionEnd> {
    let mut backoff = retry::store_backoff(retry::seed(&[shared.config.key.as_bytes()]));
    loop {
        let put = tokio::select! {
            biased;
            end = session.done() => return Some(end),
            put = shared.put(session.lease()) => put,
        };
        match put {
            Ok(_) => {
                tracing::warn!("registered key was deleted under a live lease; put it back");
                return None;
            }
            Err(Error::LeaseNotFound { .. }) => return Some(SessionEnd::LeaseLost),
            Err(e) => {
                tracing::debug!(
                    error = &e as &dyn std::error::Error,
                    "could not put the key back; retrying"
                );
                tokio::select! {
                    biased;
                    end = session.done() => return Some(end),
                    _ = backoff.wait() => {}
                }
            }
        }
    }
}
