//! A single-value channel whose receivers wake in a fixed order.
//!
//! It does what `tokio::sync::watch` does for the recipes (one value, many readers, each
//! told when it changed), with one difference that matters in simulation: tokio puts each
//! waiter of a watch channel in one of eight wait lists chosen by a random generator that only
//! `--cfg tokio_unstable` builds can seed, so several tasks waiting on one channel wake in a
//! different order from run to run, and a simulation does not replay from its seed. Here
//! waiters wake in the order they started waiting (tokio's `Notify`, which is first in, first
//! out), so the same inputs give the same interleaving in any build.
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
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

/// The sending half; see the [module docs](self).
pub struct Sender<T> {
    shared: Arc<Shared<T>>,
}

/// A receiving half: reads the value and waits for changes; see the [module docs](self).
/// Cloning gives another receiver that has seen what this one has.
pub struct Receiver<T> {
    shared: Arc<Shared<T>>,
    seen: u64,
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
}

struct Shared<T> {
    slot: Mutex<Slot<T>>,
    changed: Notify,
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
                }),
                changed: Notify::new(),
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
        let modified = {
            let mut slot = self.shared.lock();
            let modified = change(&mut slot.value);
            if modified {
                slot.version += 1;
            }
            modified
        };
        if modified {
            self.shared.changed.notify_waiters();
        }
        modified
    }

    /// A new receiver, which has seen the current value.
    pub fn subscribe(&self) -> Receiver<T> {
        let seen = self.shared.lock().version;
        Receiver {
            shared: self.shared.clone(),
            seen,
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
        self.shared.lock().closed = true;
        self.shared.changed.notify_waiters();
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
        loop {
            // Registered before the check, so that a change between the check and the wait
            // still wakes us.
            let notified = self.shared.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let slot = self.shared.lock();
                if slot.version != self.seen {
                    self.seen = slot.version;
                    return Ok(());
                }
                if slot.closed {
                    return Err(Closed);
                }
            }
            notified.await;
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
