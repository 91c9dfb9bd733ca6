//! The one shape of a recipe's background task: spawned with a cancellation token (or, when
//! it has nothing to clean up, to be aborted), cancelled when its owner is dropped, stopped
//! (cancelled, then awaited) by the owner's `stop`.

use std::future::Future;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// A recipe's background task; see the module docs.
#[derive(Debug)]
pub(crate) struct Task {
    /// `None` for a task stopped by aborting it (see [`Task::spawn_abortable`]).
    cancel: Option<CancellationToken>,
    handle: Option<JoinHandle<()>>,
}

impl Task {
    /// Spawns `run` in `span`, handing it the token that cancels it.
    pub(crate) fn spawn<F>(span: tracing::Span, run: impl FnOnce(CancellationToken) -> F) -> Task
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let cancel = CancellationToken::new();
        let handle = tokio::spawn(run(cancel.clone()).instrument(span));
        Task {
            cancel: Some(cancel),
            handle: Some(handle),
        }
    }

    /// Spawns `run` in `span`, to be stopped by dropping it where it waits: for a task with
    /// nothing to do when stopped but stop. It polls no token: each look at one takes two
    /// locks on lines of their own, and a session's renewer, woken twice a renewal, looked
    /// four times a renewal (tokens and waiter lists were a tenth of a thousand-host
    /// simulation's wall time).
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
            (Some(cancel), _) => cancel.cancel(),
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
