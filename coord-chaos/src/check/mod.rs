//! The checkers: invariants over a run's history, each a pure function of it.
//!
//! Every run is held to the generic invariants ([`generic`]): those of any service that elects
//! leaders (tokens grow, beliefs exclusive, no phantom leadership, a leader exists after a
//! fault, failover in time), of leases (a crashed node's leases end in time), and of
//! consumers (what a recipe reports agrees with its state). A service adds its own
//! ([`Service::invariants`](crate::Service::invariants)): coord's nodes add those of
//! registrations and watchers; yours add what your service promises, often a
//! [`FencedWrites`] for the resource its leader writes.

mod beliefs;
mod consumers;
mod elections;
mod leases;
mod permits;
mod registrations;
mod stops;
mod truth;
mod watchers;
mod work;

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use coord_api::{EventKind, KeyValue, Revision};
use coord_sim::journal::Origin;

pub(crate) use beliefs::{Beliefs, FaultSpan, PartStop};
pub use elections::FencedWrites;
pub(crate) use permits::PermitHeld;
pub use permits::Permits;
pub use truth::Commit;
pub(crate) use truth::Truth;

use crate::history::{History, Incarnation};
use crate::scenario::Scenario;

/// Reads a fenced write's token from its value (the fenced checkers' one shape for it).
pub(crate) type TokenReader = std::sync::Arc<dyn Fn(&[u8]) -> Option<Revision> + Send + Sync>;

/// A broken invariant: which, when, who, and the events that show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The invariant's id (`S1`...`S9`, `L1`...`L7` of coord's own; your invariant's name).
    pub invariant: String,
    /// When it was broken (simulated time from the start of the run).
    pub at: Duration,
    /// The incarnations involved (`n<node>.<incarnation>`).
    pub nodes: Vec<String>,
    /// What happened.
    pub detail: String,
    /// The faults in force when it was broken, or over less than a TTL before (what they
    /// did may last that long), each as the schedule shows it (`12.345s partition n2 for
    /// 3.000s`).
    pub faults: Vec<String>,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} at {:.3}s [{}]: {}",
            self.invariant,
            self.at.as_secs_f64(),
            self.nodes.join(", "),
            self.detail
        )?;
        if self.faults.is_empty() {
            f.write_str(" (no fault in force)")
        } else {
            write!(f, " (faults in force: {})", self.faults.join("; "))
        }
    }
}

/// An invariant a run must hold.
///
/// ```
/// use coord_chaos::{Invariant, Run, Violation};
///
/// /// Nobody ever writes `forbidden/`.
/// struct NothingForbidden;
///
/// impl Invariant for NothingForbidden {
///     fn name(&self) -> &str {
///         "nothing-forbidden"
///     }
///
///     fn check(&self, run: &Run<'_>, out: &mut Vec<Violation>) {
///         for c in run.commits() {
///             if c.events.iter().any(|e| e.kv.key.starts_with(b"forbidden/")) {
///                 let who: Vec<_> = run.author(c.origin).into_iter().collect();
///                 out.push(run.violation(self.name(), c.at, &who, format!("wrote at {}", c.revision)));
///             }
///         }
///     }
/// }
/// ```
pub trait Invariant: Send + Sync {
    /// Its name, as reports print it.
    fn name(&self) -> &str;

    /// Adds a violation to `out` for each way `run` breaks it.
    fn check(&self, run: &Run<'_>, out: &mut Vec<Violation>);
}

/// What an invariant reads: the scenario, the history, and what was rebuilt from it.
pub struct Run<'a> {
    pub(crate) scenario: &'a Scenario,
    pub(crate) history: &'a History,
    pub(crate) truth: Truth,
    pub(crate) beliefs: Beliefs,
    /// The end of the run.
    pub(crate) end: Duration,
}

impl fmt::Debug for Run<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Run")
            .field("records", &self.history.records.len())
            .field("end", &self.end)
            .finish()
    }
}

impl<'a> Run<'a> {
    /// Rebuilds the truth and the beliefs of `history`.
    pub fn new(scenario: &'a Scenario, history: &'a History) -> Self {
        let truth = Truth::build(history);
        let end = history.end(scenario.duration);
        let beliefs = Beliefs::build(history, end);
        Run {
            scenario,
            history,
            truth,
            beliefs,
            end,
        }
    }

    /// The scenario run.
    pub fn scenario(&self) -> &Scenario {
        self.scenario
    }

    /// The history.
    pub fn history(&self) -> &History {
        self.history
    }

    /// When the run ended.
    pub fn end(&self) -> Duration {
        self.end
    }

    /// When every fault was over.
    pub fn heal(&self) -> Duration {
        self.beliefs.heal
    }

    /// Every write the store committed, in order.
    pub fn commits(&self) -> &[Commit] {
        &self.truth.commits
    }

    /// The keys under `prefix` as the store had them at `at` (the commits up to and at
    /// `at` applied, lease expiries' deletes among them), by key: what an invariant about
    /// a service's own keys compares its nodes' beliefs with.
    ///
    /// ```
    /// # fn f(run: &coord_chaos::Run<'_>) {
    /// let at = run.heal();
    /// for (key, kv) in run.keys_at("results/", at) {
    ///     println!("{key} = {:?} (lease {})", kv.value, kv.lease);
    /// }
    /// # }
    /// ```
    pub fn keys_at(&self, prefix: &str, at: Duration) -> BTreeMap<String, KeyValue> {
        let mut keys = BTreeMap::new();
        for c in self.commits().iter().take_while(|c| c.at <= at) {
            for e in &c.events {
                if !e.kv.key.starts_with(prefix.as_bytes()) {
                    continue;
                }
                let key = String::from_utf8_lossy(&e.kv.key).into_owned();
                match e.kind {
                    EventKind::Put => {
                        keys.insert(key, e.kv.clone());
                    }
                    EventKind::Delete => {
                        keys.remove(&key);
                    }
                }
            }
        }
        keys
    }

    /// The service's notes of kind `kind` ([`Node::note`](crate::Node::note)), with when
    /// and who, in the order they were made.
    pub fn notes<'r>(
        &'r self,
        kind: &'r str,
    ) -> impl Iterator<Item = (Duration, Incarnation, &'r str)> + 'r {
        self.history.notes(kind)
    }

    /// Which incarnation made a change (none for an operator or the store itself).
    pub fn author(&self, origin: Origin) -> Option<Incarnation> {
        self.truth.author(origin)
    }

    /// The election's leader as the store had it just after `revision`: its oldest key's
    /// create revision (the fencing token), if it had any candidate.
    pub fn leader_at(&self, election: &str, revision: Revision) -> Option<Revision> {
        self.truth.leader_at(election, revision)
    }

    /// Every leadership a node believed in, in `election`: who, its token, from when, until
    /// when (a crash ends it; a belief still held at the end lasts to the end).
    pub fn leaderships(&self, election: &str) -> Vec<Believed> {
        self.beliefs
            .leading
            .iter()
            .filter(|l| l.election == election)
            .map(|l| Believed {
                who: l.who,
                token: l.token,
                from: l.from,
                until: l.until,
            })
            .collect()
    }

    /// Every fault of the run, with when it started and ended (instant faults end when they
    /// start).
    pub fn faults(&self) -> Vec<(crate::fault::Fault, Duration, Duration)> {
        self.beliefs
            .faults
            .iter()
            .map(|f| (f.fault.clone(), f.from, f.until))
            .collect()
    }

    /// The shortest round trip a healthy call takes here: the base latency each way, each
    /// at least the world's time resolution (a turmoil tick).
    pub fn round_trip(&self) -> Duration {
        self.scenario.latency.max(self.history.resolution) * 2
    }

    /// Slack for one message: the base latency each way plus the largest injected latency.
    pub fn rtt(&self) -> Duration {
        self.scenario.rtt() + Duration::from_millis(800)
    }

    /// How long before `at` the store may have answered a reply that reached `node` at
    /// `at` (and so how long before `at` a write of `node` landing then may have been sent):
    /// [`rtt`](Self::rtt), plus the added delay of a slow-replies fault on the node whose
    /// replies may still be arriving then (up to 1.5 s, more than `rtt` allows for), or back
    /// to the start of a hold (or pause) of the node's traffic that ended within that: the
    /// hold delivers what it held when it ends (`--defaults` seed 2019114: a confirming
    /// read's reply, held 4 s, arrived after an operator's revoke of the key it confirmed).
    pub fn reply_window(&self, node: usize, at: Duration) -> Duration {
        use crate::fault::FaultKind;
        let on_node = |f: &&FaultSpan| f.fault.node == node && f.from <= at;
        let slow = self
            .beliefs
            .faults
            .iter()
            .filter(on_node)
            .filter(|f| {
                f.fault.kind == FaultKind::SlowReplies
                    && at <= f.until + f.fault.added_latency() + self.rtt()
            })
            .map(|f| f.fault.added_latency())
            .max()
            .unwrap_or_default();
        let window = self.rtt() + slow;
        self.beliefs
            .faults
            .iter()
            .filter(on_node)
            .filter(|f| {
                matches!(f.fault.kind, FaultKind::Hold | FaultKind::Pause) && at <= f.until + window
            })
            .map(|f| at - f.from + window)
            .fold(window, Duration::max)
    }

    /// A violation of `invariant`.
    pub fn violation(
        &self,
        invariant: &str,
        at: Duration,
        nodes: &[Incarnation],
        detail: String,
    ) -> Violation {
        let recent = self.scenario.ttl;
        let faults = self
            .beliefs
            .faults
            .iter()
            .filter(|f| f.from <= at && at <= f.until + recent)
            .map(|f| f.fault.to_string())
            .collect();
        Violation {
            invariant: invariant.to_owned(),
            at,
            nodes: nodes.iter().map(|n| n.to_string()).collect(),
            detail,
            faults,
        }
    }
}

/// A leadership as a node believed in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Believed {
    /// Who believed it.
    pub who: Incarnation,
    /// The fencing token.
    pub token: Revision,
    /// When the belief began.
    pub from: Duration,
    /// When it ended.
    pub until: Duration,
}

/// A fixed-name invariant made of a function, for the built-in ones.
struct Named {
    name: &'static str,
    check: fn(&Run<'_>, &mut Vec<Violation>),
}

impl Invariant for Named {
    fn name(&self) -> &str {
        self.name
    }

    fn check(&self, run: &Run<'_>, out: &mut Vec<Violation>) {
        (self.check)(run, out)
    }
}

fn named(name: &'static str, check: fn(&Run<'_>, &mut Vec<Violation>)) -> Box<dyn Invariant> {
    Box::new(Named { name, check })
}

/// The invariants every run is held to, whatever the service: of elections (S1 tokens grow,
/// S2 beliefs exclusive, S3 no phantom leadership, S9 no self-deposition, L5 a leader
/// exists, L6 failover, W1 the work of two terms never overlaps), of leases (L3 a crashed
/// node's leases end in time) and of consumers (C1).
pub fn generic() -> Vec<Box<dyn Invariant>> {
    vec![
        named("S1", elections::s1_tokens_grow),
        named("S2", elections::s2_belief_exclusivity),
        named("S3", elections::s3_no_phantom_leadership),
        named("S9", elections::s9_no_self_deposition),
        named("L3", leases::l3_dead_host_expiry),
        named("L5", elections::l5_leader_exists),
        named("L6", elections::l6_failover),
        named("C1", consumers::c1_consistent_state),
        named("W1", work::w1_work_never_overlaps),
    ]
}

/// The invariants of the recipes' own duties, for a service that registers its nodes under
/// [`HOSTS`](crate::HOSTS) with coord's registration, watches them, and stops its parts on
/// request (coord's own service does): registrations (S6, S7, S8, L1, L2, M1), watchers
/// (S4/S5, L4, L8), stops (L7).
pub(crate) fn recipes() -> Vec<Box<dyn Invariant>> {
    vec![
        named("S4/S5", watchers::s4_s5_watchers),
        named("S6", registrations::s6_no_foreign_deletes),
        named("S7", registrations::s7_single_registration),
        named("S8", registrations::s8_registration_belief),
        named("L1", registrations::l1_self_healing),
        named("L2", registrations::l2_ride_through),
        named("L4", watchers::l4_watcher_convergence),
        named("L8", watchers::l8_watcher_recovery),
        named("L7", stops::l7_stops),
        named("M1", registrations::m1_latest_metadata),
    ]
}

/// Checks `history` against `invariants`; empty when all hold.
pub fn check(
    scenario: &Scenario,
    history: &History,
    invariants: &[Box<dyn Invariant>],
) -> Vec<Violation> {
    let run = Run::new(scenario, history);
    let mut out = Vec::new();
    for i in invariants {
        i.check(&run, &mut out);
    }
    out.sort_by_key(|v| v.at);
    out
}

/// The time a revision was committed.
pub(crate) fn time_of(run: &Run<'_>, revision: Revision) -> Duration {
    run.truth
        .revision_at
        .get(&revision)
        .copied()
        .unwrap_or_default()
}

/// A span's intersection with a fault span.
pub(crate) fn overlaps(f: &FaultSpan, from: Duration, until: Duration) -> bool {
    f.from <= until && f.until >= from
}
