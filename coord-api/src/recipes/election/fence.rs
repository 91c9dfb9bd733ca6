//! [`Fence`]: transactions that apply only while one leadership's key stands as created.

use super::*;

/// Transactions fenced by one leadership: from [`Leadership::fence`]. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Fence {
    pub(super) store: Arc<DynKvLeaseStore>,
    pub(super) key: LeaderKey,
    pub(super) lost: Arc<watch::Sender<Option<LossReason>>>,
}

impl Fence {
    /// Why the leadership ended, if it has been seen to end.
    pub(crate) fn loss(&self) -> Option<LossReason> {
        self.lost.get()
    }

    /// The leadership's fencing token.
    pub fn token(&self) -> Revision {
        self.key.token
    }

    /// `txn` made conditional on the leadership (see [`Leadership::fenced`]).
    pub fn fenced(&self, mut txn: TxnRequest) -> TxnRequest {
        txn.compares.push(self.key.is_current());
        txn
    }

    /// Runs `txn` only while the leadership's key leads, in one round trip. The store checks
    /// the key (so the check holds even if this process is paused or its clock is off); when
    /// the transaction fails, one more read in the same transaction says whether it failed on
    /// the caller's compares (`Ok` with `succeeded: false`, as any transaction) or because the
    /// leadership is over.
    ///
    /// # Errors
    /// [`Error::FencedOut`] when the store refused it because the key no longer leads; the
    /// leadership has then ended ([`Leadership::lost`] fires with [`LossReason::FencedOut`]).
    /// Otherwise whatever the transaction fails with.
    pub async fn txn(&self, txn: TxnRequest) -> Result<TxnResponse> {
        if crate::hooks::planted::enabled(crate::hooks::planted::Bug::FenceCheckedLocally)
            && self.lost.get().is_none()
        {
            return self.store.txn(txn).await;
        }
        let mut req = self.fenced(txn);
        let probe = req.failure.len();
        req.failure
            .push(TxnOp::Get(GetRequest::key(self.key.key.to_vec())));
        let mut resp = self.store.txn(req).await?;
        if resp.succeeded {
            return Ok(resp);
        }
        let standing = resp
            .responses
            .get(probe)
            .and_then(|r| r.as_get())
            .and_then(|g| g.kvs.first())
            .is_some_and(|kv| kv.create_revision == self.key.token);
        resp.responses.truncate(probe);
        if standing {
            return Ok(resp);
        }
        crate::metrics::record::fenced_out(&self.key.name);
        if lose(&self.lost, &self.key.name, LossReason::FencedOut) {
            tracing::warn!(election = %self.key.name, token = %self.key.token, "fenced out: the store no longer counts this leadership");
        }
        Err(Error::FencedOut {
            election: self.key.name.clone(),
            token: self.key.token,
        })
    }
}
