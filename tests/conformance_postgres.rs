//! The conformance suite on real PostgreSQL through `PostgresStore`: the same cases, with the
//! same assertions, as on `SimStore` and etcd. Each case gets its own PostgreSQL server
//! (started on a free loopback port from a copy of one initialised data directory, and killed
//! when the case ends, pass or fail), so exclusive cases (exact revision arithmetic,
//! compaction) hold.

use std::sync::Arc;

use coord_api::testkit::{Case, Ctx, Harness};
use coord_postgres::testing::PostgresServer;

struct PostgresHarness {
    /// Run each case through a namespace of the store.
    namespace: Option<&'static str>,
}

impl Harness for PostgresHarness {
    fn run(&self, case: &Case) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        rt.block_on(async {
            let server = PostgresServer::start()
                .await
                .unwrap_or_else(|e| panic!("cannot start PostgreSQL for {}: {e}", case.name));
            let store = server.store().await;
            let mut cx = Ctx::new(Arc::new(store), format!("conformance/{}/", case.name));
            if let Some(ns) = self.namespace {
                cx = cx.in_namespace(ns).await;
            }
            (case.run)(cx).await;
        });
    }
}

coord_api::conformance_tests!(PostgresHarness { namespace: None });

/// Every case again, through a namespace (`Namespaced`).
mod namespaced {
    use super::*;

    coord_api::conformance_tests!(PostgresHarness {
        namespace: Some("tenant/")
    });
}
