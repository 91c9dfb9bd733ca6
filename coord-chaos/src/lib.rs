//! `coord-chaos`: chaos testing for services that coordinate through coord, yours included.
//!
//! A run starts a simulated etcd and `hosts` nodes, each running a [`Service`] on its own
//! connection to the store, and hits them with a schedule of faults drawn from a seed:
//! partitions both ways and one way, held messages, slow requests and slow replies, lost
//! replies, closed streams, etcd leader changes, store crashes, compaction storms, operators
//! deleting keys and revoking leases, node crashes, GC pauses, rolling restarts, and stops of
//! a node's parts at random moments. Then a quiet phase lets everything heal. Everything that
//! happens lands in one [`History`] on the simulated clock: every change the store made, with
//! who made it; every belief and output the nodes recorded; every fault. The history is held
//! to invariants ([`check`]): the generic ones of elections, leases and consumers, and the
//! service's own. A violation names the invariant, the time, the incarnations and what
//! happened, and the seed replays it exactly.
//!
//! Runs are in-process ([`simulate_service`]: the simulator as a library, thousands of
//! simulated hours an hour) or, with the `turmoil` feature, over turmoil
//! (`simulate_service_turmoil`: every node a turmoil host on the production `EtcdStore`,
//! etcd-client, tonic and h2 over simulated TCP).
//!
//! # Your service
//!
//! Implement [`Service`]: how a node runs, given its [`Node`] (its store handle, its
//! identity, the history to record on), and the invariants the service promises. Record
//! leaderships with [`Node::leader_start`] and [`Node::leader_end`] and the generic election
//! invariants apply (one believer at a time, growing tokens, failover, a leader after the
//! heal, no delete of a node's own landing on a key it still believes it leads on); declare the resource its leader writes with a [`FencedWrites`] and no deposed
//! leader's write may land; add your own [`Invariant`]s over the store's commits and your
//! nodes' [notes](Node::note). Name your coordination keys' prefixes in
//! [`Service::operator_prefixes`], so that an operator's revoke and delete faults reach them
//! (the run's summary counts only the faults that acted). The crate's `job_scheduler` example is a complete one, with a
//! planted bug the checkers catch.
//!
//! A node's duties, beside its work:
//!
//! * **Timings from the scenario.** Build sessions, registrations and candidates from
//!   [`Scenario::session_config`], [`Scenario::registration_config`] and
//!   [`Scenario::candidate_config`]: the checkers draw their bounds from the scenario, so a
//!   service on other timings is held to bounds that are not its own.
//! * **Say when it is up**: [`Node::ready`], once it serves. A rolling restart stops the old
//!   incarnation then (after 2 TTL without it).
//! * **Stop a part when asked**: take [`Node::take_part_stops`], and for each
//!   [`PartStopRequest`] stop one part gracefully and start it again after its length. A
//!   service that never takes them gets no `stop` faults.
//! * **Go down whole in a crash.** A crash drops the incarnation's future; a task it spawned
//!   with a bare `tokio::spawn` would run on beside the next incarnation. Keep helper tasks
//!   in a [`tokio::task::JoinSet`] (aborted when dropped). coord's own handles need nothing:
//!   what they run in the background ends once they and the store client are dropped.
//!
//! An invariant of your own reads the run through [`Run`]: the store's [commits](Run::commits)
//! and who made them, [the keys under a prefix at an instant](Run::keys_at), your nodes'
//! [notes](Run::notes) and leaderships, and the faults.
//!
//! ```
//! use std::sync::Arc;
//! use coord_api::recipes::{Election, Session};
//! use coord_chaos::{Node, Runner, Scenario, Service};
//! use futures::future::BoxFuture;
//!
//! /// Each node campaigns for "leader" and holds it until it loses it.
//! struct Leader;
//!
//! impl Service for Leader {
//!     fn name(&self) -> &str { "leader" }
//!
//!     // An operator may revoke a candidate's lease or delete its key.
//!     fn operator_prefixes(&self) -> Vec<String> { vec!["leader/".into()] }
//!
//!     fn run(&self, node: Node) -> BoxFuture<'static, ()> {
//!         Box::pin(async move {
//!             node.ready();
//!             while !node.is_stopping() {
//!                 let Ok(session) = Session::new(node.store().clone(), node.scenario().session_config()).await
//!                 else { continue };
//!                 if let Ok(lead) = Election::new(&session, "leader").campaign(node.who().to_string()).await {
//!                     node.leader_start("leader", lead.token());
//!                     tokio::select! {
//!                         _ = lead.lost() => node.leader_end("leader", lead.token(), false),
//!                         _ = node.stopping() => {
//!                             node.leader_end("leader", lead.token(), true);
//!                             let _ = lead.resign().await;
//!                         }
//!                     }
//!                 }
//!             }
//!         })
//!     }
//! }
//!
//! let mut scenario = Scenario::default();
//! scenario.duration = std::time::Duration::from_secs(40);
//! let runner = Runner::new(Leader).scenario(scenario);
//! runner.run(runner.seeds_from_env(0..2)).assert_clean();
//! ```
//!
//! A failing seed is replayed by running the same test with `CHAOS_SEED=<seed>`, which also
//! prints the run's timeline (with `CHAOS_STORE=1`, the store's journal in it:
//! [`timeline_with_store`]); [`timeline_svg`] draws it.
//!
//! # Determinism
//!
//! The same seed gives the same history, byte for byte: all time is tokio's virtual time,
//! every random choice comes from the seed, the simulator and the recipes wake their waiters
//! in a fixed order, and schedule exploration ([`Scenario::explore`]) draws its yields from the
//! seed. In-process runs need no build flags for this. Over turmoil, tonic's server makes
//! tokio's unbiased selects, which only a `--cfg tokio_unstable` build seeds.
//!
//! # The chaos binary
//!
//! `cargo run -p coord-chaos-cli` (the `chaos` binary, in `coord-chaos/cli`) runs coord's own service ([`CoordService`]) over
//! 500 seeds; `--help` lists the knobs.

#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]

mod check;
mod coord;
mod driver;
mod fault;
mod fenced_act;
mod first_writer;
mod history;
mod inprocess;
mod keys;
mod recorder;
mod rng;
mod runner;
mod scenario;
mod service;
mod svg;
mod timeline;
#[cfg(feature = "turmoil")]
mod turmoil_world;
mod watcher_record;

pub use check::{
    check, generic, Believed, Commit, FencedWrites, Invariant, Permits, Run, Violation,
};
#[cfg(feature = "turmoil")]
#[cfg_attr(docsrs, doc(cfg(feature = "turmoil")))]
pub use coord::simulate_turmoil;
pub use coord::{simulate, CoordService};
pub use fault::{schedule, Fault, FaultKind};
pub use history::{Emitted, Happening, History, Incarnation, Outcome, Part, Record};
pub use inprocess::simulate_service;
pub use keys::{election_name, host_key, work_key, HOSTS};
pub use recorder::Recorder;
pub use rng::Rng;
pub use runner::{Report, Runner, SeedOutcome};
pub use scenario::{EtcdRelease, Scenario};
pub use service::{Node, PartStopRequest, Service, WorkGuard};
pub use svg::timeline_svg;
pub use timeline::{timeline, timeline_with_store};
#[cfg(feature = "turmoil")]
#[cfg_attr(docsrs, doc(cfg(feature = "turmoil")))]
pub use turmoil_world::{simulate_service_turmoil, turmoil_fault_kinds, turmoil_supports};
pub use watcher_record::record_watcher;

/// The crate's README, whose examples are compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// The repository's README, whose example is compiled as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct RepositoryReadmeDoctests;
