//! [`Session`]: one lease kept alive, and a local deadline that says when to stop trusting it.
//!
//! The safety argument: etcd expires a lease no earlier than TTL after it received the last
//! renewal, which is after we sent it. So "send time of the last acknowledged renewal + TTL"
//! is a deadline the server's expiry cannot precede. A session treats itself as done at that
//! deadline even if no server ever tells it so (a partition, a stalled stream), so anything
//! built on it (a leadership) steps down no later than the server could hand it to someone
//! else.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{sleep, sleep_until, Instant};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::error::{Error, Result};
use crate::store::{DynKvLeaseStore, KeepAlive};
use crate::types::LeaseId;

/// How a [`Session`] keeps its lease.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SessionConfig {
    /// The lease's TTL (default 10 s).
    pub ttl: Duration,
    /// How often to renew; `None` is a third of the granted TTL, which survives one lost
    /// renewal.
    pub renew_interval: Option<Duration>,
    /// Revoke the lease, in the background, once the local deadline passes (default on): the
    /// store may still hold it (a reply lost, an etcd restart refreshed it), and keys under it,
    /// such as a queued election candidate, would block others until it expires. Turn it off
    /// when the owner replaces the keys itself first (a registration re-puts its key, then
    /// revokes the old lease, so watchers see no flap).
    pub revoke_on_expiry: bool,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            ttl: Duration::from_secs(10),
            renew_interval: None,
            revoke_on_expiry: true,
        }
    }
}

impl SessionConfig {
    /// Use this TTL.
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Renew this often instead of every TTL/3.
    pub fn with_renew_interval(mut self, every: Duration) -> Self {
        self.renew_interval = Some(every);
        self
    }

    /// Whether to revoke the lease once the local deadline passes (see
    /// [`revoke_on_expiry`](Self::revoke_on_expiry)).
    pub fn with_revoke_on_expiry(mut self, on: bool) -> Self {
        self.revoke_on_expiry = on;
        self
    }
}

/// Why a session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SessionEnd {
    /// The store said the lease is gone (revoked, or expired on the server).
    LeaseLost,
    /// The local deadline passed without an acknowledged renewal.
    Expired,
    /// [`Session::close`] revoked it.
    Closed,
    /// [`Session::orphan`] stopped renewing it.
    Orphaned,
}

impl std::fmt::Display for SessionEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SessionEnd::LeaseLost => "the lease is gone",
            SessionEnd::Expired => "the local deadline passed without a renewal",
            SessionEnd::Closed => "closed",
            SessionEnd::Orphaned => "orphaned",
        })
    }
}

#[derive(Debug, Clone, Copy)]
struct State {
    deadline: Instant,
    ended: Option<SessionEnd>,
}

#[derive(Debug)]
struct Inner {
    store: Arc<DynKvLeaseStore>,
    lease: LeaseId,
    ttl: Duration,
    revoke_on_expiry: bool,
    state: watch::Sender<State>,
}

impl Inner {
    fn end(&self, why: SessionEnd) {
        let ended = self.state.send_if_modified(|s| {
            if s.ended.is_none() {
                s.ended = Some(why);
                true
            } else {
                false
            }
        });
        // Whoever noticed the deadline first (the renewal task, or a waiter on `done`), the
        // abandoned lease is revoked once.
        if ended && why == SessionEnd::Expired && self.revoke_on_expiry {
            revoke_abandoned(self.store.clone(), self.lease, self.ttl);
        }
    }

    fn state(&self) -> State {
        *self.state.borrow()
    }

    async fn done(&self) -> SessionEnd {
        let mut rx = self.state.subscribe();
        loop {
            let s = *rx.borrow_and_update();
            if let Some(end) = s.ended {
                return end;
            }
            tokio::select! {
                biased;
                changed = rx.changed() => if changed.is_err() { return SessionEnd::Closed },
                _ = sleep_until(s.deadline), if !ignores_deadline() => {
                    self.end(SessionEnd::Expired);
                }
            }
        }
    }

    /// Whether the local deadline counts (it always does, unless the planted bug is on).
    fn past_deadline(&self, now: Instant) -> bool {
        !ignores_deadline() && now >= self.state().deadline
    }
}

/// A cheap handle on a session's liveness, for things built on it (a [`Leadership`]
/// holds one).
///
/// [`Leadership`]: crate::recipes::Leadership
#[derive(Debug, Clone)]
pub struct SessionHandle {
    inner: Arc<Inner>,
}

impl SessionHandle {
    /// The session's lease.
    pub fn lease(&self) -> LeaseId {
        self.inner.lease
    }

    /// The local deadline: send time of the last acknowledged renewal + TTL.
    pub fn deadline(&self) -> Instant {
        self.inner.state().deadline
    }

    /// True once the session ended or its deadline passed.
    pub fn is_done(&self) -> bool {
        self.inner.state().ended.is_some() || self.inner.past_deadline(Instant::now())
    }

    /// Resolves when the session ends: the lease is reported gone, the deadline passes, or
    /// it is closed or orphaned.
    pub async fn done(&self) -> SessionEnd {
        self.inner.done().await
    }
}

/// One lease, renewed about every TTL/3, with a local deadline.
///
/// # Drop
/// Dropping a session stops renewing without revoking: the lease expires after its TTL.
/// Use [`close`](Session::close) to give it up at once.
///
/// ```no_run
/// # async fn run(store: std::sync::Arc<coord_api::DynKvLeaseStore>) -> coord_api::Result<()> {
/// use coord_api::recipes::{Session, SessionConfig};
/// let session = Session::new(store, SessionConfig::default()).await?;
/// tokio::select! {
///     end = session.done() => println!("lost the session: {end}"),
///     _ = tokio::time::sleep(std::time::Duration::from_secs(60)) => session.close().await?,
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Session {
    handle: SessionHandle,
    cancel: CancellationToken,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Session {
    /// Grants a lease and starts renewing it.
    ///
    /// # Errors
    /// Whatever the grant fails with.
    pub async fn new(store: Arc<DynKvLeaseStore>, config: SessionConfig) -> Result<Self> {
        let sent = Instant::now();
        let grant = store.grant(config.ttl).await?;
        let (state, _) = watch::channel(State {
            deadline: sent + grant.ttl,
            ended: None,
        });
        let inner = Arc::new(Inner {
            store,
            lease: grant.id,
            ttl: grant.ttl,
            revoke_on_expiry: config.revoke_on_expiry,
            state,
        });
        let every = config.renew_interval.unwrap_or(grant.ttl / 3);
        let cancel = CancellationToken::new();
        let span = tracing::info_span!("session", lease_id = %grant.id, ttl_ms = grant.ttl.as_millis() as u64);
        let task = tokio::spawn(renew(inner.clone(), every, cancel.clone()).instrument(span));
        Ok(Session {
            handle: SessionHandle { inner },
            cancel,
            task: Mutex::new(Some(task)),
        })
    }

    /// The session's lease.
    pub fn lease(&self) -> LeaseId {
        self.handle.inner.lease
    }

    /// The TTL the store granted.
    pub fn ttl(&self) -> Duration {
        self.handle.inner.ttl
    }

    /// The local deadline: send time of the last acknowledged renewal + TTL.
    pub fn deadline(&self) -> Instant {
        self.handle.deadline()
    }

    /// True once the session ended or its deadline passed.
    pub fn is_done(&self) -> bool {
        self.handle.is_done()
    }

    /// Resolves when the session ends; see [`SessionEnd`].
    pub async fn done(&self) -> SessionEnd {
        self.handle.done().await
    }

    /// A handle that follows this session's liveness.
    pub fn handle(&self) -> SessionHandle {
        self.handle.clone()
    }

    /// The store the session lives in.
    pub fn store(&self) -> &Arc<DynKvLeaseStore> {
        &self.handle.inner.store
    }

    async fn stop_renewing(&self) {
        self.cancel.cancel();
        let task = self.task.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }

    /// Stops renewing and revokes the lease: its keys disappear now. Idempotent.
    ///
    /// # Errors
    /// Whatever the revoke fails with, except that a lease already gone is success.
    pub async fn close(&self) -> Result<()> {
        self.stop_renewing().await;
        self.handle.inner.end(SessionEnd::Closed);
        match self.handle.inner.store.revoke(self.lease()).await {
            Ok(_) | Err(Error::LeaseNotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Stops renewing without revoking: the lease (and its keys) expire after the TTL, or
    /// another process can take it over.
    pub async fn orphan(&self) {
        self.stop_renewing().await;
        self.handle.inner.end(SessionEnd::Orphaned);
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// A session whose deadline passed is over for us, but the store may still hold its lease:
/// renewals that arrived without their replies coming back (a one-way partition), or an etcd
/// restart that refreshed every lease. Its keys (a queued candidate, a registration) would
/// linger until the store expires them, blocking the queue behind them. So revoke it, in the
/// background and without the session's cancellation (the session is being replaced), for up
/// to two TTLs.
pub(crate) fn revoke_abandoned(store: Arc<DynKvLeaseStore>, lease: LeaseId, ttl: Duration) {
    let retry = ttl / 3;
    tokio::spawn(
        async move {
            let give_up = Instant::now() + ttl * 2;
            loop {
                match store.revoke(lease).await {
                    Ok(_) => {
                        tracing::info!("revoked the expired session's lease");
                        return;
                    }
                    Err(Error::LeaseNotFound { .. }) => return,
                    Err(_) if Instant::now() + retry < give_up => sleep(retry).await,
                    Err(e) => {
                        tracing::debug!(
                            error = &e as &dyn std::error::Error,
                            "could not revoke the expired session's lease; it will expire"
                        );
                        return;
                    }
                }
            }
        }
        .in_current_span(),
    );
}

/// The planted bug that trusts renewal replies alone (see [`crate::planted`]).
fn ignores_deadline() -> bool {
    crate::planted::enabled(crate::planted::Bug::StepDownOnRenewalReply)
}

/// Renews every `every` until cancelled, the lease is gone, or the deadline passes.
async fn renew(inner: Arc<Inner>, every: Duration, cancel: CancellationToken) {
    let mut channel: Option<Box<dyn KeepAlive>> = None;
    let mut next = Instant::now() + every;
    // After a failed renewal, try again sooner than the regular cadence.
    let retry = (every / 4).max(Duration::from_millis(50));
    loop {
        let deadline = inner.state().deadline;
        tokio::select! {
            biased;
            _ = cancel.cancelled() => return,
            _ = sleep_until(deadline), if !ignores_deadline() => {
                tracing::warn!("session expired: no renewal acknowledged before the deadline");
                inner.end(SessionEnd::Expired);
                return;
            }
            _ = sleep_until(next) => {}
        }
        if channel.is_none() {
            match inner.store.keep_alive(inner.lease).await {
                Ok(c) => channel = Some(c),
                Err(e) => {
                    tracing::debug!(
                        error = &e as &dyn std::error::Error,
                        "could not open a keep-alive channel"
                    );
                    next = Instant::now() + retry;
                    continue;
                }
            }
        }
        // Measured before sending: the server cannot expire the lease earlier than TTL after
        // this instant.
        let sent = Instant::now();
        let ch = channel.as_mut().expect("opened above");
        let result = tokio::select! {
            biased;
            _ = cancel.cancelled() => return,
            _ = sleep_until(deadline), if !ignores_deadline() => {
                tracing::warn!("session expired while a renewal was outstanding");
                inner.end(SessionEnd::Expired);
                return;
            }
            r = ch.renew() => r,
        };
        match result {
            Ok(ttl) => {
                inner
                    .state
                    .send_modify(|s| s.deadline = s.deadline.max(sent + ttl));
                tracing::trace!(ttl_ms = ttl.as_millis() as u64, "renewed");
                next = sent + every;
            }
            Err(Error::LeaseNotFound { .. }) => {
                tracing::warn!("session lost: the store reports the lease gone");
                inner.end(SessionEnd::LeaseLost);
                return;
            }
            Err(e) => {
                // The channel died (or the store is unreachable): the lease may still live,
                // so re-open on the same lease and keep trying until the deadline.
                tracing::debug!(
                    error = &e as &dyn std::error::Error,
                    "renewal failed; re-opening the channel"
                );
                channel = None;
                next = Instant::now() + retry;
            }
        }
    }
}
