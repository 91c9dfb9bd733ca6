//! `coord-chaos`: the coord recipes under injected faults in virtual time, checked over their
//! history.
//!
//! A run builds one [`SimStore`](coord_sim::SimStore) and `hosts` nodes, each a client of its own
//! (so faults hit one node's link), each running the real recipes: a [`HostRegistration`],
//! an [`ElectionPool`] campaigning in every election and acting as leader through the fence,
//! and on the first nodes a [`ClusterWatcher`]. A schedule of faults drawn from the seed
//! hits them during the chaos phase; then a quiet phase lets everything heal. Every store
//! change (the journal), belief, output and fault lands in one [`History`], which
//! [`check`] holds to the invariants of RELIABILITY.md.
//!
//! ```
//! use coord_chaos::{check, schedule, simulate, Rng, Scenario};
//!
//! let mut scenario = Scenario::default();
//! scenario.duration = std::time::Duration::from_secs(40);
//! let seed = 7;
//! let faults = schedule(&scenario, &mut Rng::new(seed));
//! let history = simulate(&scenario, seed, &faults);
//! assert_eq!(check(&scenario, &history), vec![]);
//! ```
//!
//! [`HostRegistration`]: coord_api::recipes::HostRegistration
//! [`ElectionPool`]: coord_api::recipes::ElectionPool
//! [`ClusterWatcher`]: coord_api::recipes::ClusterWatcher

mod check;
mod fault;
mod history;
mod node;
mod recorder;
mod rng;
mod run;
mod scenario;
mod svg;
mod truth;
#[cfg(feature = "turmoil")]
mod turmoil_run;

pub use check::{check, Violation, INVARIANTS};
pub use fault::{schedule, Fault, FaultKind};
pub use history::{Emitted, Happening, History, Incarnation, Record};
pub use node::{election_name, host_key, work_key, HOSTS};
pub use rng::Rng;
pub use run::simulate;
pub use scenario::Scenario;
pub use svg::timeline_svg;
#[cfg(feature = "turmoil")]
#[cfg_attr(docsrs, doc(cfg(feature = "turmoil")))]
pub use turmoil_run::{simulate_turmoil, turmoil_fault_kinds};
