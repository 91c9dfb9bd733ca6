//! The one shape of a recipe's background task: spawned with a cancellation token, cancelled
//! when its owner is dropped, stopped (cancelled, then awaited) by the owner's `stop`.

use std::future::Future;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// A recipe's background task; see the module docs.
#[derive(Debug)]
pub(crate) struct Task {
    cancel: CancellationToken,
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
            cancel,
            handle: Some(handle),
        }
    }

    /// Cancels it without waiting.
    pub(crate) fn cancel(&self) {
        self.cancel.cancel();
    }

    /// Cancels it and waits until it has finished. Idempotent.
    pub(crate) async fn stop(&mut self) {
        self.cancel.cancel();
        if let Some(handle) = self.handle.take() {
            let _ = handle.await;
        }
    }
}

impl Drop for Task {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}
