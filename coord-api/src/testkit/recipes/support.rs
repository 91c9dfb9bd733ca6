//! What the recipe cases share.

use std::sync::Arc;
use std::time::Duration;

use crate::recipes::{RegistrationConfig, Session, SessionConfig};
use crate::{DynKvLeaseStore, KvLeaseStoreExt};

use super::fixture::Fixture;

/// How long something prompt may take: a round trip and a watch delivery, plus the
/// backend's slack.
pub(super) fn prompt(fx: &dyn Fixture) -> Duration {
    Duration::from_secs(1) + fx.slack()
}

pub(super) fn reg(fx: &dyn Fixture, key: &str, md: &str) -> RegistrationConfig {
    RegistrationConfig::new(key, md.to_owned()).with_ttl(fx.ttl())
}

pub(super) async fn present(store: &Arc<DynKvLeaseStore>, key: &str) -> bool {
    store.get_key(key).await.unwrap().is_some()
}

pub(super) async fn session(fx: &dyn Fixture, store: &Arc<DynKvLeaseStore>) -> Session {
    Session::new(store.clone(), SessionConfig::default().with_ttl(fx.ttl()))
        .await
        .unwrap()
}

/// A store that counts the transactions sent through it (the reads a recipe's waiter makes
/// when it wakes), and passes everything on.
#[derive(Debug, Clone)]
pub(super) struct CountingTxns {
    inner: Arc<DynKvLeaseStore>,
    txns: Arc<std::sync::atomic::AtomicU64>,
}

impl CountingTxns {
    pub(super) fn new(inner: Arc<DynKvLeaseStore>) -> Self {
        CountingTxns {
            inner,
            txns: Arc::default(),
        }
    }

    pub(super) fn txns(&self) -> u64 {
        self.txns.load(std::sync::atomic::Ordering::SeqCst)
    }
}

// Every method, so that nothing bypasses the count through a default.
#[deny(clippy::missing_trait_methods)]
#[crate::async_trait]
impl crate::KvLeaseStore for CountingTxns {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    fn limits(&self) -> crate::Limits {
        self.inner.limits()
    }
    fn shared(&self) -> Arc<DynKvLeaseStore> {
        Arc::new(self.clone())
    }
    async fn get(&self, req: crate::GetRequest) -> crate::Result<crate::GetResponse> {
        self.inner.get(req).await
    }
    async fn put(&self, req: crate::PutRequest) -> crate::Result<crate::PutResponse> {
        self.inner.put(req).await
    }
    async fn delete(&self, req: crate::DeleteRequest) -> crate::Result<crate::DeleteResponse> {
        self.inner.delete(req).await
    }
    async fn txn(&self, req: crate::TxnRequest) -> crate::Result<crate::TxnResponse> {
        self.txns.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.txn(req).await
    }
    async fn grant(&self, ttl: Duration) -> crate::Result<crate::LeaseGrant> {
        self.inner.grant(ttl).await
    }
    async fn revoke(&self, lease: crate::LeaseId) -> crate::Result<crate::Revision> {
        self.inner.revoke(lease).await
    }
    async fn time_to_live(&self, lease: crate::LeaseId) -> crate::Result<crate::LeaseTimeToLive> {
        self.inner.time_to_live(lease).await
    }
    async fn keep_alive(&self, lease: crate::LeaseId) -> crate::Result<Box<dyn crate::KeepAlive>> {
        self.inner.keep_alive(lease).await
    }
    async fn watch(&self, req: crate::WatchRequest) -> crate::Result<crate::WatchStream> {
        self.inner.watch(req).await
    }
    async fn compact(&self, revision: crate::Revision) -> crate::Result<()> {
        self.inner.compact(revision).await
    }
    async fn campaign(
        &self,
        name: &str,
        value: bytes::Bytes,
        lease: crate::LeaseId,
    ) -> crate::Result<crate::LeaderKey> {
        self.inner.campaign(name, value, lease).await
    }
    async fn proclaim(&self, leader: &crate::LeaderKey, value: bytes::Bytes) -> crate::Result<()> {
        self.inner.proclaim(leader, value).await
    }
    async fn leader(&self, name: &str) -> crate::Result<crate::KeyValue> {
        self.inner.leader(name).await
    }
    async fn observe(&self, name: &str) -> crate::Result<crate::LeaderStream> {
        self.inner.observe(name).await
    }
    async fn resign(&self, leader: &crate::LeaderKey) -> crate::Result<()> {
        self.inner.resign(leader).await
    }
}
