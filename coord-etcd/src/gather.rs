//! A member connection's writes, gathered: a small write first lets the connection's task
//! yield once, so that the frames of requests made meanwhile (on other threads, or queued
//! behind it on this one) go out in the same system call.
//!
//! Why: hyper writes whatever its HTTP/2 connection has ready the moment it is polled, and
//! with many requests in flight that is nearly always one request's frames: 0.86 writes per
//! put with 32 concurrent tasks, for raw etcd-client as for coord, each a trip through the
//! kernel's send path and a wake of the member's reader. One yield before a small write
//! (grpc-go's writer does the same before it flushes a small batch) brought coord to 0.30
//! writes per put, about 2 µs of client CPU less per put than raw etcd-client's, and its
//! concurrent puts to 1.01-1.06 of raw's (BENCHMARKS.md, the concurrent puts). A lone request
//! pays one pass of the runtime's queue, which the sequential latency does not show.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::dial::MemberIo;

/// Writes at least this long go at once: there is enough in them already for the system
/// call to be worth it (a put of a 1 KiB value is about this long on its own).
const GATHER_BELOW: usize = 1024;

/// A member's stream whose small writes wait for one yield of the task that writes them.
pub(crate) struct Gathered {
    io: Box<dyn MemberIo>,
    /// Whether the write now asked for has waited its yield already.
    yielded: bool,
}

impl Gathered {
    pub(crate) fn new(io: Box<dyn MemberIo>) -> Self {
        Gathered { io, yielded: false }
    }

    /// Whether a write of `len` bytes is to wait, the task woken again at once so that the
    /// wait is one pass of the runtime's queue and never longer.
    fn waits(&mut self, len: usize, cx: &Context<'_>) -> bool {
        if self.yielded || len >= GATHER_BELOW {
            return false;
        }
        self.yielded = true;
        cx.waker().wake_by_ref();
        true
    }

    /// After a write: the next one waits again once this one has gone (a write the stream
    /// could not take yet does not wait twice).
    fn wrote<T>(&mut self, written: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        if written.is_ready() {
            self.yielded = false;
        }
        written
    }
}

impl AsyncRead for Gathered {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Gathered {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.waits(buf.len(), cx) {
            return Poll::Pending;
        }
        let written = Pin::new(&mut self.io).poll_write(cx, buf);
        self.wrote(written)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.waits(bufs.iter().map(|b| b.len()).sum(), cx) {
            return Poll::Pending;
        }
        let written = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.wrote(written)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    use std::task::{Wake, Waker};

    use super::*;

    /// A stream that keeps every write it takes, one entry per call; it takes nothing while
    /// `full` is set.
    #[derive(Clone, Default)]
    struct Recorded {
        writes: Arc<Mutex<Vec<Vec<u8>>>>,
        full: Arc<Mutex<bool>>,
    }

    impl AsyncRead for Recorded {
        fn poll_read(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            _: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    impl AsyncWrite for Recorded {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            if *self.full.lock().unwrap() {
                return Poll::Pending;
            }
            self.writes.lock().unwrap().push(buf.to_vec());
            Poll::Ready(Ok(buf.len()))
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// A waker that counts its wakes.
    #[derive(Default)]
    struct Counted(AtomicUsize);

    impl Wake for Counted {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn gathered() -> (Gathered, Recorded, Arc<Counted>, Waker) {
        let inner = Recorded::default();
        let wakes = Arc::new(Counted::default());
        let waker = Waker::from(wakes.clone());
        (Gathered::new(Box::new(inner.clone())), inner, wakes, waker)
    }

    fn write(io: &mut Gathered, waker: &Waker, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(io).poll_write(&mut Context::from_waker(waker), buf)
    }

    #[test]
    fn a_small_write_waits_one_yield_and_then_goes() {
        let (mut io, inner, wakes, waker) = gathered();
        assert!(write(&mut io, &waker, b"frame").is_pending());
        assert_eq!(wakes.0.load(Ordering::SeqCst), 1, "woken again at once");
        assert!(inner.writes.lock().unwrap().is_empty());
        assert!(matches!(
            write(&mut io, &waker, b"frame"),
            Poll::Ready(Ok(5))
        ));
        assert_eq!(*inner.writes.lock().unwrap(), vec![b"frame".to_vec()]);
        assert_eq!(wakes.0.load(Ordering::SeqCst), 1);

        // Each write waits its own yield, not only the connection's first.
        assert!(write(&mut io, &waker, b"next").is_pending());
        assert!(matches!(
            write(&mut io, &waker, b"next"),
            Poll::Ready(Ok(4))
        ));
        assert_eq!(inner.writes.lock().unwrap().len(), 2);
    }

    #[test]
    fn a_large_write_goes_at_once() {
        let (mut io, inner, wakes, waker) = gathered();
        let large = vec![7u8; GATHER_BELOW];
        assert!(matches!(write(&mut io, &waker, &large), Poll::Ready(Ok(n)) if n == large.len()));
        assert_eq!(wakes.0.load(Ordering::SeqCst), 0);

        let vectored = [
            io::IoSlice::new(&large[..512]),
            io::IoSlice::new(&large[512..]),
        ];
        let mut cx = Context::from_waker(&waker);
        let written = Pin::new(&mut io).poll_write_vectored(&mut cx, &vectored);
        assert!(
            matches!(written, Poll::Ready(Ok(_))),
            "counted over all its slices"
        );
        assert_eq!(wakes.0.load(Ordering::SeqCst), 0);
        assert_eq!(inner.writes.lock().unwrap().len(), 2);
    }

    #[test]
    fn a_write_the_stream_cannot_take_yet_does_not_wait_twice() {
        let (mut io, inner, wakes, waker) = gathered();
        *inner.full.lock().unwrap() = true;
        assert!(write(&mut io, &waker, b"frame").is_pending());
        assert!(
            write(&mut io, &waker, b"frame").is_pending(),
            "the stream is full"
        );
        *inner.full.lock().unwrap() = false;
        assert!(matches!(
            write(&mut io, &waker, b"frame"),
            Poll::Ready(Ok(5))
        ));
        assert_eq!(wakes.0.load(Ordering::SeqCst), 1, "one yield in all");
    }

    #[tokio::test]
    async fn what_is_written_arrives_whole_and_in_order() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        let (ours, mut theirs) = tokio::io::duplex(1 << 16);
        let mut io = Gathered::new(Box::new(ours));
        let sent: Vec<Vec<u8>> = (0..100u8).map(|i| vec![i; 1 + 37 * i as usize]).collect();
        let writing = async {
            for chunk in &sent {
                io.write_all(chunk).await.unwrap();
            }
            io.shutdown().await.unwrap();
        };
        // Read while writing: the pipe holds less than all of it.
        let mut received = Vec::new();
        let reading = theirs.read_to_end(&mut received);
        let ((), read) = tokio::join!(writing, reading);
        read.unwrap();
        assert_eq!(received, sent.concat());
    }
}
