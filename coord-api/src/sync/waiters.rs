//! The wait list [`Stop`](super::Stop) and [`watch`](super::watch) share: wakers in the order
//! their waits registered, each registration kept by its waiter with a copy of its waker, so
//! that polling again from the same task costs no lock.

use std::collections::BTreeMap;
use std::task::Waker;

/// Registered waits, first in first out (as tokio's `Notify` wakes them): a simulation's
/// wake-ups then follow the program, and replay from its seed.
#[derive(Default)]
pub(crate) struct Waiters {
    next: u64,
    wakers: BTreeMap<u64, Waker>,
}

/// A waiter's side of its registration: its place in the order, and the waker it left.
#[derive(Default)]
pub(crate) struct Registration(Option<(u64, Waker)>);

impl Registration {
    /// Whether it is registered with a waker that wakes the same task as `waker`: polled
    /// again by that task, it need not touch the list.
    pub(crate) fn wakes(&self, waker: &Waker) -> bool {
        self.0.as_ref().is_some_and(|(_, w)| w.will_wake(waker))
    }

    /// Whether it was registered (and not since taken out by its waiter).
    pub(crate) fn is_registered(&self) -> bool {
        self.0.is_some()
    }
}

impl Waiters {
    /// Registers `waker` for `r`, keeping `r`'s place when it is still in the list (a wait
    /// that a wake-up took out goes to the back, as a new one).
    pub(crate) fn register(&mut self, r: &mut Registration, waker: &Waker) {
        let id = match &r.0 {
            Some((id, _)) if self.wakers.contains_key(id) => *id,
            _ => {
                self.next += 1;
                self.next
            }
        };
        self.wakers.insert(id, waker.clone());
        r.0 = Some((id, waker.clone()));
    }

    /// Takes `r` out of the list, if it is there (a wake-up may have taken it already).
    pub(crate) fn remove(&mut self, r: &mut Registration) {
        if let Some((id, _)) = r.0.take() {
            self.wakers.remove(&id);
        }
    }

    /// Every registered waker, in order, the list left empty: to wake once the lock is let go.
    pub(crate) fn take(&mut self) -> std::collections::btree_map::IntoValues<u64, Waker> {
        std::mem::take(&mut self.wakers).into_values()
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.wakers.len()
    }
}
