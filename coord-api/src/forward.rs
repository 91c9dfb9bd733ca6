//! The base wrapper stores are written on: [`Forward`], every call passed to an inner store
//! unless the wrapper says otherwise; and `Arc<S>` as a store.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;

use crate::error::Result;
use crate::leader_key::LeaderKey;
use crate::request::{
    DeleteRequest, DeleteResponse, GetRequest, GetResponse, LeaseGrant, LeaseTimeToLive,
    PutRequest, PutResponse, WatchRequest,
};
use crate::store::{DynKvLeaseStore, KeepAlive, KvLeaseStore, LeaderStream, WatchStream};
use crate::txn::{TxnRequest, TxnResponse};
use crate::types::{KeyValue, LeaseId, Limits, Revision};

/// A store that wraps another: every method passes the call to [`inner`](Forward::inner)
/// unless the wrapper overrides it, and every `Forward` is a [`KvLeaseStore`]. A wrapper
/// (tracing, metrics, a recorder, a key prefix) writes only what it changes, like a layer in
/// tower.
///
/// Everything not overridden goes to the inner store, elections included: a backend's own
/// elections are never replaced by a default. [`shared`](KvLeaseStore::shared) is a clone of
/// the wrapper, so clean-ups run through it pass through the wrapper too.
///
/// Implement this trait where you write the wrapper, and call the store through
/// [`KvLeaseStore`] elsewhere: with both traits in scope, a method call names two methods.
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use std::sync::Arc;
/// use coord_api::{async_trait, DynKvLeaseStore, Forward, PutRequest, PutResponse, Result};
///
/// /// Counts the puts sent through it.
/// #[derive(Debug, Clone)]
/// struct CountingPuts {
///     inner: Arc<DynKvLeaseStore>,
///     puts: Arc<AtomicU64>,
/// }
///
/// #[async_trait]
/// impl Forward for CountingPuts {
///     fn inner(&self) -> &DynKvLeaseStore {
///         &*self.inner
///     }
///
///     async fn put(&self, req: PutRequest) -> Result<PutResponse> {
///         self.puts.fetch_add(1, Ordering::Relaxed);
///         self.inner.put(req).await
///     }
/// }
///
/// fn counted(store: Arc<DynKvLeaseStore>) -> Arc<DynKvLeaseStore> {
///     Arc::new(CountingPuts { inner: store, puts: Arc::default() })
/// }
/// ```
#[async_trait]
pub trait Forward: fmt::Debug + Clone + Send + Sync + 'static {
    /// The store every call the wrapper does not override goes to.
    fn inner(&self) -> &DynKvLeaseStore;

    /// [`KvLeaseStore::backend`].
    fn backend(&self) -> &'static str {
        self.inner().backend()
    }
    /// [`KvLeaseStore::limits`].
    fn limits(&self) -> Limits {
        self.inner().limits()
    }
    /// [`KvLeaseStore::get`].
    async fn get(&self, req: GetRequest) -> Result<GetResponse> {
        self.inner().get(req).await
    }
    /// [`KvLeaseStore::put`].
    async fn put(&self, req: PutRequest) -> Result<PutResponse> {
        self.inner().put(req).await
    }
    /// [`KvLeaseStore::delete`].
    async fn delete(&self, req: DeleteRequest) -> Result<DeleteResponse> {
        self.inner().delete(req).await
    }
    /// [`KvLeaseStore::txn`].
    async fn txn(&self, req: TxnRequest) -> Result<TxnResponse> {
        self.inner().txn(req).await
    }
    /// [`KvLeaseStore::grant`].
    async fn grant(&self, ttl: Duration) -> Result<LeaseGrant> {
        self.inner().grant(ttl).await
    }
    /// [`KvLeaseStore::revoke`].
    async fn revoke(&self, lease: LeaseId) -> Result<Revision> {
        self.inner().revoke(lease).await
    }
    /// [`KvLeaseStore::time_to_live`].
    async fn time_to_live(&self, lease: LeaseId) -> Result<LeaseTimeToLive> {
        self.inner().time_to_live(lease).await
    }
    /// [`KvLeaseStore::keep_alive`].
    async fn keep_alive(&self, lease: LeaseId) -> Result<Box<dyn KeepAlive>> {
        self.inner().keep_alive(lease).await
    }
    /// [`KvLeaseStore::watch`].
    async fn watch(&self, req: WatchRequest) -> Result<WatchStream> {
        self.inner().watch(req).await
    }
    /// [`KvLeaseStore::compact`].
    async fn compact(&self, revision: Revision) -> Result<()> {
        self.inner().compact(revision).await
    }
    /// [`KvLeaseStore::campaign`].
    async fn campaign(&self, name: &str, value: Bytes, lease: LeaseId) -> Result<LeaderKey> {
        self.inner().campaign(name, value, lease).await
    }
    /// [`KvLeaseStore::proclaim`].
    async fn proclaim(&self, leader: &LeaderKey, value: Bytes) -> Result<()> {
        self.inner().proclaim(leader, value).await
    }
    /// [`KvLeaseStore::leader`].
    async fn leader(&self, name: &str) -> Result<KeyValue> {
        self.inner().leader(name).await
    }
    /// [`KvLeaseStore::observe`].
    async fn observe(&self, name: &str) -> Result<LeaderStream> {
        self.inner().observe(name).await
    }
    /// [`KvLeaseStore::resign`].
    async fn resign(&self, leader: &LeaderKey) -> Result<()> {
        self.inner().resign(leader).await
    }
}

// Every method, so that none falls back to a default of the contract's.
#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl<F: Forward> KvLeaseStore for F {
    fn backend(&self) -> &'static str {
        Forward::backend(self)
    }
    fn limits(&self) -> Limits {
        Forward::limits(self)
    }
    fn shared(&self) -> Arc<DynKvLeaseStore> {
        Arc::new(self.clone())
    }
    async fn get(&self, req: GetRequest) -> Result<GetResponse> {
        Forward::get(self, req).await
    }
    async fn put(&self, req: PutRequest) -> Result<PutResponse> {
        Forward::put(self, req).await
    }
    async fn delete(&self, req: DeleteRequest) -> Result<DeleteResponse> {
        Forward::delete(self, req).await
    }
    async fn txn(&self, req: TxnRequest) -> Result<TxnResponse> {
        Forward::txn(self, req).await
    }
    async fn grant(&self, ttl: Duration) -> Result<LeaseGrant> {
        Forward::grant(self, ttl).await
    }
    async fn revoke(&self, lease: LeaseId) -> Result<Revision> {
        Forward::revoke(self, lease).await
    }
    async fn time_to_live(&self, lease: LeaseId) -> Result<LeaseTimeToLive> {
        Forward::time_to_live(self, lease).await
    }
    async fn keep_alive(&self, lease: LeaseId) -> Result<Box<dyn KeepAlive>> {
        Forward::keep_alive(self, lease).await
    }
    async fn watch(&self, req: WatchRequest) -> Result<WatchStream> {
        Forward::watch(self, req).await
    }
    async fn compact(&self, revision: Revision) -> Result<()> {
        Forward::compact(self, revision).await
    }
    async fn campaign(&self, name: &str, value: Bytes, lease: LeaseId) -> Result<LeaderKey> {
        Forward::campaign(self, name, value, lease).await
    }
    async fn proclaim(&self, leader: &LeaderKey, value: Bytes) -> Result<()> {
        Forward::proclaim(self, leader, value).await
    }
    async fn leader(&self, name: &str) -> Result<KeyValue> {
        Forward::leader(self, name).await
    }
    async fn observe(&self, name: &str) -> Result<LeaderStream> {
        Forward::observe(self, name).await
    }
    async fn resign(&self, leader: &LeaderKey) -> Result<()> {
        Forward::resign(self, leader).await
    }
}

/// `Arc<S>` is the store `S`: the same client, shared.
#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl<S: KvLeaseStore + ?Sized> KvLeaseStore for Arc<S> {
    fn backend(&self) -> &'static str {
        (**self).backend()
    }
    fn limits(&self) -> Limits {
        (**self).limits()
    }
    fn shared(&self) -> Arc<DynKvLeaseStore> {
        (**self).shared()
    }
    async fn get(&self, req: GetRequest) -> Result<GetResponse> {
        (**self).get(req).await
    }
    async fn put(&self, req: PutRequest) -> Result<PutResponse> {
        (**self).put(req).await
    }
    async fn delete(&self, req: DeleteRequest) -> Result<DeleteResponse> {
        (**self).delete(req).await
    }
    async fn txn(&self, req: TxnRequest) -> Result<TxnResponse> {
        (**self).txn(req).await
    }
    async fn grant(&self, ttl: Duration) -> Result<LeaseGrant> {
        (**self).grant(ttl).await
    }
    async fn revoke(&self, lease: LeaseId) -> Result<Revision> {
        (**self).revoke(lease).await
    }
    async fn time_to_live(&self, lease: LeaseId) -> Result<LeaseTimeToLive> {
        (**self).time_to_live(lease).await
    }
    async fn keep_alive(&self, lease: LeaseId) -> Result<Box<dyn KeepAlive>> {
        (**self).keep_alive(lease).await
    }
    async fn watch(&self, req: WatchRequest) -> Result<WatchStream> {
        (**self).watch(req).await
    }
    async fn compact(&self, revision: Revision) -> Result<()> {
        (**self).compact(revision).await
    }
    async fn campaign(&self, name: &str, value: Bytes, lease: LeaseId) -> Result<LeaderKey> {
        (**self).campaign(name, value, lease).await
    }
    async fn proclaim(&self, leader: &LeaderKey, value: Bytes) -> Result<()> {
        (**self).proclaim(leader, value).await
    }
    async fn leader(&self, name: &str) -> Result<KeyValue> {
        (**self).leader(name).await
    }
    async fn observe(&self, name: &str) -> Result<LeaderStream> {
        (**self).observe(name).await
    }
    async fn resign(&self, leader: &LeaderKey) -> Result<()> {
        (**self).resign(leader).await
    }
}
