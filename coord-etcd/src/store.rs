//! [`EtcdStore`]: the [`KvLeaseStore`] on a real etcd cluster.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use coord_api::{
    elections, validate, Bytes, DeleteRequest, DeleteResponse, DynKvLeaseStore, Error, GetRequest,
    GetResponse, KeepAlive, KeyValue, KvLeaseStore, KvLeaseStoreExt, LeaderKey, LeaderStream,
    LeaseGrant, LeaseId, LeaseTimeToLive, Limits, PutRequest, PutResponse, Result, Revision, TxnOp,
    TxnRequest, TxnResponse, WatchRequest, WatchStream,
};

use crate::config::EtcdConfig;
use crate::convert;
use crate::dial::MemberDialer;
use crate::error::{with_lease, Kind, BACKEND};
use crate::keepalive::EtcdKeepAlive;
use crate::pool::{ChannelFactory, Pool, Transport};
use crate::watch;

/// Makes a new channel (a new connection) to one member; see
/// [`EtcdStore::from_member_channels`].
pub type MemberChannel = Box<dyn Fn() -> tonic::transport::Channel + Send + Sync>;

/// The production [`KvLeaseStore`]: etcd v3 through the `etcd-client` crate.
///
/// * **Failover.** Given every member's endpoint, it sends requests to one member and moves
///   to the next when a connection fails. Reads are retried (any transport failure), writes
///   only when they were never sent; retries back off from 20 ms to 500 ms, jittered by
///   what the request is about (coord's one policy, [`coord_api::retry`]), and stop at the
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
    pub(crate) pool: Arc<Pool>,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let urls = self.pool.urls();
        f.debug_struct("EtcdStore")
            .field("endpoints", &urls)
            .field("current", &self.pool.current())
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
        let store = Self::on(Pool::new(config, Vec::new()));
        store.pool.probe().await?;
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
        Ok(Self::on(Pool::new(config, Vec::new())))
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
        Self::from_member_channels(vec![Box::new(make)], config).await
    }

    /// Connects to a cluster over channels to its members, one factory per member (as
    /// [`from_channel_factory`](Self::from_channel_factory) for each): requests go to the
    /// first until it fails, then move on, as with a list of endpoints. For example, the
    /// members of a simulated cluster.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] without a factory; otherwise as
    /// [`from_channel`](Self::from_channel).
    pub async fn from_member_channels(
        members: Vec<MemberChannel>,
        config: EtcdConfig,
    ) -> Result<Self> {
        if members.is_empty() {
            return Err(Error::InvalidArgument {
                reason: "from_member_channels needs a channel factory per member, got none".into(),
            });
        }
        let channels = members
            .into_iter()
            .map(|make| Transport::Channel(ChannelFactory::from(make)))
            .collect();
        let store = Self::on(Pool::new(config, channels));
        store.pool.client_at(0).await?;
        Ok(store)
    }

    /// Connects to a cluster over connections that dialers open, one dialer per member, with
    /// coord's own HTTP/2 channel and `config`'s connect timeout and keep-alive, as
    /// [`connect`](Self::connect) does over TCP: for example over a simulated network. The
    /// dialled stream is used as it is (TLS, if wanted, is the dialer's); `config`'s endpoints
    /// are not dialled. Requests go to the first member until it fails, then move on.
    ///
    /// ```no_run
    /// # async fn run() -> coord_api::Result<()> {
    /// use coord_etcd::{member_dialer, EtcdConfig, EtcdStore};
    /// let members = ["10.0.0.1:2379", "10.0.0.2:2379"]
    ///     .map(|at| member_dialer(move || tokio::net::TcpStream::connect(at)))
    ///     .into();
    /// let store = EtcdStore::from_member_dialers(members, EtcdConfig::new(["unused:1"])).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] without a dialer or with an invalid `config`;
    /// [`Error::Unavailable`] when the first member cannot be reached.
    pub async fn from_member_dialers(
        members: Vec<MemberDialer>,
        config: EtcdConfig,
    ) -> Result<Self> {
        if members.is_empty() {
            return Err(Error::InvalidArgument {
                reason: "from_member_dialers needs a dialer per member, got none".into(),
            });
        }
        config.validate()?;
        let members = members
            .into_iter()
            .map(|dial| Transport::Dial(Arc::from(dial)))
            .collect();
        let store = Self::on(Pool::new(config, members));
        store.pool.client_at(0).await?;
        Ok(store)
    }

    fn on(pool: Arc<Pool>) -> Self {
        EtcdStore { pool }
    }

    /// The configuration the store runs with.
    pub fn config(&self) -> &EtcdConfig {
        self.pool.config()
    }

    /// The compaction point. etcd's revision errors do not carry it, and a watch's cancel
    /// (which does) comes from an asynchronous loop that can take seconds; so search for it:
    /// reads below it fail with "compacted", reads at or above it succeed. `below` is a
    /// revision known to be compacted. About 20 reads at worst, and only on an error path.
    async fn compact_revision(&self, below: Revision) -> Revision {
        let readable = |rev: i64| async move {
            let r = self
                .pool
                .call("get", Kind::Read, &rev.to_le_bytes(), |c| {
                    let mut c = c.kv_client();
                    async move {
                        c.get(
                            vec![0u8],
                            Some(etcd_client::GetOptions::new().with_revision(rev)),
                        )
                        .await
                    }
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
        self.pool.config().limits.clone()
    }

    fn shared(&self) -> Arc<DynKvLeaseStore> {
        Arc::new(self.clone())
    }

    async fn get(&self, req: GetRequest) -> Result<GetResponse> {
        validate::get(&req)?;
        let (key, opts) = convert::get(&req);
        let res = self
            .pool
            .call("get", Kind::Read, req.range.start(), |c| {
                let (mut c, key, opts) = (c.kv_client(), key.clone(), opts.clone());
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
        validate::put(&req, &self.pool.config().limits)?;
        let opts = convert::put_options(&req);
        self.pool
            .call("put", Kind::Write, &req.key, |c| {
                let (mut c, key, value, opts) = (
                    c.kv_client(),
                    req.key.to_vec(),
                    req.value.to_vec(),
                    opts.clone(),
                );
                async move { c.put(key, value, Some(opts)).await }
            })
            .await
            .map(convert::put_response)
            .map_err(|e| with_lease(e, req.lease))
    }

    async fn delete(&self, req: DeleteRequest) -> Result<DeleteResponse> {
        validate::delete(&req)?;
        let (key, opts) = convert::delete(&req);
        self.pool
            .call("delete", Kind::Write, req.range.start(), |c| {
                let (mut c, key, opts) = (c.kv_client(), key.clone(), opts.clone());
                async move { c.delete(key, Some(opts)).await }
            })
            .await
            .map(convert::delete_response)
    }

    async fn txn(&self, req: TxnRequest) -> Result<TxnResponse> {
        validate::txn(&req, &self.pool.config().limits)?;
        let kind = if req.writes() {
            Kind::Write
        } else {
            Kind::Read
        };
        let res = self
            .pool
            .call("txn", kind, txn_about(&req), |c| {
                let (mut c, txn) = (c.kv_client(), convert::txn(&req));
                async move {
                    if kind == Kind::Write {
                        return c.txn(txn).await;
                    }
                    // etcd 3.5.0 to 3.5.4 read a read-only transaction under the request's
                    // own context and panic, taking the member down, if it is cancelled
                    // mid-read (etcd#14110, docs/ETCD-BEHAVIOUR.md 3.11). Whoever stops
                    // waiting (a caller dropped, the request timeout, a try on another
                    // member), the request runs out on its own task, never cancelled from
                    // here; it ends when the member answers or the connection goes.
                    tokio::spawn(async move { c.txn(txn).await })
                        .await
                        .unwrap_or_else(|e| {
                            Err(etcd_client::Error::GRpcStatus(tonic::Status::cancelled(
                                format!("the read-only transaction's task ended: {e}"),
                            )))
                        })
                }
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
        validate::ttl(ttl, &self.pool.config().limits)?;
        // Whole seconds, rounded up: etcd's TTLs are integers. etcd raises it to its minimum.
        let secs = (ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0)) as i64;
        let r = self
            .pool
            .call("grant", Kind::Write, &secs.to_le_bytes(), |c| {
                let mut c = c.lease_client();
                async move { c.grant(secs, None).await }
            })
            .await?;
        Ok(LeaseGrant::new(
            LeaseId(r.id()),
            Duration::from_secs(r.ttl().max(0) as u64),
        ))
    }

    async fn revoke(&self, lease: LeaseId) -> Result<Revision> {
        let r = self
            .pool
            .call("revoke", Kind::Write, &lease.0.to_le_bytes(), |c| {
                let mut c = c.lease_client();
                async move { c.revoke(lease.0).await }
            })
            .await
            .map_err(|e| with_lease(e, Some(lease)))?;
        Ok(Revision(r.header().map_or(0, |h| h.revision())))
    }

    async fn time_to_live(&self, lease: LeaseId) -> Result<LeaseTimeToLive> {
        let r = self
            .pool
            .call("time-to-live", Kind::Read, &lease.0.to_le_bytes(), |c| {
                let mut c = c.lease_client();
                async move {
                    c.time_to_live(
                        lease.0,
                        Some(etcd_client::LeaseTimeToLiveOptions::new().with_keys()),
                    )
                    .await
                }
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
        let mut channel = EtcdKeepAlive::new(self.pool.clone(), lease);
        let timeout = self.pool.request_timeout();
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
        watch::open(&self.pool, req).await
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        let res = self
            .pool
            .call("compact", Kind::Write, &revision.get().to_le_bytes(), |c| {
                let mut c = c.kv_client();
                async move { c.compact(revision.get(), None).await }
            })
            .await;
        match res {
            Ok(_) => Ok(()),
            Err(e) => Err(self.with_revisions(e, revision).await),
        }
    }

    // No elections of its own: etcd's algorithm on the primitives above.
    async fn campaign(&self, name: &str, value: Bytes, lease: LeaseId) -> Result<LeaderKey> {
        elections::campaign(self, name, value, lease).await
    }

    async fn proclaim(&self, leader: &LeaderKey, value: Bytes) -> Result<()> {
        elections::proclaim(self, leader, value).await
    }

    async fn leader(&self, name: &str) -> Result<KeyValue> {
        elections::leader(self, name).await
    }

    async fn observe(&self, name: &str) -> Result<LeaderStream> {
        elections::observe(self.shared(), name)
    }

    async fn resign(&self, leader: &LeaderKey) -> Result<()> {
        elections::resign(self, leader).await
    }
}

/// What a transaction is about, the seed of its retries' jitter: its first compare's key,
/// else its first operation's.
fn txn_about(req: &TxnRequest) -> &[u8] {
    if let Some(c) = req.compares.first() {
        return &c.key;
    }
    match req.success.first().or(req.failure.first()) {
        Some(TxnOp::Get(g)) => g.range.start(),
        Some(TxnOp::Put(p)) => &p.key,
        Some(TxnOp::Delete(d)) => d.range.start(),
        None => &[],
    }
}
