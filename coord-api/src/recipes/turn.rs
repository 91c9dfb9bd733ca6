//! [`KeyTurn`]: one key's turn among the writers of one lease, and the clean-up of it still
//! pending in the background, which the next writer calls off.
//!
//! Two writers on the same lease (two campaigns of a session in one election; two
//! registrations of one key on a host session) write the same key, and no compare in the
//! store tells their writes apart. So each write and each clean-up attempt takes the key's
//! turn, and a clean-up retried in the background (a withdrawal, a removal) is called off by
//! the next writer: it must not land after that writer's write.

use std::sync::{Arc, Mutex};

use crate::elections::limbo::Fences;
use crate::sync::Stop;

/// One key's turn; see the module docs.
#[derive(Debug, Default)]
pub(crate) struct KeyTurn {
    /// Held by each write and each clean-up attempt. It carries the versions the key's
    /// fences stand at (see `crate::elections::limbo`), which only the holder reads or
    /// changes.
    pub(crate) turn: Arc<tokio::sync::Mutex<Fences>>,
    /// The signal of the clean-up still pending, if any.
    pending: Mutex<Option<Stop>>,
}

impl KeyTurn {
    /// A clean-up to retry in the background: the signal that calls it off (an older one
    /// pending is called off now).
    pub(crate) fn pending_cleanup(&self) -> Stop {
        let stop = Stop::new();
        if let Some(old) = self.lock().replace(stop.clone()) {
            old.stop();
        }
        stop
    }

    /// A writer takes the key over: the clean-up still pending is called off. True when one
    /// was: the key (if it stands) is then the writer's to clean up.
    pub(crate) fn call_off_cleanup(&self) -> bool {
        match self.lock().take() {
            Some(old) => {
                old.stop();
                true
            }
            None => false,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Stop>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }
}
