//! A store seen through a key prefix: [`Namespaced`].

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;

use crate::error::{Error, Result};
use crate::forward::Forward;
use crate::leader_key::LeaderKey;
use crate::request::{
    DeleteRequest, DeleteResponse, GetRequest, GetResponse, LeaseTimeToLive, PutRequest,
    PutResponse, WatchRequest,
};
use crate::store::{DynKvLeaseStore, KvLeaseStore, LeaderStream, WatchStream};
use crate::txn::{Compare, TxnOp, TxnOpResponse, TxnRequest, TxnResponse};
use crate::types::{Event, KeyRange, KeyValue, LeaseId};
use crate::validate;

/// A store whose every key lives under `prefix`.
///
/// Several services (or several environments of one) can share one etcd cluster without
/// their keys, elections or watches meeting: each sees the store through its own prefix.
/// Like etcd's Go `namespace` package, every key of a request is prefixed on the way in and
/// stripped on the way out (responses, watch events, leaders, errors); leases and revisions
/// are the cluster's own and pass through unchanged. Unlike it, elections are included: an
/// election's name is prefixed like a key, so its candidate keys live under the prefix too.
///
/// ```
/// # async fn run(store: std::sync::Arc<coord_api::DynKvLeaseStore>) -> coord_api::Result<()> {
/// use std::sync::Arc;
/// use coord_api::{KvLeaseStoreExt, Namespaced};
///
/// let billing = Arc::new(Namespaced::new(store.clone(), "billing/"));
/// billing.put_value("hosts/a", "10.0.0.1").await?;
/// // The same key, seen from outside the namespace:
/// assert!(store.get_key("billing/hosts/a").await?.is_some());
/// // And from inside, without the prefix:
/// let kv = billing.get_key("hosts/a").await?.expect("the key");
/// assert_eq!(kv.key.as_ref(), b"hosts/a");
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Namespaced {
    inner: Arc<DynKvLeaseStore>,
    prefix: Arc<str>,
}

impl fmt::Debug for Namespaced {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Namespaced")
            .field("prefix", &self.prefix)
            .field("inner", &self.inner)
            .finish()
    }
}

impl Namespaced {
    /// `store` seen through `prefix` (usually ending in `/`). Namespaces nest: a namespaced
    /// store can be namespaced again.
    pub fn new(store: Arc<DynKvLeaseStore>, prefix: impl Into<String>) -> Self {
        Namespaced {
            inner: store,
            prefix: Arc::from(prefix.into()),
        }
    }

    /// The prefix every key lives under.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    fn key_in(&self, key: &[u8]) -> Bytes {
        let mut k = Vec::with_capacity(self.prefix.len() + key.len());
        k.extend_from_slice(self.prefix.as_bytes());
        k.extend_from_slice(key);
        Bytes::from(k)
    }

    fn key_out(&self, key: Bytes) -> Bytes {
        if key.starts_with(self.prefix.as_bytes()) {
            key.slice(self.prefix.len()..)
        } else {
            key
        }
    }

    fn name_in(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    fn name_out(&self, name: String) -> String {
        match name.strip_prefix(&*self.prefix) {
            Some(n) => n.to_owned(),
            None => name,
        }
    }

    fn range_in(&self, range: KeyRange) -> KeyRange {
        match range {
            KeyRange::Key(k) => KeyRange::Key(self.key_in(&k)),
            KeyRange::Prefix(p) => KeyRange::Prefix(self.key_in(&p)),
        }
    }

    fn kv_out(&self, mut kv: KeyValue) -> KeyValue {
        kv.key = self.key_out(kv.key);
        kv
    }

    fn get_in(&self, mut req: GetRequest) -> GetRequest {
        req.range = self.range_in(req.range);
        req
    }

    fn get_out(&self, mut resp: GetResponse) -> GetResponse {
        resp.kvs = resp.kvs.into_iter().map(|kv| self.kv_out(kv)).collect();
        resp
    }

    fn put_in(&self, mut req: PutRequest) -> PutRequest {
        req.key = self.key_in(&req.key);
        req
    }

    fn put_out(&self, mut resp: PutResponse) -> PutResponse {
        resp.prev_kv = resp.prev_kv.map(|kv| self.kv_out(kv));
        resp
    }

    fn delete_in(&self, mut req: DeleteRequest) -> DeleteRequest {
        req.range = self.range_in(req.range);
        req
    }

    fn delete_out(&self, mut resp: DeleteResponse) -> DeleteResponse {
        resp.prev_kvs = resp
            .prev_kvs
            .into_iter()
            .map(|kv| self.kv_out(kv))
            .collect();
        resp
    }

    fn compare_in(&self, mut c: Compare) -> Compare {
        c.key = self.key_in(&c.key);
        c
    }

    fn op_in(&self, op: TxnOp) -> TxnOp {
        match op {
            TxnOp::Get(r) => TxnOp::Get(self.get_in(r)),
            TxnOp::Put(r) => TxnOp::Put(self.put_in(r)),
            TxnOp::Delete(r) => TxnOp::Delete(self.delete_in(r)),
        }
    }

    fn txn_in(&self, mut req: TxnRequest) -> TxnRequest {
        req.compares = req
            .compares
            .into_iter()
            .map(|c| self.compare_in(c))
            .collect();
        req.success = req.success.into_iter().map(|o| self.op_in(o)).collect();
        req.failure = req.failure.into_iter().map(|o| self.op_in(o)).collect();
        req
    }

    fn txn_out(&self, mut resp: TxnResponse) -> TxnResponse {
        resp.responses = resp
            .responses
            .into_iter()
            .map(|r| match r {
                TxnOpResponse::Get(r) => TxnOpResponse::Get(self.get_out(r)),
                TxnOpResponse::Put(r) => TxnOpResponse::Put(self.put_out(r)),
                TxnOpResponse::Delete(r) => TxnOpResponse::Delete(self.delete_out(r)),
            })
            .collect();
        resp
    }

    fn leader_in(&self, leader: &LeaderKey) -> LeaderKey {
        LeaderKey {
            name: self.name_in(&leader.name),
            key: self.key_in(&leader.key),
            ..leader.clone()
        }
    }

    fn leader_out(&self, leader: LeaderKey) -> LeaderKey {
        LeaderKey {
            name: self.name_out(leader.name),
            key: self.key_out(leader.key),
            ..leader
        }
    }

    /// Errors that name an election or a key name them as the caller does.
    fn error_out(&self, e: Error) -> Error {
        match e {
            Error::NoLeader { election } => Error::NoLeader {
                election: self.name_out(election),
            },
            Error::NotLeader { election } => Error::NotLeader {
                election: self.name_out(election),
            },
            Error::FencedOut { election, token } => Error::FencedOut {
                election: self.name_out(election),
                token,
            },
            Error::CandidacyLost {
                election,
                key,
                lease,
                reason,
            } => Error::CandidacyLost {
                election: self.name_out(election),
                key: self.name_out(key),
                lease,
                reason,
            },
            other => other,
        }
    }
}

// Every method that carries a key, a key range or an election's name maps it; what is left to
// the inner store (backend, limits, grant, revoke, keep_alive, compact) carries none. A method
// added to the contract must be judged here: its default passes keys through unprefixed.
#[crate::async_trait]
impl Forward for Namespaced {
    fn inner(&self) -> &DynKvLeaseStore {
        &*self.inner
    }

    // Each request is checked as the caller wrote it, before the prefix makes an empty key
    // look valid; the backend checks the prefixed one again.
    async fn get(&self, req: GetRequest) -> Result<GetResponse> {
        validate::get(&req)?;
        let resp = self.inner.get(self.get_in(req)).await;
        resp.map(|r| self.get_out(r)).map_err(|e| self.error_out(e))
    }

    async fn put(&self, req: PutRequest) -> Result<PutResponse> {
        validate::put(&req, &self.inner.limits())?;
        let resp = self.inner.put(self.put_in(req)).await;
        resp.map(|r| self.put_out(r)).map_err(|e| self.error_out(e))
    }

    async fn delete(&self, req: DeleteRequest) -> Result<DeleteResponse> {
        validate::delete(&req)?;
        let resp = self.inner.delete(self.delete_in(req)).await;
        resp.map(|r| self.delete_out(r))
            .map_err(|e| self.error_out(e))
    }

    async fn txn(&self, req: TxnRequest) -> Result<TxnResponse> {
        validate::txn(&req, &self.inner.limits())?;
        let resp = self.inner.txn(self.txn_in(req)).await;
        resp.map(|r| self.txn_out(r)).map_err(|e| self.error_out(e))
    }

    /// The lease's keys are listed as seen from inside the namespace; keys attached to it
    /// from outside the namespace are left out, as etcd's Go `namespace` package does.
    async fn time_to_live(&self, lease: LeaseId) -> Result<LeaseTimeToLive> {
        let mut ttl = self.inner.time_to_live(lease).await?;
        let prefix = self.prefix.as_bytes();
        ttl.keys = ttl
            .keys
            .into_iter()
            .filter(|k| k.starts_with(prefix))
            .map(|k| k.slice(prefix.len()..))
            .collect();
        Ok(ttl)
    }

    async fn watch(&self, mut req: WatchRequest) -> Result<WatchStream> {
        validate::watch(&req)?;
        req.range = self.range_in(req.range);
        let stream = self.inner.watch(req).await.map_err(|e| self.error_out(e))?;
        let ns = self.clone();
        Ok(stream.map_items(move |r| {
            r.map(|mut resp| {
                resp.events = std::mem::take(&mut resp.events)
                    .into_iter()
                    .map(|e| Event {
                        kind: e.kind,
                        kv: ns.kv_out(e.kv),
                        prev_kv: e.prev_kv.map(|kv| ns.kv_out(kv)),
                    })
                    .collect();
                resp
            })
            .map_err(|e| ns.error_out(e))
        }))
    }

    async fn campaign(&self, name: &str, value: Bytes, lease: LeaseId) -> Result<LeaderKey> {
        // Judged on the caller's name, so a bad one is refused in the caller's words.
        validate::election_name(name)?;
        let leader = self
            .inner
            .campaign(&self.name_in(name), value, lease)
            .await
            .map_err(|e| self.error_out(e))?;
        Ok(self.leader_out(leader))
    }

    async fn proclaim(&self, leader: &LeaderKey, value: Bytes) -> Result<()> {
        self.inner
            .proclaim(&self.leader_in(leader), value)
            .await
            .map_err(|e| self.error_out(e))
    }

    async fn leader(&self, name: &str) -> Result<KeyValue> {
        validate::election_name(name)?;
        let kv = self.inner.leader(&self.name_in(name)).await;
        kv.map(|kv| self.kv_out(kv)).map_err(|e| self.error_out(e))
    }

    async fn observe(&self, name: &str) -> Result<LeaderStream> {
        validate::election_name(name)?;
        let stream = self
            .inner
            .observe(&self.name_in(name))
            .await
            .map_err(|e| self.error_out(e))?;
        let ns = self.clone();
        Ok(stream
            .map(move |r| r.map(|kv| ns.kv_out(kv)).map_err(|e| ns.error_out(e)))
            .boxed())
    }

    async fn resign(&self, leader: &LeaderKey) -> Result<()> {
        self.inner
            .resign(&self.leader_in(leader))
            .await
            .map_err(|e| self.error_out(e))
    }
}
