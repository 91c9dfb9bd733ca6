//! Writes on their way to the store, and their replies on the way back: each write lands at
//! its arrival instant whether or not its caller still waits, as a request already on the
//! wire does, and its reply reaches the caller at its own.
//!
//! One queue per store, ordered by arrival instant and then by send order, and one task that
//! lands each arrival when its instant comes: a thousand simulated clients renewing and
//! writing cost a queue entry each way, not a task and a timer each.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::store::Shared;

/// What lands: a request's application at the store (or its loss), with the reply sent on
/// to whoever still waits for it; a reply reaching its caller; a watch response reaching its
/// stream. Each is given the instant it lands at (the clock, read once for the batch).
pub(crate) enum Arrival {
    /// A closure allocated for the one arrival.
    Boxed(Box<dyn FnOnce(Instant) + Send>),
    /// One leg of a call whose state its caller keeps from call to call (a keep-alive
    /// channel's renewals, a thousand a simulated second at scale): nothing allocated for it.
    Kept(Arc<dyn Kept>, u64),
}

/// State kept across calls that lands its own legs. See [`Arrival::Kept`].
pub(crate) trait Kept: Send + Sync {
    /// The leg `step` (as the pusher numbered it) lands `now`.
    fn land(self: Arc<Self>, step: u64, now: Instant);
}

/// The writes in flight to one store. See the module docs.
#[derive(Default)]
pub(crate) struct Arrivals {
    queue: Mutex<Queue>,
    /// Wakes the landing task when an arrival earlier than all others is queued.
    wake: Notify,
}

/// Earliest first: by arrival instant, then by send order. Kept sorted as it is filled:
/// nearly every arrival is sent with the same latency as the ones before it, so it goes at
/// the back, and the first to land is taken from the front, each in constant time (a binary
/// heap paid a sift each way).
#[derive(Default)]
struct Queue {
    due: VecDeque<Queued>,
}

/// One arrival, and when it lands.
struct Queued {
    at: Instant,
    arrival: Arrival,
}

impl Arrivals {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        // Nothing runs under the lock but the queue's own bookkeeping.
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `arrival` to land at `at`.
    pub(crate) fn push(&self, at: Instant, arrival: Arrival) {
        let earliest = {
            let mut q = self.lock();
            // After every arrival due at or before `at`: those sent earlier for the same
            // instant land first.
            let place = if q.due.back().is_none_or(|last| last.at <= at) {
                q.due.len()
            } else {
                q.due.partition_point(|queued| queued.at <= at)
            };
            q.due.insert(place, Queued { at, arrival });
            place == 0
        };
        if earliest {
            // `notify_one` leaves a permit when the task is not waiting yet, so an arrival
            // queued between its look at the queue and its wait still wakes it.
            self.wake.notify_one();
        }
    }

    fn next(&self) -> Option<Instant> {
        self.lock().due.front().map(|first| first.at)
    }

    /// Takes the first arrival due at `now`, if any.
    fn take_due(&self, now: Instant) -> Option<Arrival> {
        let mut q = self.lock();
        if q.due.front()?.at > now {
            return None;
        }
        q.due.pop_front().map(|first| first.arrival)
    }
}

impl std::fmt::Debug for Arrivals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arrivals")
            .field("in_flight", &self.lock().due.len())
            .finish()
    }
}

/// Lands each arrival at its instant, in order, until the store is gone. Each lands outside
/// the queue's lock (landing takes the store's).
pub(crate) async fn land(shared: Weak<Shared>, arrivals: Arc<Arrivals>) {
    loop {
        if shared.strong_count() == 0 {
            return;
        }
        match arrivals.next() {
            Some(at) => {
                tokio::select! {
                    biased;
                    _ = arrivals.wake.notified() => {}
                    _ = tokio::time::sleep_until(at) => {}
                }
            }
            None => arrivals.wake.notified().await,
        }
        // One reading of the clock serves the batch: virtual time stands still while it
        // lands (arrivals it queues for this instant land in it too); in real time, what
        // comes due meanwhile lands on the next turn of the loop.
        let now = coord_api::hooks::clock::now();
        while let Some(arrival) = arrivals.take_due(now) {
            match arrival {
                Arrival::Boxed(land) => land(now),
                Arrival::Kept(kept, step) => kept.land(step, now),
            }
        }
    }
}
