//! A stop signal: set once, waited on by any number of tasks, and cheap to wait on again.
//!
//! It does what a cancellation token without children does for the recipes' tasks, at a
//! price that matters when a thousand simulated hosts each keep a stop branch in their
//! select loops: a task polls its stop branch at every wake-up, whatever woke it. Asking
//! whether a `Stop` is set is one atomic load, and a wait that is already registered for the
//! same task is polled again by that load and a comparison with the waker it kept, with no
//! lock taken (a token's wait takes two locks each time). Waiters wake in the order they
//! started waiting, first in first out, as tokio's `Notify` wakes them, so a simulation
//! replays from its seed.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use coord_api::sync::Stop;
//! let stop = Stop::new();
//! let task = tokio::spawn({
//!     let stop = stop.clone();
//!     async move {
//!         stop.stopped().await;
//!         "stopped"
//!     }
//! });
//! stop.stop();
//! assert!(stop.is_stopped());
//! assert_eq!(task.await.unwrap(), "stopped");
//! # }
//! ```

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use super::waiters::{Registration, Waiters};

/// A stop signal, set once and waited on by any number of tasks; clones share it.
#[derive(Clone, Default)]
pub struct Stop {
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    stopped: AtomicBool,
    waiters: Mutex<Waiters>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Waiters> {
        // Nothing panics while holding it; the map is whole.
        self.waiters.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl std::fmt::Debug for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stop")
            .field("stopped", &self.is_stopped())
            .finish()
    }
}

impl Stop {
    /// A signal not yet set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the signal and wakes every wait, in the order they started waiting. Idempotent.
    pub fn stop(&self) {
        if self.shared.stopped.swap(true, Ordering::AcqRel) {
            return;
        }
        // Set before the lock is taken: a wait that registers after this finds it set under
        // the lock, and one that registered before is in the map taken here.
        let wakers = self.shared.lock().take();
        for waker in wakers {
            waker.wake();
        }
    }

    /// Whether the signal is set.
    pub fn is_stopped(&self) -> bool {
        self.shared.stopped.load(Ordering::Acquire)
    }

    /// Completes once the signal is set (at once if it is).
    pub fn stopped(&self) -> Stopped<'_> {
        Stopped {
            shared: &self.shared,
            registered: Registration::default(),
        }
    }
}

/// The future of [`Stop::stopped`].
#[must_use = "futures do nothing unless polled"]
pub struct Stopped<'a> {
    shared: &'a Shared,
    registered: Registration,
}

impl Future for Stopped<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        if this.shared.stopped.load(Ordering::Acquire) {
            return Poll::Ready(());
        }
        if this.registered.wakes(cx.waker()) {
            return Poll::Pending;
        }
        let mut waiters = this.shared.lock();
        // Checked again under the lock: `stop` sets it before taking the lock.
        if this.shared.stopped.load(Ordering::Acquire) {
            return Poll::Ready(());
        }
        waiters.register(&mut this.registered, cx.waker());
        Poll::Pending
    }
}

impl Drop for Stopped<'_> {
    fn drop(&mut self) {
        // Once the signal is set the list is taken (or being taken) whole: nothing to remove.
        if self.registered.is_registered() && !self.shared.stopped.load(Ordering::Acquire) {
            self.shared.lock().remove(&mut self.registered);
        }
    }
}

impl std::fmt::Debug for Stopped<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stopped")
            .field("registered", &self.registered.is_registered())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex as StdMutex;

    #[tokio::test(flavor = "current_thread")]
    async fn a_set_signal_completes_a_wait_at_once() {
        let stop = Stop::new();
        stop.stop();
        stop.stop();
        stop.stopped().await;
        assert!(stop.is_stopped());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn waits_wake_in_the_order_they_started_waiting() {
        let stop = Stop::new();
        let order = Arc::new(StdMutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..5 {
            let (stop, order) = (stop.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                stop.stopped().await;
                order.lock().unwrap().push(i);
            }));
            // Each registers before the next is spawned.
            tokio::task::yield_now().await;
        }
        // One wait given up before the stop leaves no waker behind to wake.
        let dropped = stop.clone();
        let gone = tokio::spawn(async move { dropped.stopped().await });
        tokio::task::yield_now().await;
        gone.abort();
        let _ = gone.await;
        assert_eq!(stop.shared.lock().len(), 5);
        stop.stop();
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3, 4]);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_wait_polled_by_another_waker_wakes_the_last() {
        let stop = Stop::new();
        let task = tokio::spawn({
            let stop = stop.clone();
            async move {
                let mut wait = std::pin::pin!(stop.stopped());
                // Polled first with a waker that wakes nothing, then by this task.
                let noop = futures::task::noop_waker();
                let first = wait.as_mut().poll(&mut Context::from_waker(&noop));
                assert!(first.is_pending());
                wait.await;
            }
        });
        tokio::task::yield_now().await;
        assert_eq!(stop.shared.lock().len(), 1, "re-registered in place");
        stop.stop();
        tokio::time::timeout(std::time::Duration::from_secs(5), task)
            .await
            .expect("the task was woken")
            .unwrap();
    }
}
