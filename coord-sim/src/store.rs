//! [`SimStore`]: the state machine served in-process, on `tokio::time`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use async_trait::async_trait;
use coord_api::{
    validate, DeleteRequest, DeleteResponse, DynKvLeaseStore, GetRequest, GetResponse, KeepAlive,
    KvLeaseStore, LeaseGrant, LeaseId, LeaseTimeToLive, Limits, PutRequest, PutResponse, Result,
    Revision, TxnRequest, TxnResponse, WatchRequest, WatchResponse, WatchStream,
};
use futures::StreamExt;
use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;

use crate::journal::{Entry, Origin};
use crate::link::{Leg, Link};
use crate::state::{State, WatchId};

/// How a [`SimStore`] behaves where etcd's behaviour depends on its configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SimConfig {
    /// Lease ids are drawn from this seed, so a run is reproducible.
    pub seed: u64,
    /// Limits the store enforces and reports. The defaults are etcd's, except that expiry is
    /// exact (etcd checks every 500 ms) and idle watches get progress notifications every
    /// second, as an etcd started with `--experimental-watch-progress-notify-interval=1s` does.
    pub limits: Limits,
    /// How often watches that start in the past are caught up (etcd: 100 ms). Until then
    /// they deliver nothing, and a compaction can end them.
    pub watch_sync_interval: Duration,
    /// The one-way latency of every message: a request takes it to reach the store, its reply
    /// takes it again to come back, and so does each watch delivery; so operations take time
    /// and interleave as they do over a network. Zero by default.
    pub latency: Duration,
    /// Reproduce etcd 3.4's etcd#19179: a watch from the compaction revision misses the
    /// deletes made at that revision. On by default (the project runs etcd 3.4); turn it off
    /// to model an etcd that has the fix.
    pub compaction_drops_deletes_at_point: bool,
    /// How long a call whose reply is lost (a deaf link) waits before failing, as a client's
    /// request timeout does. 5 s, as `EtcdStore`'s default.
    pub request_timeout: Duration,
}

impl Default for SimConfig {
    fn default() -> Self {
        let mut limits = Limits::ETCD_DEFAULTS;
        limits.expiry_granularity = Duration::ZERO;
        limits.progress_notify_interval = Duration::from_secs(1);
        SimConfig {
            seed: 0,
            limits,
            watch_sync_interval: Duration::from_millis(100),
            compaction_drops_deletes_at_point: true,
            latency: Duration::ZERO,
            request_timeout: Duration::from_secs(5),
        }
    }
}

impl SimConfig {
    /// Draw lease ids from `seed`.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Grant at least `ttl` (etcd: 1.5 x the election timeout, 2 s by default).
    pub fn with_min_lease_ttl(mut self, ttl: Duration) -> Self {
        self.limits.min_lease_ttl = ttl;
        self
    }

    /// Refuse requests larger than `bytes` (etcd's `--max-request-bytes`).
    pub fn with_max_request_bytes(mut self, bytes: usize) -> Self {
        self.limits.max_request_bytes = bytes;
        self
    }

    /// Make every message take `latency` one way (a call: twice that).
    pub fn with_latency(mut self, latency: Duration) -> Self {
        self.latency = latency;
        self
    }

    /// Catch up watches that start in the past this often.
    pub fn with_watch_sync_interval(mut self, every: Duration) -> Self {
        self.watch_sync_interval = every;
        self
    }

    /// Fail calls whose reply is lost after `timeout`.
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Send idle watches a progress notification this often.
    pub fn with_progress_notify_interval(mut self, every: Duration) -> Self {
        self.limits.progress_notify_interval = every;
        self
    }
}

type Sender = mpsc::UnboundedSender<Result<WatchResponse>>;

/// What a call does at the store, which decides its fate when its caller stops waiting and
/// when its reply is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Call {
    /// Changes nothing: dropped with its caller.
    Read,
    /// A write: goes on without its caller; may lose its reply to `lose_replies`.
    Write,
    /// A lease renewal: goes on without its caller.
    Renew,
}

/// Where a request got to.
enum Delivery<T> {
    Applied(Result<T>),
    Lost,
    Refused(coord_api::Error),
}

/// Receives the store's journal (see [`SimStore::on_journal`]).
struct JournalSink(Box<dyn Fn(Instant, Entry) + Send + Sync>);

impl std::fmt::Debug for JournalSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JournalSink")
    }
}

#[derive(Debug)]
struct Inner {
    state: State,
    /// Where each open watch's deliveries go.
    sinks: BTreeMap<WatchId, Sender>,
}

#[derive(Debug)]
struct Shared {
    /// Bumped by [`SimStore::close_streams`]; a keep-alive channel opened under an older
    /// epoch is dead.
    stream_epoch: AtomicU64,
    // A std mutex, not tokio's: nothing awaits while holding it (the state machine is
    // synchronous), so the cheaper lock is also the correct one.
    inner: Mutex<Inner>,
    /// Wakes the expiry task when a lease deadline may have moved earlier.
    deadlines_changed: Arc<Notify>,
    config: SimConfig,
    /// The next client id for [`SimStore::connect`].
    next_client: AtomicU64,
    /// Crashed: nothing answers and no lease expires, until [`SimStore::restart`].
    down: AtomicBool,
    journal: Mutex<Option<JournalSink>>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves the state as consistent as any single
        // operation leaves it; later callers may carry on.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs one operation for `origin` on the state and delivers what it queued, under one
    /// lock so that deliveries (and the journal) keep commit order.
    fn apply<T>(&self, origin: Origin, op: impl FnOnce(&mut State, Instant) -> T) -> T {
        let mut inner = self.lock();
        let now = Instant::now();
        inner.state.set_origin(origin);
        let out = op(&mut inner.state, now);
        inner.state.set_origin(Origin::Store);
        Self::deliver(&mut inner);
        let entries = inner.state.take_journal();
        if !entries.is_empty() {
            let sink = self.journal.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(sink) = sink.as_ref() {
                for e in entries {
                    (sink.0)(now, e);
                }
            }
        }
        out
    }

    fn deliver(inner: &mut Inner) {
        for d in inner.state.take_outbox() {
            let end = d.item.is_err();
            let gone = match inner.sinks.get(&d.watch) {
                Some(tx) => tx.send(d.item).is_err(),
                None => true,
            };
            if end || gone {
                inner.sinks.remove(&d.watch);
                inner.state.cancel_watch(d.watch);
            }
        }
    }
}

/// An in-memory, etcd-faithful [`KvLeaseStore`], in `tokio::time`.
///
/// It behaves like etcd 3.4 in everything the trait exposes (revisions, MVCC reads, leases
/// and their expiry, watches from any revision, compaction, elections) and passes the same
/// conformance suite. Lease expiry runs on `tokio::time`, so under
/// `#[tokio::test(start_paused = true)]` a 10 s TTL expires in no wall time at all.
///
/// Cloning is cheap and every clone is the same store. Creating one spawns its expiry task,
/// so it must be created inside a Tokio runtime; the task ends when the last clone is dropped.
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> coord_api::Result<()> {
/// use std::time::Duration;
/// use coord_api::{KvLeaseStore, KvLeaseStoreExt, PutRequest};
/// use coord_sim::SimStore;
///
/// let store = SimStore::new();
/// let lease = store.grant(Duration::from_secs(10)).await?;
/// store.put(PutRequest::new("hosts/a", "up").with_lease(lease.id)).await?;
/// tokio::time::sleep(Duration::from_secs(11)).await; // virtual time: instant
/// assert!(store.get_key("hosts/a").await?.is_none());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct SimStore {
    shared: Arc<Shared>,
    /// This handle's connection to the store; clones share it, [`SimStore::connect`] makes a
    /// new one.
    link: Arc<Link>,
}

impl Default for SimStore {
    fn default() -> Self {
        Self::new()
    }
}

impl SimStore {
    /// A store with [`SimConfig::default`].
    pub fn new() -> Self {
        Self::with_config(SimConfig::default())
    }

    /// A store with the given configuration.
    ///
    /// # Panics
    /// Outside a Tokio runtime.
    pub fn with_config(config: SimConfig) -> Self {
        let mut state = State::new(config.seed, config.limits.min_lease_ttl);
        state.set_compaction_drops_deletes_at_point(config.compaction_drops_deletes_at_point);
        let shared = Arc::new(Shared {
            stream_epoch: AtomicU64::new(0),
            inner: Mutex::new(Inner {
                state,
                sinks: BTreeMap::new(),
            }),
            deadlines_changed: Arc::new(Notify::new()),
            config,
            next_client: AtomicU64::new(1),
            down: AtomicBool::new(false),
            journal: Mutex::new(None),
        });
        tokio::spawn(background(
            Arc::downgrade(&shared),
            shared.deadlines_changed.clone(),
        ));
        SimStore {
            shared,
            link: Arc::new(Link::new(0)),
        }
    }

    /// Another client of the same store, with its own connection: cutting one client off
    /// ([`partition`](Self::partition)) leaves the others connected.
    pub fn connect(&self) -> SimStore {
        let id = self.shared.next_client.fetch_add(1, Ordering::SeqCst);
        SimStore {
            shared: self.shared.clone(),
            link: Arc::new(Link::new(id)),
        }
    }

    /// This client's id, as the journal names it ([`Origin::Client`]). The first handle is 0;
    /// each [`connect`](Self::connect) gets the next.
    pub fn client_id(&self) -> u64 {
        self.link.id
    }

    /// Starts a journal of every change the store makes, delivered to `sink` with the
    /// instant it was made, in commit order (see [`Entry`]). The journal is complete:
    /// compaction does not trim it. One sink per store; a second call replaces the first.
    pub fn on_journal(&self, sink: impl Fn(Instant, Entry) + Send + Sync + 'static) {
        *self
            .shared
            .journal
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(JournalSink(Box::new(sink)));
        self.shared.lock().state.set_journaling(true);
    }

    /// Fault: the next `count` writes of this client (put, delete, txn, grant, revoke,
    /// compact) are applied, but their replies are lost: each returns `Indeterminate`, as a
    /// request that timed out after reaching etcd does.
    pub fn lose_replies(&self, count: u32) {
        self.link.set_lost_replies(count);
    }

    /// Fault: an etcd leader change. Every keep-alive channel and watch stream ends (as
    /// [`close_streams`](Self::close_streams)), and every lease is refreshed to its full TTL
    /// plus `election_timeout` from now, as etcd's new leader does (so a crashed client's
    /// lease outlives its TTL: etcd#9395).
    pub fn leader_change(&self, election_timeout: Duration) {
        self.close_streams();
        self.shared.apply(Origin::Store, |s, now| {
            s.expire(now);
            s.promote(now, election_timeout);
        });
        self.shared.deadlines_changed.notify_one();
    }

    /// Fault: the store crashes. Every stream ends; until [`restart`](Self::restart) every
    /// call fails with `Unavailable` (connection refused) and no lease expires, as a stopped
    /// etcd's leases do not. Its data is kept, as etcd's is on disk.
    pub fn crash(&self) {
        self.shared.down.store(true, Ordering::SeqCst);
        self.close_streams();
    }

    /// Repairs [`crash`](Self::crash): the store answers again, with every lease refreshed
    /// to its TTL plus `election_timeout` from now, as a restarted etcd member that becomes
    /// leader does.
    pub fn restart(&self, election_timeout: Duration) {
        // Refresh before answering: a lease whose deadline passed while the store was down
        // lives on, as etcd's recovered leases do.
        self.shared
            .apply(Origin::Store, |s, now| s.promote(now, election_timeout));
        self.shared.down.store(false, Ordering::SeqCst);
        self.close_streams();
        self.shared.deadlines_changed.notify_one();
    }

    /// Starts the store again after the runtime that ran its clock is gone, as when the
    /// turmoil host serving it crashed and came back: its data is kept (as etcd's is on
    /// disk), its clock task starts on the current runtime, every stream of the old runtime
    /// is closed, and every lease is refreshed to its TTL plus `election_timeout`, as a
    /// restarted etcd member does.
    ///
    /// # Panics
    /// Outside a Tokio runtime.
    pub fn resume_on_current_runtime(&self, election_timeout: Duration) {
        tokio::spawn(background(
            Arc::downgrade(&self.shared),
            self.shared.deadlines_changed.clone(),
        ));
        self.restart(election_timeout);
    }

    /// Whether the store is crashed.
    pub fn is_down(&self) -> bool {
        self.shared.down.load(Ordering::SeqCst)
    }

    /// Fault: compacts at the current revision every `every`, until the returned handle is
    /// dropped (etcd's `--auto-compaction-mode=revision` at its most aggressive).
    pub fn compact_every(&self, every: Duration) -> CompactionTask {
        let store = self.connect();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval_at(Instant::now() + every, every);
            loop {
                tick.tick().await;
                let rev = store.revision();
                if rev > store.compact_revision() && !store.is_down() {
                    let _ = store
                        .shared
                        .apply(Origin::Store, |s, now| s.compact(now, rev));
                }
            }
        });
        CompactionTask(task)
    }

    /// One call over this client's link: the request's way to the store, `apply` there if
    /// it arrived, and the reply's way back. A request or reply that vanishes (a partition,
    /// a lost reply) fails the call once the request timeout, counted from the send, has
    /// passed: a read or a renewal with `Unavailable`, a write with `Indeterminate` (it may
    /// have applied). A write or a renewal goes on to the store if its caller stops waiting
    /// for it, as a request already on the wire does.
    async fn call<T: Send + 'static>(
        &self,
        operation: &'static str,
        kind: Call,
        apply: impl FnOnce(&SimStore) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let sent = Instant::now();
        let arrived = if kind == Call::Read {
            self.deliver(operation, apply).await
        } else {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let this = self.clone();
            tokio::spawn(async move {
                let _ = tx.send(this.deliver(operation, apply).await);
            });
            rx.await.unwrap_or(Delivery::Lost)
        };
        match arrived {
            Delivery::Refused(e) => return Err(e),
            Delivery::Applied(result) => {
                // Between the store applying a request and its caller learning of it, let
                // other tasks run when a simulation explores schedules.
                coord_api::sync::explore::point().await;
                let base = self.shared.config.latency;
                if self.link.reply(base, kind == Call::Write).await == Leg::Delivered {
                    return result;
                }
            }
            Delivery::Lost => {}
        }
        tokio::time::sleep_until(sent + self.shared.config.request_timeout).await;
        let write = kind == Call::Write;
        let source = format!(
            "no reply within {:?} (the simulated link lost the {})",
            self.shared.config.request_timeout,
            if write {
                "request or its reply; it may have applied"
            } else {
                "request or its reply"
            }
        )
        .into();
        Err(if write {
            coord_api::Error::Indeterminate {
                backend: "sim",
                operation,
                source,
            }
        } else {
            coord_api::Error::Unavailable {
                backend: "sim",
                operation,
                source,
            }
        })
    }

    /// A request's way to the store, and its application there if it arrives.
    async fn deliver<T>(
        &self,
        operation: &'static str,
        apply: impl FnOnce(&SimStore) -> Result<T>,
    ) -> Delivery<T> {
        if self.link.request(self.shared.config.latency).await == Leg::Lost {
            return Delivery::Lost;
        }
        if self.is_down() {
            return Delivery::Refused(coord_api::Error::Unavailable {
                backend: "sim",
                operation,
                source: "the simulated store is down (connection refused)".into(),
            });
        }
        Delivery::Applied(apply(self))
    }

    /// Fault: partitions this client from the store, both ways, until [`repair`]: requests
    /// and replies vanish, so every call through this handle (and its clones) fails after
    /// [`SimConfig::request_timeout`] having changed nothing (unless the request got across
    /// before), and its watch streams deliver nothing, then end with `StreamClosed` once the
    /// link is repaired (the connection died). The store, its leases' clocks and other clients
    /// go on.
    ///
    /// [`repair`]: Self::repair
    pub fn partition(&self) {
        self.link.update(|s| s.cut = true);
    }

    /// Repairs [`partition`](Self::partition).
    pub fn repair(&self) {
        self.link.update(|s| s.cut = false);
    }

    /// Fault: a one-way partition, store to client, until [`repair_oneway`]: requests still
    /// reach the store and apply, but replies vanish, so each call fails after
    /// [`SimConfig::request_timeout`] (writes with `Indeterminate`), renewals renew the lease
    /// without the client learning it, and watch streams stall, then end once repaired.
    ///
    /// [`repair_oneway`]: Self::repair_oneway
    pub fn partition_oneway(&self) {
        self.link.update(|s| s.deaf = true);
    }

    /// Repairs [`partition_oneway`](Self::partition_oneway).
    pub fn repair_oneway(&self) {
        self.link.update(|s| s.deaf = false);
    }

    /// Fault: holds every message of this client, both ways (calls, their replies, renewals,
    /// watch deliveries), until [`release`](Self::release); then they all go through, nothing
    /// lost (turmoil's hold).
    pub fn hold(&self) {
        self.link.update(|s| s.held = true);
    }

    /// Releases [`hold`](Self::hold).
    pub fn release(&self) {
        self.link.update(|s| s.held = false);
    }

    /// Fault: every request of this client (and its clones) takes `latency` more to reach the
    /// store, on top of [`SimConfig::latency`]; other clients are not slowed.
    pub fn set_latency(&self, latency: Duration) {
        self.link.set_latency(latency);
    }

    /// Fault: every reply to this client, and every watch delivery, takes `latency` more to
    /// come back, on top of [`SimConfig::latency`]: requests apply on time, their callers
    /// learn of it late (a slow but successful reply).
    pub fn set_reply_latency(&self, latency: Duration) {
        self.link.set_reply_latency(latency);
    }

    fn origin(&self) -> Origin {
        Origin::Client(self.link.id)
    }

    /// Runs one operation on the state as this client.
    fn apply<T>(&self, op: impl FnOnce(&mut State, Instant) -> T) -> T {
        self.shared.apply(self.origin(), op)
    }

    /// The configuration the store runs with.
    pub fn config(&self) -> &SimConfig {
        &self.shared.config
    }

    /// The current revision, read without going through the trait (no validation, no await).
    pub fn revision(&self) -> Revision {
        self.shared.lock().state.revision()
    }

    /// The compaction point (0 before any compaction).
    pub fn compact_revision(&self) -> Revision {
        self.shared.lock().state.compact_revision()
    }

    /// Fault: ends every open keep-alive channel and watch stream, as a lost connection or an
    /// etcd leader change does. Each channel fails its next renewal with `StreamClosed` (the
    /// lease itself lives on), each watch yields `StreamClosed` and ends. New channels and
    /// watches work as before.
    pub fn close_streams(&self) {
        self.shared.stream_epoch.fetch_add(1, Ordering::SeqCst);
        let mut inner = self.shared.lock();
        let sinks = std::mem::take(&mut inner.sinks);
        for (id, tx) in sinks {
            inner.state.cancel_watch(id);
            let _ = tx.send(Err(coord_api::Error::StreamClosed {
                stream: "watch",
                source: Some("the simulator closed every stream".into()),
            }));
        }
    }

    fn limits_ref(&self) -> &Limits {
        &self.shared.config.limits
    }
}

/// The store's own clock work, as etcd's server loops do it: expires leases at their
/// deadlines (so delete events appear without anyone calling the store), and catches up
/// watches that started in the past on a fixed cadence. It holds the store weakly and ends
/// when the store is gone.
async fn background(shared: Weak<Shared>, wake: Arc<Notify>) {
    let epoch = Instant::now();
    loop {
        let Some((deadline, sync_at)) = shared.upgrade().map(|s| {
            if s.down.load(Ordering::SeqCst) {
                // Crashed: nothing expires until the restart wakes us.
                return (None, None);
            }
            let inner = s.lock();
            let sync_at = inner
                .state
                .has_unsynced_watchers()
                .then(|| next_tick(epoch, Instant::now(), s.config.watch_sync_interval));
            (inner.state.next_deadline(), sync_at)
        }) else {
            return;
        };
        let next = match (deadline, sync_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        // `notify_one` leaves a permit when nobody waits, so a grant or a watch registered
        // between the read above and the wait below still wakes us.
        match next {
            Some(at) => {
                tokio::select! {
                    biased;
                    _ = wake.notified() => {}
                    _ = tokio::time::sleep_until(at) => {}
                }
            }
            None => wake.notified().await,
        }
        let Some(strong) = shared.upgrade() else {
            return;
        };
        if strong.down.load(Ordering::SeqCst) {
            continue;
        }
        strong.apply(Origin::Store, |state, now| {
            state.expire(now);
            // Sync on the cadence's ticks only, like etcd's loop, not whenever we woke.
            if sync_at.is_some_and(|at| now >= at) {
                state.sync_watchers(now);
            }
        });
    }
}

/// The first tick of the cadence `epoch + k * every` strictly after `now`.
fn next_tick(epoch: Instant, now: Instant, every: Duration) -> Instant {
    let every_ns = every.as_nanos().max(1);
    let k = (now - epoch).as_nanos() / every_ns + 1;
    epoch + Duration::from_nanos((k * every_ns) as u64)
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Lets the expiry task see that the store is gone.
        self.deadlines_changed.notify_one();
    }
}

#[async_trait]
impl KvLeaseStore for SimStore {
    fn backend(&self) -> &'static str {
        "sim"
    }

    fn limits(&self) -> Limits {
        self.limits_ref().clone()
    }

    fn shared(&self) -> Arc<DynKvLeaseStore> {
        // The same client (same connection), as the trait asks.
        Arc::new(self.clone())
    }

    async fn get(&self, req: GetRequest) -> Result<GetResponse> {
        validate::get(&req)?;
        self.call("get", Call::Read, move |c| {
            c.apply(|s, now| s.get(now, &req))
        })
        .await
    }

    async fn put(&self, req: PutRequest) -> Result<PutResponse> {
        validate::put(&req, self.limits_ref())?;
        self.call("put", Call::Write, move |c| {
            c.apply(|s, now| s.put(now, &req))
        })
        .await
    }

    async fn delete(&self, req: DeleteRequest) -> Result<DeleteResponse> {
        validate::delete(&req)?;
        self.call("delete", Call::Write, move |c| {
            c.apply(|s, now| s.delete(now, &req))
        })
        .await
    }

    async fn txn(&self, req: TxnRequest) -> Result<TxnResponse> {
        validate::txn(&req, self.limits_ref())?;
        self.call("txn", Call::Write, move |c| {
            c.apply(|s, now| s.txn(now, &req))
        })
        .await
    }

    async fn grant(&self, ttl: Duration) -> Result<LeaseGrant> {
        validate::ttl(ttl, self.limits_ref())?;
        let ttl = validate::granted_ttl(ttl, self.limits_ref());
        self.call("grant", Call::Write, move |c| {
            let grant = c.apply(|s, now| s.grant(now, ttl));
            c.shared.deadlines_changed.notify_one();
            Ok(grant)
        })
        .await
    }

    async fn revoke(&self, lease: LeaseId) -> Result<Revision> {
        self.call("revoke", Call::Write, move |c| {
            c.apply(|s, now| s.revoke(now, lease))
        })
        .await
    }

    async fn time_to_live(&self, lease: LeaseId) -> Result<LeaseTimeToLive> {
        self.call("time-to-live", Call::Read, move |c| {
            c.apply(|s, now| s.time_to_live(now, lease))
        })
        .await
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<Box<dyn KeepAlive>> {
        Ok(Box::new(SimKeepAlive {
            epoch: self.shared.stream_epoch.load(Ordering::SeqCst),
            generation: self.link.state().generation,
            client: self.clone(),
            lease,
        }))
    }

    async fn watch(&self, req: WatchRequest) -> Result<WatchStream> {
        validate::watch(&req)?;
        // A confirmation that never comes back drops the stream, which cancels the watch.
        self.call("watch", Call::Read, move |c| {
            let generation = c.link.state().generation;
            let (tx, rx) = mpsc::unbounded_channel();
            let id = {
                let mut inner = c.shared.lock();
                let id = inner.state.watch(Instant::now(), &req);
                inner.sinks.insert(id, tx);
                Shared::deliver(&mut inner);
                id
            };
            // It may need catching up: let the background task see it.
            c.shared.deadlines_changed.notify_one();
            let progress = req
                .progress_notify
                .then_some(c.limits_ref().progress_notify_interval);
            let link = StreamLink {
                link: c.link.clone(),
                generation,
                latency: c.shared.config.latency,
            };
            Ok(watch_stream(c.shared.clone(), id, rx, progress, link))
        })
        .await
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        self.call("compact", Call::Write, move |c| {
            c.apply(|s, now| s.compact(now, revision))
        })
        .await
    }
}

/// Periodic compaction started by [`SimStore::compact_every`]; dropping it stops it.
#[derive(Debug)]
pub struct CompactionTask(tokio::task::JoinHandle<()>);

impl Drop for CompactionTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Cancels the watch when its stream is dropped.
struct WatchGuard {
    shared: Weak<Shared>,
    id: WatchId,
}

impl Drop for WatchGuard {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.upgrade() {
            let mut inner = shared.lock();
            inner.sinks.remove(&self.id);
            inner.state.cancel_watch(self.id);
        }
    }
}

/// The link a watch stream was opened over, the connection it was opened on, and the
/// store's base latency each delivery takes.
struct StreamLink {
    link: Arc<Link>,
    generation: u64,
    latency: Duration,
}

fn link_broken() -> coord_api::Error {
    coord_api::Error::StreamClosed {
        stream: "watch",
        source: Some("the simulated connection broke".into()),
    }
}

fn watch_stream(
    shared: Arc<Shared>,
    id: WatchId,
    mut rx: mpsc::UnboundedReceiver<Result<WatchResponse>>,
    progress: Option<Duration>,
    link: StreamLink,
) -> WatchStream {
    let guard = WatchGuard {
        shared: Arc::downgrade(&shared),
        id,
    };
    drop(shared);
    async_stream::stream! {
        let guard = guard;
        // Like etcd, notify progress only after a whole interval without events.
        let mut next_tick = progress.map(|every| Instant::now() + every);
        let mut sent_since_tick = false;
        let mut link_rx = link.link.subscribe();
        loop {
            let tick = async {
                match next_tick {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                // A fault on the link: the stream stalls while it lasts, and dies with the
                // connection if the connection broke.
                changed = link_rx.changed() => {
                    if changed.is_err() || link.link.wait_flowing(link.generation).await.is_err() {
                        yield Err(link_broken());
                        break;
                    }
                }
                item = rx.recv() => match item {
                    Some(item) => {
                        let delay = link.latency + link.link.reply_latency();
                        if !delay.is_zero() {
                            tokio::time::sleep(delay).await;
                        }
                        if link.link.wait_flowing(link.generation).await.is_err() {
                            yield Err(link_broken());
                            break;
                        }
                        let end = item.is_err();
                        sent_since_tick = true;
                        yield item;
                        if end { break; }
                    }
                    None => break,
                },
                _ = tick => {
                    let every = progress.expect("ticks only with progress");
                    next_tick = Some(Instant::now() + every);
                    if std::mem::take(&mut sent_since_tick) {
                        continue;
                    }
                    if link.link.wait_flowing(link.generation).await.is_err() {
                        yield Err(link_broken());
                        break;
                    }
                    let Some(shared) = guard.shared.upgrade() else { break };
                    // Read the revision under the lock that deliveries are sent under: if
                    // nothing is queued for us now, every event up to it has been delivered.
                    let revision = {
                        let inner = shared.lock();
                        rx.is_empty().then(|| inner.state.revision())
                    };
                    if let Some(revision) = revision {
                        yield Ok(WatchResponse::new(revision, Vec::new()));
                    }
                }
            }
        }
    }
    .boxed()
}

/// A keep-alive channel on a [`SimStore`]: each renewal is one call into the state machine.
#[derive(Debug)]
struct SimKeepAlive {
    /// The client that opened the channel: its link's faults apply to renewals.
    client: SimStore,
    lease: LeaseId,
    epoch: u64,
    /// The client's connection it was opened on.
    generation: u64,
}

#[async_trait]
impl KeepAlive for SimKeepAlive {
    fn lease(&self) -> LeaseId {
        self.lease
    }

    async fn renew(&mut self) -> Result<Duration> {
        // A stream whose connection broke (or that the store closed) fails at once; a
        // renewal on a live one crosses the link like any call.
        if self.client.shared.stream_epoch.load(Ordering::SeqCst) != self.epoch
            || self.client.link.state().generation != self.generation
        {
            return Err(coord_api::Error::StreamClosed {
                stream: "keep-alive",
                source: Some("the simulated stream was closed".into()),
            });
        }
        let lease = self.lease;
        self.client
            .call("keep-alive", Call::Renew, move |c| {
                let (r, earlier) = c.apply(|s, now| {
                    let before = s.next_deadline();
                    let r = s.renew(now, lease);
                    (r, s.next_deadline() < before)
                });
                // A renewal can move the earliest deadline earlier too: after a leader
                // change refreshed the lease to TTL + election timeout, a renewal sets it
                // back to now + TTL, as etcd's does. Only then does the expiry task need
                // waking (waking it on every renewal costs a scan of every watch, per
                // renewal).
                if earlier {
                    c.shared.deadlines_changed.notify_one();
                }
                r
            })
            .await
    }
}

impl From<SimStore> for Arc<DynKvLeaseStore> {
    fn from(store: SimStore) -> Self {
        Arc::new(store)
    }
}
