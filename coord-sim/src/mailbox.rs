//! A watch stream's mailbox: the responses the store posts to it (each as it comes off the
//! way back to the client) and its caller's progress requests, behind one lock with one
//! waker.
//!
//! Two unbounded channels did this before. The stream's loop polled both at every turn, each
//! poll taking from the task's cooperative budget and registering its waker, once for every
//! response of thousands of streams; and each watch opened allocated both channels' shared
//! state (cache-padded, so allocated on a stricter alignment) and their first blocks.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Poll, Waker};

use coord_api::{Result, WatchResponse};

/// A new mailbox: the store's end, and the stream's.
pub(crate) fn mailbox() -> (Post, Mailbox) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            responses: VecDeque::new(),
            asks: 0,
            waker: None,
            posts: 1,
            open: true,
        }),
    });
    (
        Post {
            shared: shared.clone(),
        },
        Mailbox { shared },
    )
}

struct Shared {
    state: Mutex<State>,
}

struct State {
    responses: VecDeque<Result<WatchResponse>>,
    /// Progress requests not yet taken.
    asks: usize,
    /// The stream's task, once it waited.
    waker: Option<Waker>,
    /// How many [`Post`]s are left: none, and the stream has had everything.
    posts: usize,
    /// False once the stream is gone.
    open: bool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing runs under the lock but the mailbox's own bookkeeping.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl State {
    fn wake(&self) {
        // By reference: the stream keeps waiting on the same task, and a waker taken would
        // be cloned afresh at its next wait.
        if let Some(w) = &self.waker {
            w.wake_by_ref();
        }
    }
}

/// The store's end: posts responses to the stream. Clones are further ends; once every end
/// is dropped the stream, having read what was posted, ends.
pub(crate) struct Post {
    shared: Arc<Shared>,
}

impl Post {
    /// Posts `response`; false when the stream is gone (the response is dropped).
    pub(crate) fn send(&self, response: Result<WatchResponse>) -> bool {
        let mut state = self.shared.lock();
        if !state.open {
            return false;
        }
        state.responses.push_back(response);
        state.wake();
        true
    }

    /// Whether the stream is gone.
    pub(crate) fn is_closed(&self) -> bool {
        !self.shared.lock().open
    }
}

impl Clone for Post {
    fn clone(&self) -> Self {
        self.shared.lock().posts += 1;
        Post {
            shared: self.shared.clone(),
        }
    }
}

impl Drop for Post {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        state.posts -= 1;
        if state.posts == 0 {
            state.wake();
        }
    }
}

impl std::fmt::Debug for Post {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Post").finish_non_exhaustive()
    }
}

/// The caller's end: asks the stream for a progress answer.
pub(crate) struct Asks {
    shared: Arc<Shared>,
}

impl Asks {
    /// Asks once; an error when the stream is gone.
    pub(crate) fn ask(&self) -> std::result::Result<(), ()> {
        let mut state = self.shared.lock();
        if !state.open {
            return Err(());
        }
        state.asks += 1;
        state.wake();
        Ok(())
    }
}

/// What the stream takes from its mailbox next.
#[derive(Debug)]
pub(crate) enum Mail {
    /// A progress request: before any response still waiting, as the asks channel's branch
    /// came first.
    Ask,
    Response(Result<WatchResponse>),
    /// Every end of the store's is gone and nothing is left.
    Closed,
}

/// The stream's end.
pub(crate) struct Mailbox {
    shared: Arc<Shared>,
}

impl Mailbox {
    /// The end the caller asks for progress with.
    pub(crate) fn asks(&self) -> Asks {
        Asks {
            shared: self.shared.clone(),
        }
    }

    /// Waits for the next piece of mail.
    pub(crate) async fn next(&mut self) -> Mail {
        poll_fn(|cx| {
            let mut state = self.shared.lock();
            if state.asks > 0 {
                state.asks -= 1;
                return Poll::Ready(Mail::Ask);
            }
            if let Some(response) = state.responses.pop_front() {
                return Poll::Ready(Mail::Response(response));
            }
            if state.posts == 0 {
                return Poll::Ready(Mail::Closed);
            }
            crate::waker::keep(&mut state.waker, cx.waker());
            Poll::Pending
        })
        .await
    }

    /// Whether no response waits to be read.
    pub(crate) fn is_empty(&self) -> bool {
        self.shared.lock().responses.is_empty()
    }
}

impl Drop for Mailbox {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        state.open = false;
        state.waker = None;
        // What was posted and never read goes now, not with the last end of the store's.
        state.responses.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Context, Wake};

    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn poll(mailbox: &mut Mailbox, waker: &Waker) -> Poll<Mail> {
        let mut next = std::pin::pin!(mailbox.next());
        next.as_mut().poll(&mut Context::from_waker(waker))
    }

    fn response(revision: i64) -> Result<WatchResponse> {
        Ok(WatchResponse::new(
            coord_api::Revision(revision),
            Vec::new(),
        ))
    }

    #[test]
    fn asks_come_first_then_responses_in_order_then_the_end() {
        let (post, mut mailbox) = mailbox();
        let asks = mailbox.asks();
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        assert!(poll(&mut mailbox, &waker).is_pending());
        let late = post.clone();
        assert!(post.send(response(1)));
        assert!(late.send(response(2)));
        asks.ask().unwrap();
        assert_eq!(count.0.load(Ordering::SeqCst), 3, "each post and ask wakes");
        assert!(matches!(poll(&mut mailbox, &waker), Poll::Ready(Mail::Ask)));
        for revision in [1, 2] {
            match poll(&mut mailbox, &waker) {
                Poll::Ready(Mail::Response(Ok(r))) => assert_eq!(r.revision.0, revision),
                other => panic!("expected response {revision}, got {other:?}"),
            }
        }
        drop(post);
        assert!(
            poll(&mut mailbox, &waker).is_pending(),
            "an end of the store's is left"
        );
        drop(late);
        assert_eq!(
            count.0.load(Ordering::SeqCst),
            4,
            "the last end's drop wakes"
        );
        assert!(matches!(
            poll(&mut mailbox, &waker),
            Poll::Ready(Mail::Closed)
        ));
    }

    #[test]
    fn a_gone_stream_refuses_posts_and_asks() {
        let (post, mailbox) = mailbox();
        let asks = mailbox.asks();
        assert!(post.send(response(1)));
        assert!(!post.is_closed());
        drop(mailbox);
        assert!(post.is_closed());
        assert!(!post.send(response(2)));
        assert!(asks.ask().is_err());
        assert!(post.shared.lock().responses.is_empty(), "nothing kept");
    }
}
