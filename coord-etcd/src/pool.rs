//! The connections to etcd's members: a channel per member, which one requests go to, when
//! to move to the next (failover) and when a silent connection is replaced; and the one way a
//! request is sent, with bounded retries. The store's calls, its keep-alives and its watches all
//! go through it.

use std::future::Future;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::sync::{Arc, Weak};
use std::time::Duration;

use coord_api::retry::{self, Backoff, Pace};
use coord_api::{Error, Result};
use etcd_client::Client;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::channel::Http2;
use crate::config::EtcdConfig;
use crate::dial::Dialer;
use crate::error::{from_member, map, Kind, BACKEND};
use crate::settle::{Headed, Terms, SETTLE_AFTER};

/// One endpoint and, once connected, its client. Each endpoint gets its own client (a
/// channel to that member alone) so the store decides where a request goes: etcd-client's
/// own balancer keeps picking a dead member and fails about a third of requests after a
/// member dies (`docs/ETCD-BEHAVIOUR.md` 3.6). Its channel is coord's own
/// (`crate::channel`), not made by etcd-client's `connect`, which puts that balancer in front
/// of even one endpoint.
struct Endpoint {
    url: String,
    /// How its connections are made.
    transport: Transport,
    /// The connection, once made.
    client: Mutex<Option<Open>>,
    /// What the current connection was last asked and last answered.
    activity: Mutex<Activity>,
    /// How many watch streams are open on this endpoint: a connection that carries one waits
    /// on the server to speak, so only a probe can tell it died (see `crate::liveness`).
    watches: AtomicUsize,
}

/// How the pool makes a connection to one member.
#[derive(Clone)]
pub(crate) enum Transport {
    /// TCP (and TLS) to the endpoint, with the configuration's settings.
    Endpoint,
    /// Over streams the caller's dialer opens
    /// ([`EtcdStore::from_member_dialers`](crate::EtcdStore::from_member_dialers)).
    Dial(Dialer),
    /// Over tonic channels the caller makes
    /// ([`EtcdStore::from_member_channels`](crate::EtcdStore::from_member_channels)).
    Channel(ChannelFactory),
}

/// What a connection was asked and answered: how the pool tells a connection that is quiet
/// from one that is dead. A connection that answered lately is slow, not dead, and is kept.
#[derive(Debug, Default, Clone, Copy)]
struct Activity {
    /// When the latest request it answered was sent (a reply, a keep-alive answer, a
    /// progress answer; not a watch event, which proves only the way back): it carried both
    /// ways from then. An answer to a request sent earlier proves nothing later: a connection
    /// whose way out died still brings in the answers to what went out before.
    answered: Option<Instant>,
    /// When the oldest request it has not answered anything since was sent.
    awaiting: Option<Instant>,
}

/// One connection to a member: its client, the token that ends the streams opened on it when
/// it is replaced, and what it told of the member's raft term (`crate::settle`).
#[derive(Clone)]
struct Open {
    client: Client,
    streams: CancellationToken,
    terms: Arc<Terms>,
}

/// Makes a new channel (a new connection) to one member.
pub(crate) type ChannelFactory = Arc<dyn Fn() -> tonic::transport::Channel + Send + Sync>;

/// Where a request ran: the endpoint, and the token that ends the streams opened on its
/// connection when that is replaced (see [`Pool::connection_at`]).
pub(crate) struct Connection {
    pub(crate) endpoint: usize,
    pub(crate) streams: CancellationToken,
}

pub(crate) struct Pool {
    endpoints: Vec<Endpoint>,
    /// The endpoint requests go to until it fails.
    current: AtomicUsize,
    config: EtcdConfig,
    /// Whether the task that probes quiet connections (`crate::liveness`) runs.
    liveness: AtomicBool,
    /// The pool itself, for that task (which ends when the pool is dropped).
    me: Weak<Pool>,
}

/// A watch stream open on an endpoint, counted there until it is dropped.
pub(crate) struct Watching {
    pool: Arc<Pool>,
    endpoint: usize,
}

impl Drop for Watching {
    fn drop(&mut self) {
        self.pool.endpoints[self.endpoint]
            .watches
            .fetch_sub(1, Ordering::Relaxed);
    }
}

impl Pool {
    /// Connects to `config`'s endpoints, or, when `members` are given, as they say: one
    /// per member, in order.
    pub(crate) fn new(config: EtcdConfig, members: Vec<Transport>) -> Arc<Self> {
        let endpoint = |url: String, transport| Endpoint {
            url,
            transport,
            client: Mutex::new(None),
            activity: Mutex::default(),
            watches: AtomicUsize::new(0),
        };
        let endpoints = if members.is_empty() {
            config
                .endpoints
                .iter()
                .map(|url| endpoint(url.clone(), Transport::Endpoint))
                .collect()
        } else {
            members
                .into_iter()
                .enumerate()
                .map(|(i, t)| endpoint(format!("member-{i}"), t))
                .collect()
        };
        Arc::new_cyclic(|me| Pool {
            endpoints,
            current: AtomicUsize::new(0),
            config,
            liveness: AtomicBool::new(false),
            me: me.clone(),
        })
    }

    /// Starts the probe of quiet connections (`crate::liveness`), with the first request or
    /// watch: a store dialled lazily may be made outside a runtime.
    fn start_probing(&self) {
        // A load first: every request passes here, and a swap is a write to a line they
        // all share.
        if !self.liveness.load(Ordering::Relaxed) && !self.liveness.swap(true, Ordering::Relaxed) {
            // In the span of the first request, so that its events say whose store it is.
            let span = tracing::debug_span!("liveness");
            tokio::spawn(tracing::Instrument::instrument(
                crate::liveness::probe_quiet_connections(self.me.clone()),
                span,
            ));
        }
    }

    /// Counts a watch stream opened on endpoint `i` until the returned guard is dropped.
    pub(crate) fn watching(self: &Arc<Self>, i: usize) -> Watching {
        self.endpoints[i].watches.fetch_add(1, Ordering::Relaxed);
        self.start_probing();
        Watching {
            pool: self.clone(),
            endpoint: i,
        }
    }

    /// How many endpoints the pool has.
    pub(crate) fn len(&self) -> usize {
        self.endpoints.len()
    }

    /// Whether endpoint `i`'s connection is something waits on (a watch stream, a request)
    /// and has answered nothing since `since`.
    pub(crate) fn quiet_and_waited_on(&self, i: usize, since: Instant) -> bool {
        let waited_on = self.endpoints[i].watches.load(Ordering::Relaxed) > 0
            || self.activity(i).awaiting.is_some();
        waited_on && self.silent_since(i, since)
    }

    /// Endpoint `i`'s connection, if it is made: its client and what it told of its term.
    pub(crate) fn open_at(&self, i: usize) -> Option<(Client, Arc<Terms>)> {
        let open = self.endpoints[i]
            .client
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        open.as_ref().map(|o| (o.client.clone(), o.terms.clone()))
    }

    /// The members' endpoints, in order.
    pub(crate) fn urls(&self) -> Vec<&str> {
        self.endpoints.iter().map(|e| e.url.as_str()).collect()
    }

    /// The configuration the connections run with.
    pub(crate) fn config(&self) -> &EtcdConfig {
        &self.config
    }

    /// Asks each endpoint in turn for its status until one answers.
    pub(crate) async fn probe(&self) -> Result<()> {
        let mut failures = Vec::new();
        for i in 0..self.endpoints.len() {
            let url = self.endpoints[i].url.clone();
            let attempt = async {
                let mut c = self.client_at(i).await?;
                c.status().await.map_err(|e| map("connect", Kind::Read, e))
            };
            match tokio::time::timeout(self.config.connect_timeout, attempt).await {
                Ok(Ok(_)) => {
                    self.current.store(i, Ordering::Relaxed);
                    return Ok(());
                }
                Ok(Err(e @ (Error::PermissionDenied { .. } | Error::InvalidArgument { .. }))) => {
                    return Err(e)
                }
                Ok(Err(e)) => {
                    if let Some(reason) = self.tls_refusal(&e) {
                        return Err(Error::PermissionDenied {
                            backend: BACKEND,
                            reason: format!("{url}: {reason}"),
                        });
                    }
                    failures.push(format!("{url}: {}", error_chain(&e)))
                }
                Err(_) => failures.push(format!(
                    "{url}: no answer within {:?}",
                    self.config.connect_timeout
                )),
            }
        }
        Err(Error::Unavailable {
            backend: BACKEND,
            operation: "connect",
            source: format!("no etcd endpoint answered: {}", failures.join("; ")).into(),
        })
    }

    /// A TLS failure that retrying cannot fix, in words: the server refused our certificate,
    /// we do not trust the server's, or the server hung up right after the handshake (how a
    /// TLS 1.3 server refuses a missing or foreign client certificate when its alert loses
    /// the race with our first write). The last is a judgement: it only applies on connect,
    /// where a server that answers nothing at all would have failed the handshake instead.
    fn tls_refusal(&self, e: &Error) -> Option<String> {
        let tls = self.config.tls.as_ref()?;
        // Debug, not Display: tonic's Status does not expose the transport error it wraps as
        // a source, and the TLS alert is only in there.
        let chain = format!("{e:?}");
        if chain.contains("fatal alert") || chain.contains("invalid peer certificate") {
            return Some(format!("TLS refused: {chain}"));
        }
        // Depending on timing, the hang-up surfaces as any of these.
        let hung_up = ["connection closed", "broken pipe", "connection reset"]
            .iter()
            .any(|m| chain.contains(m));
        if hung_up {
            let why = if tls.identity.is_none() {
                "it most likely requires a client certificate, and none is configured"
            } else {
                "it most likely does not accept this client certificate (TLS 1.3 lets a \
                 server refuse it after the client's handshake is done)"
            };
            return Some(format!(
                "the server closed the connection right after the TLS handshake; {why} ({chain})"
            ));
        }
        None
    }

    /// The client of endpoint `i`, connecting it first if needed.
    pub(crate) async fn client_at(&self, i: usize) -> Result<Client> {
        Ok(self.connection_at(i).await?.0)
    }

    /// Endpoint `i`'s client, and a token cancelled when that connection is replaced (see
    /// [`reconnect`](Self::reconnect)): streams opened on it end then, rather than wait on a
    /// dead connection.
    pub(crate) async fn connection_at(&self, i: usize) -> Result<(Client, CancellationToken)> {
        let open = self.open(i).await?;
        Ok((open.client, open.streams))
    }

    /// Endpoint `i`'s connection, made first if needed.
    async fn open(&self, i: usize) -> Result<Open> {
        let ep = &self.endpoints[i];
        if let Some(o) = ep.client.lock().unwrap_or_else(|p| p.into_inner()).clone() {
            return Ok(o);
        }
        let options = Some(self.config.connect_options());
        let channel = match &ep.transport {
            Transport::Endpoint => {
                let (dial, origin) = crate::dial::tcp(&ep.url, &self.config)?;
                Http2::new(dial, &origin, &self.config).into_etcd()
            }
            Transport::Dial(dial) => {
                let origin = format!("http://{}", ep.url)
                    .parse()
                    .expect("member-N is a host name");
                Http2::new(dial.clone(), &origin, &self.config).into_etcd()
            }
            Transport::Channel(make) => etcd_client::Channel::Tonic(make()),
        };
        let client = Client::from_channel(channel, options)
            .await
            .map_err(|e| map("connect", Kind::Read, e))?;
        let open = Open {
            client,
            streams: CancellationToken::new(),
            terms: Arc::default(),
        };
        *ep.client.lock().unwrap_or_else(|p| p.into_inner()) = Some(open.clone());
        Ok(open)
    }

    /// Calls `f` with endpoint `i`'s client and connection, if it is connected, under one
    /// lock; hands back what `f` returned, with the token that ends the connection's streams
    /// and what it told of its term. A request takes from the client only the service client
    /// it needs: a whole `Client` is eight service clients and the connect options, and
    /// cloning one per request cost a tenth of the throughput of 32 concurrent tasks against
    /// raw etcd-client's. The request is boxed where it is made: a gRPC call's future is
    /// kilobytes, and unboxed it was copied on its way out of here and into the try's pin
    /// (`memmove` was an eighth of the request task's own samples).
    fn lend<R>(
        &self,
        i: usize,
        f: impl FnOnce(&Client, Connection) -> R,
    ) -> Option<(std::pin::Pin<Box<R>>, CancellationToken, Arc<Terms>)> {
        let open = self.endpoints[i]
            .client
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let o = open.as_ref()?;
        let connection = Connection {
            endpoint: i,
            streams: o.streams.clone(),
        };
        Some((
            Box::pin(f(&o.client, connection)),
            o.streams.clone(),
            o.terms.clone(),
        ))
    }

    /// Drops endpoint `i`'s connection after it stopped answering: the next request connects
    /// afresh. A connection whose peer vanished without a reset (a partition that outlived
    /// TCP, a NAT that forgot it) otherwise holds every request until the request timeout,
    /// over and over, until HTTP/2 keep-alive finally notices it (10 s + 5 s by default).
    pub(crate) fn reconnect(&self, i: usize) {
        let ep = &self.endpoints[i];
        *ep.activity.lock().unwrap_or_else(|p| p.into_inner()) = Activity::default();
        if let Some(open) = ep.client.lock().unwrap_or_else(|p| p.into_inner()).take() {
            tracing::debug!(endpoint = %ep.url, "no answer; reconnecting");
            open.streams.cancel();
        }
    }

    /// Ends the streams open on endpoint `i`'s connection and keeps the connection, when
    /// requests move off the member (see [`fail_over`](Self::fail_over)).
    fn end_streams(&self, i: usize) {
        let ep = &self.endpoints[i];
        if let Some(open) = ep.client.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            std::mem::replace(&mut open.streams, CancellationToken::new()).cancel();
        }
    }

    fn activity(&self, i: usize) -> std::sync::MutexGuard<'_, Activity> {
        self.endpoints[i]
            .activity
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Notes that a request sent at `sent` is on endpoint `i`'s connection. The caller hands
    /// the same instant to [`answered`](Self::answered) when it is answered, so that answer
    /// ends the wait: one read of the clock for both, or the wait outlives its answer by the
    /// nanoseconds between two reads, and the connection looks waited on forever.
    pub(crate) fn asked(&self, i: usize, sent: Instant) {
        self.start_probing();
        let mut activity = self.activity(i);
        activity.awaiting = Some(activity.awaiting.map_or(sent, |at| at.min(sent)));
    }

    /// Notes that endpoint `i`'s connection answered a request sent at `sent`.
    pub(crate) fn answered(&self, i: usize, sent: Instant) {
        let mut activity = self.activity(i);
        activity.answered = activity.answered.max(Some(sent));
        if activity.awaiting.is_some_and(|at| at <= sent) {
            activity.awaiting = None;
        }
    }

    /// A member that accepts connections and never answers (the kernel completes the
    /// handshakes; nothing reads), and a channel to it: a connection dead without a reset.
    #[cfg(test)]
    pub(crate) fn silent_member() -> (std::net::TcpListener, Transport) {
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let at = silent.local_addr().unwrap();
        let dial = crate::dial::member_dialer(move || tokio::net::TcpStream::connect(at));
        (silent, Transport::Dial(Arc::from(dial)))
    }

    /// Whether endpoint `i`'s connection waits on an answer.
    pub(crate) fn is_waited_on(&self, i: usize) -> bool {
        self.activity(i).awaiting.is_some()
    }

    /// Whether endpoint `i`'s connection has answered no request sent since `since`.
    fn silent_since(&self, i: usize, since: Instant) -> bool {
        self.activity(i).answered.is_none_or(|at| at < since)
    }

    /// A request sent at `sent` on endpoint `i` went unanswered past its bound. Unless the
    /// connection answered anything since (then it is slow, not dead), it is replaced, and so
    /// is every other connection that waits on an answer and has answered nothing sent since
    /// `sent`: one fault (a partition that outlived TCP) kills every connection that carried
    /// a byte during it (the member's watch events count, and the client cannot see those
    /// that were lost), and finding them dead one at a time, a request timeout each, outlasts
    /// a lease: turmoil seed 270 lost one to a 0.25 s partition when a lost renewal's retry
    /// went to a connection asked since, and as dead. Returns whether endpoint `i` was
    /// replaced.
    pub(crate) fn unanswered(&self, i: usize, sent: Instant) -> bool {
        if !self.silent_since(i, sent) {
            return false;
        }
        self.reconnect(i);
        self.reconnect_waiting_since(i, sent);
        true
    }

    /// Replaces every connection but endpoint `except`'s that waits on an answer and has
    /// answered nothing sent since `sent`.
    fn reconnect_waiting_since(&self, except: usize, sent: Instant) {
        for j in (0..self.endpoints.len()).filter(|&j| j != except) {
            let waiting = self.activity(j).awaiting.is_some() && self.silent_since(j, sent);
            if waiting {
                tracing::debug!(
                    endpoint = %self.endpoints[j].url,
                    "waiting on an answer, and silent since a request given up on; reconnecting"
                );
                self.reconnect(j);
            }
        }
    }

    /// Gives up on endpoint `i` after a request sent at `since` went unanswered past any
    /// live member's answer time: unless the connection answered anything since, it is
    /// replaced (with the others [`unanswered`](Self::unanswered) replaces) and requests move
    /// to the next member (a stopped member answers nothing, yet its connection stays open).
    /// Requests move before the connection goes: a read or a stream the replacement ends
    /// goes again at once, perhaps on another thread, and must find the next member, not
    /// this one again (a bare read on real etcd did, and waited on the stalled member for
    /// another two seconds).
    pub(crate) fn abandon_if_silent_since(&self, i: usize, since: Instant) {
        if self.silent_since(i, since) {
            self.fail_over(i);
            self.unanswered(i, since);
        }
    }

    /// The endpoint index requests currently go to.
    pub(crate) fn current(&self) -> usize {
        self.current.load(Ordering::Relaxed)
    }

    /// Moves requests off endpoint `from` (if no one moved them already), and the streams
    /// open on it with them: they end, and their watchers resume on the next member. Streams
    /// live where requests go, because requests are what finds a member sick: a member left
    /// for any reason (a `leader changed`, a renewal it held) and cut off later answers the
    /// progress requests of the watches still open on it from its own state, while it hears
    /// of no change the others commit, until etcd ends them three election timeouts after it
    /// lost its leader. No request of the pool's would go there to find out. (turmoil seed
    /// 80271: a leader whose key an operator deleted 70 ms after its member was cut off
    /// learned it only when etcd ended the stream, past the bound, its session renewing fine
    /// on the next member meanwhile.) The cost is one resumption per watch per failover.
    pub(crate) fn fail_over(&self, from: usize) {
        let n = self.endpoints.len();
        if n > 1 {
            let next = (from + 1) % n;
            if self
                .current
                .compare_exchange(from, next, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
            {
                tracing::debug!(
                    from = %self.endpoints[from].url,
                    to = %self.endpoints[next].url,
                    "etcd endpoint failed; moving to the next, and its streams with it"
                );
                self.end_streams(from);
            }
        }
    }

    /// Moves requests off endpoint `from` after it failed with `err`. A member that answers
    /// `no leader` is cut off from its peers: the next may be with the majority. Its
    /// connection goes too, so that a stream opened on it meanwhile ends as well.
    pub(crate) fn fail_over_after(&self, from: usize, err: &(dyn std::error::Error + 'static)) {
        use coord_api::hooks::planted::{enabled, Bug};
        let cut_off = error_chain(err).contains("no leader");
        if cut_off && enabled(Bug::FailoverStaysOnNoLeader) {
            return;
        }
        // Moved first, as in `abandon_if_silent_since`: the streams ended go to the next.
        self.fail_over(from);
        if cut_off {
            tracing::debug!(endpoint = %self.endpoints[from].url, "member has no leader; reconnecting");
            self.reconnect(from);
        }
    }

    pub(crate) fn request_timeout(&self) -> Duration {
        self.config.request_timeout
    }

    /// Runs one request with failover and bounded retries; see the type's docs. `about` is
    /// what the request is about (its key, its lease), the seed of its retries' jitter: a
    /// fleet whose requests failed together does not retry them together. A grant names
    /// only its TTL, so a fleet's grants of one TTL retry alike.
    pub(crate) async fn call<T, F, Fut>(
        &self,
        op: &'static str,
        kind: Kind,
        about: &[u8],
        mut f: F,
    ) -> Result<T>
    where
        F: FnMut(&Client) -> Fut + Send,
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>> + Send,
        T: Send + Headed,
    {
        self.call_on(op, kind, about, move |c, _| f(c)).await
    }

    /// As [`call`](Self::call), also handing `f` the connection it runs on, for requests
    /// that open a stream. `f` is lent the member's client: it takes the service client it
    /// needs (`kv_client()`, ...) into the request it returns.
    pub(crate) async fn call_on<T, F, Fut>(
        &self,
        op: &'static str,
        kind: Kind,
        about: &[u8],
        mut f: F,
    ) -> Result<T>
    where
        F: FnMut(&Client, Connection) -> Fut + Send,
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>> + Send,
        T: Send + Headed,
    {
        let deadline = Instant::now() + self.request_timeout();
        let mut failed = 0;
        // The first try outside the retry loop: nearly every request ends with it, and the
        // loop's state (a seeded backoff, a boxed try) is made only for those that go again.
        let pace = match self.step(op, kind, deadline, &mut f, &mut failed).await {
            ControlFlow::Break(done) => return done,
            ControlFlow::Continue(pace) => pace,
        };
        // coord's one retry policy (jittered, seeded), at a request's scale, within the
        // request timeout.
        let mut backoff = Backoff::request(retry::seed(&[op.as_bytes(), about]));
        let stop = std::future::pending::<std::convert::Infallible>();
        let Ok(()) = retry::pause(&mut backoff, std::pin::pin!(stop), pace).await;
        // Lent to each try: the future a try returns may borrow only from it.
        let mut lent = (self, &mut f, failed);
        let done = retry::until_with(
            &mut backoff,
            std::future::pending::<std::convert::Infallible>(),
            &mut lent,
            move |(pool, f, failed), _| {
                let pool = *pool;
                Box::pin(pool.step(op, kind, deadline, *f, failed))
            },
        );
        let Ok(done) = done.await;
        done
    }

    /// One try of [`call_on`](Self::call_on), `failed` the tries that failed before it: its
    /// outcome, or how the request goes on.
    async fn step<T, F, Fut>(
        &self,
        op: &'static str,
        kind: Kind,
        deadline: Instant,
        f: &mut F,
        failed: &mut usize,
    ) -> ControlFlow<Result<T>, Pace>
    where
        F: FnMut(&Client, Connection) -> Fut + Send,
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>> + Send,
        T: Send + Headed,
    {
        let (idx, err) = match self.attempt(op, kind, deadline, f).await {
            Attempt::Answered(v) => return ControlFlow::Break(Ok(v)),
            // Replaced before it was sent: nothing went out; go again at once.
            Attempt::Unsent => return ControlFlow::Continue(Pace::AtOnce),
            Attempt::Failed(idx, err) if err.is_retryable() => (idx, err),
            Attempt::Failed(_, err) | Attempt::Over(err) => return ControlFlow::Break(Err(err)),
        };
        self.fail_over_after(idx, &err);
        *failed += 1;
        // The first pass over the other members goes at once; after that, back off, unless
        // the longest wait would run into the request timeout.
        if *failed < self.endpoints.len() {
            return ControlFlow::Continue(Pace::AtOnce);
        }
        if Instant::now() + Backoff::request(0).max_delay() >= deadline {
            return ControlFlow::Break(Err(err));
        }
        tracing::debug!(operation = op, attempt = *failed, error = %error_chain(&err), "retrying");
        ControlFlow::Continue(Pace::Backoff)
    }

    /// One try of [`call_on`](Self::call_on) on the current member.
    async fn attempt<T, F, Fut>(
        &self,
        op: &'static str,
        kind: Kind,
        deadline: Instant,
        f: &mut F,
    ) -> Attempt<T>
    where
        F: FnMut(&Client, Connection) -> Fut + Send,
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>> + Send,
        T: Send + Headed,
    {
        let idx = self.current();
        let sent = Instant::now();
        let lent = match self.lend(idx, &mut *f) {
            Some(lent) => lent,
            None => {
                // Boxed: opening a connection (etcd-client's connect) is a future of kilobytes,
                // and inline it made every request's future 6.7 KB, copied whole into the
                // box each store call is, for a path a connection takes once (1.4 KB boxed).
                match tokio::time::timeout_at(deadline, Box::pin(self.open(idx))).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => return Attempt::Failed(idx, e),
                    Err(_) => return self.over(op, kind, idx, sent),
                }
                // Replaced between the two (another request found it dead): go again, on
                // the new one; nothing was sent.
                match self.lend(idx, f) {
                    Some(lent) => lent,
                    None => return Attempt::Unsent,
                }
            }
        };
        let (mut request, replaced, terms) = lent;
        self.asked(idx, sent);
        let _writing = (kind == Kind::Write).then(|| terms.writing(sent));
        // Most requests are answered within SETTLE_AFTER, and wait on nothing else: what
        // follows registers with locks every request on the connection shares.
        let timer = tokio::time::sleep_until(deadline.min(sent + SETTLE_AFTER));
        let mut timer = std::pin::pin!(timer);
        let quick = tokio::select! {
            biased;
            r = &mut request => Some(r),
            () = &mut timer => None,
        };
        let answer = match quick {
            Some(answer) => answer,
            None => {
                timer.as_mut().reset(deadline);
                // A read whose connection is replaced meanwhile (another request found it
                // dead) goes again on the new one rather than wait out the request timeout
                // on the old. A write may have been applied: its caller must be told, and
                // not before the request timeout. A connection left for its silence may
                // only be stalled, and a write still on it lands when it thaws: a caller
                // told at once moves on while its write is in flight (tried: turmoil seed
                // 7783, a registration's heal held 5.6 s, reported at the probe's 2 s,
                // landed after the registration's stop had returned).
                tokio::select! {
                    biased;
                    r = &mut request => r,
                    _ = replaced.cancelled(), if kind == Kind::Read => return Attempt::Unsent,
                    // Stranded by a leader change, and settled: applied, or never to be
                    // (`crate::settle`). The caller hears so now, not at the timeout.
                    () = terms.settled(sent), if kind == Kind::Write => {
                        return Attempt::Failed(idx, Error::Indeterminate {
                            backend: BACKEND,
                            operation: op,
                            source: "the member's raft leader changed while the write waited \
                                     on it: it was applied before the change, or it never will be"
                                .into(),
                        })
                    }
                    () = &mut timer => return self.over(op, kind, idx, sent),
                }
            }
        };
        match answer {
            Ok(v) => {
                if let Some(term) = v.raft_term() {
                    terms.observe(sent, term);
                }
                self.answered(idx, sent);
                Attempt::Answered(v)
            }
            Err(e) => {
                // A member's refusal is an answer: its connection is alive.
                if from_member(&e) {
                    self.answered(idx, sent);
                }
                Attempt::Failed(idx, map(op, kind, e))
            }
        }
    }

    /// A try sent at `sent` on endpoint `idx` that had no answer within the request timeout.
    fn over<T>(&self, op: &'static str, kind: Kind, idx: usize, sent: Instant) -> Attempt<T> {
        // A member that answers nothing within the request timeout (stopped, cut off) would
        // hold the next request as long: move on (first, so that what the replacement ends
        // goes again on the next member).
        self.fail_over(idx);
        self.reconnect(idx);
        self.reconnect_waiting_since(idx, sent);
        let source = format!("no answer within {:?}", self.request_timeout());
        Attempt::Over(match kind {
            Kind::Read => Error::Unavailable {
                backend: BACKEND,
                operation: op,
                source: source.into(),
            },
            Kind::Write => Error::Indeterminate {
                backend: BACKEND,
                operation: op,
                source: source.into(),
            },
        })
    }
}

/// How one try of a request ended.
enum Attempt<T> {
    Answered(T),
    /// Its connection was replaced before it went out.
    Unsent,
    /// Failed on member `.0`, as the error's class says.
    Failed(usize, Error),
    /// The request timeout passed: it ends here, whatever the class.
    Over(Error),
}

/// An error and its sources on one line, for messages that must say everything.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(src) = cur {
        s.push_str(": ");
        s.push_str(&src.to_string());
        cur = src.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pool of `members` members whose connections are never used: the requests below fail
    /// before they reach them.
    fn pool_of(members: usize) -> Arc<Pool> {
        let lazy = crate::dial::member_dialer(|| tokio::net::TcpStream::connect("127.0.0.1:1"));
        let lazy = Transport::Dial(Arc::from(lazy));
        Pool::new(
            EtcdConfig::new(["unused:1"]).with_request_timeout(Duration::from_secs(2)),
            vec![lazy; members],
        )
    }

    fn pool() -> Arc<Pool> {
        pool_of(1)
    }

    /// Each endpoint's connection, opened now: its token says when it is replaced.
    async fn connections(pool: &Pool) -> Vec<CancellationToken> {
        let mut tokens = Vec::new();
        for i in 0..pool.endpoints.len() {
            tokens.push(pool.connection_at(i).await.unwrap().1);
        }
        tokens
    }

    fn replaced(tokens: &[CancellationToken]) -> Vec<bool> {
        tokens.iter().map(|t| t.is_cancelled()).collect()
    }

    /// A request of `kind` whose first attempt never hears back, its connection replaced 100 ms
    /// in: what it came to, after how long, and in how many attempts.
    async fn replaced_under(kind: Kind) -> (Result<usize>, Duration, usize) {
        replaced_after(kind, Duration::from_millis(100)).await
    }

    /// As [`replaced_under`], the connection replaced `after` the request was sent.
    async fn replaced_after(kind: Kind, after: Duration) -> (Result<usize>, Duration, usize) {
        let pool = pool();
        let attempts = Arc::new(AtomicUsize::new(0));
        let start = Instant::now();
        let request = {
            let (pool, attempts) = (pool.clone(), attempts.clone());
            tokio::spawn(async move {
                pool.call("get", kind, b"k", move |_| {
                    let n = attempts.fetch_add(1, Ordering::Relaxed);
                    async move {
                        if n == 0 {
                            std::future::pending::<()>().await;
                        }
                        Ok(n)
                    }
                })
                .await
            })
        };
        tokio::time::sleep(after).await;
        pool.reconnect(0);
        let result = request.await.unwrap();
        (result, start.elapsed(), attempts.load(Ordering::Relaxed))
    }

    #[tokio::test(start_paused = true)]
    async fn a_read_whose_connection_is_replaced_goes_again_on_the_new_one() {
        let (result, took, attempts) = replaced_under(Kind::Read).await;
        assert_eq!(result.unwrap(), 1);
        assert_eq!(attempts, 2);
        assert_eq!(
            took,
            Duration::from_millis(100),
            "at once, not at the timeout"
        );
    }

    /// A request looks at its connection's replacement only once it has waited SETTLE_AFTER
    /// (watching costs every request a registration under a lock the connection's requests
    /// share, and nearly all are answered sooner): one replaced before goes again then.
    #[tokio::test(start_paused = true)]
    async fn a_read_replaced_in_its_first_moments_goes_again_after_settle_after() {
        let (result, took, attempts) = replaced_after(Kind::Read, Duration::from_millis(10)).await;
        assert_eq!(result.unwrap(), 1);
        assert_eq!(attempts, 2);
        assert_eq!(took, SETTLE_AFTER);
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_whose_connection_is_replaced_is_not_sent_again() {
        let (result, took, attempts) = replaced_under(Kind::Write).await;
        assert!(
            matches!(result, Err(Error::Indeterminate { .. })),
            "{result:?}"
        );
        assert_eq!(attempts, 1);
        assert_eq!(took, Duration::from_secs(2), "the request timeout");
    }

    /// In real time, where no two reads of the clock agree: a request answered leaves its
    /// connection waiting on nothing (it was left waiting forever, probed and replaced with
    /// the ones that waited, when the wait was stamped by a second read of the clock).
    #[tokio::test]
    async fn an_answered_request_leaves_its_connection_waiting_on_nothing() {
        let pool = pool_of(2);
        for kind in [Kind::Read, Kind::Write] {
            pool.call("get", kind, b"k", |_| async { Ok(()) })
                .await
                .unwrap();
            assert_eq!(pool.activity(0).awaiting, None, "{kind:?}");
        }
        let tokens = connections(&pool).await;
        // So a request given up on the other member replaces only that member's connection.
        assert!(pool.unanswered(1, Instant::now()));
        assert_eq!(replaced(&tokens), [false, true]);
    }

    #[tokio::test(start_paused = true)]
    async fn an_unanswered_request_replaces_every_connection_waiting_and_silent_since() {
        let pool = pool_of(5);
        let tokens = connections(&pool).await;
        // Endpoint 0 waits on a request sent before the one given up on endpoint 1.
        pool.asked(0, Instant::now());
        tokio::time::advance(Duration::from_millis(300)).await;
        let sent = Instant::now();
        pool.asked(1, sent);
        tokio::time::advance(Duration::from_millis(300)).await;
        // Endpoint 2 waits on one sent after it, and has answered nothing sent since: as
        // dead as endpoint 1, for all it shows (seed 270's retry went to such a one).
        pool.asked(2, Instant::now());
        // Endpoint 3 answered a request sent after it, and waits on another: alive since.
        pool.asked(3, Instant::now());
        pool.answered(3, Instant::now());
        pool.asked(3, Instant::now());
        // Endpoint 4 waits on nothing: nothing to judge it by (the probe of quiet connections
        // asks it, if something watches there).
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(pool.unanswered(1, sent));
        assert_eq!(replaced(&tokens), [true, true, true, false, false]);
        // The replacements start afresh, awaiting nothing: a request given up now replaces
        // only endpoint 3, still waiting and silent since.
        let tokens = connections(&pool).await;
        assert!(pool.unanswered(1, Instant::now()));
        assert_eq!(replaced(&tokens), [false, true, false, true, false]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_that_answered_since_is_slow_not_dead() {
        let pool = pool_of(2);
        let tokens = connections(&pool).await;
        let sent = Instant::now();
        pool.asked(0, sent);
        pool.asked(1, sent);
        tokio::time::advance(Duration::from_millis(500)).await;
        // An answer to a request sent before this one proves nothing: the way out may have
        // died since.
        pool.answered(1, sent - Duration::from_millis(1));
        assert!(!pool.silent_since(1, sent - Duration::from_millis(1)));
        assert!(pool.silent_since(1, sent));
        // Endpoint 1 answered another request sent after this one: it is slow, so neither it
        // nor endpoint 0 (which waits longer) is given up on.
        pool.answered(1, Instant::now());
        tokio::time::advance(Duration::from_millis(500)).await;
        assert!(!pool.unanswered(1, sent));
        assert_eq!(replaced(&tokens), [false, false]);
        // An answer on endpoint 0 ends its wait: an older request of its own, since answered
        // around, says nothing about it.
        pool.answered(0, Instant::now());
        let later = Instant::now();
        pool.asked(1, later);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(pool.unanswered(1, later));
        assert_eq!(replaced(&tokens), [false, true]);
    }

    /// A read whose attempts fail in turn with `answers` (an `Unavailable` status each, as
    /// its message says), and then succeed.
    async fn read_answered(pool: &Pool, answers: &[&'static str]) -> Result<()> {
        let answers = Arc::new(Mutex::new(
            answers.iter().rev().copied().collect::<Vec<_>>(),
        ));
        pool.call("get", Kind::Read, b"k", move |_| {
            let answer = answers.lock().unwrap().pop();
            async move {
                match answer {
                    Some(m) => Err(etcd_client::Error::GRpcStatus(tonic::Status::unavailable(
                        m,
                    ))),
                    None => Ok(()),
                }
            }
        })
        .await
    }

    /// A read answered `no leader` by member 0 and then `leader changed` by member 1: which
    /// streams ended, which connections went, and where requests go now.
    #[tokio::test(start_paused = true)]
    async fn the_streams_of_a_member_requests_leave_end() {
        let pool = pool_of(3);
        let tokens = connections(&pool).await;
        let result = read_answered(&pool, &["etcdserver: no leader", "leader changed"]).await;
        assert!(result.is_ok(), "{result:?}");
        // Requests left members 0 and 1, and their streams with them: a watch left on member
        // 1 would go stale, unwatched, if it were cut off later.
        assert_eq!(replaced(&tokens), [true, true, false]);
        assert_eq!(pool.current(), 2);
        // Member 0 is cut off: its connection goes too. Member 1 only lost its leader to an
        // election: its connection is kept.
        assert!(
            pool.open_at(0).is_none(),
            "member 0's connection is replaced"
        );
        assert!(pool.open_at(1).is_some(), "member 1's connection is kept");
        let fresh = pool.connection_at(1).await.unwrap().1;
        assert!(
            !fresh.is_cancelled(),
            "streams opened on it afterwards carry on"
        );
    }

    /// A member's refusal is an answer from a live member: it ends its connection's wait, so
    /// a request given up on elsewhere leaves that connection be. A failure on the way there
    /// is no answer: that connection still waits, and goes with the one given up on.
    #[tokio::test(start_paused = true)]
    async fn a_members_refusal_is_an_answer_and_a_transport_failure_is_not() {
        let pool = pool_of(3);
        let tokens = connections(&pool).await;
        // Member 0 refuses, the way to member 1 fails, member 2 answers.
        let result = read_answered(
            &pool,
            &[
                "etcdserver: leader changed",
                "transport error: connection reset",
            ],
        )
        .await;
        assert!(result.is_ok(), "{result:?}");
        assert_eq!(pool.activity(0).awaiting, None, "member 0 answered");
        assert!(pool.activity(1).awaiting.is_some(), "member 1 did not");
        tokio::time::advance(Duration::from_millis(100)).await;
        let sent = Instant::now();
        pool.asked(2, sent);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(pool.unanswered(2, sent));
        // Every member's streams ended (requests left 0 and 1, 2 was replaced); only the
        // connections that had not answered went.
        assert_eq!(replaced(&tokens), [true, true, true]);
        let kept: Vec<bool> = (0..3).map(|i| pool.open_at(i).is_some()).collect();
        assert_eq!(kept, [true, false, false]);
    }

    /// The gaps between the attempts of a read, about `about`, that fails every time with
    /// an error the pool retries.
    async fn retry_gaps(about: &[u8]) -> Vec<Duration> {
        let attempts = Arc::new(Mutex::new(Vec::new()));
        let seen = attempts.clone();
        let result: Result<()> = pool()
            .call("get", Kind::Read, about, move |_| {
                seen.lock().unwrap().push(Instant::now());
                async {
                    Err(etcd_client::Error::GRpcStatus(tonic::Status::unavailable(
                        "leader changed",
                    )))
                }
            })
            .await;
        assert!(result.is_err());
        let at = attempts.lock().unwrap().clone();
        at.windows(2).map(|w| w[1] - w[0]).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn retries_back_off_with_jitter_seeded_by_what_the_request_is_about() {
        let gaps = retry_gaps(b"hosts/a").await;
        // 20 ms doubling to 500 ms, each step jittered down by up to half, until the next
        // would pass the 2 s request timeout.
        assert!(gaps.len() >= 5, "{gaps:?}");
        let mut step = Duration::from_millis(20);
        for gap in &gaps {
            assert!(
                *gap <= step && *gap >= step / 2,
                "{gap:?} outside [{:?}, {step:?}]",
                step / 2
            );
            step = (step * 2).min(Duration::from_millis(500));
        }
        assert_eq!(
            retry_gaps(b"hosts/a").await,
            gaps,
            "the same request, the same delays"
        );
        assert_ne!(
            retry_gaps(b"hosts/b").await,
            gaps,
            "another host's, other delays"
        );
    }
}
