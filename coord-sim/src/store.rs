//! [`SimStore`]: the state machine served in-process, on `tokio::time`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use async_trait::async_trait;
use coord_api::{
    validate, DeleteRequest, DeleteResponse, DynKvLeaseStore, GetRequest, GetResponse, KeepAlive,
    KvLeaseStore, LeaseGrant, LeaseId, LeaseTimeToLive, Limits, PutRequest, PutResponse, Result,
    TxnRequest, TxnResponse, WatchRequest, WatchResponse, WatchStream,
};
use futures::StreamExt;
use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;

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
    /// Fault: every call waits this long before it reaches the store (a round trip), so
    /// operations take time and interleave as they do over a network. Zero by default.
    pub latency: Duration,
    /// Reproduce etcd 3.4's etcd#19179: a watch from the compaction revision misses the
    /// deletes made at that revision. On by default (the project runs etcd 3.4); turn it off
    /// to model an etcd that has the fix.
    pub compaction_drops_deletes_at_point: bool,
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

    /// Make every call take `latency` before it reaches the store.
    pub fn with_latency(mut self, latency: Duration) -> Self {
        self.latency = latency;
        self
    }

    /// Catch up watches that start in the past this often.
    pub fn with_watch_sync_interval(mut self, every: Duration) -> Self {
        self.watch_sync_interval = every;
        self
    }

    /// Send idle watches a progress notification this often.
    pub fn with_progress_notify_interval(mut self, every: Duration) -> Self {
        self.limits.progress_notify_interval = every;
        self
    }
}

type Sender = mpsc::UnboundedSender<Result<WatchResponse>>;

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
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves the state as consistent as any single
        // operation leaves it; later callers may carry on.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs one operation on the state and delivers what it queued, under one lock so that
    /// deliveries keep commit order.
    fn apply<T>(&self, op: impl FnOnce(&mut State, Instant) -> T) -> T {
        let mut inner = self.lock();
        let out = op(&mut inner.state, Instant::now());
        Self::deliver(&mut inner);
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

/// One client's connection to the store, and the faults set on it.
#[derive(Debug, Default)]
struct Link {
    /// Cut off: every call fails with `Unavailable`.
    cut: AtomicBool,
    /// How many of the client's next writes lose their reply.
    lost_replies: AtomicU32,
    /// Extra time every call of the client takes, in nanoseconds.
    latency_ns: AtomicU64,
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
        });
        tokio::spawn(background(
            Arc::downgrade(&shared),
            shared.deadlines_changed.clone(),
        ));
        SimStore {
            shared,
            link: Arc::default(),
        }
    }

    /// Another client of the same store, with its own connection: cutting one client off
    /// ([`set_cut_off`](Self::set_cut_off)) leaves the others connected.
    pub fn connect(&self) -> SimStore {
        SimStore {
            shared: self.shared.clone(),
            link: Arc::default(),
        }
    }

    /// Fault: the next `count` writes of this client (put, delete, txn, grant, revoke,
    /// compact) are applied, but their replies are lost: each returns `Indeterminate`, as a
    /// request that timed out after reaching etcd does.
    pub fn lose_replies(&self, count: u32) {
        self.link.lost_replies.store(count, Ordering::SeqCst);
    }

    /// Fault: an etcd leader change. Every keep-alive channel and watch stream ends (as
    /// [`close_streams`](Self::close_streams)), and every lease is refreshed to its full TTL
    /// plus `election_timeout` from now, as etcd's new leader does (so a crashed client's
    /// lease outlives its TTL: etcd#9395).
    pub fn leader_change(&self, election_timeout: Duration) {
        self.close_streams();
        self.shared.apply(|s, now| s.promote(now, election_timeout));
        self.shared.deadlines_changed.notify_one();
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
                if rev > store.compact_revision() {
                    let _ = store.shared.apply(|s, now| s.compact(now, rev));
                }
            }
        });
        CompactionTask(task)
    }

    /// Applies a write's loss of reply, if one is due: the write happened, the caller learns
    /// nothing.
    fn reply<T>(&self, operation: &'static str, result: Result<T>) -> Result<T> {
        let lose = self
            .link
            .lost_replies
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if lose {
            return Err(coord_api::Error::Indeterminate {
                backend: "sim",
                operation,
                source: "the simulator lost the reply (the write was applied)".into(),
            });
        }
        result
    }

    /// Fault: cuts this client off from the store (or reconnects it). While cut off, every
    /// call and renewal through this handle (and its clones) fails with `Unavailable` and
    /// changes nothing; the store, its leases' clocks and other clients go on.
    pub fn set_cut_off(&self, cut: bool) {
        self.link.cut.store(cut, Ordering::SeqCst);
    }

    /// Fault: every call of this client (and its clones) takes `latency` more before it
    /// reaches the store, on top of [`SimConfig::latency`]; other clients are not slowed.
    pub fn set_latency(&self, latency: Duration) {
        let ns = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        self.link.latency_ns.store(ns, Ordering::SeqCst);
    }

    /// The way to the store: the call's latency, then the link's state.
    async fn travel(&self, operation: &'static str) -> Result<()> {
        let latency = self.shared.config.latency
            + Duration::from_nanos(self.link.latency_ns.load(Ordering::SeqCst));
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        if self.link.cut.load(Ordering::SeqCst) {
            return Err(coord_api::Error::Unavailable {
                backend: "sim",
                operation,
                source: "this client is cut off from the simulated store".into(),
            });
        }
        Ok(())
    }

    /// The configuration the store runs with.
    pub fn config(&self) -> &SimConfig {
        &self.shared.config
    }

    /// The current revision, read without going through the trait (no validation, no await).
    pub fn revision(&self) -> i64 {
        self.shared.lock().state.revision()
    }

    /// The compaction point (0 before any compaction).
    pub fn compact_revision(&self) -> i64 {
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
        strong.apply(|state, now| {
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
        self.travel("get").await?;
        validate::get(&req)?;
        self.shared.apply(|s, now| s.get(now, &req))
    }

    async fn put(&self, req: PutRequest) -> Result<PutResponse> {
        self.travel("put").await?;
        validate::put(&req, self.limits_ref())?;
        self.reply("put", self.shared.apply(|s, now| s.put(now, &req)))
    }

    async fn delete(&self, req: DeleteRequest) -> Result<DeleteResponse> {
        self.travel("delete").await?;
        validate::delete(&req)?;
        self.reply("delete", self.shared.apply(|s, now| s.delete(now, &req)))
    }

    async fn txn(&self, req: TxnRequest) -> Result<TxnResponse> {
        self.travel("txn").await?;
        validate::txn(&req, self.limits_ref())?;
        self.reply("txn", self.shared.apply(|s, now| s.txn(now, &req)))
    }

    async fn grant(&self, ttl: Duration) -> Result<LeaseGrant> {
        self.travel("grant").await?;
        validate::ttl(ttl, self.limits_ref())?;
        let ttl = validate::granted_ttl(ttl, self.limits_ref());
        let grant = self.shared.apply(|s, now| s.grant(now, ttl));
        self.shared.deadlines_changed.notify_one();
        self.reply("grant", Ok(grant))
    }

    async fn revoke(&self, lease: LeaseId) -> Result<i64> {
        self.travel("revoke").await?;
        self.reply("revoke", self.shared.apply(|s, now| s.revoke(now, lease)))
    }

    async fn time_to_live(&self, lease: LeaseId) -> Result<LeaseTimeToLive> {
        self.travel("time-to-live").await?;
        self.shared.apply(|s, now| s.time_to_live(now, lease))
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<Box<dyn KeepAlive>> {
        Ok(Box::new(SimKeepAlive {
            epoch: self.shared.stream_epoch.load(Ordering::SeqCst),
            client: self.clone(),
            lease,
        }))
    }

    async fn watch(&self, req: WatchRequest) -> Result<WatchStream> {
        self.travel("watch").await?;
        validate::watch(&req)?;
        let (tx, rx) = mpsc::unbounded_channel();
        let id = {
            let mut inner = self.shared.lock();
            let id = inner.state.watch(Instant::now(), &req);
            inner.sinks.insert(id, tx);
            Shared::deliver(&mut inner);
            id
        };
        // It may need catching up: let the background task see it.
        self.shared.deadlines_changed.notify_one();
        let progress = req
            .progress_notify
            .then_some(self.limits_ref().progress_notify_interval);
        Ok(watch_stream(self.shared.clone(), id, rx, progress))
    }

    async fn compact(&self, revision: i64) -> Result<()> {
        self.travel("compact").await?;
        self.reply(
            "compact",
            self.shared.apply(|s, now| s.compact(now, revision)),
        )
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

fn watch_stream(
    shared: Arc<Shared>,
    id: WatchId,
    mut rx: mpsc::UnboundedReceiver<Result<WatchResponse>>,
    progress: Option<Duration>,
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
        loop {
            let tick = async {
                match next_tick {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                item = rx.recv() => match item {
                    Some(item) => {
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
                    let Some(shared) = guard.shared.upgrade() else { break };
                    // Read the revision under the lock that deliveries are sent under: if
                    // nothing is queued for us now, every event up to it has been delivered.
                    let revision = {
                        let inner = shared.lock();
                        rx.is_empty().then(|| inner.state.revision())
                    };
                    if let Some(revision) = revision {
                        yield Ok(WatchResponse { revision, events: Vec::new() });
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
}

#[async_trait]
impl KeepAlive for SimKeepAlive {
    fn lease(&self) -> LeaseId {
        self.lease
    }

    async fn renew(&mut self) -> Result<Duration> {
        self.client.travel("keep-alive").await?;
        let shared = &self.client.shared;
        if shared.stream_epoch.load(Ordering::SeqCst) != self.epoch {
            return Err(coord_api::Error::StreamClosed {
                stream: "keep-alive",
                source: Some("the simulator closed every stream".into()),
            });
        }
        // A renewal only moves a deadline later; the expiry task re-reads the earliest
        // deadline whenever it wakes, so it needs no nudge.
        shared.apply(|s, now| s.renew(now, self.lease))
    }
}

impl From<SimStore> for Arc<DynKvLeaseStore> {
    fn from(store: SimStore) -> Self {
        Arc::new(store)
    }
}
