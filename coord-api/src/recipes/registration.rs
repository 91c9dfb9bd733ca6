//! [`HostRegistration`]: a host's key, kept present under a lease, healing itself.
//!
//! The promise: while the handle lives and the store is reachable, the key exists with the
//! latest metadata. When the keep-alive channel breaks, the session re-opens it on the same
//! lease; when the lease is gone (expired, revoked, lost in an etcd restart), the
//! registration re-grants and re-puts under a fresh lease, with jittered exponential backoff.
//! When the key alone is deleted, it is put back under the same lease.
//!
//! The other promise, which go-coord and Curator both broke: after [`stop`] returns, the key
//! is gone and nothing brings it back. `stop` cancels the loop and waits for it to finish
//! before revoking, and the loop publishes a new lease before it writes the key under it, so
//! the revoke always hits the lease the key lives under.
//!
//! [`stop`]: HostRegistration::stop

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::backoff::Backoff;
use super::session::{Session, SessionConfig};
use crate::error::{Error, Result};
use crate::request::{PutRequest, WatchRequest};
use crate::store::DynKvLeaseStore;
use crate::types::{EventKind, LeaseId};

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
    /// Seed of the backoff's jitter (tests inject it to replay a run).
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

    /// Jitter the backoff from this seed.
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

#[derive(Debug)]
struct Shared {
    store: Arc<DynKvLeaseStore>,
    config: RegistrationConfig,
    /// The lease the key is (or is about to be) written under; 0 when none.
    lease: AtomicI64,
    status: watch::Sender<RegistrationStatus>,
    /// Writes of the key (heal, re-put, update) go one at a time, so an update never loses
    /// to a heal writing the old metadata.
    writes: tokio::sync::Mutex<Bytes>,
}

impl Shared {
    async fn put(&self, lease: LeaseId) -> Result<i64> {
        let metadata = self.writes.lock().await;
        let req = PutRequest::new(self.config.key.clone(), metadata.to_vec()).with_lease(lease);
        Ok(self.store.put(req).await?.revision)
    }
}

/// A host registered under a lease, healing itself. See the module docs.
///
/// # Drop
/// Dropping the handle stops the registration without revoking: the key expires after its
/// TTL, which is what a crash looks like. Call [`stop`](HostRegistration::stop) to remove the
/// key at once.
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
    task: tokio::sync::Mutex<Option<JoinHandle<()>>>,
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
        let (status, _) = watch::channel(RegistrationStatus::Registering);
        let shared = Arc::new(Shared {
            store: store.clone(),
            lease: AtomicI64::new(0),
            status,
            writes: tokio::sync::Mutex::new(config.metadata.clone()),
            config,
        });
        let session = register(&shared).await?;
        let cancel = CancellationToken::new();
        let span = tracing::info_span!("host_registration", key = %shared.config.key);
        let task = tokio::spawn(run(shared.clone(), session, cancel.clone()).instrument(span));
        Ok(HostRegistration {
            shared,
            cancel,
            task: tokio::sync::Mutex::new(Some(task)),
        })
    }

    /// The lease the key lives under now ([`LeaseId::NONE`] between a loss and the heal).
    pub fn lease_id(&self) -> LeaseId {
        LeaseId(self.shared.lease.load(Ordering::SeqCst))
    }

    /// The current status.
    pub fn status(&self) -> RegistrationStatus {
        *self.shared.status.borrow()
    }

    /// Follows status changes.
    pub fn subscribe(&self) -> watch::Receiver<RegistrationStatus> {
        self.shared.status.subscribe()
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

    /// Stops healing and revokes the lease: the key is gone when this returns, and no heal
    /// can bring it back. Idempotent.
    ///
    /// # Errors
    /// Whatever the revoke fails with (a lease already gone is success). The registration is
    /// stopped either way; the key then expires after its TTL.
    pub async fn stop(&self) -> Result<()> {
        self.cancel.cancel();
        // Wait for the loop: after this, nothing can publish a new lease or write the key.
        if let Some(task) = self.task.lock().await.take() {
            let _ = task.await;
        }
        let first = self.shared.status.send_replace(RegistrationStatus::Stopped)
            != RegistrationStatus::Stopped;
        let lease = LeaseId(self.shared.lease.swap(0, Ordering::SeqCst));
        if crate::planted::enabled(crate::planted::Bug::StopDeletesUnconditionally) {
            let key = crate::DeleteRequest::key(self.shared.config.key.clone());
            self.shared.store.delete(key).await?;
        }
        if lease.is_none() {
            return Ok(());
        }
        match self.shared.store.revoke(lease).await {
            Ok(_) | Err(Error::LeaseNotFound { .. }) => {
                if first {
                    tracing::info!(key = %self.shared.config.key, "registration stopped; key revoked");
                }
                Ok(())
            }
            Err(e) => Err(e),
        }
    }
}

impl Drop for HostRegistration {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// Grants a lease, publishes it, then writes the key under it.
async fn register(shared: &Shared) -> Result<Session> {
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
    if let Err(e) = shared.put(session.lease()).await {
        shared.lease.store(0, Ordering::SeqCst);
        let _ = session.close().await;
        return Err(e);
    }
    shared.status.send_replace(RegistrationStatus::Registered {
        lease: session.lease(),
    });
    Ok(session)
}

/// Keeps the key while the session lives; heals when it dies.
async fn run(shared: Arc<Shared>, mut session: Session, cancel: CancellationToken) {
    let cfg = &shared.config;
    let mut backoff = Backoff::new(cfg.initial_backoff, cfg.max_backoff, cfg.backoff_seed);
    tracing::info!(lease_id = %session.lease(), "registered");
    loop {
        // Hold the key until the session ends (or the registration stops).
        let end = tokio::select! {
            biased;
            _ = cancel.cancelled() => {
                session.orphan().await;
                return;
            }
            end = hold(&shared, &session) => end,
        };
        tracing::warn!(lease_id = %session.lease(), reason = %end, "registration lost; healing");
        shared.lease.store(0, Ordering::SeqCst);
        // A lease given up at its deadline may live on at the store; it goes once the key is
        // under the new one.
        let abandoned =
            (end == super::SessionEnd::Expired).then(|| (session.lease(), session.ttl()));
        if crate::planted::enabled(crate::planted::Bug::RegistrationGivesUpOnLoss) {
            shared
                .status
                .send_replace(RegistrationStatus::Healing { attempt: 0 });
            cancel.cancelled().await;
            return;
        }
        // Heal: a fresh lease and the key under it, backing off between attempts.
        let mut attempt = 0;
        session = loop {
            attempt += 1;
            shared
                .status
                .send_replace(RegistrationStatus::Healing { attempt });
            let delay = backoff.next_delay();
            tokio::select! {
                biased;
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(delay) => {}
            }
            // A cancel that lands during the attempt waits for it: the attempt has published
            // its lease first, so stop() revokes whatever it wrote.
            match register(&shared).await {
                Ok(s) => break s,
                Err(e) => tracing::debug!(
                    attempt,
                    backoff_ms = delay.as_millis() as u64,
                    error = &e as &dyn std::error::Error,
                    "heal attempt failed"
                ),
            }
        };
        backoff.reset();
        if let Some((lease, ttl)) = abandoned {
            super::session::revoke_abandoned(shared.store.clone(), lease, ttl);
        }
        tracing::info!(lease_id = %session.lease(), attempts = attempt, "registration healed");
    }
}

/// Watches the key while the session lives, putting it back if it is deleted under a live
/// lease. Returns why the session ended.
async fn hold(shared: &Shared, session: &Session) -> super::SessionEnd {
    let key = shared.config.key.clone();
    let mut from = None;
    loop {
        let mut req = WatchRequest::key(key.clone());
        if let Some(rev) = from {
            req = req.with_start_revision(rev);
        }
        let mut stream = tokio::select! {
            biased;
            end = session.done() => return end,
            w = shared.store.watch(req) => match w {
                Ok(s) => s,
                Err(_) => {
                    tokio::select! {
                        biased;
                        end = session.done() => return end,
                        _ = tokio::time::sleep(Duration::from_millis(200)) => continue,
                    }
                }
            },
        };
        // The key may have gone while no watch was open: check once per (re)opened watch.
        match shared.store.get(crate::GetRequest::key(key.clone())).await {
            Ok(r) if r.kvs.is_empty() => {
                if let Some(end) = put_back(shared, session).await {
                    return end;
                }
            }
            _ => {}
        }
        loop {
            tokio::select! {
                biased;
                end = session.done() => return end,
                item = stream.next() => match item {
                    Some(Ok(batch)) => {
                        from = Some(batch.revision + 1);
                        if batch.events.iter().any(|e| e.kind == EventKind::Delete) && !session.is_done() {
                            if let Some(end) = put_back(shared, session).await {
                                return end;
                            }
                        }
                    }
                    // Compacted or closed: re-open (from the start of current history).
                    Some(Err(Error::Compacted { .. })) => { from = None; break; }
                    Some(Err(_)) | None => break,
                },
            }
        }
    }
}

/// Puts the key back after it was deleted. A lease that turns out to be gone (the delete was
/// its expiry or revocation) ends the hold at once, so the heal starts now rather than at the
/// session's next renewal.
async fn put_back(shared: &Shared, session: &Session) -> Option<super::SessionEnd> {
    match shared.put(session.lease()).await {
        Ok(_) => {
            tracing::warn!("registered key was deleted under a live lease; put it back");
            None
        }
        Err(Error::LeaseNotFound { .. }) => Some(super::SessionEnd::LeaseLost),
        Err(e) => {
            tracing::debug!(
                error = &e as &dyn std::error::Error,
                "could not put the key back"
            );
            None
        }
    }
}
