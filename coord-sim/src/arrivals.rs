//! Writes on their way to the store, and their replies on the way back: each write lands at
//! its arrival instant whether or not its caller still waits, as a request already on the
//! wire does, and its reply reaches the caller at its own.
//!
//! One queue per store, ordered by arrival instant and then by send order, and one task that
//! lands each arrival when its instant comes: a thousand simulated clients renewing and
//! writing cost a queue entry each way, not a task and a timer each.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::store::Shared;

/// What lands: the request's application at the store (or its loss), with the reply sent
/// to whoever still waits for it.
pub(crate) type Arrival = Box<dyn FnOnce() + Send>;

/// The writes in flight to one store. See the module docs.
#[derive(Default)]
pub(crate) struct Arrivals {
    queue: Mutex<Queue>,
    /// Wakes the landing task when an arrival earlier than all others is queued.
    wake: Notify,
}

#[derive(Default)]
struct Queue {
    /// Earliest first: by arrival instant, then by send order.
    due: BinaryHeap<Reverse<Queued>>,
    sent: u64,
}

/// One arrival, ordered by when it lands.
struct Queued {
    at: Instant,
    seq: u64,
    arrival: Arrival,
}

impl PartialEq for Queued {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Queued {}

impl PartialOrd for Queued {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Queued {
    fn cmp(&self, other: &Self) -> Ordering {
        // Send order is unique, so no two arrivals are equal.
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
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
            q.sent += 1;
            let seq = q.sent;
            q.due.push(Reverse(Queued { at, seq, arrival }));
            q.due.peek().is_some_and(|first| first.0.seq == seq)
        };
        if earliest {
            // `notify_one` leaves a permit when the task is not waiting yet, so an arrival
            // queued between its look at the queue and its wait still wakes it.
            self.wake.notify_one();
        }
    }

    fn next(&self) -> Option<Instant> {
        self.lock().due.peek().map(|first| first.0.at)
    }

    /// Takes the first arrival due at `now`, if any.
    fn take_due(&self, now: Instant) -> Option<Arrival> {
        let mut q = self.lock();
        if q.due.peek()?.0.at > now {
            return None;
        }
        q.due.pop().map(|first| first.0.arrival)
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
        while let Some(arrival) = arrivals.take_due(Instant::now()) {
            arrival();
        }
    }
}
