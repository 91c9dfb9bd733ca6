//! The one waker a simulated wait keeps (a watch stream's mailbox, a keep-alive channel's
//! renewal): replaced only when another task polls, so that a task polling again clones
//! nothing.

use std::task::Waker;

/// Keeps `waker` in `slot` unless the waker there already wakes the same task.
pub(crate) fn keep(slot: &mut Option<Waker>, waker: &Waker) {
    if !slot.as_ref().is_some_and(|w| w.will_wake(waker)) {
        *slot = Some(waker.clone());
    }
}
