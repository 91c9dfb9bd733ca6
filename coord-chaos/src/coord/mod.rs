//! coord's own service: the crate's self-test, and the chaos binary's workload.
//!
//! It is built on the framework the way a user's service is (the public [`Service`] API, the
//! public checkers), and adds the invariants of coord's recipes. Nothing outside this module
//! names anything in it but the crate root, which re-exports [`CoordService`] and the two
//! conveniences below.
//!
//! [`Service`]: crate::Service

mod host_key_writes;
mod locker;
mod node;

use std::sync::Arc;

use crate::fault::Fault;
use crate::history::History;
use crate::scenario::Scenario;

pub use node::CoordService;

/// Runs coord's own service ([`CoordService`]) in-process; see
/// [`simulate_service`](crate::simulate_service).
///
/// # Panics
/// Inside an async context (it blocks on its own runtime).
pub fn simulate(scenario: &Scenario, seed: u64, faults: &[Fault]) -> History {
    crate::simulate_service(Arc::new(CoordService), scenario, seed, faults)
}

/// Runs coord's own service over turmoil; see
/// [`simulate_service_turmoil`](crate::simulate_service_turmoil).
///
/// # Panics
/// When turmoil fails (a host returned an error).
#[cfg(feature = "turmoil")]
#[cfg_attr(docsrs, doc(cfg(feature = "turmoil")))]
pub fn simulate_turmoil(scenario: &Scenario, seed: u64, faults: &[Fault]) -> History {
    crate::simulate_service_turmoil(Arc::new(CoordService), scenario, seed, faults)
}
