//! The simulator's recipe fixture: `SimStore` in virtual time, shared by `recipes_sim` and
//! the planted-bug suites.

use std::sync::Arc;
use std::time::Duration;

use coord_api::testkit::recipes::{Case, Client, Control, Fixture};
use coord_api::DynKvLeaseStore;
use coord_sim::SimStore;

pub(crate) struct SimFixture {
    sim: SimStore,
}

impl SimFixture {
    /// A fixture on a fresh store.
    pub(crate) fn new() -> Self {
        SimFixture {
            sim: SimStore::new(),
        }
    }
}

struct SimControl(SimStore);

#[coord_api::async_trait]
impl Control for SimControl {
    async fn close_streams(&self) {
        self.0.close_streams();
    }

    fn cut_off(&self, on: bool) {
        if on {
            self.0.partition();
        } else {
            self.0.repair();
        }
    }

    fn delay_requests(&self, by: Duration) {
        self.0.set_latency(by);
    }

    fn hold_in_flight(&self, on: bool) {
        if on {
            self.0.hold_sent();
        } else {
            let _ = self.0.release_sent();
        }
    }
}

#[coord_api::async_trait]
impl Fixture for SimFixture {
    fn store(&self) -> Arc<DynKvLeaseStore> {
        Arc::new(self.sim.clone())
    }

    async fn client(&self) -> Client {
        let c = self.sim.connect();
        Client::new(Arc::new(c.clone()), SimControl(c))
    }

    fn ttl(&self) -> Duration {
        Duration::from_secs(10)
    }

    fn slack(&self) -> Duration {
        Duration::ZERO
    }

    fn request_timeout(&self) -> Duration {
        self.sim.config().request_timeout
    }

    async fn slow_store(&self) -> Arc<DynKvLeaseStore> {
        // A client of the same store (so the rest of the world sees what it writes) whose
        // every call takes 5 ms.
        let c = self.sim.connect();
        c.set_latency(Duration::from_millis(5));
        Arc::new(c)
    }

    fn stop_offsets(&self) -> Vec<u64> {
        (0..130).step_by(3).collect()
    }
}

/// Runs `case` on a fresh store in virtual time.
pub(crate) fn run(case: Case) {
    in_virtual_time(async { case(&SimFixture::new()).await });
}

/// Runs `work` to its end on a runtime whose clock is paused (it jumps to the next timer).
pub(crate) fn in_virtual_time<F: std::future::Future>(work: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime")
        .block_on(work)
}
