//! The conformance suite on real etcd through `EtcdStore`: the same cases, with the same
//! assertions, as on `SimStore`. Each case gets its own etcd process (started on free loopback
//! ports and killed when the case ends, pass or fail), so exclusive cases (exact revision
//! arithmetic, compaction) hold, and shared ones trivially do.

use std::sync::Arc;

use coord_api::testkit::{Case, Ctx, Harness};
use coord_etcd::testing::EtcdCluster;

struct EtcdHarness {
    /// Run each case through a namespace of the store.
    namespace: Option<&'static str>,
}

impl Harness for EtcdHarness {
    fn run(&self, case: &Case) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        rt.block_on(async {
            let cluster = EtcdCluster::single()
                .await
                .unwrap_or_else(|e| panic!("cannot start etcd for {}: {e}", case.name));
            let store = cluster.store().await;
            let mut cx = Ctx::new(Arc::new(store), format!("conformance/{}/", case.name));
            if let Some(ns) = self.namespace {
                cx = cx.in_namespace(ns).await;
            }
            (case.run)(cx).await;
        });
    }
}

coord_api::conformance_tests!(EtcdHarness { namespace: None });

/// Every case again, through a namespace (`Namespaced`).
mod namespaced {
    use super::*;

    coord_api::conformance_tests!(EtcdHarness {
        namespace: Some("tenant/")
    });
}
