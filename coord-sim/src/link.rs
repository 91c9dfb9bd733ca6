//! One client's connection to a [`SimStore`](crate::SimStore), and the network faults set on
//! it. A call crosses it twice: the request on its way to the store, the reply on its way
//! back. Each leg takes its latency and can stall (held) or vanish (partitioned both ways;
//! one way, only replies vanish), as turmoil's links do.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use coord_api::sync::watch;
use tokio::time::Instant;

/// The link's fault state; streams and calls wait on its changes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct LinkState {
    /// Partitioned both ways: requests and replies vanish; streams stall, then die.
    pub(crate) cut: bool,
    /// Partitioned one way, store to client: requests arrive and apply, replies vanish;
    /// streams stall, then die.
    pub(crate) deaf: bool,
    /// Every message stalls until released; nothing is lost.
    pub(crate) held: bool,
    /// Bumped whenever the connection breaks (cut or deaf): streams opened before are dead.
    pub(crate) generation: u64,
}

impl LinkState {
    /// Whether a stream can deliver now.
    pub(crate) fn flowing(&self) -> bool {
        !self.cut && !self.deaf && !self.held
    }

    /// As one word: the generation above three flags.
    fn pack(&self) -> u64 {
        self.generation << 3
            | u64::from(self.held) << 2
            | u64::from(self.deaf) << 1
            | u64::from(self.cut)
    }

    fn unpack(word: u64) -> Self {
        LinkState {
            cut: word & 1 != 0,
            deaf: word & 2 != 0,
            held: word & 4 != 0,
            generation: word >> 3,
        }
    }
}

/// Whether a message got across.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Leg {
    Delivered,
    Lost,
}

/// A call held on its way: it lands when called with the instant it lands at.
pub(crate) type Landing = Box<dyn FnOnce(Instant) + Send>;

/// A client's link. Clones of a `SimStore` handle share it.
pub(crate) struct Link {
    /// Unique within the store; the journal names clients by it.
    pub(crate) id: u64,
    state: watch::Sender<LinkState>,
    /// The state as one word, written with the watch's value: every leg of every call
    /// reads the state, and this keeps those reads on the link's own line of memory (the
    /// watch's value is behind a lock in an allocation of its own, a second cold line for
    /// each leg of each of a thousand sessions' renewals).
    word: AtomicU64,
    /// How many of the client's next writes lose their reply.
    lost_replies: AtomicU32,
    /// Extra time each request takes to reach the store, in nanoseconds.
    latency_ns: AtomicU64,
    /// Extra time each reply (and stream delivery) takes to come back, in nanoseconds.
    reply_latency_ns: AtomicU64,
    /// How many calls the client has sent; each call's number is its place in that count.
    sent: AtomicU64,
    /// Calls numbered up to this one that have not landed stay on their way (0: none); see
    /// [`SimStore::hold_sent`](crate::SimStore::hold_sent).
    held_through: AtomicU64,
    /// The calls stopped by `held_through` as they arrived, in arrival order.
    parked: Mutex<Vec<Landing>>,
    /// Whether `next_write` holds a callback: read on every write, locked only when set.
    armed: AtomicBool,
    /// Called as the client's next write is sent, before it leaves; see
    /// [`SimStore::on_next_write`](crate::SimStore::on_next_write).
    next_write: Mutex<Option<NextWrite>>,
}

/// What runs as a client's next write is sent.
pub(crate) type NextWrite = Box<dyn FnOnce() + Send>;

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("id", &self.id)
            .field("state", &self.state())
            .finish_non_exhaustive()
    }
}

impl Link {
    pub(crate) fn new(id: u64) -> Self {
        Link {
            id,
            state: watch::Sender::new(LinkState::default()),
            word: AtomicU64::new(LinkState::default().pack()),
            lost_replies: AtomicU32::new(0),
            latency_ns: AtomicU64::new(0),
            reply_latency_ns: AtomicU64::new(0),
            sent: AtomicU64::new(0),
            held_through: AtomicU64::new(0),
            parked: Mutex::new(Vec::new()),
            armed: AtomicBool::new(false),
            next_write: Mutex::new(None),
        }
    }

    /// Sets (or, with `None`, calls off) what runs as the next write is sent.
    pub(crate) fn on_next_write(&self, then: Option<NextWrite>) {
        let mut next = self.next_write.lock().unwrap_or_else(|p| p.into_inner());
        self.armed.store(then.is_some(), Ordering::SeqCst);
        *next = then;
    }

    /// A write is being sent (it has not left yet): runs what waited for it.
    pub(crate) fn write_sent(&self) {
        if !self.armed.load(Ordering::Relaxed) {
            return;
        }
        let then = {
            let mut next = self.next_write.lock().unwrap_or_else(|p| p.into_inner());
            self.armed.store(false, Ordering::SeqCst);
            next.take()
        };
        if let Some(then) = then {
            then();
        }
    }

    /// Numbers a call as it is sent.
    pub(crate) fn send(&self) -> u64 {
        self.sent.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Holds every call sent so far that has not landed: each stays on its way when it
    /// arrives, until [`release_sent`](Self::release_sent); calls sent later pass.
    pub(crate) fn hold_sent(&self) {
        // Under the lock, as `at_door` reads it.
        let _parked = self.parked();
        self.held_through
            .store(self.sent.load(Ordering::SeqCst), Ordering::SeqCst);
    }

    /// Ends [`hold_sent`](Self::hold_sent): the calls it stopped, in the order they arrived.
    pub(crate) fn release_sent(&self) -> Vec<Landing> {
        let mut parked = self.parked();
        self.held_through.store(0, Ordering::SeqCst);
        std::mem::take(&mut *parked)
    }

    /// Call `seq` arriving: `None` when it is held (kept, to land on release), else `land`
    /// back to land now. The check and the keeping are one step under the lock, so a call
    /// is never kept after its release.
    pub(crate) fn at_door<L: FnOnce(Instant) + Send + 'static>(
        &self,
        seq: u64,
        land: L,
    ) -> Option<L> {
        // Every call passes here: no lock unless a hold is set.
        if self.held_through.load(Ordering::SeqCst) < seq {
            return Some(land);
        }
        let mut parked = self.parked();
        if self.held_through.load(Ordering::SeqCst) < seq {
            return Some(land);
        }
        parked.push(Box::new(land));
        None
    }

    fn parked(&self) -> MutexGuard<'_, Vec<Landing>> {
        // Nothing runs under the lock but the list's own bookkeeping.
        self.parked.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn state(&self) -> LinkState {
        LinkState::unpack(self.word.load(Ordering::SeqCst))
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<LinkState> {
        self.state.subscribe()
    }

    /// Changes the fault state; entering a cut or deaf state breaks the connection.
    pub(crate) fn update(&self, change: impl FnOnce(&mut LinkState)) {
        self.state.send_if_modified(|s| {
            let before = *s;
            change(s);
            if !(before.cut || before.deaf) && (s.cut || s.deaf) {
                s.generation += 1;
            }
            self.word.store(s.pack(), Ordering::SeqCst);
            *s != before
        });
    }

    pub(crate) fn set_lost_replies(&self, count: u32) {
        self.lost_replies.store(count, Ordering::SeqCst);
    }

    pub(crate) fn set_latency(&self, latency: Duration) {
        self.latency_ns.store(nanos(latency), Ordering::SeqCst);
    }

    pub(crate) fn set_reply_latency(&self, latency: Duration) {
        self.reply_latency_ns
            .store(nanos(latency), Ordering::SeqCst);
    }

    /// Waits while the link is held.
    async fn pass_hold(&self) {
        // Every request and reply passes here: no receiver unless there is a hold to wait out.
        if !self.state().held {
            return;
        }
        let mut rx = self.subscribe();
        // The sender lives as long as the link, which outlives this call.
        let _ = rx.wait_for(|s| !s.held).await;
    }

    /// The request's way to the store: held while the link is, then `base` plus the client's
    /// latency. Lost when the link is cut as it arrives.
    pub(crate) async fn request(&self, base: Duration) -> Leg {
        self.pass_hold().await;
        let latency = self.request_latency(base);
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        self.arrived()
    }

    /// A request reaching the store now: lost when the link is cut.
    pub(crate) fn arrived(&self) -> Leg {
        if self.state().cut {
            Leg::Lost
        } else {
            Leg::Delivered
        }
    }

    /// When a request sent at `sent` (now: the caller's reading of the clock) reaches the
    /// store, as [`request`](Self::request) would take it there; `None` while the link is
    /// held (the request waits for the hold first). Whether it is lost is for
    /// [`arrived`](Self::arrived) to tell then.
    pub(crate) fn arrival(&self, sent: Instant, base: Duration) -> Option<Instant> {
        (!self.state().held).then(|| sent + self.request_latency(base))
    }

    fn request_latency(&self, base: Duration) -> Duration {
        base + Duration::from_nanos(self.latency_ns.load(Ordering::SeqCst))
    }

    /// The reply's way back up to its arrival: held while the link is, then `base` plus the
    /// client's reply latency.
    pub(crate) async fn reply_way(&self, base: Duration) {
        self.pass_hold().await;
        let latency = base + self.reply_latency();
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
    }

    /// When a reply sent at `now` (the caller's reading of the clock) reaches the client, as
    /// [`reply_way`](Self::reply_way) would take it there; `None` while the link is held.
    /// Whether it is lost is for [`replied`](Self::replied) to tell then.
    pub(crate) fn reply_arrival(&self, now: Instant, base: Duration) -> Option<Instant> {
        (!self.state().held).then(|| now + base + self.reply_latency())
    }

    /// A reply reaching the client now: lost when the link is cut or deaf, or when a lost
    /// reply is due (writes only).
    pub(crate) fn replied(&self, write: bool) -> Leg {
        let s = self.state();
        if s.cut || s.deaf || (write && self.take_lost_reply()) {
            Leg::Lost
        } else {
            Leg::Delivered
        }
    }

    /// How long a stream delivery takes on top of the store's base latency.
    pub(crate) fn reply_latency(&self) -> Duration {
        Duration::from_nanos(self.reply_latency_ns.load(Ordering::SeqCst))
    }

    /// Takes one lost reply, if one is due.
    fn take_lost_reply(&self) -> bool {
        self.lost_replies
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }

    /// Waits until a stream opened under `generation` may deliver: `Ok` when it can, `Err`
    /// when its connection broke meanwhile (it must end with `StreamClosed`). A broken stream
    /// stalls until the link flows again and only then dies, as a TCP connection across a
    /// partition does: its client learns of it when it is replaced.
    pub(crate) async fn wait_flowing(&self, generation: u64) -> std::result::Result<(), ()> {
        // Every stream delivery passes here: no receiver unless there is a fault to wait out.
        let now = self.state();
        if now.flowing() {
            return if now.generation == generation {
                Ok(())
            } else {
                Err(())
            };
        }
        let mut rx = self.subscribe();
        match rx.wait_for(LinkState::flowing).await {
            Ok(s) if s.generation == generation => Ok(()),
            _ => Err(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_word_holds_every_state_the_watch_does() {
        let link = Link::new(7);
        for generation in [0, 1, 2, 41, 1 << 40] {
            for flags in 0..8u8 {
                let want = LinkState {
                    cut: flags & 1 != 0,
                    deaf: flags & 2 != 0,
                    held: flags & 4 != 0,
                    generation,
                };
                assert_eq!(LinkState::unpack(want.pack()), want);
            }
        }
        // Through the link's own changes: a cut breaks the connection.
        link.update(|s| s.held = true);
        assert_eq!(link.state(), link.state.get());
        link.update(|s| s.cut = true);
        assert_eq!(link.state(), link.state.get());
        assert_eq!(link.state().generation, 1);
        link.update(|s| *s = LinkState::default());
        assert_eq!(link.state(), link.state.get());
    }
}
