//! Runs many seeds of a scenario with a service, checks every history, and reports: the
//! chaos binary is this, and so is a user's test of their own service.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{IsTerminal, Write as _};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::check::{generic, Invariant, Run, Violation};
use crate::fault::{schedule, Fault, FaultKind};
use crate::history::History;
use crate::rng::Rng;
use crate::scenario::Scenario;
use crate::service::Service;

/// One seed's outcome.
#[derive(Debug, Clone)]
pub struct SeedOutcome {
    /// The seed.
    pub seed: u64,
    /// The faults that acted, by kind (a member fault drawn while another is in force, or a
    /// leader transfer the cluster refused, did nothing and is not counted).
    pub faults: BTreeMap<FaultKind, u64>,
    /// What broke; empty when every invariant held.
    pub violations: Vec<Violation>,
}

/// Many seeds' outcomes.
#[derive(Clone)]
pub struct Report {
    /// The scenario run.
    pub scenario: Scenario,
    /// Each seed's outcome, in seed order.
    pub outcomes: Vec<SeedOutcome>,
    /// How many invariants each run was checked against.
    pub invariants: usize,
    /// How long it took.
    pub wall: Duration,
    /// Threads used.
    pub jobs: usize,
    /// How to replay one seed, given the seed.
    replay: Arc<dyn Fn(u64) -> String + Send + Sync>,
}

impl std::fmt::Debug for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Report")
            .field("outcomes", &self.outcomes.len())
            .field("failed", &self.failed().count())
            .field("wall", &self.wall)
            .finish()
    }
}

impl Report {
    /// The seeds that broke an invariant.
    pub fn failed(&self) -> impl Iterator<Item = &SeedOutcome> {
        self.outcomes.iter().filter(|o| !o.violations.is_empty())
    }

    /// The command that replays `seed`.
    pub fn replay(&self, seed: u64) -> String {
        (self.replay)(seed)
    }

    /// The summary: seeds, simulated time, faults by kind, checks, wall time, speed; then up
    /// to ten failing seeds with their violations and replay commands.
    pub fn summary(&self) -> String {
        let s = &self.scenario;
        let mut faults: BTreeMap<FaultKind, u64> = BTreeMap::new();
        for o in &self.outcomes {
            for (k, n) in &o.faults {
                *faults.entry(*k).or_insert(0) += n;
            }
        }
        let runs = self.outcomes.len();
        let failed: Vec<&SeedOutcome> = self.failed().collect();
        let simulated = s.duration.as_secs_f64() * runs as f64;
        let checks = self.invariants * runs;
        let broken: usize = failed
            .iter()
            .map(|o| {
                let ids: std::collections::BTreeSet<_> =
                    o.violations.iter().map(|v| &v.invariant).collect();
                ids.len()
            })
            .sum();
        let wall = self.wall.as_secs_f64().max(1e-9);
        let mut out = String::new();
        let _ = writeln!(out, "  seeds run          {runs}");
        let _ = writeln!(
            out,
            "  simulated          {:.2} h ({:.0} s per seed)",
            simulated / 3600.0,
            s.duration.as_secs_f64()
        );
        let _ = writeln!(out, "  faults injected    {}", faults.values().sum::<u64>());
        for (k, n) in &faults {
            let _ = writeln!(out, "    {:<16} {n}", k.name());
        }
        let _ = writeln!(
            out,
            "  invariant checks   {} passed of {checks} ({} invariants x {runs} seeds)",
            checks.saturating_sub(broken),
            self.invariants
        );
        let _ = writeln!(
            out,
            "  violations         {} in {} seeds",
            failed.iter().map(|o| o.violations.len()).sum::<usize>(),
            failed.len()
        );
        let _ = writeln!(
            out,
            "  wall time          {wall:.2} s on {} threads",
            self.jobs
        );
        let _ = writeln!(
            out,
            "  speed              {:.0}x simulated/wall ({:.0} seeds per minute)",
            simulated / wall,
            runs as f64 * 60.0 / wall
        );
        if failed.is_empty() {
            let _ = writeln!(out, "\nall invariants held.");
            return out;
        }
        let _ = writeln!(out);
        for o in failed.iter().take(10) {
            let _ = writeln!(out, "seed {}:", o.seed);
            for v in o.violations.iter().take(5) {
                let _ = writeln!(out, "  {v}");
            }
            if o.violations.len() > 5 {
                let _ = writeln!(out, "  ... and {} more", o.violations.len() - 5);
            }
            let _ = writeln!(out, "  replay: {}", self.replay(o.seed));
        }
        if failed.len() > 10 {
            let _ = writeln!(out, "... and {} more failing seeds", failed.len() - 10);
        }
        out
    }

    /// Panics with the summary if any seed broke an invariant.
    #[track_caller]
    pub fn assert_clean(&self) {
        assert!(self.failed().next().is_none(), "\n{}", self.summary());
    }
}

/// The chaos runner: a service, a scenario, invariants; seeds in, a [`Report`] out.
///
/// ```
/// use coord_chaos::{CoordService, Runner, Scenario};
///
/// let mut scenario = Scenario::default();
/// scenario.duration = std::time::Duration::from_secs(40);
/// let report = Runner::new(CoordService).scenario(scenario).run(0..2);
/// report.assert_clean();
/// ```
#[derive(Clone)]
pub struct Runner {
    service: Arc<dyn Service>,
    scenario: Scenario,
    extra: Vec<Arc<dyn Invariant>>,
    jobs: usize,
    turmoil: bool,
    progress: bool,
    replay: Arc<dyn Fn(u64) -> String + Send + Sync>,
}

impl std::fmt::Debug for Runner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runner")
            .field("service", &self.service.name())
            .field("scenario", &self.scenario)
            .field("jobs", &self.jobs)
            .field("turmoil", &self.turmoil)
            .finish()
    }
}

impl Runner {
    /// A runner of `service` on [`Scenario::default`], with the generic invariants and the
    /// service's own, on every core.
    pub fn new(service: impl Service) -> Self {
        Runner {
            service: Arc::new(service),
            scenario: Scenario::default(),
            extra: Vec::new(),
            jobs: std::thread::available_parallelism().map_or(1, |n| n.get()),
            turmoil: false,
            progress: false,
            replay: Arc::new(|seed| format!("CHAOS_SEED={seed} <the same command>")),
        }
    }

    /// Runs this scenario.
    pub fn scenario(mut self, scenario: Scenario) -> Self {
        self.scenario = scenario;
        self
    }

    /// Holds every run to `invariant` too.
    pub fn invariant(mut self, invariant: impl Invariant + 'static) -> Self {
        self.extra.push(Arc::new(invariant));
        self
    }

    /// Runs seeds on this many threads.
    pub fn jobs(mut self, jobs: usize) -> Self {
        self.jobs = jobs.max(1);
        self
    }

    /// Runs each node as a turmoil host on the production `EtcdStore` over simulated TCP,
    /// against the simulator served as a cluster of three etcd members (see
    /// [`members`](Self::members)), so that member faults are drawn too; rolling restarts
    /// are left out.
    #[cfg(feature = "turmoil")]
    pub fn turmoil(mut self, on: bool) -> Self {
        self.turmoil = on;
        if on {
            self.scenario
                .fault_kinds
                .retain(|k| crate::turmoil_world::turmoil_supports(*k));
            self.scenario.members = 3;
        }
        self
    }

    /// Over turmoil, serves the store as `n` etcd members (3 by default); one member draws
    /// no member faults. In-process runs have one store whatever this says.
    pub fn members(mut self, n: usize) -> Self {
        self.scenario.members = n.max(1);
        self
    }

    /// Draws a progress bar on standard error while running.
    pub fn progress(mut self, on: bool) -> Self {
        self.progress = on;
        self
    }

    /// How a report says to replay one seed (by default: `CHAOS_SEED=<seed>` before the same
    /// command, which [`seeds_from_env`](Self::seeds_from_env) honours).
    pub fn replay_with(mut self, command: impl Fn(u64) -> String + Send + Sync + 'static) -> Self {
        self.replay = Arc::new(command);
        self
    }

    /// The scenario this runner runs.
    pub fn scenario_ref(&self) -> &Scenario {
        &self.scenario
    }

    /// Every invariant a run is held to.
    fn invariants(&self) -> Vec<Box<dyn Invariant>> {
        let mut all = generic();
        all.extend(self.service.invariants(&self.scenario));
        all
    }

    /// Runs one seed's schedule.
    pub fn run_seed(&self, seed: u64) -> (SeedOutcome, History) {
        let faults = if self.turmoil || self.scenario.members < 2 {
            schedule(&self.scenario, &mut Rng::new(seed))
        } else {
            // In-process runs have one store: draw no member faults.
            let one = Scenario {
                members: 1,
                ..self.scenario.clone()
            };
            schedule(&one, &mut Rng::new(seed))
        };
        self.run_schedule(seed, &faults)
    }

    /// Runs a given schedule of faults from `seed` (for shrinking with proptest).
    pub fn run_schedule(&self, seed: u64, faults: &[Fault]) -> (SeedOutcome, History) {
        let history = self.simulate(seed, faults);
        let run = Run::new(&self.scenario, &history);
        let mut violations = Vec::new();
        for i in self.invariants() {
            i.check(&run, &mut violations);
        }
        for i in &self.extra {
            i.check(&run, &mut violations);
        }
        violations.sort_by_key(|v| v.at);
        // What acted, as the history has it: a fault drawn that did nothing is not counted.
        let mut counts = BTreeMap::new();
        for (_, f) in history.faults() {
            *counts.entry(f.kind).or_insert(0) += 1;
        }
        (
            SeedOutcome {
                seed,
                faults: counts,
                violations,
            },
            history,
        )
    }

    fn simulate(&self, seed: u64, faults: &[Fault]) -> History {
        #[cfg(feature = "turmoil")]
        if self.turmoil {
            return crate::turmoil_world::simulate_service_turmoil(
                self.service.clone(),
                &self.scenario,
                seed,
                faults,
            );
        }
        crate::inprocess::simulate_service(self.service.clone(), &self.scenario, seed, faults)
    }

    /// Runs every seed of `seeds` on the runner's threads.
    pub fn run(&self, seeds: impl IntoIterator<Item = u64>) -> Report {
        let seeds: Vec<u64> = seeds.into_iter().collect();
        let started = Instant::now();
        let next = AtomicUsize::new(0);
        let done = AtomicUsize::new(0);
        let outcomes = Mutex::new(Vec::new());
        let progress = self.progress && std::io::stderr().is_terminal();
        std::thread::scope(|scope| {
            for _ in 0..self.jobs.min(seeds.len()).max(1) {
                scope.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some(seed) = seeds.get(i).copied() else {
                        return;
                    };
                    let (outcome, _) = self.run_seed(seed);
                    if !outcome.violations.is_empty() && self.progress {
                        eprintln!(
                            "{}seed {seed}: VIOLATION",
                            if progress { "\r\x1b[K" } else { "" }
                        );
                    }
                    outcomes
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(outcome);
                    let n = done.fetch_add(1, Ordering::SeqCst) + 1;
                    if progress {
                        bar(n, seeds.len(), started.elapsed());
                    }
                });
            }
        });
        if progress {
            eprint!("\r\x1b[K");
        }
        let mut outcomes = outcomes.into_inner().unwrap_or_else(|p| p.into_inner());
        outcomes.sort_by_key(|o| o.seed);
        Report {
            scenario: self.scenario.clone(),
            outcomes,
            invariants: self.invariants().len() + self.extra.len(),
            wall: started.elapsed(),
            jobs: self.jobs,
            replay: self.replay.clone(),
        }
    }

    /// The seeds to run: `CHAOS_SEED=S` replays seed S alone (and prints its timeline; with
    /// `CHAOS_STORE=1` too, the store's journal in it), else `CHAOS_SEEDS=N` runs seeds 0..N,
    /// else `default`. A failure in a user's test names the seed; running the test again with
    /// `CHAOS_SEED` set replays exactly that run.
    pub fn seeds_from_env(&self, default: std::ops::Range<u64>) -> Vec<u64> {
        let var = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
        if let Some(seed) = var("CHAOS_SEED") {
            let (outcome, history) = self.run_seed(seed);
            if std::env::var_os("CHAOS_STORE").is_some_and(|v| v == "1") {
                println!("{}", crate::timeline::timeline_with_store(&history));
            } else {
                println!("{}", crate::timeline::timeline(&history));
            }
            for v in &outcome.violations {
                println!("VIOLATION {v}");
            }
            return vec![seed];
        }
        match var("CHAOS_SEEDS") {
            Some(n) => (0..n).collect(),
            None => default.collect(),
        }
    }
}

fn bar(done: usize, total: usize, elapsed: Duration) {
    let width = 40;
    let filled = width * done / total.max(1);
    eprint!(
        "\r[{}{}] {done}/{total} seeds, {:.1} s",
        "#".repeat(filled),
        " ".repeat(width - filled),
        elapsed.as_secs_f64()
    );
    let _ = std::io::stderr().flush();
}
