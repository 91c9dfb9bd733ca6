//! A write of unknown outcome must not land after the writes that follow it.
//!
//! A write that comes back `Indeterminate` (its reply lost, or given up at the request
//! timeout on a member that was not answering) may still be waiting inside the store, and
//! apply later: etcd applies a write held by a stalled member when the member resumes, after
//! its client gave up on it (`docs/ETCD-BEHAVIOUR.md`, "a write given up on a stalled
//! member"). A session's candidate key shows what that does. A campaign's write given up on,
//! then withdrawn, lands after the withdrawal: the key stands again, queued, and nobody waits
//! on it, blocking the election for as long as the session lives (turmoil seed 120325). A
//! withdrawal or resignation given up on lands after a newer campaign of the session took the
//! key over: the session deletes its own leadership (seed 140007).
//!
//! No compare on the candidate key can tell one of the session's writes from another (they
//! share the key, its create revision and its lease), so each write of it by the session is
//! also conditional on the version of a fence key of the session's own in that election
//! (absent until needed: version 0). A write that came back `Indeterminate` is fenced before
//! the session's turn in the election passes on: the fence key is written (under the
//! session's lease), and the write, if it is still to apply, fails its compare. From then on
//! the key is where a read finds it. The turn carries the version the fence stands at, which
//! only its holder changes, so the next write compares against the right one.
//!
//! The fence key lives under no election's prefix (it starts with a NUL byte), so no queue
//! counts it, and it goes with the session's lease. It is written only after an unknown
//! outcome, so a session that never met one writes no key of this kind.

use std::future::Future;
use std::ops::ControlFlow;
use std::pin::Pin;
use std::sync::Arc;

use tracing::Instrument;

use super::Turn;
use crate::error::{Error, ErrorClass, Result};
use crate::request::{GetRequest, PutRequest};
use crate::retry;
use crate::store::DynKvLeaseStore;
use crate::txn::{Compare, CompareOp, TxnOp, TxnRequest, TxnResponse};
use crate::types::LeaseId;

/// The versions a key's fences stand at, one per lease it was written under (see the module
/// docs); a lease not listed has none (version 0). Raised only after a
/// write of unknown outcome, so almost always empty.
#[derive(Debug, Default)]
pub(crate) struct Fences(Vec<(LeaseId, i64)>);

/// Where the versions a key's fences stand at are kept: a turn's (held while the write is
/// out), or a registration's, shared by its writes.
pub(crate) trait FenceBook {
    /// The version the fence of `lease` stands at, as known here.
    fn version(&self, lease: LeaseId) -> i64;
    /// The fence of `lease` stands at `version`.
    fn set(&mut self, lease: LeaseId, version: i64);
}

impl FenceBook for Fences {
    fn version(&self, lease: LeaseId) -> i64 {
        self.0
            .iter()
            .find(|(l, _)| *l == lease)
            .map_or(0, |(_, v)| *v)
    }

    fn set(&mut self, lease: LeaseId, version: i64) {
        match self.0.iter_mut().find(|(l, _)| *l == lease) {
            Some(entry) => entry.1 = version,
            None => self.0.push((lease, version)),
        }
    }
}

impl FenceBook for Arc<std::sync::Mutex<Fences>> {
    fn version(&self, lease: LeaseId) -> i64 {
        self.lock()
            .unwrap_or_else(|p| p.into_inner())
            .version(lease)
    }

    fn set(&mut self, lease: LeaseId, version: i64) {
        self.lock()
            .unwrap_or_else(|p| p.into_inner())
            .set(lease, version)
    }
}

/// The fence key of `lease` in election `name`.
pub(crate) fn fence_key(name: &str, lease: LeaseId) -> String {
    format!("{}election/{name}/{lease}", super::FENCE_PREFIX)
}

/// The fence key of `lease` for a key a recipe writes alone (a registration's).
pub(crate) fn key_fence_key(key: &str, lease: LeaseId) -> String {
    format!("{}key/{key}/{lease}", super::FENCE_PREFIX)
}

/// Runs `txn`, a write of the session's candidate key, fenced: see [`fenced`].
pub(crate) async fn write(
    store: Arc<DynKvLeaseStore>,
    txn: TxnRequest,
    turn: Turn,
    fencing: Fencing,
) -> (Result<TxnResponse>, Option<Turn>) {
    fenced(store, txn, turn, fencing, || true).await
}

/// What a fenced write holds until it is settled (the session's turn in an election, a
/// registration's place among its writes), and where it keeps the fences' versions.
pub(crate) trait Hold: Send + 'static {
    /// The book the fences' versions are kept in.
    fn book(&mut self) -> &mut (dyn FenceBook + Send);
}

impl Hold for Turn {
    fn book(&mut self) -> &mut (dyn FenceBook + Send) {
        &mut **self
    }
}

/// Runs `txn` conditional on `fencing`'s fence (see [`Fencing::send`]), as a task of its
/// own that keeps `hold` until the write is settled: dropping the caller does not let go of
/// it while the write may still land. The answer comes back as soon as the store gives it,
/// and `hold` with it; but an answer that leaves the outcome unknown comes back alone, while
/// the task raises the fence and only then lets go of `hold`. So a caller told
/// `Indeterminate` hears it at once, however long the store takes to take the fence, and
/// whoever waits for the hold next finds the write fenced. No hold comes back either when the
/// task was cancelled (its runtime shutting down).
pub(crate) async fn fenced<H: Hold>(
    store: Arc<DynKvLeaseStore>,
    txn: TxnRequest,
    mut hold: H,
    fencing: Fencing,
    may_resend: impl Fn() -> bool + Send + Sync + 'static,
) -> (Result<TxnResponse>, Option<H>) {
    let (answer, answered) = tokio::sync::oneshot::channel();
    tokio::spawn(
        async move {
            match fencing
                .fence
                .send(&*store, txn, hold.book(), &may_resend)
                .await
            {
                Err(e) if e.class() == ErrorClass::Indeterminate => {
                    let _ = answer.send((Err(e), None));
                    let lease = fencing.fence.lease;
                    if let Some(version) = fencing.raise(&*store).await {
                        hold.book().set(lease, version);
                    }
                    drop(hold);
                }
                settled => {
                    let _ = answer.send((settled, Some(hold)));
                }
            }
        }
        .in_current_span(),
    );
    answered.await.unwrap_or_else(|_| {
        (
            Err(Error::Cancelled {
                operation: "a fenced write",
            }),
            None,
        )
    })
}

/// What fencing one lease's writes of one key takes (a session's candidate key in an
/// election, a registration's key): its fence key, its lease, and when to give up (the lease
/// is surely gone).
pub(crate) struct Fencing {
    fence: Fence,
    over: Pin<Box<dyn Future<Output = ()> + Send>>,
}

/// A fence key, and the lease it fences the writes of.
struct Fence {
    key: String,
    lease: LeaseId,
}

impl Fencing {
    /// The fence of `lease`'s candidate writes in election `name`.
    pub(crate) fn election(
        name: &str,
        lease: LeaseId,
        over: impl Future<Output = ()> + Send + 'static,
    ) -> Self {
        Self::at(fence_key(name, lease), lease, over)
    }

    /// The fence of `lease`'s writes of `key` (a registration's).
    pub(crate) fn key(
        key: &str,
        lease: LeaseId,
        over: impl Future<Output = ()> + Send + 'static,
    ) -> Self {
        Self::at(key_fence_key(key, lease), lease, over)
    }

    fn at(key: String, lease: LeaseId, over: impl Future<Output = ()> + Send + 'static) -> Self {
        Fencing {
            fence: Fence { key, lease },
            over: Box::pin(over),
        }
    }

    /// Writes the fence, until the store answers or the lease is over; the version it then
    /// stands at, or `None` when the lease is gone (and with it every write under it).
    async fn raise(self, store: &DynKvLeaseStore) -> Option<i64> {
        if crate::hooks::planted::enabled(crate::hooks::planted::Bug::UnknownWriteNotFenced) {
            return None;
        }
        let Fencing {
            fence: Fence { key, lease },
            mut over,
        } = self;
        // None started once the lease is surely over: a crashed host's tasks must not
        // outlive it by a request timeout each.
        if futures::FutureExt::now_or_never(&mut over).is_some() {
            return None;
        }
        let mut backoff = retry::Backoff::store(retry::seed(&[key.as_bytes()]));
        // Given up once the lease is surely over, between tries: a put already on its way is
        // waited for. A renewal held by a slow or stalled member can keep the lease alive at
        // the store past what this process counts as its end (turmoil seed 190853, a slow
        // member: a raise abandoned in flight let a metadata update given up on land after a
        // newer one), and the fence on its way may be all that stops the write it fences.
        let raised = retry::until(&mut backoff, over, |_| {
            let put = PutRequest::new(key.clone(), Vec::new())
                .with_lease(lease)
                .with_prev_kv();
            async move {
                match store.put(put).await {
                    Ok(r) => ControlFlow::Break(Some(r.prev_kv.map_or(0, |kv| kv.version) + 1)),
                    Err(Error::LeaseNotFound { .. }) => ControlFlow::Break(None),
                    Err(e) => {
                        tracing::debug!(
                            error = &e as &dyn std::error::Error,
                            "could not fence a write of unknown outcome yet; retrying"
                        );
                        ControlFlow::Continue(())
                    }
                }
            }
        })
        .await
        .ok()
        .flatten();
        tracing::debug!(fenced = ?raised, "fenced a write of unknown outcome");
        raised
    }
}

impl Fence {
    /// Sends `txn` conditional also on the fence standing at the version `book` holds for
    /// the lease. A transaction that failed where the fence stood elsewhere (`book` was stale:
    /// a registration started anew on the same lease, a raise given up on) is sent again at
    /// the version read, if `may_resend` says so (a registration being stopped sends nothing
    /// more), so the caller sees only its own compares' verdict.
    async fn send(
        &self,
        store: &DynKvLeaseStore,
        txn: TxnRequest,
        book: &mut (dyn FenceBook + Send),
        may_resend: &(dyn Fn() -> bool + Sync),
    ) -> Result<TxnResponse> {
        let lease = self.lease;
        loop {
            let version = book.version(lease);
            let mut guarded = txn.clone();
            guarded.compares.push(Compare::version(
                self.key.clone(),
                CompareOp::Equal,
                version,
            ));
            guarded
                .failure
                .push(TxnOp::Get(GetRequest::key(self.key.clone())));
            let mut answer = store.txn(guarded).await?;
            if !answer.succeeded {
                let fence = answer.responses.pop();
                let stood = fence
                    .as_ref()
                    .and_then(|r| r.as_get())
                    .map(|g| g.kvs.first().map_or(0, |kv| kv.version));
                if let Some(stood) = stood.filter(|stood| *stood != version) {
                    book.set(lease, stood);
                    if may_resend() {
                        continue;
                    }
                }
            }
            return Ok(answer);
        }
    }
}
