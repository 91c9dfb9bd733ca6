//! The store as coord's node sees it, recording each write of the node's host key when the
//! node sends it ([`Happening::HostKeyWriteSent`]). The store's journal says when a write
//! landed; only the sender knows when it was sent, and L7 holds a registration to sending
//! nothing once its stop was asked (a write already on its way may still land).

use std::sync::Arc;

use coord_api::{
    async_trait, Bytes, DynKvLeaseStore, Forward, PutRequest, PutResponse, Result, TxnOp,
    TxnRequest, TxnResponse,
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

// Only the writes that may carry the key; the rest goes to the node's store unchanged.
#[async_trait]
impl Forward for HostKeyWrites {
    fn inner(&self) -> &DynKvLeaseStore {
        &*self.inner
    }

    async fn put(&self, req: PutRequest) -> Result<PutResponse> {
        if req.key == self.key {
            self.sent();
        }
        self.inner.put(req).await
    }

    async fn txn(&self, req: TxnRequest) -> Result<TxnResponse> {
        if self.puts_key(&req) {
            self.sent();
        }
        self.inner.txn(req).await
    }
}
