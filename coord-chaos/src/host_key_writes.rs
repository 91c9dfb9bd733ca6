//! The store as coord's node sees it, recording each write of the node's host key when the
//! node sends it ([`Happening::HostKeyWriteSent`]). The store's journal says when a write
//! landed; only the sender knows when it was sent, and L7 holds a registration to sending
//! nothing once its stop was asked (a write already on its way may still land).

use std::sync::Arc;
use std::time::Duration;

use coord_api::{
    async_trait, Bytes, DeleteRequest, DeleteResponse, DynKvLeaseStore, GetRequest, GetResponse,
    KeepAlive, KeyValue, KvLeaseStore, LeaderKey, LeaderStream, LeaseGrant, LeaseId,
    LeaseTimeToLive, Limits, PutRequest, PutResponse, Result, Revision, TxnOp, TxnRequest,
    TxnResponse, WatchRequest, WatchStream,
};

use crate::history::Happening;
use crate::service::Node;

/// `inner`, recording the node's host-key writes as they are sent; see the module docs.
#[derive(Clone)]
pub(crate) struct HostKeyWrites {
    inner: Arc<DynKvLeaseStore>,
    node: Node,
    key: Bytes,
}

impl std::fmt::Debug for HostKeyWrites {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostKeyWrites")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl HostKeyWrites {
    /// The node's store, recording its writes of `key`.
    pub(crate) fn new(node: &Node, key: &str) -> Self {
        HostKeyWrites {
            inner: node.store().clone(),
            node: node.clone(),
            key: Bytes::copy_from_slice(key.as_bytes()),
        }
    }

    fn sent(&self) {
        self.node.record(Happening::HostKeyWriteSent {
            who: self.node.who(),
            key: String::from_utf8_lossy(&self.key).into_owned(),
        });
    }

    /// Whether a transaction may put the key (on either branch: which one runs is the
    /// store's to decide).
    fn puts_key(&self, req: &TxnRequest) -> bool {
        req.success
            .iter()
            .chain(&req.failure)
            .any(|op| matches!(op, TxnOp::Put(p) if p.key == self.key))
    }
}

// Every method, so that none falls back to a default that would bypass the backend's own.
#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl KvLeaseStore for HostKeyWrites {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    fn limits(&self) -> Limits {
        self.inner.limits()
    }

    fn shared(&self) -> Arc<DynKvLeaseStore> {
        Arc::new(self.clone())
    }

    async fn get(&self, req: GetRequest) -> Result<GetResponse> {
        self.inner.get(req).await
    }

    async fn put(&self, req: PutRequest) -> Result<PutResponse> {
        if req.key == self.key {
            self.sent();
        }
        self.inner.put(req).await
    }

    async fn delete(&self, req: DeleteRequest) -> Result<DeleteResponse> {
        self.inner.delete(req).await
    }

    async fn txn(&self, req: TxnRequest) -> Result<TxnResponse> {
        if self.puts_key(&req) {
            self.sent();
        }
        self.inner.txn(req).await
    }

    async fn grant(&self, ttl: Duration) -> Result<LeaseGrant> {
        self.inner.grant(ttl).await
    }

    async fn revoke(&self, lease: LeaseId) -> Result<Revision> {
        self.inner.revoke(lease).await
    }

    async fn time_to_live(&self, lease: LeaseId) -> Result<LeaseTimeToLive> {
        self.inner.time_to_live(lease).await
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<Box<dyn KeepAlive>> {
        self.inner.keep_alive(lease).await
    }

    async fn watch(&self, req: WatchRequest) -> Result<WatchStream> {
        self.inner.watch(req).await
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        self.inner.compact(revision).await
    }

    async fn campaign(&self, name: &str, value: Bytes, lease: LeaseId) -> Result<LeaderKey> {
        self.inner.campaign(name, value, lease).await
    }

    async fn proclaim(&self, leader: &LeaderKey, value: Bytes) -> Result<()> {
        self.inner.proclaim(leader, value).await
    }

    async fn leader(&self, name: &str) -> Result<KeyValue> {
        self.inner.leader(name).await
    }

    async fn observe(&self, name: &str) -> Result<LeaderStream> {
        self.inner.observe(name).await
    }

    async fn resign(&self, leader: &LeaderKey) -> Result<()> {
        self.inner.resign(leader).await
    }
}
