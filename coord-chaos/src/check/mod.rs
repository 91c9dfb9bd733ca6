//! The checkers: pure functions over a run's history, one per invariant of RELIABILITY.md.
//! Safety (S*) over the whole run; liveness (L*) after the heal instant or after each fault.

mod beliefs;
mod liveness;
mod safety;

use std::fmt;
use std::time::Duration;

use crate::history::History;
use crate::scenario::Scenario;
use crate::truth::Truth;
use beliefs::Beliefs;

/// A broken invariant: which, when, who, and the events that show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The invariant's id in RELIABILITY.md (`S1`...`S7`, `L1`...`L7`).
    pub invariant: &'static str,
    /// When it was broken (simulated time from the start of the run).
    pub at: Duration,
    /// The incarnations involved (`n<node>.<incarnation>`).
    pub nodes: Vec<String>,
    /// What happened.
    pub detail: String,
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
        )
    }
}

/// Everything a checker reads.
pub(crate) struct Ctx<'a> {
    pub scenario: &'a Scenario,
    pub history: &'a History,
    pub truth: Truth,
    pub beliefs: Beliefs,
    /// The end of the run.
    pub end: Duration,
}

impl Ctx<'_> {
    /// Slack for one message: the base latency each way plus the largest injected latency.
    pub(crate) fn rtt(&self) -> Duration {
        self.scenario.rtt() + Duration::from_millis(800)
    }
}

/// The names of the invariants [`check`] evaluates, for reports.
pub const INVARIANTS: [&str; 14] = [
    "S1", "S2", "S3", "S4", "S5", "S6", "S7", "L1", "L2", "L3", "L4", "L5", "L6", "L7",
];

/// Checks every invariant over `history`; empty when all hold.
pub fn check(scenario: &Scenario, history: &History) -> Vec<Violation> {
    let truth = Truth::build(history, scenario.elections);
    let end = history.end(scenario.duration);
    let beliefs = Beliefs::build(history, end);
    let ctx = Ctx {
        scenario,
        history,
        truth,
        beliefs,
        end,
    };
    let mut out = Vec::new();
    safety::check(&ctx, &mut out);
    liveness::check(&ctx, &mut out);
    out.sort_by_key(|v| v.at);
    out
}
