//! Appends to a run's history, stamping each record with the simulated time.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::history::{Happening, History, Record};

/// Where simulated time comes from.
#[derive(Debug, Clone, Copy)]
enum Clock {
    /// One runtime's paused clock, from this instant.
    Tokio(Instant),
    /// turmoil's global clock (each host has its own runtime, and so its own `Instant`s).
    #[cfg(feature = "turmoil")]
    Turmoil,
}

/// A shared handle on the history being written; every node of a run writes to the same one.
/// Cheap to clone.
#[derive(Debug, Clone)]
pub struct Recorder {
    clock: Clock,
    history: Arc<Mutex<History>>,
}

impl Recorder {
    /// Stamps records with the time since `start` on the current runtime's clock.
    pub(crate) fn new(start: Instant) -> Self {
        Recorder {
            clock: Clock::Tokio(start),
            history: Arc::default(),
        }
    }

    /// Stamps records with turmoil's simulated time.
    #[cfg(feature = "turmoil")]
    pub(crate) fn turmoil() -> Self {
        Recorder {
            clock: Clock::Turmoil,
            history: Arc::default(),
        }
    }

    /// Records `what` as happening now.
    pub fn record(&self, what: Happening) {
        self.record_at(Instant::now(), what);
    }

    /// Records `what` as happening at `at` (on the current runtime's clock).
    pub(crate) fn record_at(&self, at: Instant, what: Happening) {
        let at = match self.clock {
            Clock::Tokio(start) => at.saturating_duration_since(start),
            #[cfg(feature = "turmoil")]
            Clock::Turmoil => turmoil::sim_elapsed().unwrap_or_default(),
        };
        self.push(at, what);
    }

    /// Records `what` at `at` from the start of the run (for a driver outside the runtime).
    #[cfg(feature = "turmoil")]
    pub(crate) fn record_elapsed(&self, at: Duration, what: Happening) {
        self.push(at, what);
    }

    fn push(&self, at: Duration, what: Happening) {
        self.history
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .records
            .push(Record { at, what });
    }

    /// The history so far.
    pub(crate) fn take(&self) -> History {
        std::mem::take(&mut *self.history.lock().unwrap_or_else(|p| p.into_inner()))
    }
}
