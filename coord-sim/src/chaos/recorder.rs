//! Appends to a run's history, stamping each record with the simulated time.

use std::sync::{Arc, Mutex};

use tokio::time::Instant;

use super::history::{Happening, History, Record};

/// A shared handle on the history being written. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Recorder {
    start: Instant,
    history: Arc<Mutex<History>>,
}

impl Recorder {
    pub(crate) fn new(start: Instant) -> Self {
        Recorder {
            start,
            history: Arc::default(),
        }
    }

    /// Records `what` as happening now.
    pub(crate) fn log(&self, what: Happening) {
        self.log_at(Instant::now(), what);
    }

    /// Records `what` as happening at `at`.
    pub(crate) fn log_at(&self, at: Instant, what: Happening) {
        let at = at.saturating_duration_since(self.start);
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
