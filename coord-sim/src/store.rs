//! [`SimStore`]: the state machine served in-process, on `tokio::time`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use coord_api::{
    elections, validate, Bytes, DeleteRequest, DeleteResponse, DynKvLeaseStore, GetRequest,
    GetResponse, KeepAlive, KeyValue, KvLeaseStore, LeaderKey, LeaderStream, LeaseGrant, LeaseId,
    LeaseTimeToLive, Limits, PutRequest, PutResponse, Result, Revision, TxnRequest, TxnResponse,
    WatchRequest, WatchResponse, WatchStream,
};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::arrivals::{land, Arrival, Arrivals};
use crate::clock::background;
use crate::config::SimConfig;
use crate::journal::{Entry, Origin};
use crate::keepalive::SimKeepAlive;
use crate::link::{Leg, Link};
use crate::mailbox::{mailbox, Post};
use crate::state::{State, WatchId};
use crate::watch::{watch_stream, StreamLink};

/// Where one open watch's deliveries go: its stream's mailbox, and the way back to the
/// client they take first.
#[derive(Debug)]
pub(crate) struct Sink {
    tx: Post,
    /// The link the stream was opened over. Each delivery comes into the mailbox the store's
    /// base latency plus the link's reply latency after it was sent, on the store's arrival
    /// queue, so that the stream's task wakes once for it rather than twice (the delivery,
    /// then a timer). In send order: a delivery never overtakes one sent before it, whatever
    /// the link's latency did meanwhile.
    link: Arc<Link>,
    latency: Duration,
    /// When the last delivery sent comes into the mailbox.
    last: Option<Instant>,
}

impl Sink {
    /// Sends `item` on its way; false when the stream is gone.
    pub(crate) fn send(
        &mut self,
        arrivals: &crate::arrivals::Arrivals,
        item: Result<WatchResponse>,
    ) -> bool {
        if self.tx.is_closed() {
            return false;
        }
        let now = coord_api::hooks::clock::now();
        let at = now + self.latency + self.link.reply_latency();
        let at = self.last.map_or(at, |last| last.max(at));
        // Straight into the mailbox only when nothing sent before may still be on its way:
        // one due at `now` itself may not have landed yet, and must not be overtaken.
        if at <= now && !self.in_flight(now) {
            return self.tx.send(item);
        }
        self.last = Some(at);
        let tx = self.tx.clone();
        arrivals.push(
            at,
            Arrival::Boxed(Box::new(move |_| {
                tx.send(item);
            })),
        );
        true
    }

    /// Whether a delivery sent may still be on its way at `now`: one due at `now` itself
    /// may not have landed yet (the landing task runs at that instant too, before or after
    /// the caller).
    pub(crate) fn in_flight(&self, now: Instant) -> bool {
        self.last.is_some_and(|last| last >= now)
    }
}

/// What a call does at the store, which decides its fate when its caller stops waiting and
/// when its reply is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Call {
    /// Changes nothing: not applied once its caller stopped waiting.
    Read,
    /// A write: goes on without its caller; may lose its reply to `lose_replies`.
    Write,
    /// A lease renewal: goes on without its caller.
    Renew,
}

/// Where a request got to.
pub(crate) enum Delivery<T> {
    Applied(Result<T>),
    Lost,
    Refused(coord_api::Error),
}

/// What came back to the caller.
#[derive(Debug)]
pub(crate) enum Answer<T> {
    Replied(Result<T>),
    /// The request or its reply: the caller waits out its timeout.
    Lost,
    Refused(coord_api::Error),
}

impl<T> Answer<T> {
    /// What the caller gets of `result` once its reply took the way back `leg`.
    pub(crate) fn over(leg: Leg, result: Result<T>) -> Self {
        match leg {
            Leg::Delivered => Answer::Replied(result),
            Leg::Lost => Answer::Lost,
        }
    }
}

/// Receives the store's journal (see [`SimStore::on_journal`]).
pub(crate) struct JournalSink(Box<dyn Fn(Instant, Entry) + Send + Sync>);

impl std::fmt::Debug for JournalSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JournalSink")
    }
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) state: State,
    /// Where each open watch's deliveries go.
    pub(crate) sinks: BTreeMap<WatchId, Sink>,
    /// The state's outbox and journal of the operation before, emptied, for the next.
    spare_outbox: Vec<crate::state::Delivery>,
    spare_journal: Vec<Entry>,
}

#[derive(Debug)]
pub(crate) struct Shared {
    /// Bumped by [`SimStore::close_streams`]; a keep-alive channel opened under an older
    /// epoch is dead.
    pub(crate) stream_epoch: AtomicU64,
    // A std mutex, not tokio's: nothing awaits while holding it (the state machine is
    // synchronous), so the cheaper lock is also the correct one.
    pub(crate) inner: Mutex<Inner>,
    /// Wakes the expiry task when a lease deadline may have moved earlier.
    pub(crate) deadlines_changed: Arc<Notify>,
    /// The writes on their way here, and their replies on the way back.
    pub(crate) arrivals: Arc<Arrivals>,
    pub(crate) config: SimConfig,
    /// The next client id for [`SimStore::connect`].
    pub(crate) next_client: AtomicU64,
    /// Crashed: nothing answers and no lease expires, until [`SimStore::restart`].
    pub(crate) down: AtomicBool,
    pub(crate) journal: Mutex<Option<JournalSink>>,
    /// Set when the store is served from several turmoil hosts: the instant (on the clock
    /// of the host that set it) at which the simulation started. See [`Shared::now`].
    #[cfg(feature = "grpc")]
    pub(crate) origin: Mutex<Option<Instant>>,
    /// Set with `origin`, read without its lock.
    #[cfg(feature = "grpc")]
    pub(crate) counts_in_simulated_time: AtomicBool,
}

impl Shared {
    /// The store's clock. Each turmoil host runs its own runtime, whose `Instant`s start from
    /// a base of their own, so a store served from several hosts counts on one of them: the
    /// origin's host's, as simulated time since the start (the same on every host).
    pub(crate) fn now(&self) -> Instant {
        // The flag first: every call reads the clock, and only a store served from several
        // turmoil hosts has an origin to lock and read.
        #[cfg(feature = "grpc")]
        if self.counts_in_simulated_time.load(Ordering::Acquire) {
            if let Some(origin) = *self.origin.lock().unwrap_or_else(|p| p.into_inner()) {
                if let Some(elapsed) = turmoil::sim_elapsed() {
                    return origin + elapsed;
                }
            }
        }
        coord_api::hooks::clock::now()
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves the state as consistent as any single
        // operation leaves it; later callers may carry on.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs one operation for `origin` on the state and delivers what it queued, under one
    /// lock so that deliveries (and the journal) keep commit order.
    pub(crate) fn apply<T>(&self, origin: Origin, op: impl FnOnce(&mut State, Instant) -> T) -> T {
        let mut inner = self.lock();
        let now = self.now();
        inner.state.set_origin(origin);
        let out = op(&mut inner.state, now);
        inner.state.set_origin(Origin::Store);
        self.deliver(&mut inner);
        let spare = std::mem::take(&mut inner.spare_journal);
        let mut entries = inner.state.swap_journal(spare);
        if !entries.is_empty() {
            let sink = self.journal.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(sink) = sink.as_ref() {
                for e in entries.drain(..) {
                    (sink.0)(now, e);
                }
            }
        }
        entries.clear();
        inner.spare_journal = entries;
        out
    }

    /// Sends the state's queued watch responses on their way.
    fn deliver(&self, inner: &mut Inner) {
        let spare = std::mem::take(&mut inner.spare_outbox);
        let mut outbox = inner.state.swap_outbox(spare);
        for d in outbox.drain(..) {
            let end = d.item.is_err();
            let gone = match inner.sinks.get_mut(&d.watch) {
                Some(sink) => !sink.send(&self.arrivals, d.item),
                None => true,
            };
            if end || gone {
                inner.sinks.remove(&d.watch);
                inner.state.cancel_watch(d.watch);
            }
        }
        inner.spare_outbox = outbox;
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
    pub(crate) shared: Arc<Shared>,
    /// This handle's connection to the store; clones share it, [`SimStore::connect`] makes a
    /// new one.
    pub(crate) link: Arc<Link>,
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
                spare_outbox: Vec::new(),
                spare_journal: Vec::new(),
            }),
            deadlines_changed: Arc::new(Notify::new()),
            arrivals: Arc::default(),
            config,
            next_client: AtomicU64::new(1),
            down: AtomicBool::new(false),
            journal: Mutex::new(None),
            #[cfg(feature = "grpc")]
            origin: Mutex::new(None),
            #[cfg(feature = "grpc")]
            counts_in_simulated_time: AtomicBool::new(false),
        });
        tokio::spawn(background(
            Arc::downgrade(&shared),
            shared.deadlines_changed.clone(),
        ));
        tokio::spawn(land(Arc::downgrade(&shared), shared.arrivals.clone()));
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

    /// One call over this client's link: the request's way to the store, `apply` there if
    /// it arrived, and the reply's way back. A request or reply that vanishes (a partition,
    /// a lost reply) fails the call once the request timeout, counted from the send, has
    /// passed: a read or a renewal with `Unavailable`, a write with `Indeterminate` (it may
    /// have applied). A write or a renewal goes on to the store if its caller stops waiting
    /// for it, as a request already on the wire does; a read is not applied then.
    pub(crate) async fn call<T: Send + 'static>(
        &self,
        operation: &'static str,
        kind: Call,
        apply: impl FnOnce(&SimStore) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let sent = coord_api::hooks::clock::now();
        let seq = self.link.send();
        if kind == Call::Write {
            self.link.write_sent();
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        let this = self.clone();
        // Lands the call, unless a hold on calls already sent keeps it on its way.
        let arrive = move |now: Instant| {
            let link = this.link.clone();
            let land = move |now: Instant| {
                let leg = this.link.arrived();
                this.land(leg, operation, kind, apply, tx, now);
            };
            if let Some(land) = link.at_door(seq, land) {
                land(now);
            }
        };
        match self.link.arrival(sent, self.shared.config.latency) {
            // On the wire: it lands at its instant, in send order with every other call to
            // this store, and its reply comes back on the same queue, one wake-up for the
            // caller in all (a read took a timer and a wake-up each way).
            Some(at) => self
                .shared
                .arrivals
                .push(at, Arrival::Boxed(Box::new(arrive))),
            // Held: it waits out the hold on its own, then goes the same way.
            None => {
                let link = self.link.clone();
                let latency = self.shared.config.latency;
                tokio::spawn(async move {
                    link.request(latency).await;
                    arrive(Instant::now());
                });
            }
        }
        let answer = rx.await.unwrap_or(Answer::Lost);
        match answer {
            Answer::Refused(e) => return Err(e),
            Answer::Replied(result) => {
                // Between the caller learning of the outcome and acting on it, let other tasks
                // run when a simulation explores schedules. (A session's renewer has its point
                // there already: one per renewal, the thousand a second at scale.)
                if kind != Call::Renew {
                    coord_api::hooks::explore::point().await;
                }
                return result;
            }
            Answer::Lost => {}
        }
        Err(self.lost(operation, kind, sent).await)
    }

    /// A call sent at `sent` whose request or reply the link lost: its caller waits out the
    /// request timeout, then gets `Indeterminate` for a write (it may have applied), else
    /// `Unavailable`.
    pub(crate) async fn lost(
        &self,
        operation: &'static str,
        kind: Call,
        sent: Instant,
    ) -> coord_api::Error {
        // Boxed: a future is as large as its largest state, and a timer made every call's
        // future hundreds of bytes larger, written afresh a thousand times a simulated second.
        Box::pin(tokio::time::sleep_until(
            sent + self.shared.config.request_timeout,
        ))
        .await;
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
        if write {
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
        }
    }

    /// A request reaching the store `now` over `leg`: applied unless lost or refused, its
    /// outcome sent back. A read whose caller stopped waiting is not applied: it changes
    /// nothing, and nobody waits for its answer.
    fn land<T: Send + 'static>(
        &self,
        leg: Leg,
        operation: &'static str,
        kind: Call,
        apply: impl FnOnce(&SimStore) -> Result<T>,
        tx: tokio::sync::oneshot::Sender<Answer<T>>,
        now: Instant,
    ) {
        if kind == Call::Read && tx.is_closed() {
            return;
        }
        let landed = match leg {
            Leg::Lost => Delivery::Lost,
            Leg::Delivered => self.arrive(operation, apply),
        };
        self.answer(landed, kind, tx, now);
    }

    /// Sends a call's outcome back to its caller, `now` (the instant it landed):
    /// a refusal at once, an applied one over the reply's way (on the arrival queue unless the
    /// link is held), nothing for a lost request.
    fn answer<T: Send + 'static>(
        &self,
        landed: Delivery<T>,
        kind: Call,
        tx: tokio::sync::oneshot::Sender<Answer<T>>,
        now: Instant,
    ) {
        let result = match landed {
            Delivery::Applied(result) => result,
            Delivery::Lost => return,
            Delivery::Refused(e) => {
                let _ = tx.send(Answer::Refused(e));
                return;
            }
        };
        let base = self.shared.config.latency;
        let write = kind == Call::Write;
        let this = self.clone();
        match self.link.reply_arrival(now, base) {
            Some(at) => self.shared.arrivals.push(
                at,
                Arrival::Boxed(Box::new(move |_| this.replied(result, write, tx))),
            ),
            None => {
                tokio::spawn(async move {
                    this.link.reply_way(base).await;
                    this.replied(result, write, tx);
                });
            }
        }
    }

    /// A reply reaching its caller now, unless the link loses it.
    fn replied<T>(
        &self,
        result: Result<T>,
        write: bool,
        tx: tokio::sync::oneshot::Sender<Answer<T>>,
    ) {
        // A reply nobody waits for any more takes no lost reply from the link.
        if tx.is_closed() {
            return;
        }
        let _ = tx.send(Answer::over(self.link.replied(write), result));
    }

    /// A request that reached the store: refused by a crashed store, else applied.
    pub(crate) fn arrive<T>(
        &self,
        operation: &'static str,
        apply: impl FnOnce(&SimStore) -> Result<T>,
    ) -> Delivery<T> {
        if self.is_down() {
            return Delivery::Refused(coord_api::Error::Unavailable {
                backend: "sim",
                operation,
                source: "the simulated store is down (connection refused)".into(),
            });
        }
        Delivery::Applied(apply(self))
    }

    fn origin(&self) -> Origin {
        Origin::Client(self.link.id)
    }

    /// Runs one operation on the state as this client.
    pub(crate) fn apply<T>(&self, op: impl FnOnce(&mut State, Instant) -> T) -> T {
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

    fn limits_ref(&self) -> &Limits {
        &self.shared.config.limits
    }
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
        // A transaction that writes nothing is a read, as `EtcdStore` counts it.
        let kind = if req.writes() {
            Call::Write
        } else {
            Call::Read
        };
        self.call("txn", kind, move |c| c.apply(|s, now| s.txn(now, &req)))
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
        Ok(Box::new(SimKeepAlive::new(
            self.clone(),
            lease,
            self.shared.stream_epoch.load(Ordering::SeqCst),
            self.link.state().generation,
        )))
    }

    async fn watch(&self, req: WatchRequest) -> Result<WatchStream> {
        validate::watch(&req)?;
        // A confirmation that never comes back drops the stream, which cancels the watch.
        self.call("watch", Call::Read, move |c| {
            let generation = c.link.state().generation;
            let (tx, rx) = mailbox();
            let id = {
                let mut inner = c.shared.lock();
                let id = inner.state.watch(c.shared.now(), &req);
                let sink = Sink {
                    tx,
                    link: c.link.clone(),
                    latency: c.shared.config.latency,
                    last: None,
                };
                inner.sinks.insert(id, sink);
                c.shared.deliver(&mut inner);
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

    // No elections of its own: etcd's algorithm on the primitives above.
    async fn campaign(&self, name: &str, value: Bytes, lease: LeaseId) -> Result<LeaderKey> {
        elections::campaign(self, name, value, lease).await
    }

    async fn proclaim(&self, leader: &LeaderKey, value: Bytes) -> Result<()> {
        elections::proclaim(self, leader, value).await
    }

    async fn leader(&self, name: &str) -> Result<KeyValue> {
        elections::leader(self, name).await
    }

    async fn observe(&self, name: &str) -> Result<LeaderStream> {
        elections::observe(self.shared(), name)
    }

    async fn resign(&self, leader: &LeaderKey) -> Result<()> {
        elections::resign(self, leader).await
    }
}

impl From<SimStore> for Arc<DynKvLeaseStore> {
    fn from(store: SimStore) -> Self {
        Arc::new(store)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A delivery sent at the very instant an earlier, slowed one is due must not go straight
    /// into the mailbox: the earlier one may not have landed yet (the landing task runs at that
    /// instant too, before or after the sender). Under turmoil, where everything happens on
    /// 10 ms steps, a watcher saw revision 505 before 493 that way.
    #[tokio::test(start_paused = true)]
    async fn a_delivery_sent_as_an_earlier_one_is_due_waits_behind_it() {
        let (tx, mail) = mailbox();
        let link = Arc::new(Link::new(1));
        let mut sink = Sink {
            tx,
            link: link.clone(),
            latency: Duration::ZERO,
            last: None,
        };
        let arrivals = Arrivals::default();
        let response = |r: i64| Ok(WatchResponse::progress_answer(Revision(r)));
        link.set_reply_latency(Duration::from_millis(500));
        assert!(sink.send(&arrivals, response(1)));
        link.set_reply_latency(Duration::ZERO);
        tokio::time::advance(Duration::from_millis(500)).await;
        // The first is due now and, with no landing task here, has not landed.
        assert!(sink.send(&arrivals, response(2)));
        assert!(mail.is_empty(), "the second overtook the first");
        // Once nothing is on its way, a delivery with no latency goes straight in.
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(sink.send(&arrivals, response(3)));
        assert!(!mail.is_empty());
    }
}
