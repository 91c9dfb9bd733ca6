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
use crate::error::{Error, Result};
use crate::request::{
    Compare, CompareOp, DeleteRequest, GetRequest, PutRequest, TxnOp, TxnOpResponse, TxnRequest,
    TxnResponse,
};
use crate::retry::{self, Backoff};
use crate::store::DynKvLeaseStore;
use crate::sync::{watch, Stop};
use crate::types::{KeyValue, LeaseId, Revision};

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
    /// Remove the key, in the background, when the handle is dropped without
    /// [`stop`](HostRegistration::stop) (default off: the key expires with its lease, as after
    /// a crash).
    pub revoke_on_drop: bool,
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
            revoke_on_drop: false,
        }
    }

    /// Whether dropping the handle removes the key (see
    /// [`revoke_on_drop`](Self::revoke_on_drop)).
    pub fn with_revoke_on_drop(mut self, on: bool) -> Self {
        self.revoke_on_drop = on;
        self
    }

    /// The session of a registration with a lease of its own.
    fn session(&self) -> SessionConfig {
        SessionConfig::default()
            .with_ttl(self.ttl)
            .with_revoke_on_drop(self.revoke_on_drop)
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
    /// The lease was lost (re-granting), or the key was deleted under the live lease
    /// (putting it back), or another lease took the key (a newer incarnation of the host:
    /// waiting for it to be freed, then putting it back): the key is not known to be present
    /// under this registration's lease. Counts the attempts so far.
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
    host: HostSession,
    /// Whether the host session is the registration's own (from [`HostRegistration::start`]
    /// or [`spawn`](HostRegistration::spawn)): stopping the registration then revokes it.
    owned: bool,
    /// The registration's id on the host session.
    id: u64,
    config: RegistrationConfig,
    /// The lease the key is (or is about to be) written under; 0 when none.
    lease: AtomicI64,
    /// The session of that lease, for health.
    session: Mutex<Option<SessionHandle>>,
    status: watch::Sender<RegistrationStatus>,
    /// The latest metadata: what a heal (or put-back) writes. See [`Shared::put`] for why a
    /// heal never waits for an update (whose put may be waiting out a lost reply) and never
    /// writes over a newer value.
    metadata: Mutex<Bytes>,
    /// Updates go one at a time, so two never land in the wrong order.
    updates: tokio::sync::Mutex<()>,
    /// Held (shared) by each heal write while it is in flight, even after its caller gave up
    /// on it (a request already sent may still land): an update waits for those that may
    /// carry an older value before it returns, while a heal waits for no update.
    heal_writes: Arc<tokio::sync::RwLock<()>>,
}

impl Shared {
    fn store(&self) -> &Arc<DynKvLeaseStore> {
        self.host.store()
    }

    /// Writes the key under `lease` with the latest metadata, unless it already stands
    /// under `lease`; returns its create and mod revisions.
    ///
    /// An update writes the latest value there, so a key found under `lease` is not
    /// overwritten with what may by then be older: a heal never waits for an update to
    /// finish (its put may be waiting out a lost reply), and never writes over a newer value;
    /// an update waits for the heal writes in flight. Found with older metadata (a heal write
    /// that landed after its caller gave up on it), it is brought up to date
    /// ([`bring_up_to_date`](Self::bring_up_to_date)), unless `stop` was asked meanwhile:
    /// the stop removes the key, and a write sent after it was asked may land after the
    /// name went to a newer incarnation.
    async fn put(&self, lease: LeaseId, stop: Option<&Stop>) -> Result<(Revision, Revision)> {
        let in_flight = self.heal_writes.clone().read_owned().await;
        // In the key's turn: a stopped registration's removal still pending is called off,
        // and one on its way lands before this write, not after it.
        let key_turn = self.host.key_turn(&self.config.key);
        key_turn.call_off_cleanup();
        let turn = key_turn.turn.clone().lock_owned();
        // A stop asked while the turn is waited for sends nothing after it.
        let _turn = match stop {
            Some(stop) => tokio::select! {
                biased;
                _ = stop.stopped() => return Err(Error::Cancelled {
                    operation: "registration (stopped while its key's turn was waited for)",
                }),
                turn = turn => turn,
            },
            None => turn.await,
        };
        let metadata = if crate::hooks::planted::enabled(
            crate::hooks::planted::Bug::HealWritesFirstMetadata,
        ) {
            self.config.metadata.clone()
        } else {
            self.latest()
        };
        let key = self.config.key.clone();
        let put = PutRequest::new(key.clone(), metadata.to_vec())
            .with_lease(lease)
            .with_prev_kv();
        let txn = TxnRequest::new()
            .when([Compare::lease(key.clone(), CompareOp::NotEqual, lease)])
            .and_then([TxnOp::Put(put)])
            .or_else([TxnOp::Get(GetRequest::key(key.clone()))]);
        let r = self.write(txn, in_flight).await?;
        let revisions = match r.responses.first() {
            Some(TxnOpResponse::Put(p)) => {
                Some(p.prev_kv.as_ref().map_or((r.revision, r.revision), |kv| {
                    (kv.create_revision, r.revision)
                }))
            }
            Some(TxnOpResponse::Get(g)) => match g.kvs.first() {
                Some(kv) if stop.is_some_and(Stop::is_stopped) => {
                    tracing::debug!("stopping: the key under our lease is left for the stop");
                    Some((kv.create_revision, kv.mod_revision))
                }
                Some(kv) => Some(self.bring_up_to_date(kv, lease).await?),
                None => None,
            },
            _ => None,
        };
        // The compare failed only if the key stands under the lease, so the read found it.
        revisions.ok_or_else(|| Error::Rejected {
            backend: "coord",
            operation: "registration put",
            source: format!("the store answered {r:?}").into(),
        })
    }

    /// The key found under our lease: its create and mod revisions, once it carries the
    /// latest metadata. An update writes the latest value, but the key may carry another:
    /// a registration started again on a host session whose lease still holds the key from
    /// an earlier one, or a heal write its caller gave up on (the backend answered
    /// `Indeterminate` while its last attempt was still on the wire) that landed after an
    /// update returned. Left as it stands, the key would keep that value until the next
    /// update.
    async fn bring_up_to_date(
        &self,
        kv: &KeyValue,
        lease: LeaseId,
    ) -> Result<(Revision, Revision)> {
        let in_flight = self.heal_writes.clone().read_owned().await;
        let latest = self.latest();
        if kv.value == latest {
            return Ok((kv.create_revision, kv.mod_revision));
        }
        tracing::warn!(
            "the key under our lease carries other metadata than the latest; rewriting it"
        );
        let key = self.config.key.clone();
        let put = PutRequest::new(key.clone(), latest.to_vec()).with_lease(lease);
        let txn = TxnRequest::new()
            .when([Compare::mod_revision(
                key,
                CompareOp::Equal,
                kv.mod_revision,
            )])
            .and_then([TxnOp::Put(put)]);
        let r = self.write(txn, in_flight).await?;
        // Written by someone else meanwhile: only an update (with the latest value) or an
        // operator can have; what stands is not ours to overwrite.
        let mod_revision = if r.succeeded {
            r.revision
        } else {
            kv.mod_revision
        };
        Ok((kv.create_revision, mod_revision))
    }

    /// Runs a write of the key. It runs on as a task of its own, holding its place among the
    /// heal writes until it resolves, if the heal stops waiting for it (its session ended
    /// meanwhile).
    async fn write(
        &self,
        txn: TxnRequest,
        in_flight: tokio::sync::OwnedRwLockReadGuard<()>,
    ) -> Result<TxnResponse> {
        let store = self.store().clone();
        let write = tokio::spawn(
            async move {
                let _in_flight = in_flight;
                store.txn(txn).await
            }
            .in_current_span(),
        );
        write.await.map_err(|e| Error::Rejected {
            backend: "coord",
            operation: "registration put",
            source: e.to_string().into(),
        })?
    }

    fn latest(&self) -> Bytes {
        self.metadata
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn set_session(&self, session: Option<SessionHandle>) {
        *self.session.lock().unwrap_or_else(|p| p.into_inner()) = session;
    }

    /// Deletes the key if it lives under one of the host's leases (another writer's key at
    /// the same path is left alone). Retried in the background when the store cannot be
    /// reached; the error is returned.
    async fn remove_key(self: &Arc<Self>) -> Result<()> {
        let key_turn = self.host.key_turn(&self.config.key);
        let first = {
            let _turn = key_turn.turn.clone().lock_owned().await;
            delete_if_under(self.store(), &self.config.key, &self.host.leases()).await
        };
        match first {
            Ok(()) => Ok(()),
            Err(e) => {
                // Retried until it lands, unless a registration of the key started on this
                // host session writes it first (its write calls the retries off).
                let called_off = key_turn.pending_cleanup();
                let shared = self.clone();
                tokio::spawn(
                    async move {
                        let key = shared.config.key.as_bytes();
                        let mut backoff = retry::store_backoff(retry::seed(&[key]));
                        let leases = shared.host.leases();
                        loop {
                            let turn = tokio::select! {
                                biased;
                                _ = called_off.stopped() => return,
                                turn = key_turn.turn.clone().lock_owned() => turn,
                            };
                            if called_off.is_stopped() {
                                return;
                            }
                            let removed =
                                delete_if_under(shared.store(), &shared.config.key, &leases).await;
                            drop(turn);
                            if removed.is_ok() {
                                return;
                            }
                            tokio::select! {
                                biased;
                                _ = called_off.stopped() => return,
                                () = backoff.wait() => {}
                            }
                        }
                    }
                    .in_current_span(),
                );
                Err(e)
            }
        }
    }
}

/// Deletes `key` if its lease is one of `leases`.
async fn delete_if_under(
    store: &Arc<DynKvLeaseStore>,
    key: &str,
    leases: &[LeaseId],
) -> Result<()> {
    for &lease in leases {
        let txn = TxnRequest::new()
            .when([Compare::lease(key, CompareOp::Equal, lease)])
            .and_then([TxnOp::Delete(DeleteRequest::key(key))]);
        if store.txn(txn).await?.succeeded {
            return Ok(());
        }
    }
    Ok(())
}

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
    /// TTL is the host session's; the config's is not used.
    ///
    /// # Errors
    /// As [`start`](Self::start); [`Error::Cancelled`] if `host` was stopped.
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
    /// [`Error::InvalidArgument`] for an empty key.
    pub fn spawn_on(host: &HostSession, config: RegistrationConfig) -> Result<Self> {
        Self::background(host.clone(), false, config)
    }

    fn shared(host: HostSession, owned: bool, config: RegistrationConfig) -> Result<Arc<Shared>> {
        if config.key.is_empty() {
            return Err(Error::invalid("registration: empty key"));
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
            config,
        }))
    }

    fn background(host: HostSession, owned: bool, config: RegistrationConfig) -> Result<Self> {
        let shared = Self::shared(host, owned, config)?;
        Ok(Self::running(shared, None))
    }

    async fn begin(host: HostSession, owned: bool, config: RegistrationConfig) -> Result<Self> {
        let shared = Self::shared(host, owned, config)?;
        match register(&shared, None).await {
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
        // landed (or failed), every later one carries this one.
        drop(self.shared.heal_writes.write().await);
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
            .and_then([PutRequest::new(key, metadata.to_vec()).with_lease(lease)]);
        match self.shared.store().txn(req).await {
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
            let _ = tokio::join!(
                delete_if_under(shared.store(), &shared.config.key, &leases),
                self.task.stop()
            );
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

/// A registered key: its session, and the key's create and mod revisions.
type Held = (SessionHandle, (Revision, Revision));

/// Takes the host's live session, publishes its lease, then writes the key under it. A stop
/// (`cancel`) that comes while the lease is still being granted ends the attempt before
/// anything is written: a heal held up by a slow grant must not put the key seconds after its
/// stop was asked (by then a newer incarnation may hold the name). A put already sent is
/// waited for, and `stop` removes what it wrote; nothing more is sent (a key it finds with
/// older metadata is left for the stop, not rewritten).
async fn register(shared: &Shared, cancel: Option<&Stop>) -> Result<Held> {
    let cancel = cancel.filter(|_| {
        !crate::hooks::planted::enabled(crate::hooks::planted::Bug::StopSkipsTheHeal)
            && !crate::hooks::planted::enabled(crate::hooks::planted::Bug::HealOutlivesTheStop)
    });
    let session = match cancel {
        Some(cancel) => tokio::select! {
            biased;
            _ = cancel.stopped() => {
                return Err(Error::Cancelled {
                    operation: "registration (stopped while its lease was granted)",
                })
            }
            session = shared.host.session() => session?,
        },
        None => shared.host.session().await?,
    };
    // Published before the put, so that a stop() that comes later removes the key whatever
    // lease it is written under (see the module docs).
    shared.lease.store(session.lease().0, Ordering::SeqCst);
    match shared.put(session.lease(), cancel).await {
        Ok(revisions) => {
            shared.set_session(Some(session.clone()));
            // A reply that came after the session's deadline (a held link, a slow store)
            // registered nothing to rely on: the hold that follows ends at once and heals.
            if !session.is_done() {
                shared.status.send_replace(RegistrationStatus::Registered {
                    lease: session.lease(),
                });
            }
            // The key is under the live lease: older leases of the host hold nothing of ours.
            shared.host.moved(shared.id, session.lease());
            crate::hooks::explore::point().await;
            Ok((session, revisions))
        }
        Err(e) => {
            shared.lease.store(0, Ordering::SeqCst);
            if let Error::LeaseNotFound { lease } = e {
                shared.host.evict(lease).await;
            }
            Err(e)
        }
    }
}

/// Registers (unless `first` did) and keeps the key while the session lives; heals when it
/// dies.
async fn run(shared: Arc<Shared>, first: Option<Held>, cancel: Stop) {
    let cfg = &shared.config;
    let seed = cfg.backoff_seed ^ retry::seed(&[cfg.key.as_bytes()]);
    let mut backoff = Backoff::new(cfg.initial_backoff, cfg.max_backoff, seed);
    let mut next = first;
    let mut healing = false;
    loop {
        let (session, revisions) = match next.take() {
            Some(held) => held,
            None => match establish(&shared, &mut backoff, healing, &cancel).await {
                Some(held) => held,
                None => return,
            },
        };
        if healing {
            tracing::info!(lease_id = %session.lease(), "registration healed");
            crate::metrics::record::registration_healed();
        } else {
            tracing::info!(lease_id = %session.lease(), "registered");
        }
        // Hold the key until the session ends (or the registration stops).
        let end = tokio::select! {
            biased;
            _ = cancel.stopped() => return,
            end = hold(&shared, &session, revisions) => end,
        };
        tracing::warn!(lease_id = %session.lease(), reason = %end, "registration lost; healing");
        crate::metrics::record::registration_lost();
        // Said at once: evicting the lease below may wait behind a grant another recipe of
        // the host has in flight.
        shared
            .status
            .send_replace(RegistrationStatus::Healing { attempt: 0 });
        shared.lease.store(0, Ordering::SeqCst);
        shared.set_session(None);
        if end == SessionEnd::LeaseLost {
            // The store may have said so to us alone: the host's session must not be reused.
            shared.host.evict(session.lease()).await;
        }
        healing = true;
        if crate::hooks::planted::enabled(crate::hooks::planted::Bug::RegistrationGivesUpOnLoss) {
            shared
                .status
                .send_replace(RegistrationStatus::Healing { attempt: 0 });
            cancel.stopped().await;
            return;
        }
    }
}

/// Registers, backing off between attempts (and before the first, when healing: the loss
/// may be the store restarting). `None` when cancelled.
async fn establish(
    shared: &Shared,
    backoff: &mut Backoff,
    healing: bool,
    cancel: &Stop,
) -> Option<Held> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        if healing {
            shared
                .status
                .send_replace(RegistrationStatus::Healing { attempt });
        }
        crate::hooks::explore::point().await;
        let delay = if healing || attempt > 1 {
            backoff.next_delay()
        } else {
            Duration::ZERO
        };
        tokio::select! {
            biased;
            _ = cancel.stopped() => return None,
            _ = tokio::time::sleep(delay) => {}
        }
        // A cancel that lands while the lease is granted ends the attempt; one that lands
        // during the put waits for it: the attempt has published its lease first, so stop()
        // removes whatever it wrote.
        match register(shared, Some(cancel)).await {
            Ok(held) => {
                if !crate::hooks::planted::enabled(crate::hooks::planted::Bug::BackoffNeverResets) {
                    backoff.reset();
                }
                if attempt > 1 || healing {
                    tracing::debug!(attempts = attempt, "registered after retrying");
                }
                return Some(held);
            }
            Err(e) => tracing::debug!(
                attempt,
                backoff_ms = delay.as_millis() as u64,
                error = &e as &dyn std::error::Error,
                "registration attempt failed"
            ),
        }
    }
}

/// Follows the key while the session lives, putting it back if it is deleted under a live
/// lease. Returns why the session ended.
async fn hold(
    shared: &Shared,
    session: &SessionHandle,
    (created, modified): (Revision, Revision),
) -> SessionEnd {
    let mut follow = Follow::new(
        shared.store().clone(),
        shared.config.key.clone().into_bytes(),
        modified.next(),
        Some((created, modified)),
    )
    .answered_within(session.ttl() / 3);
    // One wait for the session's end, for the hold's life: each metadata update comes back
    // as a change to the followed key, and a fresh wait per change subscribed to the session
    // and read the clock again.
    let done = session.done();
    tokio::pin!(done);
    loop {
        let change = tokio::select! {
            biased;
            end = &mut done => return end,
            change = follow.next() => change,
        };
        let registered = RegistrationStatus::Registered {
            lease: session.lease(),
        };
        if let Change::Put(kv) = &change {
            // Another lease took the key: a newer incarnation of the host (or another process
            // under the same name). The name is not ours while it holds it, and fighting for
            // it would have two owners take turns: not registered until the key is freed (a
            // delete, put back below) or ours again.
            let ours = kv.lease == session.lease();
            if !ours && shared.status.get() == registered {
                tracing::warn!(
                    lease_id = %kv.lease,
                    "registered key taken by another lease; waiting for it to be freed"
                );
                shared
                    .status
                    .send_replace(RegistrationStatus::Healing { attempt: 0 });
            } else if ours && matches!(shared.status.get(), RegistrationStatus::Healing { .. }) {
                shared.status.send_replace(registered);
            }
            continue;
        }
        if let Change::Deleted(_) = change {
            if session.is_done() {
                continue;
            }
            // The key is gone: whoever reads the status must not take it for present while
            // it is put back (the put may wait out a lost reply).
            shared
                .status
                .send_replace(RegistrationStatus::Healing { attempt: 0 });
            if let Some(end) = put_back(shared, session).await {
                return end;
            }
            shared.status.send_replace(RegistrationStatus::Registered {
                lease: session.lease(),
            });
        }
    }
}

/// Puts the key back after it was deleted, retrying until it is back or the session ends. A
/// lease that turns out to be gone (the delete was its expiry or revocation) ends the hold at
/// once, so the heal starts now rather than at the session's next renewal.
async fn put_back(shared: &Shared, session: &SessionHandle) -> Option<SessionEnd> {
    let mut backoff = retry::store_backoff(retry::seed(&[shared.config.key.as_bytes()]));
    loop {
        let put = tokio::select! {
            biased;
            end = session.done() => return Some(end),
            // Dropped, not asked, at a stop (the hold is): no stop to look at.
            put = shared.put(session.lease(), None) => put,
        };
        match put {
            Ok(_) => {
                tracing::warn!("registered key was deleted under a live lease; put it back");
                crate::metrics::record::registration_repaired();
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
