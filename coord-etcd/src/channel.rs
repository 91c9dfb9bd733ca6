//! The channel requests to one member go over: one HTTP/2 connection, opened by a dialer on the
//! first request and again after it closes, with the configuration's keep-alive and connect
//! timeout. Requests go straight to hyper's connection handle from the task that makes them.
//!
//! Why not tonic's `Channel`: it hands every request to a buffer task of its own, which then
//! hands it to hyper's connection task, one hop more per request than this; with 32 concurrent
//! tasks that hop was what kept coord's puts below raw etcd-client's throughput
//! (BENCHMARKS.md, the concurrent puts). What it did besides is here: the request's origin, the
//! reconnection, and the errors, which are hyper's own as they were under tonic, so a request
//! given back unsent still reads as one (`crate::error`). What it did not do is gather the
//! connection's writes: a small one waits for one yield of the connection's task, so that
//! concurrent requests share a system call (`crate::gather`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::uri::{Authority, Scheme};
use http::{Request, Response, Uri};
use hyper::client::conn::http2::{Builder, SendRequest};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tonic::body::Body;

use crate::config::EtcdConfig;
use crate::dial::Dialer;
use crate::pool::error_chain as chain;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A channel to one member, cheap to clone: every clone shares the connection.
#[derive(Clone)]
pub(crate) struct Http2 {
    shared: Arc<Shared>,
}

struct Shared {
    dial: Dialer,
    scheme: Scheme,
    authority: Authority,
    settings: Builder<TokioExecutor>,
    connect_timeout: Duration,
    /// The connection, once open, and what the latest attempt to open one said.
    state: Mutex<State>,
    /// Held while a connection is being opened, so that the requests that find none open one
    /// between them, not one each.
    connecting: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct State {
    open: Option<Conn>,
    /// How many attempts to connect came to an end (an attempt abandoned half-way, its
    /// request given up, does not).
    finished: u64,
    /// Why the latest attempt that came to an end failed, if it did.
    failed: Option<String>,
}

/// One connection: its handle, and how it ended once it has (`None` while it runs; then
/// `Some(None)` for a clean end, `Some(Some(why))` for a failure).
#[derive(Clone)]
struct Conn {
    sender: SendRequest<Body>,
    ended: tokio::sync::watch::Receiver<Option<Option<String>>>,
}

impl Conn {
    /// The error for a request the connection gave back unsent (`e`, hyper's "canceled"): if
    /// the connection failed, why, for that is what the caller needs to hear (a TLS 1.3
    /// server refusing our certificate just after the handshake says so only there). Still
    /// worded as never sent, which it was.
    fn given_back(&self, e: hyper::Error) -> BoxError {
        // Published before the connection gave anything back (see `Shared::connect`), so
        // there is nothing to wait for: a connection that gives requests back while it still
        // runs (closing gracefully, its streams finishing) has said nothing, and the request
        // hears hyper's own words.
        if let Some(Some(why)) = &*self.ended.borrow() {
            return unsent(format!(
                "error trying to connect: the connection closed before the request went out: \
                 {why}"
            ));
        }
        e.into()
    }
}

impl Http2 {
    /// A channel that opens its connections with `dial`, to a member known to HTTP/2 as
    /// `origin` (scheme and authority), with `config`'s connect timeout and keep-alive.
    pub(crate) fn new(dial: Dialer, origin: &Uri, config: &EtcdConfig) -> Self {
        let mut settings = Builder::new(TokioExecutor::new());
        settings.timer(TokioTimer::new());
        if let Some((interval, timeout)) = config.keep_alive {
            settings
                .keep_alive_interval(interval)
                .keep_alive_timeout(timeout)
                .keep_alive_while_idle(true);
        }
        // Forget a reset stream at once, and allow any number of them: h2 remembers a stream
        // it reset for one second of *real* time, ignoring a late frame for it within that
        // second and answering one after it with a reset of its own. Under a simulation's
        // virtual time that extra message would make a run's history depend on how fast the
        // machine ran it; forgetting at once makes every late frame draw the reset, whatever
        // the machine. The cost in production is a few bytes per request abandoned while its
        // answer was on the way; etcd is a trusted peer, so the cap guards against nothing.
        settings
            .max_concurrent_reset_streams(0)
            .max_local_error_reset_streams(None);
        Http2 {
            shared: Arc::new(Shared {
                dial,
                scheme: origin.scheme().cloned().unwrap_or(Scheme::HTTP),
                authority: origin
                    .authority()
                    .cloned()
                    .unwrap_or_else(|| Authority::from_static("etcd")),
                settings,
                connect_timeout: config.connect_timeout,
                state: Mutex::default(),
                connecting: tokio::sync::Mutex::new(()),
            }),
        }
    }

    /// The channel as etcd-client takes it.
    pub(crate) fn into_etcd(self) -> etcd_client::Channel {
        let service = tower::service_fn(move |request: Request<Body>| {
            let shared = self.shared.clone();
            async move { shared.send(request).await }
        });
        etcd_client::Channel::Custom(tower::util::BoxCloneSyncService::new(service))
    }
}

impl Shared {
    async fn send(&self, request: Request<Body>) -> Result<Response<Body>, BoxError> {
        let request = self.with_origin(request)?;
        let mut conn = self.sender().await?;
        if conn.sender.ready().await.is_err() {
            // Closed since it was taken: the request is still here, unsent. One more
            // connection, not a loop: a member that closes each one at once fails this request.
            conn = self.sender().await?;
        }
        match conn.sender.send_request(request).await {
            Ok(response) => Ok(response.map(Body::new)),
            Err(e) if e.is_canceled() => Err(conn.given_back(e)),
            Err(e) => Err(e.into()),
        }
    }

    /// The request with this member's scheme and authority, which HTTP/2 sends as
    /// `:scheme` and `:authority` (tonic's clients give the path alone).
    fn with_origin(&self, request: Request<Body>) -> Result<Request<Body>, BoxError> {
        let (mut head, body) = request.into_parts();
        let mut uri = std::mem::take(&mut head.uri).into_parts();
        uri.scheme = Some(self.scheme.clone());
        uri.authority = Some(self.authority.clone());
        head.uri = Uri::from_parts(uri)?;
        Ok(Request::from_parts(head, body))
    }

    /// The open connection, if it is still open.
    fn open(&self, state: &mut State) -> Option<Conn> {
        match &state.open {
            Some(c) if !c.sender.is_closed() => Some(c.clone()),
            Some(_) => {
                state.open = None;
                None
            }
            None => None,
        }
    }

    /// The connection, opened first if there is none. Requests that wait while another opens
    /// it share that attempt's outcome, failure included, rather than each try again in turn
    /// (a member that does not answer would otherwise cost each a connect timeout).
    async fn sender(&self) -> Result<Conn, BoxError> {
        let seen = {
            let mut state = self.lock();
            if let Some(s) = self.open(&mut state) {
                return Ok(s);
            }
            state.finished
        };
        let _connecting = self.connecting.lock().await;
        {
            let mut state = self.lock();
            if let Some(s) = self.open(&mut state) {
                return Ok(s);
            }
            // An attempt ended while this request waited: it failed (or it would be open).
            if state.finished != seen {
                if let Some(why) = &state.failed {
                    return Err(unsent(why.clone()));
                }
            }
        }
        let outcome = match tokio::time::timeout(self.connect_timeout, self.connect()).await {
            Ok(outcome) => outcome,
            Err(_) => Err(format!(
                "error trying to connect: no connection within {:?}",
                self.connect_timeout
            )),
        };
        let mut state = self.lock();
        state.finished += 1;
        match outcome {
            Ok(conn) => {
                tracing::debug!(member = %self.authority, "connected");
                state.open = Some(conn.clone());
                state.failed = None;
                Ok(conn)
            }
            Err(why) => {
                tracing::debug!(member = %self.authority, %why, "could not connect");
                state.failed = Some(why.clone());
                Err(unsent(why))
            }
        }
    }

    /// Dials the member and starts HTTP/2 on the stream, its connection driven by a task of
    /// its own until it closes.
    async fn connect(&self) -> Result<Conn, String> {
        let io = (self.dial)()
            .await
            .map_err(|e| format!("error trying to connect: {}", chain(&e)))?;
        let (sender, connection) = self
            .settings
            .handshake(TokioIo::new(crate::gather::Gathered::new(io)))
            .await
            .map_err(|e| format!("error trying to connect: HTTP/2 handshake: {}", chain(&e)))?;
        let member = self.authority.clone();
        let (end, ended) = tokio::sync::watch::channel(None);
        tokio::spawn(async move {
            // Awaited in place, not consumed: the connection gives its queued requests back
            // when it is dropped, and by then how it ended must be published for them.
            let mut connection = std::pin::pin!(connection);
            let why = connection.as_mut().await.err().map(|e| chain(&e));
            if let Some(why) = &why {
                tracing::debug!(%member, error = %why, "connection closed");
            }
            end.send_replace(Some(why));
        });
        Ok(Conn { sender, ended })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A request that never left: no connection could be made. The words are those the error
/// mapping reads as "never sent" (`crate::error`), so a write that met them may go elsewhere.
fn unsent(why: String) -> BoxError {
    Box::new(tonic::Status::unavailable(why))
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use coord_api::ErrorClass;

    use super::*;
    use crate::dial::{Dialing, MemberIo};
    use crate::error::{map_status, Kind};

    /// A dialer that counts its calls and hands each to `open`.
    fn counting(
        open: impl Fn(usize) -> Dialing + Send + Sync + 'static,
    ) -> (Dialer, Arc<AtomicUsize>) {
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        let dial: Dialer = Arc::new(move || open(counted.fetch_add(1, Ordering::SeqCst)));
        (dial, calls)
    }

    fn channel(dial: Dialer) -> Arc<Shared> {
        let origin = Uri::from_static("http://member-0");
        Http2::new(dial, &origin, &EtcdConfig::new(["unused:1"])).shared
    }

    fn request() -> Request<Body> {
        Request::builder()
            .uri("/etcdserverpb.KV/Range")
            .body(Body::empty())
            .unwrap()
    }

    /// What a write that met `e` is, as the store reads it.
    fn as_write(e: BoxError) -> ErrorClass {
        map_status("put", Kind::Write, tonic::Status::from_error(e)).class()
    }

    /// A member over an in-memory pipe: hyper's HTTP/2 server answering every request 200,
    /// until the task that serves it is aborted (the member's end of the connection closes).
    fn served() -> (Box<dyn MemberIo>, tokio::task::JoinHandle<()>) {
        let (ours, theirs) = tokio::io::duplex(1 << 16);
        let server = tokio::spawn(async move {
            let answer = hyper::service::service_fn(|_request| async {
                Ok::<_, Infallible>(Response::new(String::new()))
            });
            let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(theirs), answer)
                .await;
        });
        (Box::new(ours), server)
    }

    #[tokio::test]
    async fn a_closed_connection_is_opened_again_by_the_next_request() {
        let servers = Arc::new(Mutex::new(Vec::new()));
        let kept = servers.clone();
        let (dial, calls) = counting(move |_| {
            let (io, server) = served();
            kept.lock().unwrap().push(server);
            Box::pin(async move { Ok(io) })
        });
        let channel = channel(dial);
        let answer = channel.send(request()).await.unwrap();
        assert_eq!(answer.status(), 200);
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        // Again on the same connection.
        channel.send(request()).await.unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 1, "one connection for both");
        // The member closes it; the client's side notices, and the next request dials anew.
        servers.lock().unwrap()[0].abort();
        coord_api::testkit::within(Duration::from_secs(5), "the close noticed", async {
            while !channel
                .lock()
                .open
                .as_ref()
                .is_none_or(|c| c.sender.is_closed())
            {
                tokio::task::yield_now().await;
            }
        })
        .await;
        let answer = channel.send(request()).await.unwrap();
        assert_eq!(answer.status(), 200);
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn requests_that_wait_on_one_connect_share_its_failure() {
        let (dial, calls) = counting(|_| {
            Box::pin(async {
                tokio::time::sleep(Duration::from_millis(100)).await;
                Err(std::io::Error::new(
                    std::io::ErrorKind::ConnectionRefused,
                    "tcp connect error: refused",
                ))
            })
        });
        let channel = channel(dial);
        let tries = (0..5).map(|_| {
            let channel = channel.clone();
            tokio::spawn(async move { channel.send(request()).await })
        });
        for t in tries.collect::<Vec<_>>() {
            let e = t.await.unwrap().unwrap_err();
            assert!(e.to_string().contains("refused"), "{e}");
            // Nothing was sent: a write may go to another member.
            assert_eq!(as_write(e), ErrorClass::Retryable);
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1, "one attempt for the five");
        // A later request tries again.
        channel.send(request()).await.unwrap_err();
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_connect_that_hangs_ends_at_the_connect_timeout_unsent() {
        let (dial, _) = counting(|_| Box::pin(std::future::pending()));
        let channel = channel(dial);
        let started = tokio::time::Instant::now();
        let e = channel.send(request()).await.unwrap_err();
        // EtcdConfig's default connect timeout.
        assert_eq!(started.elapsed(), Duration::from_secs(2));
        assert!(e.to_string().contains("no connection within 2s"), "{e}");
        assert_eq!(as_write(e), ErrorClass::Retryable);
    }

    /// A TLS 1.3 member that refuses our certificate does so just after the handshake: the
    /// connection fails before it takes the request, and the request, given back unsent, must
    /// say why (the probe turns it into "permission denied" from those words).
    #[tokio::test]
    async fn a_request_given_back_by_a_failed_connection_says_why() {
        let (ours, _theirs) = tokio::io::duplex(1 << 16);
        let (sender, connection) = Builder::new(TokioExecutor::new())
            .handshake::<_, Body>(TokioIo::new(ours))
            .await
            .unwrap();
        drop(connection);
        let why = "received fatal alert: CertificateRequired";
        let (end, ended) = tokio::sync::watch::channel(Some(Some(why.to_owned())));
        let mut conn = Conn { sender, ended };
        let e = conn.sender.send_request(request()).await.unwrap_err();
        assert!(e.is_canceled(), "{e:?}");
        let e = conn.given_back(e);
        assert!(e.to_string().contains(why), "{e}");
        assert_eq!(as_write(e), ErrorClass::Retryable);
        drop(end);
    }

    #[tokio::test]
    async fn requests_carry_the_members_origin() {
        let (ours, theirs) = tokio::io::duplex(1 << 16);
        let (seen_tx, seen) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let answer = hyper::service::service_fn(move |request: Request<_>| {
                let _ = seen_tx.send(request.uri().clone());
                async { Ok::<_, Infallible>(Response::new(String::new())) }
            });
            let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(theirs), answer)
                .await;
        });
        let io = Mutex::new(Some(Box::new(ours) as Box<dyn MemberIo>));
        let dial: Dialer = Arc::new(move || {
            let io = io.lock().unwrap().take();
            Box::pin(async move { io.ok_or_else(|| std::io::Error::other("dialled twice")) })
        });
        channel(dial).send(request()).await.unwrap();
        let uri = { seen }.recv().await.unwrap();
        assert_eq!(uri, "http://member-0/etcdserverpb.KV/Range");
    }
}
