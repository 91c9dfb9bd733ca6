//! [`Election`] on a [`Session`], and the [`Leadership`] it hands out.
//!
//! The safety argument, in two layers (RELIABILITY.md S1, S2):
//! * **Fenced.** A leadership's token is its key's create revision, which grows from one
//!   leader to the next. [`Leadership::fence`] makes a transaction conditional on the key
//!   still standing as created, so once another candidate can lead, the old leader's fenced
//!   writes fail at the store, whatever the old leader believes.
//! * **Belief.** [`Leadership::lost`] fires when the session's local deadline passes (send
//!   time of the last acknowledged renewal + TTL, which the server's expiry cannot precede)
//!   or when the key is seen deleted. So a leader that is cut off stops believing no later
//!   than the store could elect someone else, barring a process pause longer than the TTL,
//!   which only fencing covers.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::session::{Session, SessionHandle};
use crate::election::{candidate_key, LeaderKey};
use crate::error::{Error, Result};
use crate::request::{Compare, CompareOp, GetRequest, PutRequest, TxnRequest, WatchRequest};
use crate::store::{DynKvLeaseStore, KvLeaseStore, LeaderStream};
use crate::types::{EventKind, KeyValue};

/// An election, campaigned in under one session's lease.
#[derive(Debug, Clone)]
pub struct Election {
    store: Arc<DynKvLeaseStore>,
    session: SessionHandle,
    name: String,
    held: Option<Arc<AtomicUsize>>,
}

impl Election {
    /// The election `name`, under `session`'s lease.
    pub fn new(session: &Session, name: impl Into<String>) -> Self {
        Election {
            store: session.store().clone(),
            session: session.handle(),
            name: name.into(),
            held: None,
        }
    }

    /// Counts leaderships won through this election in `held` while they last (the pool's
    /// counter).
    pub(crate) fn counting(mut self, held: Arc<AtomicUsize>) -> Self {
        self.held = Some(held);
        self
    }

    /// The election's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Campaigns until this candidate leads.
    ///
    /// Dropping the future cancels the campaign and deletes its key. The wait ends early, with
    /// an error, when the session ends.
    ///
    /// # Errors
    /// [`Error::CandidacyLost`] when the session ends or the candidate key is deleted while
    /// waiting; whatever the store fails with.
    pub async fn campaign(&self, value: impl Into<Bytes>) -> Result<Leadership> {
        let value = value.into();
        let lease = self.session.lease();
        if self.session.is_done() {
            return Err(self.lost_candidacy());
        }
        let won = tokio::select! {
            biased;
            _ = self.session.done() => return Err(self.lost_candidacy()),
            r = self.store.campaign(&self.name, value, lease) => r?,
        };
        // The session may have ended in the same instant the campaign won; never hand out a
        // leadership on a dead session.
        if self.session.is_done() {
            let _ = self.store.resign(&won).await;
            return Err(self.lost_candidacy());
        }
        tracing::info!(election = %self.name, token = won.revision, "leadership acquired");
        Ok(Leadership::new(
            self.store.clone(),
            self.session.clone(),
            won,
            self.held.clone(),
        ))
    }

    /// Campaigns for at most `timeout`.
    ///
    /// # Errors
    /// [`Error::Cancelled`] when the time runs out (the candidate key is deleted); otherwise
    /// as [`campaign`](Self::campaign).
    pub async fn campaign_timeout(
        &self,
        value: impl Into<Bytes>,
        timeout: Duration,
    ) -> Result<Leadership> {
        match tokio::time::timeout(timeout, self.campaign(value)).await {
            Ok(r) => r,
            Err(_) => Err(Error::Cancelled {
                operation: "campaign",
            }),
        }
    }

    /// Takes the leadership if nobody holds it, in one transaction; never waits and never
    /// queues. `Ok(None)` when someone else leads.
    pub async fn try_campaign(&self, value: impl Into<Bytes>) -> Result<Option<Leadership>> {
        let value = value.into();
        let lease = self.session.lease();
        crate::validate::election_name(&self.name)?;
        let prefix = format!("{}/", self.name);
        let key = candidate_key(&self.name, lease);
        // If no candidate exists, put ours; else read the queue. One transaction, so it cannot
        // lose a race with another candidate (go-coord's TryCampaign could, and then blocked).
        let resp = self
            .store
            .txn(
                TxnRequest::new()
                    .when([
                        Compare::create_revision(prefix.clone(), CompareOp::Equal, 0).with_prefix(),
                    ])
                    .and_then([PutRequest::new(key.clone(), value.to_vec()).with_lease(lease)])
                    .or_else([GetRequest::prefix(prefix)]),
            )
            .await?;
        let won = if resp.succeeded {
            LeaderKey {
                name: self.name.clone(),
                key: Bytes::from(key),
                revision: resp.revision,
                lease,
            }
        } else {
            // Already leading with this lease (a re-campaign) counts as winning.
            let first = resp
                .responses
                .first()
                .and_then(|r| r.as_get())
                .and_then(|g| g.kvs.iter().min_by_key(|kv| kv.create_revision).cloned());
            match first {
                Some(kv) if kv.key == key.as_bytes() => LeaderKey {
                    name: self.name.clone(),
                    key: kv.key,
                    revision: kv.create_revision,
                    lease,
                },
                _ => return Ok(None),
            }
        };
        tracing::info!(election = %self.name, token = won.revision, "leadership acquired (try)");
        Ok(Some(Leadership::new(
            self.store.clone(),
            self.session.clone(),
            won,
            self.held.clone(),
        )))
    }

    /// The current leader's key and value.
    ///
    /// # Errors
    /// [`Error::NoLeader`] when nobody campaigns.
    pub async fn leader(&self) -> Result<KeyValue> {
        self.store.leader(&self.name).await
    }

    /// Streams the leader: the current one, then each change and each proclaimed value.
    pub async fn observe(&self) -> Result<LeaderStream> {
        self.store.observe(&self.name).await
    }

    fn lost_candidacy(&self) -> Error {
        Error::CandidacyLost {
            election: self.name.clone(),
            key: candidate_key(&self.name, self.session.lease()),
            lease: self.session.lease(),
        }
    }
}

/// A won election: the key, its fencing token, and a signal for when it is over.
///
/// # Drop
/// Dropping it stops watching but keeps the key (the session still holds it): call
/// [`resign`](Leadership::resign) to hand over at once.
#[derive(Debug)]
pub struct Leadership {
    store: Arc<DynKvLeaseStore>,
    session: SessionHandle,
    key: LeaderKey,
    lost: CancellationToken,
    watcher: JoinHandle<()>,
    held: Option<Arc<AtomicUsize>>,
}

impl Leadership {
    fn new(
        store: Arc<DynKvLeaseStore>,
        session: SessionHandle,
        key: LeaderKey,
        held: Option<Arc<AtomicUsize>>,
    ) -> Self {
        let lost = CancellationToken::new();
        let watcher = tokio::spawn(watch_loss(
            store.clone(),
            session.clone(),
            key.clone(),
            lost.clone(),
        ));
        if let Some(h) = &held {
            h.fetch_add(1, Ordering::SeqCst);
        }
        Leadership {
            store,
            session,
            key,
            lost,
            watcher,
            held,
        }
    }

    /// The fencing token: the leader key's create revision. Each new leader's is larger.
    pub fn token(&self) -> i64 {
        self.key.revision
    }

    /// The leader key (name, key, token, lease).
    pub fn key(&self) -> &LeaderKey {
        &self.key
    }

    /// The instant after which this leadership must not be trusted (the session's deadline).
    pub fn deadline(&self) -> Instant {
        self.session.deadline()
    }

    /// True until the leadership is known lost or its deadline passed.
    pub fn is_leader(&self) -> bool {
        !self.lost.is_cancelled() && !self.session.is_done()
    }

    /// Resolves when the leadership is over: the session's deadline passed or it ended, or
    /// the key was deleted (resigned, revoked, deleted by hand).
    pub async fn lost(&self) {
        // Biased, like every select in the library: polling order then never depends on
        // tokio's unseeded RNG, so simulation runs replay exactly.
        tokio::select! {
            biased;
            _ = self.lost.cancelled() => {}
            _ = self.session.done() => {}
        }
    }

    /// `txn` made conditional on this leadership: its compares gain "my key still stands as
    /// created", so the whole transaction fails (runs `failure`) once another leader can exist.
    pub fn fence(&self, mut txn: TxnRequest) -> TxnRequest {
        txn.compares.push(self.key.is_current());
        txn
    }

    /// The compare behind [`fence`](Self::fence), for building transactions by hand.
    pub fn guard(&self) -> Compare {
        self.key.is_current()
    }

    /// Replaces the leader's value, only while this key leads.
    ///
    /// # Errors
    /// [`Error::NotLeader`] when the key no longer stands (the leadership is then lost).
    pub async fn proclaim(&self, value: impl Into<Bytes>) -> Result<()> {
        let r = self.store.proclaim(&self.key, value.into()).await;
        if matches!(r, Err(Error::NotLeader { .. })) {
            self.lost.cancel();
        }
        r
    }

    /// Hands over: deletes the key if it is still this one. Idempotent.
    pub async fn resign(self) -> Result<()> {
        self.lost.cancel();
        self.store.resign(&self.key).await?;
        tracing::info!(election = %self.key.name, token = self.key.revision, "leadership resigned");
        Ok(())
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        self.watcher.abort();
        if let Some(h) = &self.held {
            h.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Cancels `lost` when the key is deleted or the session ends; logs the loss.
async fn watch_loss(
    store: Arc<DynKvLeaseStore>,
    session: SessionHandle,
    key: LeaderKey,
    lost: CancellationToken,
) {
    let deleted = async {
        let mut from = key.revision + 1;
        loop {
            let req = WatchRequest::key(key.key.to_vec()).with_start_revision(from);
            match store.watch(req).await {
                Ok(mut stream) => {
                    // Compacted or closed ends the loop: check directly, then resume from now.
                    while let Some(Ok(batch)) = stream.next().await {
                        if batch.events.iter().any(|e| e.kind == EventKind::Delete) {
                            return "the leader key was deleted";
                        }
                        from = batch.revision + 1;
                    }
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
            match store.get(GetRequest::key(key.key.to_vec())).await {
                Ok(r) => {
                    if r.kvs.first().map(|kv| kv.create_revision) != Some(key.revision) {
                        return "the leader key was deleted";
                    }
                    from = r.revision + 1;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    };
    let why = tokio::select! {
        biased;
        _ = lost.cancelled() => return,
        end = session.done() => format!("session ended: {end}"),
        why = deleted => why.to_owned(),
    };
    lost.cancel();
    tracing::warn!(election = %key.name, token = key.revision, reason = %why, "leadership lost");
}
