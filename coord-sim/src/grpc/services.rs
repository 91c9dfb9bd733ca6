//! The services. Each call is one call on the store; the watch and keep-alive streams are
//! served by a task per stream.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use coord_api::{KvLeaseStore, LeaseId, Revision, WatchRequest};
use etcd_client::proto::*;
use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tonic::{Request, Response, Status, Streaming};

use super::convert::{self, header, status};
use super::gate::{requires_leader, Gate};
use super::members::EtcdVersion;
use super::members::{Call, Members};
use crate::SimStore;
use coord_api::Revision as Rev;

type Reply<T> = Result<Response<T>, Status>;
type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// Which store client serves the requests from each peer, so that the store's journal (and
/// its per-client faults) tell the peers apart: by the connection (its address and port, for
/// a client that dials through [`channel_as`](super::channel_as): two clients on one host,
/// such as a node's old and new incarnation during a rolling restart), else by the peer's IP.
/// Cloning is cheap: every clone is the same registry.
#[derive(Debug, Clone, Default)]
pub struct Clients {
    by_ip: Arc<Mutex<BTreeMap<IpAddr, SimStore>>>,
    by_connection: Arc<Mutex<BTreeMap<SocketAddr, SimStore>>>,
}

impl Clients {
    /// Serves the peer at `ip` through `client` (a connection registered on its own aside).
    pub fn insert(&self, ip: IpAddr, client: SimStore) {
        lock(&self.by_ip).insert(ip, client);
    }

    /// The client serving the peer at `ip`.
    pub fn get(&self, ip: IpAddr) -> Option<SimStore> {
        lock(&self.by_ip).get(&ip).cloned()
    }

    /// Serves the connection from `peer` through `client`.
    pub(crate) fn connected(&self, peer: SocketAddr, client: SimStore) {
        lock(&self.by_connection).insert(peer, client);
    }

    /// The client serving the connection from `peer`.
    fn serving(&self, peer: SocketAddr) -> Option<SimStore> {
        lock(&self.by_connection)
            .get(&peer)
            .cloned()
            .or_else(|| self.get(peer.ip()))
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// etcd's KV, Lease, Watch and Maintenance services over one [`SimStore`]. Cloning is cheap:
/// every clone serves the same store.
#[derive(Debug, Clone)]
pub struct EtcdService {
    store: SimStore,
    clients: Clients,
    /// Set when this is one member of a simulated cluster.
    gate: Option<Gate>,
}

impl EtcdService {
    /// Serves `store`, every peer through the same store client.
    pub fn new(store: SimStore) -> Self {
        EtcdService {
            store,
            clients: Clients::default(),
            gate: None,
        }
    }

    /// Serves `store`, a peer listed in `clients` through its own store client (others
    /// through `store`'s).
    pub fn with_clients(store: SimStore, clients: Clients) -> Self {
        EtcdService {
            store,
            clients,
            gate: None,
        }
    }

    /// This service as member `index` of a cluster: it answers as that member does while
    /// members fail (see [`SimCluster`](super::SimCluster)).
    pub(crate) fn member_of(mut self, members: Members, index: usize) -> Self {
        self.gate = Some(Gate { members, index });
        self
    }

    /// Passes a request through the member's gate (served, refused or held as etcd's
    /// member would); a lone store serves everything.
    async fn admit(&self, require_leader: bool, call: Call) -> Result<(), Status> {
        match &self.gate {
            Some(g) => g.admit(call, require_leader).await,
            None => Ok(()),
        }
    }

    /// Admits a write and applies it: see [`Gate::write`]; a lone store applies at once.
    async fn write<T: Send + 'static>(
        &self,
        require_leader: bool,
        apply: impl std::future::Future<Output = Result<T, Status>> + Send + 'static,
    ) -> Result<T, Status> {
        match &self.gate {
            Some(g) => g.write(require_leader, apply).await,
            None => apply.await,
        }
    }

    /// The store client for a request's peer.
    fn client<T>(&self, request: &Request<T>) -> SimStore {
        request
            .remote_addr()
            .and_then(|a| self.clients.serving(a))
            .unwrap_or_else(|| self.store.clone())
    }

    /// The services, ready for `tonic::transport::Server::add_service`.
    pub fn kv(&self) -> PbKvServer<Self> {
        PbKvServer::new(self.clone())
    }

    /// The lease service.
    pub fn lease(&self) -> PbLeaseServer<Self> {
        PbLeaseServer::new(self.clone())
    }

    /// The watch service.
    pub fn watch(&self) -> PbWatchServer<Self> {
        PbWatchServer::new(self.clone())
    }

    /// The maintenance service (status only).
    pub fn maintenance(&self) -> PbMaintenanceServer<Self> {
        PbMaintenanceServer::new(self.clone())
    }

    /// Serves all four on `incoming` until it ends.
    ///
    /// # Errors
    /// The transport's.
    pub async fn serve<S, IO>(self, incoming: S) -> Result<(), tonic::transport::Error>
    where
        S: Stream<Item = std::io::Result<IO>> + Send + 'static,
        IO: tonic::transport::server::Connected
            + tokio::io::AsyncRead
            + tokio::io::AsyncWrite
            + Unpin
            + Send
            + 'static,
    {
        tonic::transport::Server::builder()
            .add_service(self.kv())
            .add_service(self.lease())
            .add_service(self.watch())
            .add_service(self.maintenance())
            .serve_with_incoming(incoming)
            .await
    }
}

impl EtcdService {
    /// A stream's replies, ended with `no leader` when the member's leader monitor ends a
    /// require-leader stream (a lone store never does).
    fn ending<T: Send + 'static>(
        &self,
        replies: impl Stream<Item = Result<T, Status>> + Send + 'static,
        require_leader: bool,
    ) -> BoxStream<T> {
        let Some(gate) = self.gate.clone() else {
            return Box::pin(replies);
        };
        Box::pin(async_stream::stream! {
            let mut replies = std::pin::pin!(replies);
            let ends = gate.stream_ends(require_leader);
            let mut ends = std::pin::pin!(ends);
            loop {
                tokio::select! {
                    item = replies.next() => match item {
                        Some(item) => yield item,
                        None => break,
                    },
                    status = &mut ends => {
                        yield Err(status);
                        break;
                    }
                }
            }
        })
    }
}

/// A response header at `revision` carrying the member's raft term, as etcd's do (a lone
/// store's is 1). A client learns a member's term from every answer (`EtcdStore` judges by
/// it when a write stranded by a leader change is settled), so it must agree with the status.
fn header_in(revision: Rev, gate: Option<&Gate>) -> Option<etcd_client::proto::PbResponseHeader> {
    let mut h = header(revision);
    in_term(&mut h, gate);
    h
}

/// Sets a header's raft term to the member's.
fn in_term(header: &mut Option<etcd_client::proto::PbResponseHeader>, gate: Option<&Gate>) {
    if let (Some(h), Some(g)) = (header.as_mut(), gate) {
        h.raft_term = g.status().1;
    }
}

fn unimplemented<T>(what: &str) -> Reply<T> {
    Err(Status::unimplemented(format!(
        "coord-sim does not serve {what}"
    )))
}

#[tonic::async_trait]
impl PbKvService for EtcdService {
    async fn range(&self, request: Request<PbRangeRequest>) -> Reply<PbRangeResponse> {
        let store = self.client(&request);
        self.admit(requires_leader(&request), Call::Read).await?;
        let req = convert::get(request.into_inner())?;
        let r = store.get(req).await.map_err(status)?;
        let mut resp = convert::get_response(r);
        in_term(&mut resp.header, self.gate.as_ref());
        Ok(Response::new(resp))
    }

    type RangeStreamStream = BoxStream<PbRangeStreamResponse>;

    async fn range_stream(
        &self,
        _request: Request<PbRangeRequest>,
    ) -> Reply<Self::RangeStreamStream> {
        unimplemented("RangeStream")
    }

    async fn put(&self, request: Request<PbPutRequest>) -> Reply<PbPutResponse> {
        let store = self.client(&request);
        let require_leader = requires_leader(&request);
        let req = convert::put(request.into_inner())?;
        let r = self
            .write(require_leader, async move {
                store.put(req).await.map_err(status)
            })
            .await?;
        let mut resp = convert::put_response(r);
        in_term(&mut resp.header, self.gate.as_ref());
        Ok(Response::new(resp))
    }

    async fn delete_range(&self, request: Request<PbDeleteRequest>) -> Reply<PbDeleteResponse> {
        let store = self.client(&request);
        let require_leader = requires_leader(&request);
        let req = convert::delete(request.into_inner())?;
        let r = self
            .write(require_leader, async move {
                store.delete(req).await.map_err(status)
            })
            .await?;
        let mut resp = convert::delete_response(r);
        in_term(&mut resp.header, self.gate.as_ref());
        Ok(Response::new(resp))
    }

    async fn txn(&self, request: Request<PbTxnRequest>) -> Reply<PbTxnResponse> {
        let store = self.client(&request);
        let call = if convert::read_only(request.get_ref()) {
            Call::Read
        } else {
            Call::Write
        };
        let require_leader = requires_leader(&request);
        let req = convert::txn(request.into_inner())?;
        let apply = async move { store.txn(req).await.map_err(status) };
        let r = if call == Call::Write {
            self.write(require_leader, apply).await?
        } else {
            self.admit(require_leader, call).await?;
            apply.await?
        };
        let mut resp = convert::txn_response(r);
        in_term(&mut resp.header, self.gate.as_ref());
        Ok(Response::new(resp))
    }

    async fn compact(&self, request: Request<PbCompactionRequest>) -> Reply<PbCompactionResponse> {
        let store = self.client(&request);
        self.admit(requires_leader(&request), Call::Write).await?;
        let rev = request.into_inner().revision;
        store.compact(Revision(rev)).await.map_err(status)?;
        Ok(Response::new(PbCompactionResponse {
            header: header_in(self.store.revision(), self.gate.as_ref()),
        }))
    }
}

fn seconds(d: Duration) -> i64 {
    d.as_secs() as i64
}

#[tonic::async_trait]
impl PbLeaseService for EtcdService {
    async fn lease_grant(
        &self,
        request: Request<PbLeaseGrantRequest>,
    ) -> Reply<PbLeaseGrantResponse> {
        let store = self.client(&request);
        self.admit(requires_leader(&request), Call::Write).await?;
        let r = request.into_inner();
        if r.id != 0 {
            return unimplemented("leases with a chosen id");
        }
        let ttl = Duration::from_secs(r.ttl.max(0) as u64);
        let g = store.grant(ttl).await.map_err(status)?;
        Ok(Response::new(PbLeaseGrantResponse {
            header: header_in(self.store.revision(), self.gate.as_ref()),
            id: g.id.0,
            ttl: seconds(g.ttl),
            error: String::new(),
        }))
    }

    async fn lease_revoke(
        &self,
        request: Request<PbLeaseRevokeRequest>,
    ) -> Reply<PbLeaseRevokeResponse> {
        let store = self.client(&request);
        self.admit(requires_leader(&request), Call::Write).await?;
        let rev = store
            .revoke(LeaseId(request.into_inner().id))
            .await
            .map_err(status)?;
        Ok(Response::new(PbLeaseRevokeResponse {
            header: header_in(rev, self.gate.as_ref()),
        }))
    }

    type LeaseKeepAliveStream = BoxStream<PbLeaseKeepAliveResponse>;

    async fn lease_keep_alive(
        &self,
        request: Request<Streaming<PbLeaseKeepAliveRequest>>,
    ) -> Reply<Self::LeaseKeepAliveStream> {
        let store = self.client(&request);
        self.admit(requires_leader(&request), Call::Local).await?;
        let require_leader = requires_leader(&request);
        let gate = self.gate.clone();
        let mut requests = request.into_inner();
        let replies = async_stream::stream! {
            while let Some(req) = requests.next().await {
                let Ok(req) = req else { break };
                let id = LeaseId(req.id);
                if let Some(g) = &gate {
                    if let Err(s) = g.admit(Call::Renew, require_leader).await {
                        yield Err(s);
                        break;
                    }
                }
                let renewed = match store.keep_alive(id).await {
                    Ok(mut ch) => ch.renew().await,
                    Err(e) => Err(e),
                };
                // etcd answers a renewal of an unknown lease with TTL 0, not an error.
                let ttl = match renewed {
                    Ok(ttl) => seconds(ttl),
                    Err(coord_api::Error::LeaseNotFound { .. }) => 0,
                    Err(e) => {
                        yield Err(status(e));
                        break;
                    }
                };
                yield Ok(PbLeaseKeepAliveResponse {
                    header: header_in(store.revision(), gate.as_ref()),
                    id: id.0,
                    ttl,
                });
            }
        };
        Ok(Response::new(self.ending(replies, require_leader)))
    }

    async fn lease_time_to_live(
        &self,
        request: Request<PbLeaseTimeToLiveRequest>,
    ) -> Reply<PbLeaseTimeToLiveResponse> {
        let store = self.client(&request);
        self.admit(requires_leader(&request), Call::Read).await?;
        let r = request.into_inner();
        let id = LeaseId(r.id);
        let (ttl, granted, keys) = match store.time_to_live(id).await {
            Ok(t) => (
                seconds(t.ttl),
                seconds(t.granted_ttl),
                if r.keys {
                    t.keys.into_iter().map(|k| k.to_vec()).collect()
                } else {
                    Vec::new()
                },
            ),
            // etcd reports an unknown lease as TTL -1.
            Err(coord_api::Error::LeaseNotFound { .. }) => (-1, 0, Vec::new()),
            Err(e) => return Err(status(e)),
        };
        Ok(Response::new(PbLeaseTimeToLiveResponse {
            header: header_in(self.store.revision(), self.gate.as_ref()),
            id: id.0,
            ttl,
            granted_ttl: granted,
            keys,
        }))
    }

    async fn lease_leases(
        &self,
        _request: Request<PbLeaseLeasesRequest>,
    ) -> Reply<PbLeaseLeasesResponse> {
        unimplemented("LeaseLeases")
    }
}

#[tonic::async_trait]
impl PbWatchService for EtcdService {
    type WatchStream = BoxStream<PbWatchResponse>;

    async fn watch(&self, request: Request<Streaming<PbWatchRequest>>) -> Reply<Self::WatchStream> {
        let store = self.client(&request);
        self.admit(requires_leader(&request), Call::Local).await?;
        let require_leader = requires_leader(&request);
        let requests = request.into_inner();
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(serve_watches(store, requests, tx, self.gate.clone()));
        let replies = async_stream::stream! {
            let mut rx = rx;
            while let Some(item) = rx.recv().await {
                let end = item.is_err();
                yield item;
                if end { break; }
            }
        };
        Ok(Response::new(self.ending(replies, require_leader)))
    }
}

type Out = mpsc::UnboundedSender<Result<PbWatchResponse, Status>>;

/// One watch stream: creates and cancels watches as asked, forwarding each watch's batches.
async fn serve_watches(
    store: SimStore,
    mut requests: Streaming<PbWatchRequest>,
    out: Out,
    gate: Option<Gate>,
) {
    let mut watches: BTreeMap<i64, tokio::task::JoinHandle<()>> = BTreeMap::new();
    let mut next_id = 0;
    // The highest revision the stream has told of.
    let told = Arc::new(AtomicI64::new(0));
    while let Some(Ok(req)) = requests.next().await {
        match req.request_union {
            Some(PbWatchRequestUnion::CreateRequest(c)) => {
                let id = if c.watch_id != 0 { c.watch_id } else { next_id };
                next_id = next_id.max(id) + 1;
                let range = match convert::range(c.key, c.range_end) {
                    Ok(r) => r,
                    Err(s) => {
                        let _ = out.send(Err(s));
                        break;
                    }
                };
                let mut req = WatchRequest::range(range);
                if c.start_revision > 0 {
                    req = req.with_start_revision(Revision(c.start_revision));
                }
                if c.prev_kv {
                    req = req.with_prev_kv();
                }
                if c.progress_notify {
                    req = req.with_progress_notify();
                }
                let stream = match store.watch(req).await {
                    Ok(s) => s,
                    Err(e) => {
                        let _ = out.send(Err(status(e)));
                        break;
                    }
                };
                told.fetch_max(store.revision().get(), Ordering::SeqCst);
                let _ = out.send(Ok(PbWatchResponse {
                    header: header_in(store.revision(), gate.as_ref()),
                    watch_id: id,
                    created: true,
                    ..Default::default()
                }));
                watches.insert(
                    id,
                    tokio::spawn(forward(id, stream, out.clone(), gate.clone(), told.clone())),
                );
            }
            Some(PbWatchRequestUnion::CancelRequest(c)) => {
                if let Some(task) = watches.remove(&c.watch_id) {
                    task.abort();
                }
                let _ = out.send(Ok(PbWatchResponse {
                    header: header_in(store.revision(), gate.as_ref()),
                    watch_id: c.watch_id,
                    canceled: true,
                    ..Default::default()
                }));
            }
            Some(PbWatchRequestUnion::ProgressRequest(_)) => {
                let cut_off = match &gate {
                    Some(g) => g.progress_answered().await,
                    None => false,
                };
                // A cut-off member's revision stops where it was cut off: no further than
                // what this stream was told.
                let revision = if cut_off {
                    Rev(told.load(Ordering::SeqCst))
                } else {
                    store.revision()
                };
                let _ = out.send(Ok(PbWatchResponse {
                    header: header_in(revision, gate.as_ref()),
                    watch_id: -1,
                    ..Default::default()
                }));
            }
            None => {}
        }
    }
    for (_, task) in watches {
        task.abort();
    }
}

/// Forwards one watch's batches; a compaction cancels it as etcd does, any other end of the
/// store's stream ends the whole gRPC stream (the connection broke).
async fn forward(
    id: i64,
    mut stream: coord_api::WatchStream,
    out: Out,
    gate: Option<Gate>,
    told: Arc<AtomicI64>,
) {
    while let Some(item) = stream.next().await {
        if let Some(g) = &gate {
            g.while_cut_off().await;
        }
        if let Ok(batch) = &item {
            told.fetch_max(batch.revision.get(), Ordering::SeqCst);
        }
        let reply = match item {
            Ok(batch) => Ok(PbWatchResponse {
                header: header_in(batch.revision, gate.as_ref()),
                watch_id: id,
                events: batch.events.into_iter().map(convert::event).collect(),
                ..Default::default()
            }),
            Err(coord_api::Error::Compacted {
                compact_revision, ..
            }) => {
                let _ = out.send(Ok(PbWatchResponse {
                    header: header_in(compact_revision, gate.as_ref()),
                    watch_id: id,
                    canceled: true,
                    compact_revision: compact_revision.get(),
                    cancel_reason: convert::COMPACTED.to_owned(),
                    ..Default::default()
                }));
                return;
            }
            Err(e) => Err(status(e)),
        };
        let end = reply.is_err();
        if out.send(reply).is_err() || end {
            return;
        }
    }
}

#[tonic::async_trait]
impl PbMaintenanceService for EtcdService {
    async fn alarm(&self, _request: Request<PbAlarmRequest>) -> Reply<PbAlarmResponse> {
        unimplemented("Alarm")
    }

    async fn status(&self, request: Request<PbStatusRequest>) -> Reply<PbStatusResponse> {
        self.admit(requires_leader(&request), Call::Local).await?;
        let (leader, raft_term) = self.gate.as_ref().map_or((1, 1), Gate::status);
        Ok(Response::new(PbStatusResponse {
            header: header_in(self.store.revision(), self.gate.as_ref()),
            version: self
                .gate
                .as_ref()
                .map_or(EtcdVersion::default().reported(), Gate::version)
                .to_owned(),
            leader,
            raft_index: self.store.revision().get() as u64,
            raft_term,
            raft_applied_index: self.store.revision().get() as u64,
            ..Default::default()
        }))
    }

    async fn defragment(
        &self,
        _request: Request<PbDefragmentRequest>,
    ) -> Reply<PbDefragmentResponse> {
        unimplemented("Defragment")
    }

    async fn hash(&self, _request: Request<PbHashRequest>) -> Reply<PbHashResponse> {
        unimplemented("Hash")
    }

    async fn hash_kv(&self, _request: Request<PbHashKvRequest>) -> Reply<PbHashKvResponse> {
        unimplemented("HashKV")
    }

    type SnapshotStream = BoxStream<PbSnapshotResponse>;

    async fn snapshot(&self, _request: Request<PbSnapshotRequest>) -> Reply<Self::SnapshotStream> {
        unimplemented("Snapshot")
    }

    async fn move_leader(
        &self,
        _request: Request<PbMoveLeaderRequest>,
    ) -> Reply<PbMoveLeaderResponse> {
        unimplemented("MoveLeader")
    }

    async fn downgrade(&self, _request: Request<PbDowngradeRequest>) -> Reply<PbDowngradeResponse> {
        unimplemented("Downgrade")
    }
}
