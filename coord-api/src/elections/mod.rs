//! Elections on the [`KvLeaseStore`] primitives, with the algorithm of etcd's Go
//! `concurrency.Election` (so Go clients and etcdctl on the same name share one queue), minus
//! its known faults:
//!
//! * etcd's Go `Campaign` (and etcd 3.4's server-side election) can return a leadership
//!   whose key is already gone (etcd#11051, #19597; measured, `docs/ETCD-BEHAVIOUR.md` 3.5). Here the
//!   waiting candidate watches its own key as well as its predecessor's, and it only returns
//!   after one consistent read showed its key present, with its create revision, and first.
//! * A dropped campaign leaves its key queued until the lease ends; here a guard deletes it.
//!
//! A backend without elections of its own implements the trait's election methods with
//! these functions, one line each:
//!
//! ```
//! use coord_api::{elections, Bytes, KeyValue, KvLeaseStore, LeaderKey, LeaderStream, LeaseId, Result};
//!
//! // What `impl KvLeaseStore for MyStore` writes for each, `store` being `self`:
//! async fn campaign<S: KvLeaseStore + ?Sized>(
//!     store: &S, name: &str, value: Bytes, lease: LeaseId,
//! ) -> Result<LeaderKey> {
//!     elections::campaign(store, name, value, lease).await
//! }
//! async fn proclaim<S: KvLeaseStore + ?Sized>(store: &S, leader: &LeaderKey, value: Bytes) -> Result<()> {
//!     elections::proclaim(store, leader, value).await
//! }
//! async fn leader<S: KvLeaseStore + ?Sized>(store: &S, name: &str) -> Result<KeyValue> {
//!     elections::leader(store, name).await
//! }
//! async fn observe<S: KvLeaseStore + ?Sized>(store: &S, name: &str) -> Result<LeaderStream> {
//!     elections::observe(store.shared(), name)
//! }
//! async fn resign<S: KvLeaseStore + ?Sized>(store: &S, leader: &LeaderKey) -> Result<()> {
//!     elections::resign(store, leader).await
//! }
//! ```

use std::ops::ControlFlow;
use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;

use crate::error::{Error, ErrorClass, Result};
use crate::leader_key::LeaderKey;
use crate::request::{DeleteRequest, GetRequest, PutRequest, SortOrder, SortTarget, WatchRequest};
use crate::retry;
use crate::store::{DynKvLeaseStore, KvLeaseStore, LeaderStream};
use crate::txn::{Compare, CompareOp, TxnOp, TxnRequest};
use crate::types::{EventKind, KeyValue, LeaseId, Revision};
use crate::validate;

use follow::{Change, Follow};

pub(crate) mod follow;
pub(crate) mod limbo;

/// The prefix of the fence keys coord writes after a write of unknown outcome, so that the
/// write, if it is still to land, cannot (see `docs/PROMISES.md`, "A campaign write of
/// unknown outcome cannot come back"). Each is under the lease of the writes it fences and
/// goes with it. A tool that watches a store's every change by prefixes adds this one.
pub const FENCE_PREFIX: &str = "\0coord-fence/";

pub(crate) use limbo::Fencing;

fn prefix_of(name: &str) -> String {
    format!("{name}/")
}

/// The candidate key of `lease` in election `name`, as etcd's Go client writes it.
pub fn candidate_key(name: &str, lease: LeaseId) -> String {
    format!("{}{lease}", prefix_of(name))
}

/// What becomes of the candidate key of a campaign that did not finish (dropped, timed out,
/// failed after its write).
pub(crate) enum Cleanup {
    /// One delete in the background, right away (the trait's own `campaign`).
    Once,
    /// Handed to whoever owns the lease (a session), which retries it until the key is gone
    /// or a newer campaign for the same key takes the key over.
    HandOff(Box<dyn FnOnce(Arc<DynKvLeaseStore>, LeaderKey) + Send>),
}

/// [`KvLeaseStore::campaign`] on `store`'s primitives: etcd's algorithm, a dropped
/// campaign's key deleted in the background.
///
/// # Errors
/// As [`KvLeaseStore::campaign`] says.
pub async fn campaign<S: KvLeaseStore + ?Sized>(
    store: &S,
    name: &str,
    value: Bytes,
    lease: LeaseId,
) -> Result<LeaderKey> {
    campaign_with(store, name, value, lease, Cleanup::Once, 1, None)
        .await
        .map(|(leader, _)| leader)
}

/// A session's turn to campaign (or withdraw) in one election: see `SessionHandle`'s
/// `campaign_turn`.
/// It carries the versions the session's fences in the election stand at (see [`limbo`]).
pub(crate) type Turn = tokio::sync::OwnedMutexGuard<limbo::Fences>;

/// A session's turn in one election, with what fencing its writes there takes.
pub(crate) type FencedTurn = (Turn, Fencing);

/// The campaign algorithm; see [`KvLeaseStore::campaign`]. With `seats` above one it is a
/// semaphore's: the key wins once fewer than `seats` keys are older than it.
///
/// `turn`, the session's turn in this election, is handed back with the win. While the
/// candidate key's write is outstanding, the write owns the turn: if the campaign is dropped
/// then, the write still settles before the turn passes on, so the withdrawal (which waits
/// for the turn) cannot land before a write sent earlier and be undone by it.
pub(crate) async fn campaign_with<S: KvLeaseStore + ?Sized>(
    store: &S,
    name: &str,
    value: Bytes,
    lease: LeaseId,
    cleanup: Cleanup,
    seats: usize,
    turn: Option<FencedTurn>,
) -> Result<(LeaderKey, Option<Turn>)> {
    validate::election_name(name)?;
    let key = candidate_key(name, lease);
    let mut leader = LeaderKey {
        name: name.to_owned(),
        key: Bytes::from(key.clone()),
        // Unknown until the transaction answers; the guard then deletes by lease.
        token: Revision::ZERO,
        lease,
    };
    // Armed before the write: a reply lost in flight (Indeterminate) or a cancellation while
    // it is outstanding must not leave a candidate queued that nobody waits for.
    let mut guard = CleanupGuard::new(store.shared(), leader.clone(), cleanup);
    let txn = TxnRequest::new()
        .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
        .and_then([PutRequest::new(key.clone(), value.to_vec()).with_lease(lease)])
        .or_else([GetRequest::key(key.clone())]);
    let (written, turn) = settled(store.shared(), txn, turn).await;
    guard.turn = turn;
    let resp = match written {
        Ok(r) => r,
        Err(e) => {
            // Only a write that may have applied can have left a key behind.
            if e.class() != ErrorClass::Indeterminate {
                guard.disarm();
            }
            return Err(e);
        }
    };
    leader.token = resp.revision;
    if !resp.succeeded {
        // Our key already exists (this lease campaigned before): rejoin at its place.
        let existing = resp
            .responses
            .first()
            .and_then(|r| r.as_get())
            .and_then(|g| g.kvs.first());
        match existing {
            Some(kv) => {
                leader.token = kv.create_revision;
                if kv.value != value {
                    proclaim(store, &leader, value).await?;
                }
            }
            // Deleted between the compare and the read, which a transaction rules out;
            // treat it as the key being gone.
            None => return Err(lost(&leader)),
        }
    }

    guard.leader = leader.clone();
    tracing::debug!(election = name, key = %String::from_utf8_lossy(&leader.key), token = %leader.token, "campaign queued");
    let waited = if seats > 1 {
        wait_for_seat(store, &leader, seats).await
    } else {
        wait_for_turn(store, &leader).await
    };
    match waited {
        Ok(()) => {
            guard.disarm();
            tracing::debug!(election = name, token = %leader.token, "campaign won");
            Ok((leader, guard.turn.take()))
        }
        // The guard deletes the key on the way out: a failed campaign leaves nothing queued.
        Err(err) => Err(err),
    }
}

/// Runs `txn` as a task of its own that owns `turn` until the store answers, so that
/// dropping the caller does not release the turn while the write may still land.
///
/// With a turn, the write is a session's candidate write, fenced (see [`limbo::write`]).
pub(crate) async fn settled(
    store: Arc<DynKvLeaseStore>,
    txn: TxnRequest,
    turn: Option<FencedTurn>,
) -> (Result<crate::txn::TxnResponse>, Option<Turn>) {
    match turn {
        Some((turn, fencing)) => limbo::write(store, txn, turn, fencing).await,
        None => (store.txn(txn).await, None),
    }
}

fn lost(leader: &LeaderKey) -> Error {
    Error::CandidacyLost {
        election: leader.name.clone(),
        key: String::from_utf8_lossy(&leader.key).into_owned(),
        lease: leader.lease,
        reason: "the candidate key was deleted".to_owned(),
    }
}

/// Waits until `leader.key` is the oldest key of the election, or fails when it disappears.
/// The store not answering is waited out (with backoff), never a reason to give up the place
/// in the queue: the caller bounds the wait (a session's end, a cancellation).
async fn wait_for_turn<S: KvLeaseStore + ?Sized>(store: &S, leader: &LeaderKey) -> Result<()> {
    let prefix = prefix_of(&leader.name);
    let skip_own_check =
        crate::hooks::planted::enabled(crate::hooks::planted::Bug::CampaignSkipsOwnKeyCheck);
    let shared = store.shared();
    let mut backoff = retry::Backoff::store(retry::seed(&[&leader.key]));
    let mut first = true;
    loop {
        // One consistent read: our own key, and the newest key created before it (the one
        // whose deletion we wait for), as etcd's Go client asks (sorted, limit 1, so a queue of
        // thousands costs one key per read, not the whole queue).
        let read = || {
            TxnRequest::new().and_then([
                TxnOp::Get(GetRequest::key(leader.key.to_vec())),
                TxnOp::Get(
                    GetRequest::prefix(prefix.clone())
                        .with_max_create_revision(leader.token.prev())
                        .with_sort(SortTarget::Create, SortOrder::Descend)
                        .with_limit(1),
                ),
            ])
        };
        let snapshot = retry::call(&mut backoff, "read an election's queue", || {
            store.txn(read())
        })
        .await?;
        crate::hooks::explore::point().await;
        let first_kv = |i: usize| {
            snapshot
                .responses
                .get(i)
                .and_then(|r| r.as_get())
                .and_then(|g| g.kvs.first())
        };
        let own = first_kv(0);
        if own.map(|kv| kv.create_revision) != Some(leader.token) && (first || !skip_own_check) {
            return Err(lost(leader));
        }
        first = false;
        let Some(predecessor) = first_kv(1) else {
            // One consistent read saw our key, as we created it, with nobody before it.
            return Ok(());
        };
        let from = snapshot.revision + 1;
        let theirs_created = predecessor.create_revision;
        tracing::debug!(
            election = %leader.name,
            predecessor = %String::from_utf8_lossy(&predecessor.key),
            revision = %snapshot.revision,
            "waiting for the key ahead to go"
        );
        let mut theirs = Follow::new(
            shared.clone(),
            predecessor.key.clone(),
            from,
            Some((theirs_created, predecessor.mod_revision)),
        );
        let mut ours = Follow::new(
            shared.clone(),
            leader.key.clone(),
            from,
            own.map(|kv| (kv.create_revision, kv.mod_revision)),
        );
        // When the predecessor goes, the snapshot (not the watch) decides what comes next.
        tokio::select! {
            biased;
            _ = ours.until_gone(|kv| kv.create_revision == leader.token), if !skip_own_check => {
                return Err(lost(leader));
            }
            _ = theirs.until_gone(|kv| kv.create_revision == theirs_created) => {}
        }
    }
}

/// Where a queued key stands, from one consistent read.
pub(crate) enum Seat {
    /// The key is gone, or is not the one this campaign created.
    Lost,
    /// Fewer than `seats` keys are older than it.
    Held,
    /// An older key records another value: see [`disagreement`].
    Disagrees(Error),
    /// At least `seats` keys are ahead of it, as of `revision`; `nearest` are the `seats`
    /// youngest of them, and `own` the key itself.
    Waiting {
        own: KeyValue,
        nearest: Vec<KeyValue>,
        revision: Revision,
    },
}

/// Reads, in one transaction, the key and the (at most `seats`) youngest keys created before
/// it.
pub(crate) async fn seat<S: KvLeaseStore + ?Sized>(
    store: &S,
    leader: &LeaderKey,
    seats: usize,
) -> Result<Seat> {
    let read = TxnRequest::new().and_then([
        TxnOp::Get(GetRequest::key(leader.key.to_vec())),
        TxnOp::Get(
            GetRequest::prefix(prefix_of(&leader.name))
                .with_max_create_revision(leader.token.prev())
                .with_sort(SortTarget::Create, SortOrder::Descend)
                .with_limit(seats as u64),
        ),
    ]);
    let snapshot = store.txn(read).await?;
    let get = |i: usize| snapshot.responses.get(i).and_then(|r| r.as_get());
    let own = match get(0).and_then(|g| g.kvs.first()) {
        Some(kv) if kv.create_revision == leader.token => kv.clone(),
        _ => return Ok(Seat::Lost),
    };
    let nearest: Vec<KeyValue> = get(1).map(|g| g.kvs.clone()).unwrap_or_default();
    if let Some(refused) = disagreement(&leader.name, &own.value, &nearest) {
        return Ok(Seat::Disagrees(refused));
    }
    if nearest.len() < seats {
        return Ok(Seat::Held);
    }
    Ok(Seat::Waiting {
        own,
        nearest,
        revision: snapshot.revision,
    })
}

/// Why a key of a multi-seat election recording `own` may not take a seat, given keys older
/// than it: one of them records another value.
///
/// The keys of a semaphore record the count their users passed. A seat is taken only on a
/// read that finds the keys ahead agreeing with it (all of them, once fewer than the count
/// are ahead), so of two users passing different counts, the one that queued later is
/// refused rather than seated on a count of its own. The check rides on the reads that
/// decide the seat, adding none. Keys with an empty value (written by an older coord) are
/// not compared.
pub(crate) fn disagreement(name: &str, own: &[u8], older: &[KeyValue]) -> Option<Error> {
    let other = older
        .iter()
        .find(|kv| !kv.value.is_empty() && !own.is_empty() && kv.value != own)?;
    Some(Error::invalid(format!(
        "semaphore {name:?}: this user's key records {:?}, but the older key {:?} records {:?}; \
         every user of a semaphore must pass the same count",
        String::from_utf8_lossy(own),
        String::from_utf8_lossy(&other.key),
        String::from_utf8_lossy(&other.value),
    )))
}

/// Waits until fewer than `seats` keys are older than `leader.key`, or fails when it
/// disappears or an older key disagrees (see [`disagreement`]).
///
/// Only the `seats` keys just ahead of it are followed, not the whole queue: with `c >= seats`
/// keys ahead, fewer than `seats` remain only after `c - seats + 1` of them go, and only
/// `c - seats` are older than the ones followed, so one of those must go first (keys join
/// the queue at its end, never ahead). A release thus wakes the `seats` waiters behind the
/// key released, each with one read, not every waiter in the queue (which, each reading the
/// queue, cost a release time quadratic in the queue's length).
async fn wait_for_seat<S: KvLeaseStore + ?Sized>(
    store: &S,
    leader: &LeaderKey,
    seats: usize,
) -> Result<()> {
    let shared = store.shared();
    let mut backoff = retry::Backoff::store(retry::seed(&[&leader.key]));
    loop {
        let seated = retry::call(&mut backoff, "read a semaphore's queue", || {
            seat(store, leader, seats)
        });
        let (own, nearest, revision) = match seated.await? {
            Seat::Held => return Ok(()),
            Seat::Lost => return Err(lost(leader)),
            Seat::Disagrees(refused) => return Err(refused),
            Seat::Waiting {
                own,
                nearest,
                revision,
            } => (own, nearest, revision),
        };
        crate::hooks::explore::point().await;
        tracing::debug!(election = %leader.name, %revision, "waiting for one of the keys just ahead to go");
        let from = revision + 1;
        let follow = |kv: &KeyValue| {
            Follow::new(
                shared.clone(),
                kv.key.clone(),
                from,
                Some((kv.create_revision, kv.mod_revision)),
            )
        };
        let mut ours = follow(&own);
        let mut theirs: Vec<(Follow, Revision)> = nearest
            .iter()
            .map(|kv| (follow(kv), kv.create_revision))
            .collect();
        let one_gone = futures::future::select_all(theirs.iter_mut().map(|(f, created)| {
            let created = *created;
            Box::pin(async move { f.until_gone(|kv| kv.create_revision == created).await })
        }));
        let never_wakes =
            crate::hooks::planted::enabled(crate::hooks::planted::Bug::SemaphoreWaiterNeverWakes);
        // Whichever goes, the next read (not the watch) decides what comes next.
        tokio::select! {
            biased;
            _ = ours.until_gone(|kv| kv.create_revision == leader.token) => {}
            _ = one_gone, if !never_wakes => {}
        }
    }
}

/// Deletes a candidate key whose campaign did not finish (dropped, timed out or failed), if
/// the key is still the one this campaign created.
struct CleanupGuard {
    store: Option<Arc<DynKvLeaseStore>>,
    leader: LeaderKey,
    cleanup: Option<Cleanup>,
    /// The session's turn, once the write gave it back: released only after the clean-up
    /// was handed over (fields drop after `drop` runs). Released first, a campaign of the
    /// same session on another thread could take the turn and number itself in between, and
    /// the hand-over would then take the key for that campaign's and leave it standing.
    turn: Option<Turn>,
}

impl CleanupGuard {
    fn new(store: Arc<DynKvLeaseStore>, leader: LeaderKey, cleanup: Cleanup) -> Self {
        CleanupGuard {
            store: Some(store),
            leader,
            cleanup: Some(cleanup),
            turn: None,
        }
    }

    fn disarm(&mut self) {
        self.store = None;
    }
}

impl Drop for CleanupGuard {
    fn drop(&mut self) {
        let (Some(store), Some(cleanup)) = (self.store.take(), self.cleanup.take()) else {
            return;
        };
        let leader = self.leader.clone();
        match cleanup {
            Cleanup::HandOff(owner) => owner(store, leader),
            // Drop cannot await, so the delete runs as its own task. Once only: a delete
            // retried later could land after a newer campaign with the same lease re-created
            // (or adopted) the same key, and delete that. Without a runtime (dropped during
            // shutdown) the key stays until its lease ends.
            Cleanup::Once => match tokio::runtime::Handle::try_current() {
                Ok(rt) => {
                    rt.spawn(async move {
                        if let Err(e) = withdraw(&*store, &leader).await {
                            tracing::warn!(
                                election = %leader.name,
                                error = &e as &dyn std::error::Error,
                                "could not delete the key of a cancelled campaign; it stays until its lease ends"
                            );
                        }
                    });
                }
                Err(_) => tracing::warn!(
                    election = %leader.name,
                    "campaign dropped outside a runtime; its key stays until its lease ends"
                ),
            },
        }
    }
}

/// Deletes a candidate key that is ours: by create revision when known, else by lease (the
/// key's name embeds our lease, so a key under it with our lease can only be ours).
pub(crate) async fn withdraw<S: KvLeaseStore + ?Sized>(
    store: &S,
    leader: &LeaderKey,
) -> Result<()> {
    store.txn(withdrawal(leader)).await?;
    Ok(())
}

/// The transaction of [`withdraw`].
pub(crate) fn withdrawal(leader: &LeaderKey) -> TxnRequest {
    if !leader.token.is_zero() {
        return resignation(leader);
    }
    TxnRequest::new()
        .when([Compare::lease(
            leader.key.to_vec(),
            CompareOp::Equal,
            leader.lease,
        )])
        .and_then([DeleteRequest::key(leader.key.to_vec())])
}

/// [`KvLeaseStore::proclaim`] on `store`'s primitives: a put conditional on the key's create
/// revision.
///
/// # Errors
/// [`Error::NotLeader`] when the key no longer stands as created; the store's own errors.
pub async fn proclaim<S: KvLeaseStore + ?Sized>(
    store: &S,
    leader: &LeaderKey,
    value: Bytes,
) -> Result<()> {
    let resp = store
        .txn(TxnRequest::new().when([leader.is_current()]).and_then([
            PutRequest::new(leader.key.to_vec(), value.to_vec()).with_lease(leader.lease),
        ]))
        .await?;
    if resp.succeeded {
        Ok(())
    } else {
        Err(Error::NotLeader {
            election: leader.name.clone(),
        })
    }
}

/// [`KvLeaseStore::resign`] on `store`'s primitives: a delete conditional on the key's create
/// revision.
///
/// # Errors
/// The store's own errors (a key already gone is success).
pub async fn resign<S: KvLeaseStore + ?Sized>(store: &S, leader: &LeaderKey) -> Result<()> {
    store.txn(resignation(leader)).await?;
    Ok(())
}

/// The transaction of [`resign`]: conditional on the create revision, so that a retried or
/// late resign never deletes a newer incarnation of the key (etcd#22082).
pub(crate) fn resignation(leader: &LeaderKey) -> TxnRequest {
    TxnRequest::new()
        .when([leader.is_current()])
        .and_then([DeleteRequest::key(leader.key.to_vec())])
}

/// The read of an election's oldest candidate (its leader), as etcd's Go client makes it
/// (`WithFirstCreate`): sorted by create revision, limit 1, so a queue of thousands costs
/// one key, not the queue.
pub(crate) fn oldest_candidate(name: &str) -> GetRequest {
    GetRequest::prefix(prefix_of(name))
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1)
}

fn first_created(kvs: Vec<KeyValue>) -> Option<KeyValue> {
    kvs.into_iter().next()
}

/// [`KvLeaseStore::leader`] on `store`'s primitives: the oldest candidate key, in one read of
/// one key.
///
/// # Errors
/// [`Error::NoLeader`] when there is no candidate; [`Error::InvalidArgument`] for a
/// malformed name; the store's own errors.
pub async fn leader<S: KvLeaseStore + ?Sized>(store: &S, name: &str) -> Result<KeyValue> {
    validate::election_name(name)?;
    let resp = store.get(oldest_candidate(name)).await?;
    first_created(resp.kvs).ok_or_else(|| Error::NoLeader {
        election: name.to_owned(),
    })
}

/// [`KvLeaseStore::observe`] on the primitives of `store` (a [`KvLeaseStore::shared`]
/// handle: the stream outlives the call).
///
/// # Errors
/// [`Error::InvalidArgument`] for a malformed name.
pub fn observe(store: Arc<DynKvLeaseStore>, name: &str) -> Result<LeaderStream> {
    validate::election_name(name)?;
    let prefix = prefix_of(name);
    let oldest = oldest_candidate(name);
    let stream = async_stream::try_stream! {
        let mut backoff = retry::Backoff::store(retry::seed(&[prefix.as_bytes()]));
        // (key, mod revision) of the last leader reported, so a re-read after a broken
        // watch does not report the same leader twice.
        let mut last: Option<(Bytes, Revision)> = None;
        loop {
            let snapshot =
                retry::call(&mut backoff, "read an election's leader", || store.get(oldest.clone()))
                    .await?;
            let from = snapshot.revision + 1;
            let Some(current) = first_created(snapshot.kvs) else {
                // No candidate yet: wait for one to appear (or the watch to break), then
                // re-read.
                let req = WatchRequest::prefix(prefix.clone()).with_start_revision(from);
                let watched = retry::until(&mut backoff, std::future::pending::<std::convert::Infallible>(), |_| {
                    let sent = store.watch(req.clone());
                    async move {
                        match sent.await {
                            Ok(w) => ControlFlow::Break(Some(w)),
                            // Gone from history: the re-read says what there is.
                            Err(Error::Compacted { .. }) => ControlFlow::Break(None),
                            Err(_) => ControlFlow::Continue(()),
                        }
                    }
                });
                let Ok(watched) = watched.await;
                if let Some(mut w) = watched {
                    while let Some(Ok(batch)) = w.next().await {
                        if batch.events.iter().any(|e| e.kind == EventKind::Put) {
                            break;
                        }
                    }
                }
                continue;
            };
            let seen = (current.key.clone(), current.mod_revision);
            if last.as_ref() != Some(&seen) {
                last = Some(seen);
                yield current.clone();
            }
            // Follow the leader's key: a put is a proclaim, anything else hands over.
            let created = current.create_revision;
            let mut follow = Follow::new(store.clone(), current.key.clone(), from, Some((created, current.mod_revision)));
            loop {
                match follow.next().await {
                    Change::Put(kv) if kv.create_revision == created => {
                        last = Some((kv.key.clone(), kv.mod_revision));
                        yield kv;
                    }
                    _ => break,
                }
            }
        }
    };
    Ok(stream.boxed())
}
