//! Appends to a run's history, stamping each record with the simulated time.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::history::{Happening, History, Incarnation, Record};

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
    /// Incarnations that crashed: a crashed process does nothing more, and what its dropped
    /// tasks would say is not recorded. (It also could not be replayed: a crashed turmoil
    /// host drops its tasks in an order drawn from tokio's process-wide task ids.)
    crashed: Arc<Mutex<BTreeSet<Incarnation>>>,
}

impl Recorder {
    /// Stamps records with the time since `start` on the current runtime's clock.
    pub(crate) fn new(start: Instant) -> Self {
        Recorder {
            clock: Clock::Tokio(start),
            history: Arc::default(),
            crashed: Arc::default(),
        }
    }

    /// A recorder for a history written outside the simulator (a test on a real store, in
    /// real time): records are stamped with the time since now.
    pub fn starting_now() -> Self {
        Recorder::new(Instant::now())
    }

    /// A copy of the history so far, in the order it was recorded.
    pub fn history(&self) -> History {
        self.history
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Stamps records with turmoil's simulated time.
    #[cfg(feature = "turmoil")]
    pub(crate) fn turmoil(tick: Duration) -> Self {
        let history = History {
            resolution: tick,
            ..History::default()
        };
        Recorder {
            clock: Clock::Turmoil,
            history: Arc::new(Mutex::new(history)),
            crashed: Arc::default(),
        }
    }

    /// Records `what` as happening now.
    pub fn record(&self, what: Happening) {
        self.record_at(coord_api::hooks::clock::now(), what);
    }

    /// Records `what` as happening at `at` (on the current runtime's clock).
    pub fn record_at(&self, at: Instant, what: Happening) {
        let at = match self.clock {
            Clock::Tokio(start) => at.saturating_duration_since(start),
            #[cfg(feature = "turmoil")]
            Clock::Turmoil => turmoil::sim_elapsed().unwrap_or_default(),
        };
        self.push(at, what);
    }

    /// Records `what` on behalf of incarnation `who`, unless `who` has crashed.
    pub(crate) fn record_by(&self, who: Incarnation, what: Happening) {
        if !self.has_crashed(who) {
            self.record(what);
        }
    }

    /// Marks `who` crashed: from now on, nothing it says is recorded. Call it before the
    /// process's tasks are dropped.
    pub(crate) fn mute(&self, who: Incarnation) {
        self.crashed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(who);
    }

    fn has_crashed(&self, who: Incarnation) -> bool {
        self.crashed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&who)
    }

    /// Records `what` at `at` from the start of the run (for a driver outside the runtime).
    #[cfg(feature = "turmoil")]
    pub(crate) fn record_elapsed(&self, at: Duration, what: Happening) {
        self.push(at, what);
    }

    /// Makes room for `records` more without growing the history again: a growing history
    /// copies itself whole at each doubling, tens of megabytes at 1,000 hosts, through fresh
    /// memory, in the middle of the run. Room reserved and never written costs address space
    /// only.
    pub(crate) fn reserve(&self, records: usize) {
        self.history
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .records
            .reserve(records);
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
        let mut h = self.history.lock().unwrap_or_else(|p| p.into_inner());
        History {
            records: std::mem::take(&mut h.records),
            resolution: h.resolution,
        }
    }
}
