//! The one shape of a recipe's background task: spawned with a [`Stop`] signal (or, when it
//! has nothing to clean up, to be aborted), signalled when its owner is dropped, stopped
//! (signalled, then awaited) by the owner's `stop`.

use std::future::Future;

use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::sync::Stop;

/// A recipe's background task; see the module docs.
#[derive(Debug)]
pub(crate) struct Task {
    /// `None` for a task stopped by aborting it (see [`Task::spawn_abortable`]).
    cancel: Option<Stop>,
    handle: Option<JoinHandle<()>>,
}

impl Task {
    /// Spawns `run` in `span`, handing it the signal that stops it.
    pub(crate) fn spawn<F>(span: tracing::Span, run: impl FnOnce(Stop) -> F) -> Task
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let cancel = Stop::new();
        let handle = tokio::spawn(run(cancel.clone()).instrument(span));
        Task {
            cancel: Some(cancel),
            handle: Some(handle),
        }
    }

    /// Spawns `run` in `span`, to be stopped by dropping it where it waits: for a task with
    /// nothing to do when stopped but stop. It keeps no stop branch in its selects, which
    /// would be polled at each of its wake-ups (a session's renewer wakes twice a renewal).
    pub(crate) fn spawn_abortable<F>(span: tracing::Span, run: F) -> Task
    where
        F: Future<Output = ()> + Send + 'static,
    {
        Task {
            cancel: None,
            handle: Some(tokio::spawn(run.instrument(span))),
        }
    }

    /// Cancels it without waiting.
    pub(crate) fn cancel(&self) {
        match (&self.cancel, &self.handle) {
            (Some(cancel), _) => cancel.stop(),
            (None, Some(handle)) => handle.abort(),
            (None, None) => {}
        }
    }

    /// Cancels it and waits until it has finished. Idempotent.
    pub(crate) async fn stop(&mut self) {
        self.cancel();
        if let Some(handle) = self.handle.take() {
            let _ = handle.await;
        }
    }
}

impl Drop for Task {
    fn drop(&mut self) {
        self.cancel();
    }
}
