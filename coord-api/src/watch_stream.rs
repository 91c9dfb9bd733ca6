//! [`WatchStream`]: the batches one watch delivers, and the progress requests it carries.

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::stream::{BoxStream, Stream, StreamExt};

use crate::error::Result;
use crate::request::WatchResponse;

/// Sends one progress request on a watch's connection; see [`WatchStream::request_progress`].
type RequestProgress = Arc<dyn Fn() -> Result<()> + Send + Sync>;

/// The batches of one watch, in revision order; see [`KvLeaseStore::watch`].
///
/// Besides the batches, a watch can be asked whether it is still alive:
/// [`request_progress`](Self::request_progress) makes the store answer on the stream at once,
/// with its current revision, even when nothing under the watch changed. A stream that leaves
/// such a request unanswered is stuck (its member stopped, its connection went silent), which
/// a quiet stream that answers is not.
///
/// Dropping the stream cancels the watch.
///
/// [`KvLeaseStore::watch`]: crate::KvLeaseStore::watch
pub struct WatchStream {
    batches: BoxStream<'static, Result<WatchResponse>>,
    request_progress: RequestProgress,
}

impl WatchStream {
    /// A stream of `batches` whose progress requests `request_progress` sends (for backends).
    ///
    /// `request_progress` must not wait: it hands the request to whatever drives the stream
    /// (which runs while the stream is polled) and returns
    /// [`StreamClosed`](crate::Error::StreamClosed) once the stream has ended.
    pub fn new(
        batches: impl Stream<Item = Result<WatchResponse>> + Send + 'static,
        request_progress: impl Fn() -> Result<()> + Send + Sync + 'static,
    ) -> Self {
        WatchStream {
            batches: batches.boxed(),
            request_progress: Arc::new(request_progress),
        }
    }

    /// Asks the store for a progress answer: a batch with no events for which
    /// [`WatchResponse::is_progress_answer`] holds, whose revision is the store's when it
    /// answered. It comes while the stream is polled, however quiet the watch is.
    ///
    /// The answer says the stream is alive, not that every event up to its revision has been
    /// delivered: etcd 3.4 sends it ahead of events already queued for the watch (see
    /// `docs/ETCD-BEHAVIOUR.md`), so a consumer must not advance its resume point on it.
    ///
    /// # Errors
    /// [`StreamClosed`](crate::Error::StreamClosed) when the stream has ended.
    pub fn request_progress(&self) -> Result<()> {
        (self.request_progress)()
    }

    /// The same watch with `f` applied to every item; progress requests still reach it (for
    /// wrappers such as [`Namespaced`](crate::Namespaced)).
    pub fn map_items(
        self,
        f: impl FnMut(Result<WatchResponse>) -> Result<WatchResponse> + Send + 'static,
    ) -> Self {
        WatchStream {
            batches: self.batches.map(f).boxed(),
            request_progress: self.request_progress,
        }
    }
}

impl Stream for WatchStream {
    type Item = Result<WatchResponse>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.batches.poll_next_unpin(cx)
    }
}

impl fmt::Debug for WatchStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WatchStream").finish_non_exhaustive()
    }
}
