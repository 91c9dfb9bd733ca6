//! [`HostRegistration`]: a host's key, kept present under a lease, healing itself.
//!
//! The promise: while the handle lives and the store is reachable, the key exists with the
//! latest metadata. When the keep-alive channel breaks, the session re-opens it on the same
//! lease; when the lease is gone (expired, revoked, lost in an etcd restart), the
//! registration re-grants and re-puts under a fresh lease, with jittered exponential backoff.
//! When the key alone is deleted, it is put back under the same lease. When another lease
//! takes the key (a newer incarnation of the host, registering under the same name), the
//! registration does not fight for it: it says it is not registered (`Healing`) while the
//! other holds the key, and puts the key back once it is freed.
//!
//! The other promise, which go-coord and Curator both broke: when [`stop`] returns `Ok`, the
//! key is gone and nothing brings it back. `stop` cancels the loop and waits for it to finish
//! before removing the key (and removes it at once too when a write of it is in flight, whose
//! reply may be slow or lost), and the loop publishes a new lease before it writes the key
//! under it, so the removal always hits the lease the key lives under. A lease given up at its
//! local deadline may still live at the store (its renewals arrived, their replies did not),
//! and the key with it until a heal moves the key; `stop` removes the key from such leases
//! too, and says so when it could not reach the store. A stop that comes while a heal waits for its
//! lease ends the heal there: nothing is written after the stop was asked but a put already
//! on the wire (in a rolling restart, the new incarnation may hold the name by then).
//!
//! The lease is a [`HostSession`]'s: the registration's own, or one shared with the host's
//! elections. The host session sets a lost lease aside and revokes it once the key is under
//! the new one, so watchers see the key change lease, never disappear.
//!
//! [`stop`]: HostRegistration::stop

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;
use tracing::Instrument;

use super::host::HostSession;
use super::session::{SessionConfig, SessionEnd, SessionHandle};
use super::task::Task;
use crate::elections::follow::{Change, Follow};
use crate::elections::limbo::{fenced, FenceBook, Fences, Fencing, Hold};
use crate::error::{Error, Result};
use crate::request::{DeleteRequest, GetRequest, PutRequest};
use crate::retry::{self, Backoff};
use crate::store::DynKvLeaseStore;
use crate::sync::{watch, Stop};
use crate::txn::{Compare, CompareOp, TxnOp, TxnOpResponse, TxnRequest, TxnResponse};
use crate::types::{KeyValue, LeaseId, Revision};

mod config;
mod heal;
mod shared;

pub use config::{RegistrationConfig, RegistrationHealth, RegistrationStatus};
use heal::{register, run, Held};
use shared::{Shared, Written};

/// A host registered under a lease, healing itself. See the module docs.
///
/// # Stop and drop
/// [`stop`](HostRegistration::stop) removes the key at once and says whether it could.
/// Dropping the handle stops the registration without removing the key, which then expires
/// with its lease, as after a crash; unless
/// [`revoke_on_drop`](RegistrationConfig::with_revoke_on_drop) is set, in which case the key is
/// removed in the background.
///
/// # One lease per host
/// [`start`](Self::start) gives the registration a lease of its own. A host that also
/// campaigns starts it on a [`HostSession`] with [`start_on`](Self::start_on), and its
/// elections on the same host session: one lease, one renewal stream, and the registration
/// still heals onto a new lease when the shared one is lost.
///
/// # Starting while the store is down
/// [`start`](Self::start) fails if the first registration does; [`spawn`](Self::spawn) returns
/// at once and registers in the background, retrying with backoff until the store answers
/// (watch [`status`](Self::status) or [`subscribe`](Self::subscribe) for `Registered`).
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
    task: Task,
}

impl HostRegistration {
    /// Registers the key under a lease of its own and keeps it. Returns once the first
    /// registration succeeded.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty key; whatever the first grant or put fails
    /// with (later failures are healed, and show in [`status`](Self::status)).
    pub async fn start(store: Arc<DynKvLeaseStore>, config: RegistrationConfig) -> Result<Self> {
        let host = HostSession::new(store, config.session());
        Self::begin(host, true, config).await
    }

    /// Registers the key under `host`'s lease and keeps it; see [`start`](Self::start). The
    /// TTL is the host session's.
    ///
    /// # Errors
    /// As [`start`](Self::start); [`Error::Cancelled`] if `host` was stopped;
    /// [`Error::InvalidArgument`] for a config that sets a TTL (the host session's applies).
    pub async fn start_on(host: &HostSession, config: RegistrationConfig) -> Result<Self> {
        Self::begin(host.clone(), false, config).await
    }

    /// Starts registering the key under a lease of its own, in the background: returns at
    /// once, whether or not the store can be reached, and registers as soon as it can.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty key.
    pub fn spawn(store: Arc<DynKvLeaseStore>, config: RegistrationConfig) -> Result<Self> {
        let host = HostSession::new(store, config.session());
        Self::background(host, true, config)
    }

    /// As [`spawn`](Self::spawn), under `host`'s lease.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty key, or a config that sets a TTL (the host
    /// session's applies).
    pub fn spawn_on(host: &HostSession, config: RegistrationConfig) -> Result<Self> {
        Self::background(host.clone(), false, config)
    }

    fn shared(host: HostSession, owned: bool, config: RegistrationConfig) -> Result<Arc<Shared>> {
        if config.key.is_empty() {
            return Err(Error::invalid("registration: empty key"));
        }
        if let (false, Some(ttl)) = (owned, config.ttl) {
            return Err(Error::invalid(format!(
                "registration of {}: TTL {ttl:?} set, but a registration on a host session \
                 shares the host's lease; set the TTL on the HostSession",
                config.key
            )));
        }
        Ok(Arc::new(Shared {
            id: host.attach(),
            host,
            owned,
            lease: AtomicI64::new(0),
            session: Mutex::new(None),
            status: watch::Sender::new(RegistrationStatus::Registering),
            metadata: Mutex::new(config.metadata.clone()),
            updates: tokio::sync::Mutex::new(()),
            heal_writes: Arc::new(tokio::sync::RwLock::new(())),
            fences: Arc::default(),
            stopping: Arc::default(),
            config,
        }))
    }

    fn background(host: HostSession, owned: bool, config: RegistrationConfig) -> Result<Self> {
        let shared = Self::shared(host, owned, config)?;
        Ok(Self::running(shared, None))
    }

    async fn begin(host: HostSession, owned: bool, config: RegistrationConfig) -> Result<Self> {
        let shared = Self::shared(host, owned, config)?;
        match register(&shared, None, true).await {
            Ok(first) => Ok(Self::running(shared, Some(first))),
            Err(e) => {
                shared.host.detach(shared.id);
                if owned {
                    let _ = shared.host.clone().stop().await;
                }
                Err(e)
            }
        }
    }

    fn running(shared: Arc<Shared>, first: Option<Held>) -> Self {
        let span = tracing::info_span!("host_registration", key = %shared.config.key);
        let task = Task::spawn(span, |cancel| run(shared.clone(), first, cancel));
        HostRegistration { shared, task }
    }

    /// The lease the key lives under now ([`LeaseId::NONE`] before the first registration
    /// and between a loss and the heal).
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

    /// Replaces the metadata, in place (same key, same lease), and only while the key is this
    /// registration's: a write that lands after a stop, or after the key was taken, changes
    /// nothing. While healing, the new value is what the heal writes.
    ///
    /// # Errors
    /// Whatever the put fails with, except a lost lease (the heal then writes the new value).
    pub async fn update_metadata(&self, metadata: impl Into<Bytes>) -> Result<()> {
        let _one_at_a_time = self.shared.updates.lock().await;
        let metadata = metadata.into();
        *self
            .shared
            .metadata
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = metadata.clone();
        // Heal writes sent before the line above may carry the old value; once they have
        // landed (or failed), every later one carries this one. Held on (downgraded, so that
        // nothing queued for the lock meanwhile goes first), as this write's place among them.
        let in_flight = self
            .shared
            .heal_writes
            .clone()
            .write_owned()
            .await
            .downgrade();
        if self.shared.stopping.load(Ordering::SeqCst) {
            // The stop removes the key; nothing more of it is sent.
            return Ok(());
        }
        let lease = self.lease_id();
        if lease.is_none() {
            return Ok(());
        }
        // Only over the key this registration holds: landing late (after a stop's delete, or
        // after another incarnation took the key) it writes nothing, where a plain put would
        // bring the key back under a lease that lives on. A key missing here is the heal's
        // to put back, with this value.
        let key = self.shared.config.key.clone();
        let req = TxnRequest::new()
            .when([Compare::lease(key.clone(), CompareOp::Equal, lease)])
            .and_then([PutRequest::new(key.clone(), metadata).with_lease(lease)]);
        // Fenced: given up on, it cannot land after the next update (with newer metadata).
        // The lease is the host session's, unless it was replaced meanwhile: then the lease is
        // gone, and so is anything sent under it.
        let written = match self.shared.host.current().filter(|s| s.lease() == lease) {
            Some(session) => {
                let fencing = session.key_fencing(&key);
                self.shared.write(req, fencing, in_flight).await
            }
            None => self.shared.store().txn(req).await,
        };
        match written {
            Ok(_) | Err(Error::LeaseNotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Stops healing and removes the key: when this returns `Ok` the key is gone and no heal
    /// can bring it back. On a lease of its own, the registration revokes it (and any lease
    /// it gave up at its deadline that the store may still hold); on a [`HostSession`], it
    /// deletes the key if it is under one of the host's leases, and the host's lease lives on.
    ///
    /// # Errors
    /// Whatever the revoke or delete fails with (a lease already gone is success). The
    /// registration is stopped either way, and the removal is retried in the background until
    /// it lands; until then the key may stand, at most until its lease expires.
    pub async fn stop(mut self) -> Result<()> {
        let shared = self.shared.clone();
        shared.stopping.store(true, Ordering::SeqCst);
        // Wait for the loop: after this, nothing can publish a new lease or write the key.
        if crate::hooks::planted::enabled(crate::hooks::planted::Bug::StopSkipsTheHeal) {
            self.task.cancel();
        } else if shared.owned || shared.heal_writes.try_write().is_ok() {
            self.task.stop().await;
        } else {
            // A write of the key is in flight: the loop waits for its answer (up to the
            // request timeout when the reply is slow or lost), and the key is removed only
            // after it resolves (below). But such a write has most likely landed already,
            // and the key, maybe over a newer incarnation's, would stay while its answer is
            // waited out: it is removed at once as well. Nothing is sent after the stop but
            // removals, so only the write in flight can bring it back, and the removal
            // below takes that away.
            let leases = shared.host.leases();
            let _ = tokio::join!(shared.delete_if_under(&leases), self.task.stop());
        }
        // A heal's write runs on when the loop that sent it stops: it may still land (a retry
        // on another member, a reply waited out). Removing the key first would let it come
        // back under a lease that lives on (a host's).
        drop(shared.heal_writes.write().await);
        shared.status.send_replace(RegistrationStatus::Stopped);
        shared.lease.store(0, Ordering::SeqCst);
        shared.set_session(None);
        if crate::hooks::planted::enabled(crate::hooks::planted::Bug::StopDeletesUnconditionally) {
            let key = DeleteRequest::key(shared.config.key.clone());
            shared.store().delete(key).await?;
        }
        let result = if shared.owned {
            shared.host.clone().stop().await
        } else {
            shared.remove_key().await
        };
        shared.host.detach(shared.id);
        match result {
            Ok(()) => {
                tracing::info!(key = %shared.config.key, "registration stopped; key removed");
                Ok(())
            }
            Err(e) => {
                tracing::warn!(
                    key = %shared.config.key,
                    error = &e as &dyn std::error::Error,
                    "registration stopped, but its key could not be removed yet; retrying in the background"
                );
                Err(e)
            }
        }
    }
}

impl Drop for HostRegistration {
    fn drop(&mut self) {
        self.task.cancel();
        let shared = &self.shared;
        if shared.status.get() == RegistrationStatus::Stopped {
            return;
        }
        shared.status.send_replace(RegistrationStatus::Stopped);
        if shared.config.revoke_on_drop && !shared.owned {
            // An own session is revoked by its own drop (the config says so); a shared one
            // lives on, so the key goes alone.
            if tokio::runtime::Handle::try_current().is_ok() {
                let shared = shared.clone();
                tokio::spawn(
                    async move {
                        let _ = shared.remove_key().await;
                        shared.host.detach(shared.id);
                    }
                    .in_current_span(),
                );
                return;
            }
        }
        shared.host.detach(shared.id);
    }
}
