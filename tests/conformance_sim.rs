//! The conformance suite on `SimStore`, in virtual time: every case on a fresh store, on a
//! current-thread runtime whose clock only moves when every task is waiting on it.

use std::sync::Arc;

use coord_api::testkit::{Case, Ctx, Harness};
use coord_sim::{SimConfig, SimStore};

/// Runs each case on its own store, so every case is exclusive.
struct SimHarness {
    seed: u64,
    /// Run each case through a namespace of the store.
    namespace: Option<&'static str>,
}

impl SimHarness {
    fn new() -> Self {
        // Lease ids are the only thing the seed decides here; honour the project-wide
        // override so a run can be replayed exactly.
        let seed = std::env::var("COORD_SIM_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0x5eed);
        SimHarness {
            seed,
            namespace: None,
        }
    }
}

impl Harness for SimHarness {
    fn run(&self, case: &Case) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("a current-thread runtime");
        let seed = self.seed;
        rt.block_on(async move {
            let store = SimStore::with_config(SimConfig::default().with_seed(seed));
            let mut cx = Ctx::new(Arc::new(store), format!("conformance/{}/", case.name));
            if let Some(ns) = self.namespace {
                cx = cx.in_namespace(ns).await;
            }
            (case.run)(cx).await;
        });
    }
}

coord_api::conformance_tests!(SimHarness::new());

/// Every case again, through a namespace (`Namespaced`).
mod namespaced {
    use super::*;

    coord_api::conformance_tests!(SimHarness {
        namespace: Some("tenant/"),
        ..SimHarness::new()
    });
}
