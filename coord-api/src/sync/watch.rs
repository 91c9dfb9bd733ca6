//! A single-value channel whose receivers wake in a fixed order.
//!
//! It does what `tokio::sync::watch` does for the recipes (one value, many readers, each
//! told when it changed), with one difference that matters in simulation: tokio puts each
//! waiter of a watch channel in one of eight wait lists chosen by a random generator that only
//! `--cfg tokio_unstable` builds can seed, so several tasks waiting on one channel wake in a
//! different order from run to run, and a simulation does not replay from its seed. Here
//! waiters wake in the order they started waiting, first in first out, so the same inputs give
//! the same interleaving in any build.
//!
//! A receiver keeps its place in the wait list from one wait to the next, until a change
//! wakes it: a task that waits in a select loop, with a fresh `changed()` each turn, polls it
//! again for a load and a comparison, with no lock taken and no waiter registered and torn
//! down each turn. The price: a task that stopped waiting but keeps the receiver is woken by
//! the next change, once, for nothing.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use coord_api::sync::watch;
//! let (tx, mut rx) = watch::channel(1);
//! tokio::spawn(async move { tx.send_replace(2); });
//! assert_eq!(rx.wait_for(|v| *v == 2).await, Ok(2));
//! # }
//! ```

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use super::waiters::{Registration, Waiters};

/// The sending half; see the [module docs](self).
pub struct Sender<T> {
    shared: Arc<Shared<T>>,
}

/// A receiving half: reads the value and waits for changes; see the [module docs](self).
/// Cloning gives another receiver that has seen what this one has.
pub struct Receiver<T> {
    shared: Arc<Shared<T>>,
    seen: u64,
    registered: Registration,
}

/// Every sender is gone: the value will not change again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Closed;

impl fmt::Display for Closed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the sender is gone")
    }
}

impl std::error::Error for Closed {}

struct Slot<T> {
    value: T,
    /// Bumped by every change; receivers compare it with what they have seen.
    version: u64,
    closed: bool,
    waiters: Waiters,
}

struct Shared<T> {
    slot: Mutex<Slot<T>>,
    /// The slot's version and closed flag, set under its lock, for a receiver polled again
    /// to look at without the lock.
    version: AtomicU64,
    closed: AtomicBool,
}

impl<T> Shared<T> {
    fn lock(&self) -> MutexGuard<'_, Slot<T>> {
        // Nothing panics while holding it but a caller's closure; the value is still whole.
        self.slot.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A channel holding `value`.
pub fn channel<T>(value: T) -> (Sender<T>, Receiver<T>) {
    let tx = Sender::new(value);
    let rx = tx.subscribe();
    (tx, rx)
}

impl<T> Sender<T> {
    /// A channel holding `value`, with no receiver yet.
    pub fn new(value: T) -> Self {
        Sender {
            shared: Arc::new(Shared {
                slot: Mutex::new(Slot {
                    value,
                    version: 0,
                    closed: false,
                    waiters: Waiters::default(),
                }),
                version: AtomicU64::new(0),
                closed: AtomicBool::new(false),
            }),
        }
    }

    /// Replaces the value, telling every receiver; returns the old one.
    pub fn send_replace(&self, value: T) -> T {
        let mut old = None;
        self.send_if_modified(|v| {
            old = Some(std::mem::replace(v, value));
            true
        });
        old.expect("the closure ran")
    }

    /// Changes the value in place, telling every receiver.
    pub fn send_modify(&self, change: impl FnOnce(&mut T)) {
        self.send_if_modified(|v| {
            change(v);
            true
        });
    }

    /// Changes the value in place; receivers are told only if `change` returns true. Returns
    /// what `change` returned.
    pub fn send_if_modified(&self, change: impl FnOnce(&mut T) -> bool) -> bool {
        let mut slot = self.shared.lock();
        if !change(&mut slot.value) {
            return false;
        }
        slot.version += 1;
        self.shared.version.store(slot.version, Ordering::Release);
        let wakers = slot.waiters.take();
        drop(slot);
        wakers.for_each(std::task::Waker::wake);
        true
    }

    /// A new receiver, which has seen the current value.
    pub fn subscribe(&self) -> Receiver<T> {
        let seen = self.shared.lock().version;
        Receiver {
            shared: self.shared.clone(),
            seen,
            registered: Registration::default(),
        }
    }

    /// Reads the value through `f`.
    pub fn with<R>(&self, f: impl FnOnce(&T) -> R) -> R {
        f(&self.shared.lock().value)
    }
}

impl<T: Clone> Sender<T> {
    /// A copy of the value.
    pub fn get(&self) -> T {
        self.with(T::clone)
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let mut slot = self.shared.lock();
        slot.closed = true;
        self.shared.closed.store(true, Ordering::Release);
        let wakers = slot.waiters.take();
        drop(slot);
        wakers.for_each(std::task::Waker::wake);
    }
}

impl<T> Receiver<T> {
    /// Reads the value through `f`, without marking it seen.
    pub fn with<R>(&self, f: impl FnOnce(&T) -> R) -> R {
        f(&self.shared.lock().value)
    }

    /// Whether the value changed since this receiver last marked it seen.
    pub fn has_changed(&self) -> bool {
        self.shared.lock().version != self.seen
    }

    /// Waits until the value changes from what this receiver has seen (at once if it already
    /// has), and marks it seen.
    ///
    /// # Errors
    /// [`Closed`] once every sender is gone and nothing new is left to see.
    pub async fn changed(&mut self) -> Result<(), Closed> {
        std::future::poll_fn(|cx| self.poll_changed(cx)).await
    }

    fn poll_changed(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Closed>> {
        // Polled again by the task it is registered for, with nothing new: no lock. (A change
        // stores the version before it takes the wait list, under the lock: a registration
        // still in the list has seen every change but the ones still to come, which wake it.)
        if self.registered.wakes(cx.waker())
            && self.shared.version.load(Ordering::Acquire) == self.seen
            && !self.shared.closed.load(Ordering::Acquire)
        {
            return Poll::Pending;
        }
        let mut slot = self.shared.lock();
        if slot.version != self.seen {
            self.seen = slot.version;
            slot.waiters.remove(&mut self.registered);
            return Poll::Ready(Ok(()));
        }
        if slot.closed {
            slot.waiters.remove(&mut self.registered);
            return Poll::Ready(Err(Closed));
        }
        slot.waiters.register(&mut self.registered, cx.waker());
        Poll::Pending
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        if self.registered.is_registered() {
            self.shared.lock().waiters.remove(&mut self.registered);
        }
    }
}

impl<T: Clone> Receiver<T> {
    /// A copy of the value, without marking it seen.
    pub fn get(&self) -> T {
        self.with(T::clone)
    }

    /// A copy of the value, marked seen.
    pub fn get_and_update(&mut self) -> T {
        let slot = self.shared.lock();
        self.seen = slot.version;
        slot.value.clone()
    }

    /// Waits until the value satisfies `ready` (at once if it does), and returns that value,
    /// marked seen.
    ///
    /// # Errors
    /// [`Closed`] once every sender is gone and the value never satisfied `ready`.
    pub async fn wait_for(&mut self, mut ready: impl FnMut(&T) -> bool) -> Result<T, Closed> {
        loop {
            let value = self.get_and_update();
            if ready(&value) {
                return Ok(value);
            }
            self.changed().await?;
        }
    }
}

impl<T> Clone for Receiver<T> {
    fn clone(&self) -> Self {
        Receiver {
            shared: self.shared.clone(),
            seen: self.seen,
            // A clone waits on its own.
            registered: Registration::default(),
        }
    }
}

impl<T: fmt::Debug> fmt::Debug for Sender<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.with(|v| f.debug_tuple("Sender").field(v).finish())
    }
}

impl<T: fmt::Debug> fmt::Debug for Receiver<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.with(|v| f.debug_tuple("Receiver").field(v).finish())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn waiters_wake_in_the_order_they_began_to_wait() {
        let (tx, rx) = channel(0u32);
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..16 {
            let (mut rx, order) = (rx.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                rx.changed().await.unwrap();
                order.lock().unwrap().push(i);
            }));
            // Each waiter is waiting before the next one starts.
            tokio::task::yield_now().await;
        }
        tx.send_replace(1);
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), (0..16).collect::<Vec<_>>());
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_receiver_keeps_its_place_between_waits_and_leaves_when_dropped() {
        let (tx, rx) = channel(0u32);
        let order = Arc::new(Mutex::new(Vec::new()));
        let (mut first, mut second, gone) = (rx.clone(), rx.clone(), rx.clone());
        // The first waits once and gives up (its registration stays), then the second
        // waits, then a receiver that is dropped while registered.
        let noop = futures::task::noop_waker();
        let mut cx = Context::from_waker(&noop);
        assert!(first.poll_changed(&mut cx).is_pending());
        let o = order.clone();
        let second = tokio::spawn(async move {
            second.changed().await.unwrap();
            o.lock().unwrap().push("second");
        });
        tokio::task::yield_now().await;
        let mut gone = gone;
        assert!(gone.poll_changed(&mut cx).is_pending());
        assert_eq!(tx.shared.lock().waiters.len(), 3);
        drop(gone);
        assert_eq!(tx.shared.lock().waiters.len(), 2);
        // Waiting again, from a task now, it wakes before the second: it was there first.
        let o = order.clone();
        let first = tokio::spawn(async move {
            first.changed().await.unwrap();
            o.lock().unwrap().push("first");
        });
        tokio::task::yield_now().await;
        assert_eq!(tx.shared.lock().waiters.len(), 2, "re-registered in place");
        tx.send_replace(1);
        first.await.unwrap();
        second.await.unwrap();
        assert_eq!(*order.lock().unwrap(), vec!["first", "second"]);
        assert_eq!(tx.shared.lock().waiters.len(), 0);
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_change_before_the_wait_is_not_missed_and_closing_ends_waits() {
        let (tx, mut rx) = channel(0u32);
        tx.send_modify(|v| *v += 1);
        assert!(rx.has_changed());
        rx.changed().await.unwrap();
        assert_eq!(rx.get(), 1);
        assert!(!tx.send_if_modified(|_| false));
        assert!(!rx.has_changed());
        let waiter = tokio::spawn(async move { rx.changed().await });
        tokio::task::yield_now().await;
        drop(tx);
        assert_eq!(waiter.await.unwrap(), Err(Closed));
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn wait_for_returns_the_first_value_that_satisfies() {
        let (tx, mut rx) = channel(0u32);
        let sender = tokio::spawn(async move {
            for i in 1..=5 {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                tx.send_replace(i);
            }
        });
        assert_eq!(rx.wait_for(|v| *v >= 3).await, Ok(3));
        sender.await.unwrap();
        assert_eq!(rx.wait_for(|v| *v == 9).await, Err(Closed));
    }
}
