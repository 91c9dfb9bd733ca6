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

mod contract;
mod shared;

pub(crate) use shared::{Answer, Call, Delivery, Inner, JournalSink, Shared, Sink};

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
        let sent = self.shared.now();
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
                let shared = self.shared.clone();
                tokio::spawn(async move {
                    link.request(latency).await;
                    arrive(shared.now());
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
            self.shared.local(sent + self.shared.config.request_timeout),
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
        assert!(sink.send(&arrivals, response(1), Instant::now()));
        link.set_reply_latency(Duration::ZERO);
        tokio::time::advance(Duration::from_millis(500)).await;
        // The first is due now and, with no landing task here, has not landed.
        assert!(sink.send(&arrivals, response(2), Instant::now()));
        assert!(mail.is_empty(), "the second overtook the first");
        // Once nothing is on its way, a delivery with no latency goes straight in.
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(sink.send(&arrivals, response(3), Instant::now()));
        assert!(!mail.is_empty());
    }
}
