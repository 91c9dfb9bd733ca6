//! A job scheduler under chaos: how to test your own service with coord-chaos.
//!
//! Every node runs a `Candidate` for the election `scheduler`. In each term it wins, its work
//! goes through jobs 0, 1, 2... in order, writing each job's result to `results/job-<n>` (as
//! `<token>:<n>`) only if that job has no result yet, through the term's fence, so that a leader that was
//! paused or cut off and deposed meanwhile cannot write. It promises three things, checked
//! over every run's history besides coord's generic invariants:
//!
//! * no result is written by a deposed leader ([`FencedWrites`]);
//! * each job is written once (its key created once, never overwritten or deleted);
//! * a leader exists within a bound after each fault, when nothing else is going on.
//!
//! The planted bug (`--unfenced`) writes without the fence, checking only that the job has
//! no result: a leader held in the middle of a write past its lease then writes in its
//! successor's turn, and the first promise breaks (caught in 357 of 500 seeds).
//!
//! ```text
//! cargo run -p coord-chaos --example job_scheduler              # 200 seeds, the report
//! cargo run -p coord-chaos --example job_scheduler -- --unfenced   # the bug, caught
//! CHAOS_SEED=17 cargo run -p coord-chaos --example job_scheduler   # one seed's timeline
//! ```

use std::time::Duration;

use coord_api::recipes::{Candidate, ElectionPool, Term};
use coord_api::{
    Compare, CompareOp, Error, EventKind, GetRequest, KvLeaseStore, PutRequest, Revision,
    TxnRequest,
};
use coord_chaos::{FencedWrites, Invariant, Node, Run, Runner, Scenario, Service, Violation};
use futures::future::BoxFuture;

/// The election the scheduler's nodes campaign in.
pub(crate) const ELECTION: &str = "scheduler";
/// Where results go.
pub(crate) const RESULTS: &str = "results/";

/// The scheduler; `fenced: false` is the planted bug.
#[derive(Debug, Clone, Copy)]
pub(crate) struct JobScheduler {
    /// Write results through the leadership's fence (the correct service).
    pub(crate) fenced: bool,
}

impl Service for JobScheduler {
    fn name(&self) -> &str {
        "job scheduler"
    }

    fn run(&self, node: Node) -> BoxFuture<'static, ()> {
        Box::pin(run(node, self.fenced))
    }

    fn operator_prefixes(&self) -> Vec<String> {
        // The candidates' keys: an operator may revoke a leader's lease or delete its key.
        vec![format!("{ELECTION}/")]
    }

    fn invariants(&self, scenario: &Scenario) -> Vec<Box<dyn Invariant>> {
        vec![
            Box::new(FencedWrites::new(ELECTION, RESULTS, |value| {
                let token = std::str::from_utf8(value).ok()?.split(':').next()?;
                token.parse().ok().map(Revision)
            })),
            Box::new(EachJobOnce),
            Box::new(LeaderAfterEachFault {
                bound: scenario.ttl * 2 + scenario.election_timeout + Duration::from_secs(1),
            }),
        ]
    }
}

fn result_key(job: u64) -> String {
    format!("{RESULTS}job-{job:06}")
}

/// One incarnation: a candidate whose work, in each term, works through the jobs.
async fn run(node: Node, fenced: bool) {
    // The scenario's timings, so that the checkers' bounds are this service's own.
    let pool = ElectionPool::new(node.store().clone(), node.scenario().session_config());
    // The `stop` fault: the node's one part is its candidate, stopped (its term handed over)
    // and started again after a while, as a service restarting a component would.
    let mut part_stops = node.take_part_stops().expect("taken once, here");
    // Up: a rolling restart stops the incarnation this one replaces.
    node.ready();
    loop {
        let candidate = spawn_candidate(&node, &pool, fenced);
        let rest = tokio::select! {
            _ = node.stopping() => None,
            Some(stop) = part_stops.recv() => Some(stop.length),
        };
        // The term's work ends and the leadership is handed over.
        let _ = candidate.stop().await;
        let Some(rest) = rest else { break };
        tokio::select! {
            _ = node.stopping() => break,
            _ = tokio::time::sleep(rest) => {}
        }
    }
    // The lease revoked.
    let _ = pool.stop().await;
}

fn spawn_candidate(node: &Node, pool: &ElectionPool, fenced: bool) -> Candidate {
    let observer = node.clone();
    Candidate::spawn(
        pool,
        node.scenario()
            .candidate_config(ELECTION, node.who().to_string()),
        move |term: Term| {
            let node = observer.clone();
            async move {
                node.leader_start(ELECTION, term.token());
                let _work = node.work_started(ELECTION, term.token());
                tokio::select! {
                    _ = term.over() => {}
                    _ = jobs(&node, &term, fenced) => {}
                }
                node.leader_end(ELECTION, term.token(), term.loss().is_none());
            }
        },
    )
}

/// The first job without a result.
async fn first_unfinished(node: &Node) -> Option<u64> {
    let done = node.store().get(GetRequest::prefix(RESULTS)).await.ok()?;
    Some(done.count)
}

/// Works through the jobs; the candidate drops it the moment the term is over, whatever it is
/// doing (a write it abandons may still land: the fence judges it).
async fn jobs(node: &Node, term: &Term, fenced: bool) {
    let Some(mut next) = first_unfinished(node).await else {
        return;
    };
    let every = node.scenario().ttl / 6;
    loop {
        tokio::time::sleep(every).await;
        // A pause here (a GC pause, say) is where a leader goes stale between deciding and
        // writing: only the fence keeps its write out.
        node.unpaused().await;
        let key = result_key(next);
        let txn = TxnRequest::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([PutRequest::new(key, format!("{}:{next}", term.token()))]);
        let written = if fenced {
            term.txn(txn).await
        } else {
            node.store().txn(txn).await
        };
        match written {
            // Written now, or already (by a previous leader): either way, on to the next.
            Ok(_) => next += 1,
            Err(Error::FencedOut { .. }) => return,
            // Unknown or unreachable: try the same job again (the compare keeps it once).
            Err(_) => {}
        }
    }
}

/// Each job's result is written once: its key is created once, never overwritten or deleted.
#[derive(Debug)]
pub(crate) struct EachJobOnce;

impl Invariant for EachJobOnce {
    fn name(&self) -> &str {
        "each-job-once"
    }

    fn check(&self, run: &Run<'_>, out: &mut Vec<Violation>) {
        for c in run.commits() {
            for e in c
                .events
                .iter()
                .filter(|e| e.kv.key.starts_with(RESULTS.as_bytes()))
            {
                let again = e.kind == EventKind::Delete || e.kv.version > 1;
                if again {
                    let who: Vec<_> = run.author(c.origin).into_iter().collect();
                    out.push(run.violation(
                        self.name(),
                        c.at,
                        &who,
                        format!(
                            "{} {} at revision {} (a job's result is written once)",
                            e.kv.key_str(),
                            if e.kind == EventKind::Delete {
                                "deleted"
                            } else {
                                "overwritten"
                            },
                            c.revision
                        ),
                    ));
                }
            }
        }
    }
}

/// After each fault, when nothing else goes on for `bound`, some node leads by then.
#[derive(Debug)]
pub(crate) struct LeaderAfterEachFault {
    /// How long the scheduler may go without a leader after a fault.
    pub(crate) bound: Duration,
}

impl Invariant for LeaderAfterEachFault {
    fn name(&self) -> &str {
        "leader-after-each-fault"
    }

    fn check(&self, run: &Run<'_>, out: &mut Vec<Violation>) {
        let faults = run.faults();
        let leaders = run.leaderships(ELECTION);
        for (fault, _, ended) in &faults {
            let by = *ended + self.bound;
            let quiet = faults
                .iter()
                .all(|(_, from, until)| *until <= *ended || *from > by);
            if !quiet || by >= run.end() {
                continue;
            }
            if !leaders.iter().any(|l| l.from <= by && l.until > by) {
                out.push(run.violation(
                    self.name(),
                    by,
                    &[],
                    format!("no leader {:?} after the fault `{fault}` ended", self.bound),
                ));
            }
        }
    }
}

fn main() {
    let fenced = !std::env::args().any(|a| a == "--unfenced");
    let runner = Runner::new(JobScheduler { fenced })
        .progress(true)
        .replay_with(move |seed| {
            format!(
                "CHAOS_SEED={seed} cargo run -p coord-chaos --example job_scheduler{}",
                if fenced { "" } else { " -- --unfenced" }
            )
        });
    let seeds = runner.seeds_from_env(0..200);
    let report = runner.run(seeds);
    print!("{}", report.summary());
    if report.failed().next().is_some() {
        std::process::exit(1);
    }
}
