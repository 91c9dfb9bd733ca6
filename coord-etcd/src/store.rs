//! [`EtcdStore`]: the [`KvLeaseStore`] on a real etcd cluster.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use coord_api::{
    validate, Bytes, DeleteRequest, DeleteResponse, DynKvLeaseStore, Error, GetRequest,
    GetResponse, KeepAlive, KvLeaseStore, KvLeaseStoreExt, LeaseGrant, LeaseId, LeaseTimeToLive,
    Limits, PutRequest, PutResponse, Result, Revision, TxnOp, TxnRequest, TxnResponse,
    WatchRequest, WatchStream,
};
use etcd_client::Client;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::EtcdConfig;
use crate::convert;
use crate::error::{map, Kind, BACKEND};
use crate::keepalive::EtcdKeepAlive;
use crate::watch;

/// One endpoint and, once connected, its client. Each endpoint gets its own client (a
/// channel to that member alone) so the store decides where a request goes: etcd-client's
/// own balancer keeps picking a dead member and fails about a third of requests after a
/// member dies (`docs/ETCD-BEHAVIOUR.md` 3.6).
struct Endpoint {
    url: String,
    /// The connection, and the token that ends the streams opened on it when it is
    /// replaced.
    client: Mutex<Option<(Client, CancellationToken)>>,
    /// When the current connection last answered anything (a reply, a keep-alive answer):
    /// a connection that answered lately is slow, not dead, and is kept.
    answered: Mutex<Option<Instant>>,
    /// Makes the channel to connect over, when the caller supplies channels
    /// ([`EtcdStore::from_channel_factory`]) rather than endpoints.
    channel: Option<ChannelFactory>,
}

/// Makes a new channel (a new connection) to one member.
type ChannelFactory = Arc<dyn Fn() -> tonic::transport::Channel + Send + Sync>;

pub(crate) struct Inner {
    endpoints: Vec<Endpoint>,
    /// The endpoint requests go to until it fails.
    current: AtomicUsize,
    config: EtcdConfig,
}

/// The production [`KvLeaseStore`]: etcd v3 through the `etcd-client` crate.
///
/// * **Failover.** Given every member's endpoint, it sends requests to one member and moves
///   to the next when a connection fails. Reads are retried (any transport failure), writes
///   only when they were never sent; retries back off from 20 ms to 500 ms and stop at the
///   request timeout.
/// * **Outcomes.** A write whose outcome is unknown (timed out after being sent, connection
///   lost mid-request) is [`Error::Indeterminate`], never retried silently.
/// * **Keep-alive and watch** run on etcd's streams; a revoked lease (which etcd answers with
///   TTL 0 on a stream that stays open) is [`Error::LeaseNotFound`], a compacted start
///   revision [`Error::Compacted`].
/// * **Elections** use the trait's client-side algorithm, not etcd 3.4's server-side
///   election API, which can hand out a leadership whose key is gone.
///
/// ```no_run
/// # async fn run() -> coord_api::Result<()> {
/// use coord_api::{KvLeaseStore, KvLeaseStoreExt};
/// use coord_etcd::{EtcdConfig, EtcdStore};
///
/// let store = EtcdStore::connect(EtcdConfig::new(["127.0.0.1:2379"])).await?;
/// store.put_value("greeting", "hello").await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct EtcdStore {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let urls: Vec<_> = self.inner.endpoints.iter().map(|e| &e.url).collect();
        f.debug_struct("EtcdStore")
            .field("endpoints", &urls)
            .field("current", &self.inner.current.load(Ordering::Relaxed))
            .finish()
    }
}

impl EtcdStore {
    /// Connects and checks that some endpoint answers, within the connect timeout per
    /// endpoint.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a bad configuration;
    /// [`Error::PermissionDenied`] for credentials etcd refuses;
    /// [`Error::Unavailable`] when no endpoint answers (it names them).
    pub async fn connect(config: EtcdConfig) -> Result<Self> {
        config.validate()?;
        let store = Self::from_parts(config, None);
        store.probe().await?;
        Ok(store)
    }

    /// A store that connects on first use, for a service that must start while etcd is
    /// unreachable: nothing is dialled here, every call dials (and fails over) as usual, and
    /// recipes started in the background ([`HostRegistration::spawn`], [`Candidate::spawn`])
    /// come up once etcd answers.
    ///
    /// [`HostRegistration::spawn`]: coord_api::recipes::HostRegistration::spawn
    /// [`Candidate::spawn`]: coord_api::recipes::Candidate::spawn
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a bad configuration (the only check made here).
    pub fn connect_lazy(config: EtcdConfig) -> Result<Self> {
        config.validate()?;
        Ok(Self::from_parts(config, None))
    }

    /// Connects over an existing tonic channel (for example one that runs over a simulated
    /// network). The channel's own settings (timeouts, TLS) apply; the endpoints of `config`
    /// are not used, but its request timeout, credentials and limits are.
    pub async fn from_channel(
        channel: tonic::transport::Channel,
        config: EtcdConfig,
    ) -> Result<Self> {
        Self::from_channel_factory(move || channel.clone(), config).await
    }

    /// Connects over channels that `make` builds, one per connection: the store calls it
    /// again for a fresh connection when the current one stops answering (a half-open
    /// connection that only HTTP/2 keep-alive would otherwise detect, seconds later). For
    /// example, a channel over a simulated network. Otherwise as
    /// [`from_channel`](Self::from_channel).
    pub async fn from_channel_factory(
        make: impl Fn() -> tonic::transport::Channel + Send + Sync + 'static,
        config: EtcdConfig,
    ) -> Result<Self> {
        let store = Self::from_parts(config, Some(Arc::new(make)));
        store.client_at(0).await?;
        Ok(store)
    }

    fn from_parts(config: EtcdConfig, channel: Option<ChannelFactory>) -> Self {
        let endpoints = match channel {
            None => config
                .endpoints
                .iter()
                .map(|url| Endpoint {
                    url: url.clone(),
                    client: Mutex::new(None),
                    answered: Mutex::new(None),
                    channel: None,
                })
                .collect(),
            Some(make) => vec![Endpoint {
                url: "channel".to_owned(),
                client: Mutex::new(None),
                answered: Mutex::new(None),
                channel: Some(make),
            }],
        };
        EtcdStore {
            inner: Arc::new(Inner {
                endpoints,
                current: AtomicUsize::new(0),
                config,
            }),
        }
    }

    /// The configuration the store runs with.
    pub fn config(&self) -> &EtcdConfig {
        &self.inner.config
    }

    /// Asks each endpoint in turn for its status until one answers.
    async fn probe(&self) -> Result<()> {
        let mut failures = Vec::new();
        for i in 0..self.inner.endpoints.len() {
            let url = self.inner.endpoints[i].url.clone();
            let attempt = async {
                let mut c = self.client_at(i).await?;
                c.status().await.map_err(|e| map("connect", Kind::Read, e))
            };
            match tokio::time::timeout(self.inner.config.connect_timeout, attempt).await {
                Ok(Ok(_)) => {
                    self.inner.current.store(i, Ordering::Relaxed);
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
                    self.inner.config.connect_timeout
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
        let tls = self.inner.config.tls.as_ref()?;
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
        let ep = &self.inner.endpoints[i];
        if let Some(c) = ep.client.lock().unwrap_or_else(|p| p.into_inner()).clone() {
            return Ok(c);
        }
        let options = Some(self.inner.config.connect_options());
        let client = match &ep.channel {
            Some(make) => Client::from_channel(etcd_client::Channel::Tonic(make()), options).await,
            None => Client::connect([ep.url.as_str()], options).await,
        }
        .map_err(|e| map("connect", Kind::Read, e))?;
        let connection = (client, CancellationToken::new());
        *ep.client.lock().unwrap_or_else(|p| p.into_inner()) = Some(connection.clone());
        Ok(connection)
    }

    /// Drops endpoint `i`'s connection after it stopped answering: the next request connects
    /// afresh. A connection whose peer vanished without a reset (a partition that outlived
    /// TCP, a NAT that forgot it) otherwise holds every request until the request timeout,
    /// over and over, until HTTP/2 keep-alive finally notices it (10 s + 5 s by default).
    pub(crate) fn reconnect(&self, i: usize) {
        let ep = &self.inner.endpoints[i];
        *ep.answered.lock().unwrap_or_else(|p| p.into_inner()) = None;
        if let Some((_, streams)) = ep.client.lock().unwrap_or_else(|p| p.into_inner()).take() {
            tracing::debug!(endpoint = %ep.url, "no answer; reconnecting");
            streams.cancel();
        }
    }

    /// Notes that endpoint `i`'s connection answered something just now.
    pub(crate) fn answered(&self, i: usize) {
        *self.inner.endpoints[i]
            .answered
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
    }

    /// Replaces endpoint `i`'s connection unless it answered anything since `since`: a
    /// request abandoned on a connection that still answers others is slow, not dead.
    pub(crate) fn reconnect_if_silent_since(&self, i: usize, since: Instant) {
        let last = *self.inner.endpoints[i]
            .answered
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if last.is_none_or(|at| at < since) {
            self.reconnect(i);
        }
    }

    /// The endpoint index requests currently go to.
    pub(crate) fn current(&self) -> usize {
        self.inner.current.load(Ordering::Relaxed)
    }

    /// Moves requests off endpoint `from` (if no one moved them already).
    pub(crate) fn fail_over(&self, from: usize) {
        let n = self.inner.endpoints.len();
        if n > 1 {
            let next = (from + 1) % n;
            if self
                .inner
                .current
                .compare_exchange(from, next, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
            {
                tracing::debug!(
                    from = %self.inner.endpoints[from].url,
                    to = %self.inner.endpoints[next].url,
                    "etcd endpoint failed; moving to the next"
                );
            }
        }
    }

    pub(crate) fn request_timeout(&self) -> Duration {
        self.inner.config.request_timeout
    }

    /// Runs one request with failover and bounded retries; see the type's docs.
    pub(crate) async fn call<T, F, Fut>(&self, op: &'static str, kind: Kind, mut f: F) -> Result<T>
    where
        F: FnMut(Client) -> Fut + Send,
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>> + Send,
        T: Send,
    {
        self.call_on(op, kind, move |c, _| f(c)).await
    }

    /// As [`call`](Self::call), also handing `f` the connection's token (see
    /// [`connection_at`](Self::connection_at)), for requests that open a stream.
    pub(crate) async fn call_on<T, F, Fut>(
        &self,
        op: &'static str,
        kind: Kind,
        mut f: F,
    ) -> Result<T>
    where
        F: FnMut(Client, CancellationToken) -> Fut + Send,
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>> + Send,
        T: Send,
    {
        let deadline = Instant::now() + self.request_timeout();
        let n = self.inner.endpoints.len();
        let mut backoff = Duration::from_millis(20);
        let mut attempt = 0usize;
        loop {
            let idx = self.current();
            let outcome = tokio::time::timeout_at(deadline, async {
                let (client, streams) = self.connection_at(idx).await?;
                f(client, streams).await.map_err(|e| map(op, kind, e))
            })
            .await;
            let err = match outcome {
                Ok(Ok(v)) => {
                    self.answered(idx);
                    return Ok(v);
                }
                Ok(Err(e)) => e,
                Err(_) => {
                    self.reconnect(idx);
                    let source = format!("no answer within {:?}", self.request_timeout());
                    return Err(match kind {
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
                    });
                }
            };
            if !err.is_retryable() {
                return Err(err);
            }
            self.fail_over(idx);
            attempt += 1;
            // The first pass over the other members goes at once; after that, back off.
            if attempt >= n {
                if Instant::now() + backoff >= deadline {
                    return Err(err);
                }
                tracing::debug!(operation = op, attempt, backoff_ms = backoff.as_millis() as u64, error = %error_chain(&err), "retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_millis(500));
            }
        }
    }

    /// The compaction point. etcd's revision errors do not carry it, and a watch's cancel
    /// (which does) comes from an asynchronous loop that can take seconds; so search for it:
    /// reads below it fail with "compacted", reads at or above it succeed. `below` is a
    /// revision known to be compacted. About 20 reads at worst, and only on an error path.
    async fn compact_revision(&self, below: Revision) -> Revision {
        let readable = |rev: i64| async move {
            let r = self
                .call("get", Kind::Read, |mut c| async move {
                    c.get(
                        vec![0u8],
                        Some(etcd_client::GetOptions::new().with_revision(rev)),
                    )
                    .await
                })
                .await;
            match r {
                Ok(_) => Some(true),
                Err(Error::Compacted { .. }) => Some(false),
                Err(_) => None,
            }
        };
        let Ok(current) = self.current_revision().await else {
            return Revision::ZERO;
        };
        // Invariant: `lo` is compacted, `hi` is readable (the current revision always is).
        let (mut lo, mut hi) = (below.get().max(0), current.get());
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            match readable(mid).await {
                Some(true) => hi = mid,
                Some(false) => lo = mid,
                None => return Revision::ZERO,
            }
        }
        Revision(hi)
    }

    /// Fills in what etcd's revision errors do not carry.
    async fn with_revisions(&self, err: Error, requested: Revision) -> Error {
        match err {
            Error::Compacted { .. } => Error::Compacted {
                requested,
                // `requested - 1` is compacted whether a read at `requested` failed (so it is below
                // the point) or a compaction at it did (so it is at or below).
                compact_revision: self.compact_revision(requested.prev()).await,
            },
            Error::FutureRevision { .. } => {
                let current = self.current_revision().await.unwrap_or(Revision::ZERO);
                Error::FutureRevision { requested, current }
            }
            other => other,
        }
    }
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

/// Fills in the lease a `LeaseNotFound` is about (etcd's error does not say).
pub(crate) fn with_lease(err: Error, lease: Option<LeaseId>) -> Error {
    match (err, lease) {
        (Error::LeaseNotFound { .. }, Some(lease)) => Error::LeaseNotFound { lease },
        (other, _) => other,
    }
}

/// The leases a transaction's puts name, success branch first, each once.
fn txn_leases(req: &TxnRequest) -> Vec<LeaseId> {
    let mut leases: Vec<LeaseId> = Vec::new();
    for op in req.success.iter().chain(&req.failure) {
        if let TxnOp::Put(p) = op {
            if let Some(l) = p.lease.filter(|l| !l.is_none()) {
                if !leases.contains(&l) {
                    leases.push(l);
                }
            }
        }
    }
    leases
}

#[async_trait]
impl KvLeaseStore for EtcdStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn limits(&self) -> Limits {
        self.inner.config.limits.clone()
    }

    fn shared(&self) -> Arc<DynKvLeaseStore> {
        Arc::new(self.clone())
    }

    async fn get(&self, req: GetRequest) -> Result<GetResponse> {
        validate::get(&req)?;
        let (key, opts) = convert::get(&req);
        let res = self
            .call("get", Kind::Read, |mut c| {
                let (key, opts) = (key.clone(), opts.clone());
                async move { c.get(key, Some(opts)).await }
            })
            .await;
        match res {
            Ok(r) => Ok(convert::get_response(r)),
            Err(e) => Err(self
                .with_revisions(e, req.revision.unwrap_or(Revision::ZERO))
                .await),
        }
    }

    async fn put(&self, req: PutRequest) -> Result<PutResponse> {
        validate::put(&req, &self.inner.config.limits)?;
        let opts = convert::put_options(&req);
        self.call("put", Kind::Write, |mut c| {
            let (key, value, opts) = (req.key.to_vec(), req.value.to_vec(), opts.clone());
            async move { c.put(key, value, Some(opts)).await }
        })
        .await
        .map(convert::put_response)
        .map_err(|e| with_lease(e, req.lease))
    }

    async fn delete(&self, req: DeleteRequest) -> Result<DeleteResponse> {
        validate::delete(&req)?;
        let (key, opts) = convert::delete(&req);
        self.call("delete", Kind::Write, |mut c| {
            let (key, opts) = (key.clone(), opts.clone());
            async move { c.delete(key, Some(opts)).await }
        })
        .await
        .map(convert::delete_response)
    }

    async fn txn(&self, req: TxnRequest) -> Result<TxnResponse> {
        validate::txn(&req, &self.inner.config.limits)?;
        let writes = req
            .success
            .iter()
            .chain(&req.failure)
            .any(|op| !matches!(op, TxnOp::Get(_)));
        let kind = if writes { Kind::Write } else { Kind::Read };
        let res = self
            .call("txn", kind, |mut c| {
                let txn = convert::txn(&req);
                async move { c.txn(txn).await }
            })
            .await;
        match res {
            Ok(r) => Ok(convert::txn_response(r)),
            Err(e) => {
                let requested = req
                    .success
                    .iter()
                    .chain(&req.failure)
                    .find_map(|op| match op {
                        TxnOp::Get(g) => g.revision,
                        _ => None,
                    })
                    .unwrap_or(Revision::ZERO);
                let e = match e {
                    // etcd does not say which lease is missing; with several, ask.
                    Error::LeaseNotFound { .. } => {
                        let leases = txn_leases(&req);
                        let mut missing = leases.first().copied();
                        if leases.len() > 1 {
                            for l in leases {
                                if matches!(
                                    self.time_to_live(l).await,
                                    Err(Error::LeaseNotFound { .. })
                                ) {
                                    missing = Some(l);
                                    break;
                                }
                            }
                        }
                        with_lease(e, missing)
                    }
                    other => other,
                };
                Err(self.with_revisions(e, requested).await)
            }
        }
    }

    async fn grant(&self, ttl: Duration) -> Result<LeaseGrant> {
        validate::ttl(ttl, &self.inner.config.limits)?;
        // Whole seconds, rounded up: etcd's TTLs are integers. etcd raises it to its minimum.
        let secs = (ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0)) as i64;
        let r = self
            .call("grant", Kind::Write, |mut c| async move {
                c.lease_grant(secs, None).await
            })
            .await?;
        Ok(LeaseGrant::new(
            LeaseId(r.id()),
            Duration::from_secs(r.ttl().max(0) as u64),
        ))
    }

    async fn revoke(&self, lease: LeaseId) -> Result<Revision> {
        let r = self
            .call("revoke", Kind::Write, |mut c| async move {
                c.lease_revoke(lease.0).await
            })
            .await
            .map_err(|e| with_lease(e, Some(lease)))?;
        Ok(Revision(r.header().map_or(0, |h| h.revision())))
    }

    async fn time_to_live(&self, lease: LeaseId) -> Result<LeaseTimeToLive> {
        let r = self
            .call("time-to-live", Kind::Read, |mut c| async move {
                c.lease_time_to_live(
                    lease.0,
                    Some(etcd_client::LeaseTimeToLiveOptions::new().with_keys()),
                )
                .await
            })
            .await
            .map_err(|e| with_lease(e, Some(lease)))?;
        // etcd answers a dead lease with TTL -1, not an error.
        if r.ttl() < 0 {
            return Err(Error::LeaseNotFound { lease });
        }
        let mut keys: Vec<Bytes> = r.keys().iter().map(|k| Bytes::from(k.clone())).collect();
        // etcd lists them in map order; the contract promises key order.
        keys.sort();
        Ok(LeaseTimeToLive::new(
            lease,
            Duration::from_secs(r.ttl() as u64),
            Duration::from_secs(r.granted_ttl().max(0) as u64),
            keys,
        ))
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<Box<dyn KeepAlive>> {
        // Opened now: etcd's stream needs a renewal to open, a round trip that would
        // otherwise come out of the first renewal's time.
        let mut channel = EtcdKeepAlive::new(self.clone(), lease);
        let timeout = self.request_timeout();
        match tokio::time::timeout(timeout, channel.open()).await {
            Ok(opened) => opened?,
            Err(_) => {
                return Err(Error::StreamClosed {
                    stream: "keep-alive",
                    source: Some(format!("not opened within {timeout:?}").into()),
                })
            }
        }
        Ok(Box::new(channel))
    }

    async fn watch(&self, req: WatchRequest) -> Result<WatchStream> {
        validate::watch(&req)?;
        watch::open(self, req).await
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        let res = self
            .call("compact", Kind::Write, |mut c| async move {
                c.compact(revision.get(), None).await
            })
            .await;
        match res {
            Ok(_) => Ok(()),
            Err(e) => Err(self.with_revisions(e, revision).await),
        }
    }
}
