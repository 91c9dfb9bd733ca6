//! What every handle of one simulated store shares: the state machine behind its lock, the
//! watches' sinks, the clock, and how a call's request and reply cross the link.

use super::*;

/// Where one open watch's deliveries go: its stream's mailbox, and the way back to the
/// client they take first.
#[derive(Debug)]
pub(crate) struct Sink {
    pub(super) tx: Post,
    /// The link the stream was opened over. Each delivery comes into the mailbox the store's
    /// base latency plus the link's reply latency after it was sent, on the store's arrival
    /// queue, so that the stream's task wakes once for it rather than twice (the delivery,
    /// then a timer). In send order: a delivery never overtakes one sent before it, whatever
    /// the link's latency did meanwhile.
    pub(super) link: Arc<Link>,
    pub(super) latency: Duration,
    /// When the last delivery sent comes into the mailbox.
    pub(super) last: Option<Instant>,
}

impl Sink {
    /// Sends `item` on its way, `now` by the store's clock ([`Shared::now`]); false when
    /// the stream is gone.
    pub(crate) fn send(
        &mut self,
        arrivals: &crate::arrivals::Arrivals,
        item: Result<WatchResponse>,
        now: Instant,
    ) -> bool {
        if self.tx.is_closed() {
            return false;
        }
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
pub(crate) struct JournalSink(pub(super) Box<dyn Fn(Instant, Entry) + Send + Sync>);

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
    pub(super) spare_outbox: Vec<crate::state::Delivery>,
    pub(super) spare_journal: Vec<Entry>,
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
    /// origin's host's, as simulated time since the start (the same on every host). Whatever
    /// the store queues or compares (a request's arrival, a reply's, a delivery's) is stamped
    /// by it, on whichever host the caller runs: a host's own reading differs from it by the
    /// real time between the two runtimes' starts, which a loaded machine stretches to
    /// milliseconds, and a seed replayed in one process then parted from its first run
    /// (`a_turmoil_seed_replays_exactly`, seed 77: three grants landed 7 ms later).
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

    /// `at`, by the store's clock, on the calling host's runtime clock: for a timer there.
    pub(crate) fn local(&self, at: Instant) -> Instant {
        let (store, host) = (self.now(), coord_api::hooks::clock::now());
        if at >= store {
            host + (at - store)
        } else {
            host - (store - at)
        }
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
    pub(super) fn deliver(&self, inner: &mut Inner) {
        let spare = std::mem::take(&mut inner.spare_outbox);
        let mut outbox = inner.state.swap_outbox(spare);
        let now = self.now();
        for d in outbox.drain(..) {
            let end = d.item.is_err();
            let gone = match inner.sinks.get_mut(&d.watch) {
                Some(sink) => !sink.send(&self.arrivals, d.item, now),
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
