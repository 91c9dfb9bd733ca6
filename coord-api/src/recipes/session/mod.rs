//! [`Session`]: one lease kept alive, and a local deadline that says when to stop trusting it.
//!
//! The safety argument: etcd expires a lease no earlier than TTL after it received the last
//! renewal, which is after we sent it. So "send time of the last acknowledged renewal + TTL"
//! is a deadline the server's expiry cannot precede. A session treats itself as done at that
//! deadline even if no server ever tells it so (a partition, a stalled stream), so anything
//! built on it (a leadership) steps down no later than the server could hand it to someone
//! else. The deadline is kept a clock margin earlier still (1% of the TTL by default,
//! [`SessionConfig::clock_drift_ppm`]): the server counts the TTL on its own clock, and a
//! local clock that runs slow, or a deadline timer that fires late, must not carry a belief
//! past the lease.
//!
//! The timing, all counted from sends, never from replies:
//! * A renewal goes out every renewal period (KA, a third of the TTL by default) after the
//!   previous one was sent.
//! * A renewal not answered within half a renewal period is abandoned and sent again at once
//!   on a fresh channel (a backend moves it to another member: a stalled or slow one answers
//!   a fresh connection no better). The session, not the backend's request timeout, decides
//!   how long an answer may take: with one sick member, the renewal that reaches a healthy
//!   one is sent at most 1.5 periods (half the TTL) after the last acknowledged one, which
//!   leaves a candidate's default grace (a quarter of the TTL) clear of the deadline.
//!   Opening a channel is bounded alike. Only a failure after that re-send backs off.
//! * A grant whose reply took longer than a renewal period (a stalled etcd, a slow disk) is
//!   followed at once by a renewal, before [`Session::new`] returns: a new session always has
//!   at least TTL − KA left on its deadline.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::pending;
use std::future::poll_fn;
use std::ops::ControlFlow;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::task::AtomicWaker;

use tokio::sync::Notify;
use tokio::time::{sleep_until, Instant, Sleep};
use tracing::Instrument;

use super::loss::LossReason;
use super::task::Task;
use super::turn::KeyTurn;
use crate::elections::{self, withdrawal, Cleanup};
use crate::error::{Error, ErrorClass, Result};
use crate::hooks::clock;
use crate::retry::{self, Backoff};
use crate::store::{DynKvLeaseStore, KeepAlive};
use crate::sync::watch;
use crate::types::LeaseId;

mod campaigns;
mod config;
mod release;
mod renewer;

pub(crate) use campaigns::Before;
pub(crate) use campaigns::CampaignTurn;
use campaigns::{CampaignSlot, LossSignal};
pub use config::{SessionConfig, SessionEnd, SessionHealth};
pub(crate) use release::{release_lease, release_lease_then};
use renewer::{ignores_deadline, Attempt, Renewer};

#[derive(Debug, Clone, Copy)]
struct State {
    deadline: Instant,
    ended: Option<SessionEnd>,
    last_renewal: Option<Instant>,
}

#[derive(Debug)]
struct Inner {
    store: Arc<DynKvLeaseStore>,
    lease: LeaseId,
    ttl: Duration,
    /// How far the local deadline stays ahead of the store's expiry (see
    /// [`SessionConfig::clock_drift_ppm`]), as parts per million of a TTL.
    clock_drift_ppm: u32,
    revoke_on_expiry: bool,
    /// The deadline and the end. Its receivers are told of the end only: a renewal moves the
    /// deadline later without a word to them, so that a renewal does not wake every task
    /// waiting on the session (each campaign, each leadership, and whatever they wait on
    /// beside it). The renewal task alone sleeps until the deadline, and ends the session
    /// there, in every state it can be in; whoever stops it ends the session too.
    state: watch::Sender<State>,
    /// Told of each renewal, for the waiters that wait for one ([`SessionHandle::fresh`]).
    renewed: Notify,
    /// Asks the renewal task to renew now (see [`SessionHandle::fresh`]): set, and the task
    /// woken, which takes the ask at its next turn (see [`Inner::poll_asked`]).
    renew_asked: AtomicBool,
    renewer: AtomicWaker,
    /// Per election: its campaigns on this lease, one at a time (see [`CampaignSlot`]).
    campaigns: Mutex<BTreeMap<String, Arc<CampaignSlot>>>,
}

impl Inner {
    /// The clock margin for a lease of `ttl`.
    fn margin(&self, ttl: Duration) -> Duration {
        config::clock_margin(ttl, self.clock_drift_ppm)
    }

    /// Asks the renewal task to renew now.
    fn ask_renewal(&self) {
        self.renew_asked.store(true, Ordering::SeqCst);
        self.renewer.wake();
    }

    /// Ready once asked to renew now (the ask taken); else the renewal task's waker is kept
    /// for the next ask. Two atomics on the session's own state: a notification's waiter,
    /// polled at every wake-up of the task, was a lock and a line of memory more each time.
    fn poll_asked(&self, cx: &mut Context<'_>) -> Poll<()> {
        if self.renew_asked.swap(false, Ordering::SeqCst) {
            return Poll::Ready(());
        }
        self.renewer.register(cx.waker());
        // An ask between the look and the registration woke nobody: look again.
        if self.renew_asked.swap(false, Ordering::SeqCst) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }

    fn end(&self, why: SessionEnd) {
        let ended = self.state.send_if_modified(|s| {
            if s.ended.is_none() {
                s.ended = Some(why);
                true
            } else {
                false
            }
        });
        if ended {
            tracing::info!(lease_id = %self.lease, reason = %why, "session ended");
            crate::metrics::record::session_ended(why.label());
        }
        // Whoever noticed the deadline first (the renewal task, or a waiter on `done`), the
        // abandoned lease is revoked once.
        if ended && why == SessionEnd::Expired && self.revoke_on_expiry {
            release_lease(self.store.clone(), self.lease);
        }
    }

    fn state(&self) -> State {
        self.state.get()
    }

    async fn done(&self) -> SessionEnd {
        let mut rx = self.state.subscribe();
        // Past its deadline, a session is over now, whether or not the renewal task has run
        // since; after this, the renewal task ends it at its deadline (see `state`).
        if self.past_deadline(Instant::now()) {
            self.end(SessionEnd::Expired);
        }
        loop {
            if let Some(end) = rx.get_and_update().ended {
                return end;
            }
            if rx.changed().await.is_err() {
                return SessionEnd::Orphaned;
            }
        }
    }

    /// Resolves once the lease is gone at the store, or surely will be with no word from
    /// this process: a TTL past the local deadline (the store counts its TTL from a renewal's
    /// arrival, which came before its acknowledgement, and a reply later than a TTL renews
    /// nothing we rely on). While renewals go on the deadline moves and this waits on. What
    /// works in the background for a lease (a withdrawal) stops here: its work goes with the
    /// lease, and a crashed host's tasks must not outlive it.
    async fn lease_over(&self) {
        loop {
            let over = self.state().deadline + self.ttl;
            if Instant::now() >= over {
                return;
            }
            tokio::time::sleep_until(over).await;
        }
    }

    /// Whether the local deadline counts (it always does, unless the planted bug is on).
    fn past_deadline(&self, now: Instant) -> bool {
        !ignores_deadline() && now >= self.state().deadline
    }

    fn health(&self) -> SessionHealth {
        let s = self.state();
        let now = Instant::now();
        let ended = s
            .ended
            .or_else(|| self.past_deadline(now).then_some(SessionEnd::Expired));
        SessionHealth {
            lease: self.lease,
            deadline: s.deadline,
            remaining: s.deadline.saturating_duration_since(now),
            last_renewal: s.last_renewal,
            ended,
        }
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

    /// The TTL the store granted.
    pub fn ttl(&self) -> Duration {
        self.inner.ttl
    }

    /// The local deadline: send time of the last acknowledged renewal + TTL, less the clock
    /// margin ([`clock_margin`](Self::clock_margin)).
    pub fn deadline(&self) -> Instant {
        self.inner.state().deadline
    }

    /// How far the local deadline stays ahead of the store's expiry, for clock drift (see
    /// [`SessionConfig::clock_drift_ppm`]).
    pub fn clock_margin(&self) -> Duration {
        self.inner.margin(self.inner.ttl)
    }

    /// True once the session ended or its deadline passed.
    pub fn is_done(&self) -> bool {
        self.inner.state().ended.is_some() || self.inner.past_deadline(Instant::now())
    }

    /// Resolves when the session ends: the lease is reported gone, the deadline passes, or
    /// it is stopped, orphaned or dropped.
    pub async fn done(&self) -> SessionEnd {
        self.inner.done().await
    }

    /// Whether renewals are working: the last acknowledged one, the time left.
    pub fn health(&self) -> SessionHealth {
        self.inner.health()
    }

    /// The store the session lives in.
    pub fn store(&self) -> &Arc<DynKvLeaseStore> {
        &self.inner.store
    }

    fn slot(&self, name: &str) -> Arc<CampaignSlot> {
        self.inner
            .campaigns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(name.to_owned())
            .or_default()
            .clone()
    }

    /// What fencing this session's candidate writes in election `name` takes (see
    /// `crate::elections::limbo`): given up once the lease is surely over.
    pub(crate) fn fencing(&self, name: &str) -> crate::elections::Fencing {
        let inner = self.inner.clone();
        crate::elections::Fencing::election(name, self.inner.lease, async move {
            inner.lease_over().await
        })
    }

    /// What fencing this session's writes of `key` take (a registration's; see
    /// `crate::elections::limbo`).
    pub(crate) fn key_fencing(&self, key: &str) -> crate::elections::Fencing {
        let inner = self.inner.clone();
        crate::elections::Fencing::key(
            key,
            self.inner.lease,
            async move { inner.lease_over().await },
        )
    }

    /// A campaign's turn in election `name` on this lease: waits for the campaign or
    /// withdrawal attempt in progress, calls off any pending withdrawal of the key, which the
    /// new campaign takes over (it creates the key or rejoins it), and numbers the campaign.
    pub(crate) async fn campaign_turn(&self, name: &str) -> CampaignTurn {
        let slot = self.slot(name);
        let mut withdrawal_called_off = slot.key.call_off_cleanup();
        let turn = slot.key.turn.clone().lock_owned().await;
        // A campaign that ended while we waited may have handed a withdrawal over since.
        withdrawal_called_off |= slot.key.call_off_cleanup();
        let campaign = slot.numbered.fetch_add(1, Ordering::SeqCst) + 1;
        let latest = slot.latest.send_replace(campaign);
        CampaignTurn {
            turn,
            campaign,
            before: Before {
                latest,
                withdrawal_called_off,
            },
        }
    }

    /// Records the leadership `campaign` won in election `name`: while it stands (`lost`
    /// unset), the key is left to it when a newer campaign of this session that rejoined the
    /// key gives up or resigns (see [`CampaignSlot::may_delete`]).
    pub(crate) fn stand(&self, name: &str, campaign: u64, lost: &Arc<LossSignal>) {
        let slot = self.slot(name);
        let mut standing = slot.standing.lock().unwrap_or_else(|p| p.into_inner());
        standing.retain(|(_, l)| l.upgrade().is_some_and(|l| l.get().is_none()));
        standing.push((campaign, Arc::downgrade(lost)));
    }

    /// A campaign in election `name` that ended without a leadership and left nothing to
    /// withdraw (its write surely not applied, or it found another leader first): the key is
    /// left to an earlier leadership of the session that still stands, whose resign then
    /// deletes it, as a withdrawal would have left it (see [`CampaignSlot::may_delete`]).
    /// Without this, that resign would take the ended campaign for the key's owner and leave
    /// the key standing.
    pub(crate) fn give_back(&self, name: &str, campaign: u64) {
        // For its effect alone: nothing is deleted here.
        let _ = self.slot(name).may_delete(campaign);
    }

    /// A try in election `name` that ended without a leadership, wrote nothing and handed no
    /// withdrawal over: the key goes back to whom it stood for before the try took its turn.
    /// An earlier leadership of the session that still stands keeps it (as [`give_back`]);
    /// else the campaign before the try, whose withdrawal still to come then deletes it
    /// (a waiter given up just before the try). Without this, that withdrawal would take the
    /// try for the key's owner and leave the key standing, unbelieved, until the lease ends.
    ///
    /// True when the caller must withdraw the key itself: taking the turn called off a
    /// withdrawal of it still pending, and no earlier leadership stands.
    ///
    /// [`give_back`]: Self::give_back
    #[must_use = "a called-off withdrawal must be handed over again"]
    pub(crate) fn give_back_untouched(&self, name: &str, campaign: u64, before: Before) -> bool {
        let slot = self.slot(name);
        if !slot.may_delete(campaign) {
            return false;
        }
        if before.withdrawal_called_off {
            return true;
        }
        slot.latest.send_if_modified(|latest| {
            let ours = *latest == campaign;
            if ours {
                *latest = before.latest;
            }
            ours
        });
        false
    }

    /// Whether the key of `campaign` in election `name` may be deleted now, by a caller that
    /// holds the session's turn there (see [`CampaignSlot::may_delete`]).
    pub(crate) fn may_delete(&self, name: &str, campaign: u64) -> bool {
        self.slot(name).may_delete(campaign)
    }

    /// The turn to delete the key of `campaign` in election `name` (its resign), or `None`
    /// once a newer campaign of this session has taken its turn (the key is that campaign's,
    /// not this one's to delete) or while an earlier leadership of the session on the key
    /// stands (the key is left to it). A newer campaign holds the turn for as long as it
    /// waits to lead, so this does not wait for the turn past the moment one takes it.
    pub(crate) async fn resign_turn(
        &self,
        name: &str,
        campaign: u64,
    ) -> Option<crate::elections::Turn> {
        let slot = self.slot(name);
        let mut latest = slot.latest.subscribe();
        tokio::select! {
            biased;
            _ = latest.wait_for(|n| *n != campaign) => None,
            turn = slot.key.turn.clone().lock_owned() => slot.may_delete(campaign).then_some(turn),
        }
    }

    /// What becomes of the key of `campaign` in `name` on this lease when it does not finish
    /// (or its leadership is let go of): a withdrawal retried until the key is gone or the
    /// lease is (see [`Inner::lease_over`]), unless a newer campaign takes the key over first.
    pub(crate) fn cleanup(&self, name: &str, campaign: u64) -> Cleanup {
        let slot = self.slot(name);
        let handle = self.clone();
        Cleanup::HandOff(Box::new(move |store, leader| {
            if !slot.may_delete(campaign) {
                // A newer campaign has the key, or an earlier leadership keeps it: nothing to
                // delete, nor any pending withdrawal (the newer campaign's) to call off.
                return;
            }
            let called_off = slot.key.pending_cleanup();
            let Ok(rt) = tokio::runtime::Handle::try_current() else {
                return;
            };
            rt.spawn(async move {
                let mut backoff = retry::Backoff::store(retry::seed(&[&leader.key]));
                let stop = async {
                    tokio::select! {
                        () = called_off.stopped() => {}
                        () = handle.inner.lease_over() => {}
                    }
                };
                let _ = retry::until(&mut backoff, stop, |_| async {
                    let turn = tokio::select! {
                        biased;
                        _ = called_off.stopped() => return ControlFlow::Break(()),
                        turn = slot.key.turn.clone().lock_owned() => turn,
                    };
                    if called_off.is_stopped() || !slot.may_delete(campaign) {
                        return ControlFlow::Break(());
                    }
                    let fencing = handle.fencing(&leader.name);
                    let (result, turn) =
                        elections::limbo::write(store.clone(), withdrawal(&leader), turn, fencing)
                            .await;
                    drop(turn);
                    match result {
                        Ok(_) | Err(Error::LeaseNotFound { .. }) => ControlFlow::Break(()),
                        Err(e) if matches!(e.class(), ErrorClass::Retryable | ErrorClass::Indeterminate) => {
                            tracing::debug!(
                                election = %leader.name,
                                error = &e as &dyn std::error::Error,
                                "could not delete the key of an unfinished campaign yet; retrying"
                            );
                            ControlFlow::Continue(())
                        }
                        Err(e) => {
                            tracing::warn!(
                                election = %leader.name,
                                error = &e as &dyn std::error::Error,
                                "could not delete the key of an unfinished campaign; it stays until its lease ends"
                            );
                            ControlFlow::Break(())
                        }
                    }
                })
                .await;
            }.in_current_span());
        }))
    }

    /// Waits until at least `left` remains before the deadline, renewing at once if less does
    /// now. What a new leader is guaranteed: a leadership is handed out only with half its
    /// TTL left, never with milliseconds.
    ///
    /// Returns whether it had to wait for a renewal.
    ///
    /// # Errors
    /// The session's end, if it ends first (a renewal that does not come back in time ends it
    /// at its deadline).
    pub(crate) async fn fresh(&self, left: Duration) -> std::result::Result<bool, SessionEnd> {
        let mut rx = self.inner.state.subscribe();
        let mut waited = false;
        loop {
            // Armed before the state is read, so a renewal between the two is not missed.
            let renewed = self.inner.renewed.notified();
            tokio::pin!(renewed);
            renewed.as_mut().enable();
            let s = rx.get_and_update();
            if let Some(end) = s.ended {
                return Err(end);
            }
            let now = Instant::now();
            if self.inner.past_deadline(now) {
                self.inner.end(SessionEnd::Expired);
                continue;
            }
            if s.deadline.saturating_duration_since(now) >= left || ignores_deadline() {
                return Ok(waited);
            }
            waited = true;
            self.inner.ask_renewal();
            tokio::select! {
                biased;
                changed = rx.changed() => if changed.is_err() { return Err(SessionEnd::Orphaned) },
                () = &mut renewed => {}
                _ = sleep_until(s.deadline) => {}
            }
        }
    }
}

/// One lease, renewed about every TTL/3, with a local deadline. See the module docs.
///
/// # Stop and drop
/// [`stop`](Session::stop) revokes the lease and says whether that worked; its keys disappear
/// at once. Dropping a session stops renewing without revoking (the lease expires after its
/// TTL, as after a crash), unless [`SessionConfig::revoke_on_drop`] is set.
///
/// ```no_run
/// # async fn run(store: std::sync::Arc<coord_api::DynKvLeaseStore>) -> coord_api::Result<()> {
/// use coord_api::recipes::{Session, SessionConfig};
/// let session = Session::new(store, SessionConfig::default()).await?;
/// tokio::select! {
///     end = session.done() => println!("lost the session: {end}"),
///     _ = tokio::time::sleep(std::time::Duration::from_secs(60)) => session.stop().await?,
/// }
/// # Ok(()) }
/// ```
#[must_use = "dropping a session stops renewing its lease"]
#[derive(Debug)]
pub struct Session {
    handle: SessionHandle,
    /// The renewals; taken by whoever stops them first.
    task: Mutex<Option<Task>>,
    revoke_on_drop: bool,
}

impl Session {
    /// Grants a lease and starts renewing it.
    ///
    /// # Errors
    /// Whatever the grant fails with; and when the grant's reply took longer than a renewal
    /// period, whatever the renewal that follows it at once fails with (the lease is then
    /// revoked in the background).
    pub async fn new(store: Arc<DynKvLeaseStore>, config: SessionConfig) -> Result<Self> {
        let sent = Instant::now();
        let grant = store.grant(config.ttl).await?;
        let inner = Arc::new(Inner {
            store,
            lease: grant.id,
            ttl: grant.ttl,
            clock_drift_ppm: config.clock_drift_ppm,
            revoke_on_expiry: config.revoke_on_expiry,
            state: watch::Sender::new(State {
                deadline: sent + grant.ttl
                    - config::clock_margin(grant.ttl, config.clock_drift_ppm),
                ended: None,
                last_renewal: None,
            }),
            renewed: Notify::new(),
            renew_asked: AtomicBool::new(false),
            renewer: AtomicWaker::new(),
            campaigns: Mutex::default(),
        });
        let every = config.renew_interval.unwrap_or(grant.ttl / 3);
        let span = tracing::info_span!("session", lease_id = %grant.id, ttl_ms = grant.ttl.as_millis() as u64);
        let mut renewer = Renewer::new(inner.clone(), every);
        let mut next = sent + every;
        if Instant::now() >= next {
            // The grant's reply came late: the lease is older than it looks, and waiting for
            // the regular cadence could pass the deadline before the first renewal.
            let took = sent.elapsed();
            tracing::info!(parent: &span, took_ms = took.as_millis() as u64, "lease granted late; renewing before use");
            // Nothing relies on the session yet, so its deadline (counted from the grant's
            // send) may pass meanwhile: a renewal acknowledged now proves the lease lives a
            // TTL from this renewal's send.
            let timer = sleep_until(next);
            tokio::pin!(timer);
            match renewer
                .renew(timer, false, None)
                .instrument(span.clone())
                .await
            {
                Attempt::Renewed { sent } => next = sent + every,
                other => {
                    inner.end(SessionEnd::Expired);
                    if !config.revoke_on_expiry {
                        release_lease(inner.store.clone(), inner.lease);
                    }
                    return Err(match other {
                        Attempt::Failed { error: e, .. } | Attempt::Ended(Some(e)) => e,
                        Attempt::Ended(None) | Attempt::Renewed { .. } => Error::Cancelled {
                            operation: "session",
                        },
                    });
                }
            }
        }
        tracing::debug!(parent: &span, "session started");
        crate::metrics::record::session_started();
        let task = Task::spawn_abortable(span, renewer.run(next));
        Ok(Session {
            handle: SessionHandle { inner },
            task: Mutex::new(Some(task)),
            revoke_on_drop: config.revoke_on_drop,
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

    /// The local deadline: send time of the last acknowledged renewal + TTL, less the clock
    /// margin ([`clock_margin`](Self::clock_margin)).
    pub fn deadline(&self) -> Instant {
        self.handle.deadline()
    }

    /// How far the local deadline stays ahead of the store's expiry, for clock drift (see
    /// [`SessionConfig::clock_drift_ppm`]).
    pub fn clock_margin(&self) -> Duration {
        self.handle.clock_margin()
    }

    /// True once the session ended or its deadline passed.
    pub fn is_done(&self) -> bool {
        self.handle.is_done()
    }

    /// Resolves when the session ends; see [`SessionEnd`].
    pub async fn done(&self) -> SessionEnd {
        self.handle.done().await
    }

    /// Whether renewals are working: the last acknowledged one, the time left.
    pub fn health(&self) -> SessionHealth {
        self.handle.health()
    }

    /// A handle that follows this session's liveness.
    pub fn handle(&self) -> SessionHandle {
        self.handle.clone()
    }

    /// The store the session lives in.
    pub fn store(&self) -> &Arc<DynKvLeaseStore> {
        &self.handle.inner.store
    }

    fn task(&self) -> Option<Task> {
        self.task.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    async fn stop_renewing(&self) {
        if let Some(mut task) = self.task() {
            task.stop().await;
        }
    }

    /// Stops renewing and revokes the lease, for a session shared behind an `Arc`
    /// ([`stop`](Self::stop) takes it by value).
    pub(crate) async fn close(&self) -> Result<()> {
        self.stop_renewing().await;
        self.handle.inner.end(SessionEnd::Closed);
        let inner = &self.handle.inner;
        match inner.store.revoke(inner.lease).await {
            Ok(_) | Err(Error::LeaseNotFound { .. }) => Ok(()),
            Err(e) => {
                // Its keys would stay until it expires, or longer if the store restarts and
                // refreshes it: keep trying.
                release_lease(inner.store.clone(), inner.lease);
                Err(e)
            }
        }
    }

    /// Stops renewing and revokes the lease: its keys disappear now.
    ///
    /// # Errors
    /// Whatever the revoke fails with (a lease already gone is success). The revoke is then
    /// retried in the background until it lands or the lease is gone.
    pub async fn stop(self) -> Result<()> {
        self.close().await
    }

    /// Stops renewing, recording why the owner gave the session up (a lease it found gone, a
    /// deadline it saw pass), without revoking.
    pub(crate) fn end(&self, why: SessionEnd) {
        drop(self.task());
        self.handle.inner.end(why);
    }

    /// Stops renewing without revoking: the lease (and its keys) expire after the TTL, or
    /// another process can take it over.
    pub async fn orphan(self) {
        self.stop_renewing().await;
        self.handle.inner.end(SessionEnd::Orphaned);
    }
}

impl From<&Session> for SessionHandle {
    fn from(session: &Session) -> Self {
        session.handle()
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        drop(self.task());
        let inner = &self.handle.inner;
        if inner.state().ended.is_some() {
            return;
        }
        if inner.past_deadline(Instant::now()) {
            // Over already: it ends as expired (and its lease is revoked, if configured).
            inner.end(SessionEnd::Expired);
        } else if self.revoke_on_drop {
            inner.end(SessionEnd::Closed);
            release_lease(inner.store.clone(), inner.lease);
        } else {
            tracing::info!(lease_id = %inner.lease, "session dropped; its lease is left to expire");
            inner.end(SessionEnd::Orphaned);
        }
    }
}
