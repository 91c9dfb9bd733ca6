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
    reg_on(key, md).with_ttl(fx.ttl())
}

/// A registration on a host session: the session's TTL applies.
pub(super) fn reg_on(key: &str, md: &str) -> RegistrationConfig {
    RegistrationConfig::new(key, md.to_owned())
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

#[crate::async_trait]
impl crate::Forward for CountingTxns {
    fn inner(&self) -> &DynKvLeaseStore {
        &*self.inner
    }
    async fn txn(&self, req: crate::TxnRequest) -> crate::Result<crate::TxnResponse> {
        self.txns.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.txn(req).await
    }
}
