//! The [`KvLeaseStore`] trait: the one contract every backend implements.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;

use crate::error::Result;
use crate::leader_key::LeaderKey;
use crate::request::{
    DeleteRequest, DeleteResponse, GetRequest, GetResponse, LeaseGrant, LeaseTimeToLive,
    PutRequest, PutResponse, WatchRequest,
};
use crate::txn::{TxnRequest, TxnResponse};
use crate::types::{KeyValue, LeaseId, Limits, Revision};
pub use crate::watch_stream::WatchStream;

/// A stream of leaders; see [`KvLeaseStore::observe`].
pub type LeaderStream = BoxStream<'static, Result<KeyValue>>;

/// The trait object every recipe takes.
pub type DynKvLeaseStore = dyn KvLeaseStore;

/// A key-value store with revisions, transactions, leases, watches and compaction, with etcd
/// v3's semantics as the reference, plus etcd-style elections built on those primitives.
///
/// # Contract
///
/// * **Revisions.** The store has one revision counter. Every transaction that writes
///   (a put, a delete that deletes something, a revoke or expiry that deletes keys) advances it
///   by exactly one, whatever the number of keys written; reads, lease calls and writes that
///   change nothing leave it alone. Every response carries the revision it was served at.
/// * **Keys** carry a create revision, a mod revision, a version (1 on creation, +1 per write,
///   reset by a delete) and a lease.
/// * **Leases** expire no earlier than their TTL after their last renewal, and at most
///   [`Limits::expiry_granularity`] later (real etcd may extend them across its own leader
///   changes). Expiry or revocation deletes every attached key in one revision, with one delete
///   event each.
/// * **Watches** deliver events in revision order, every event of a revision in the same batch,
///   none twice, none skipped, from the start revision inclusive.
/// * **Bad input** is refused with [`Error::InvalidArgument`](crate::Error::InvalidArgument)
///   before anything is sent; backends call [`crate::validate`] for that.
///
/// # Cancellation
///
/// Dropping a returned future is always safe, but a dropped write may still apply (it may
/// already be on its way). A dropped [`campaign`](KvLeaseStore::campaign) deletes its candidate
/// key in the background. Dropping a [`WatchStream`] cancels the watch.
///
/// # Elections
///
/// The five election methods ([`campaign`](KvLeaseStore::campaign) to
/// [`resign`](KvLeaseStore::resign)) are part of the contract, so that a backend may offer
/// elections of its own; a backend without them writes each as one call into
/// [`crate::elections`], etcd's algorithm on the primitives above (as `SimStore` and
/// `EtcdStore` do). They have no default: a wrapper store (retries, tracing, metrics,
/// [`Namespaced`](crate::Namespaced)) forwards them like every other method, on
/// [`Forward`](crate::Forward) or by hand; the compiler says so if it does not.
///
/// # Example
///
/// ```no_run
/// # use std::sync::Arc;
/// # use coord_api::{DynKvLeaseStore, GetRequest, PutRequest, Result};
/// # async fn run(store: Arc<DynKvLeaseStore>) -> Result<()> {
/// let lease = store.grant(std::time::Duration::from_secs(10)).await?;
/// store.put(PutRequest::new("hosts/a", "10.0.0.1:80").with_lease(lease.id)).await?;
/// let hosts = store.get(GetRequest::prefix("hosts/")).await?;
/// println!("{} hosts at revision {}", hosts.count, hosts.revision);
/// # Ok(()) }
/// ```
#[async_trait]
pub trait KvLeaseStore: fmt::Debug + Send + Sync + 'static {
    /// A short, stable name for errors and traces ("etcd", "sim").
    fn backend(&self) -> &'static str;

    /// What the store accepts and how its time behaves.
    fn limits(&self) -> Limits;

    /// Another handle to the same store that may outlive `&self`. The election algorithm
    /// ([`crate::elections`]) uses it to finish clean-up after a cancelled campaign and to
    /// drive [`observe`](KvLeaseStore::observe) streams.
    ///
    /// # Contract
    /// * The handle reaches the same store and sees every write `self` made (it reads its
    ///   own writes, as `self` does).
    /// * It is the same client: the same connection, credentials, limits and timeouts, and
    ///   the same faults, so that a clean-up issued through it is judged as `self`'s would be
    ///   (a test that cuts `self` off cuts the clean-up off too). For a backend whose handle
    ///   is a cheap clone of shared state, `Arc::new(self.clone())`.
    /// * It must not block or do I/O.
    fn shared(&self) -> Arc<DynKvLeaseStore>;

    /// Reads one key or a prefix.
    ///
    /// # Behavior
    /// * Keys come back in key order; a missing key gives an empty `kvs`, not an error.
    /// * With `revision`, reads the store as it was just after that revision.
    /// * With `limit`, returns at most that many keys; `count` counts them all, `more` says so.
    ///
    /// # Errors
    /// [`InvalidArgument`](crate::Error::InvalidArgument) for an empty key;
    /// [`Compacted`](crate::Error::Compacted) for a revision below the compaction point;
    /// [`FutureRevision`](crate::Error::FutureRevision) for one not yet written.
    async fn get(&self, req: GetRequest) -> Result<GetResponse>;

    /// Writes one key, optionally attached to a lease.
    ///
    /// # Errors
    /// [`InvalidArgument`](crate::Error::InvalidArgument) for an empty key or a request over
    /// [`Limits::max_request_bytes`]; [`LeaseNotFound`](crate::Error::LeaseNotFound) when the
    /// lease does not exist (nothing is written).
    async fn put(&self, req: PutRequest) -> Result<PutResponse>;

    /// Deletes one key or a prefix, all in one revision. Deleting nothing is not an error and
    /// does not advance the revision.
    ///
    /// # Errors
    /// [`InvalidArgument`](crate::Error::InvalidArgument) for an empty key.
    async fn delete(&self, req: DeleteRequest) -> Result<DeleteResponse>;

    /// Runs an atomic if/then/else. The branch's operations run in order, each read seeing the
    /// branch's earlier writes; all its writes share one revision.
    ///
    /// # Errors
    /// As for each operation, failing the whole transaction (nothing applied);
    /// [`InvalidArgument`](crate::Error::InvalidArgument) when a branch writes a key twice.
    async fn txn(&self, req: TxnRequest) -> Result<TxnResponse>;

    /// Grants a lease. The TTL is rounded up to whole seconds and raised to
    /// [`Limits::min_lease_ttl`]; the response says what was granted.
    ///
    /// # Errors
    /// [`InvalidArgument`](crate::Error::InvalidArgument) for a zero TTL or one above
    /// [`Limits::max_lease_ttl`].
    async fn grant(&self, ttl: Duration) -> Result<LeaseGrant>;

    /// Revokes a lease, deleting its keys in one revision. Returns the store revision after.
    ///
    /// # Errors
    /// [`LeaseNotFound`](crate::Error::LeaseNotFound) when it is already gone.
    async fn revoke(&self, lease: LeaseId) -> Result<Revision>;

    /// Reports a lease's remaining time and keys.
    ///
    /// # Errors
    /// [`LeaseNotFound`](crate::Error::LeaseNotFound) when it is gone.
    async fn time_to_live(&self, lease: LeaseId) -> Result<LeaseTimeToLive>;

    /// Opens a keep-alive channel for a lease; each [`KeepAlive::renew`] then sends one
    /// renewal and waits for its answer. The caller decides when to renew. Opening may itself
    /// renew the lease once (etcd's stream opens with a renewal), which the caller does not
    /// count: its deadline comes from the renewals it times.
    ///
    /// # Errors
    /// [`LeaseNotFound`](crate::Error::LeaseNotFound) when the lease is gone (if opening
    /// asks the store); [`StreamClosed`](crate::Error::StreamClosed) when the channel could
    /// not be opened.
    async fn keep_alive(&self, lease: LeaseId) -> Result<Box<dyn KeepAlive>>;

    /// Watches one key or a prefix.
    ///
    /// The watch is registered when this returns: every write after that is delivered.
    ///
    /// # Stream items
    /// * `Ok(batch)`: the events of one or more whole revisions, or (with `progress_notify`)
    ///   an empty progress notification, or the answer to a
    ///   [`request_progress`](WatchStream::request_progress).
    /// * `Err(Compacted)`: the start revision is below the compaction point; the stream ends.
    /// * `Err(StreamClosed)`: the connection was lost; the stream ends. Resume from the last
    ///   revision seen + 1.
    ///
    /// # Errors
    /// [`InvalidArgument`](crate::Error::InvalidArgument) for an empty key.
    async fn watch(&self, req: WatchRequest) -> Result<WatchStream>;

    /// Discards history before `revision`: reads and watches below it fail with
    /// [`Compacted`](crate::Error::Compacted). Current values are kept.
    ///
    /// # Errors
    /// [`Compacted`](crate::Error::Compacted) when `revision` is at or below the compaction
    /// point already; [`FutureRevision`](crate::Error::FutureRevision) when it is above the
    /// current revision.
    async fn compact(&self, revision: Revision) -> Result<()>;

    /// Campaigns in election `name` with `value`, under `lease`, and returns once this
    /// candidate leads.
    ///
    /// The algorithm is etcd's Go `concurrency.Election`, so coord and Go clients on the same
    /// name share one queue: the candidate key is `name/<lease hex>`, candidates queue by
    /// create revision, and each waits for the deletion of the candidate just before it.
    /// Unlike etcd 3.4's server-side election, it then confirms in one read that its own key
    /// still stands and is first; and it watches its own key while waiting, so a candidate
    /// whose lease dies gets [`CandidacyLost`](crate::Error::CandidacyLost), never a
    /// leadership.
    ///
    /// Campaigning again with a key that already exists (same lease) rejoins at its place,
    /// updating the value if it differs.
    ///
    /// # Cancellation
    /// Dropping the future deletes the candidate key (if it is still ours) in the background.
    ///
    /// # Errors
    /// [`InvalidArgument`](crate::Error::InvalidArgument) for a malformed name;
    /// [`LeaseNotFound`](crate::Error::LeaseNotFound) when the lease is gone to begin with;
    /// [`CandidacyLost`](crate::Error::CandidacyLost) as above.
    async fn campaign(&self, name: &str, value: Bytes, lease: LeaseId) -> Result<LeaderKey>;

    /// Replaces the leader's value, only if `leader` still leads (its key still has the same
    /// create revision).
    ///
    /// # Errors
    /// [`NotLeader`](crate::Error::NotLeader) otherwise.
    async fn proclaim(&self, leader: &LeaderKey, value: Bytes) -> Result<()>;

    /// The current leader's key and value: the candidate with the lowest create revision.
    ///
    /// # Errors
    /// [`NoLeader`](crate::Error::NoLeader) when there is no candidate.
    async fn leader(&self, name: &str) -> Result<KeyValue>;

    /// Streams the election's leader: the current one first (once there is one), then each
    /// new leader and each proclaimed value. Like etcd's, it reports the leader as it sees it
    /// when it looks, not every intermediate leader.
    async fn observe(&self, name: &str) -> Result<LeaderStream>;

    /// Gives up leadership (or a place in the queue) by deleting the key, only if it is still
    /// this one (same create revision). Resigning twice, or after the key is gone, is `Ok`.
    async fn resign(&self, leader: &LeaderKey) -> Result<()>;
}

/// A keep-alive channel for one lease, from [`KvLeaseStore::keep_alive`].
///
/// The backend never renews on its own: the caller (the Session recipe) decides when, and
/// measures its local deadline from the moment it called `renew`.
#[async_trait]
pub trait KeepAlive: fmt::Debug + Send {
    /// The lease this channel renews.
    fn lease(&self) -> LeaseId;

    /// Sends one renewal and waits for its answer: the TTL the lease now has.
    ///
    /// # Errors
    /// [`LeaseNotFound`](crate::Error::LeaseNotFound) when the lease is gone (the channel
    /// stays usable but the lease will not come back);
    /// [`StreamClosed`](crate::Error::StreamClosed) when the channel itself died: open a new
    /// one, the lease may still live.
    async fn renew(&mut self) -> Result<Duration>;
}

/// Fails to compile if [`KvLeaseStore`] stops being dyn-compatible.
#[allow(dead_code)]
fn assert_dyn_compatible(_: &DynKvLeaseStore) {}
