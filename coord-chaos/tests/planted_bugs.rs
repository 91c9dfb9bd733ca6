//! Every planted bug is caught by the chaos checkers within a bounded number of seeds.
//!
//! Built only with `--features planted-bugs,turmoil` (coord-api then compiles its planted
//! defects in, all off); this test switches them on one at a time, process-wide, so it is one
//! test. The recipes' bugs are hunted in-process; `EtcdStore`'s failover bug over turmoil,
//! on three members under member faults alone (where a member stalled or slow is not drowned
//! out by other faults).

use coord_api::hooks::planted::{self, Bug};
use coord_chaos::{CoordService, FaultKind, Runner, Scenario};

/// Seeds tried per bug before declaring it missed. The seeds are fixed, so the result is the
/// same on every run: a miss is a checker that lost its teeth, not bad luck.
const SEEDS: u64 = 40;

/// The bugs the chaos runs cannot see in a few seeds, each caught by the suite that holds
/// its promise (coord-tests' `planted_suites`): a failover defect hidden behind the sessions'
/// own failover (every chaos node holds one), a simulator defect only real etcd shows, and a
/// candidate stopped between terms that forgets the key its failed resignation left (the
/// chaos nodes meet that in about one seed in a thousand; the recipe case every time), and
/// a candidate write of unknown outcome left unfenced (over turmoil, a stalled member lands
/// one after its withdrawal in about one seed in a thousand; the recipe case every time).
const ELSEWHERE: [Bug; 7] = [
    Bug::FailoverStaysOnNoLeader,
    Bug::SimPrefixCompareChecksLastKey,
    Bug::CandidateRestForgetsItsKey,
    Bug::UnknownWriteNotFenced,
    // Defects of the PostgreSQL backend, which the chaos runs (on the simulator) never use.
    Bug::PostgresRevisionFromSequence,
    Bug::PostgresWatchFedByNotifications,
    Bug::PostgresRetriesUnknownCommit,
];

/// Where a bug is hunted.
fn runner_for(bug: Bug) -> Runner {
    match bug {
        Bug::AbandonedRenewalStaysOnMember => Runner::new(CoordService)
            .scenario(member_faults())
            .turmoil(true)
            .jobs(1),
        _ => Runner::new(CoordService).jobs(1),
    }
}

/// Member faults alone.
fn member_faults() -> Scenario {
    let mut s = Scenario::default();
    s.fault_kinds = FaultKind::MEMBERS.into_iter().collect();
    s
}

#[test]
fn every_planted_bug_is_caught() {
    let runner = Runner::new(CoordService).jobs(1);
    // With no bug planted, these seeds are clean: a catch below is the bug's doing.
    planted::enable(&[]);
    for seed in 0..5 {
        let (outcome, _) = runner.run_seed(seed);
        assert!(
            outcome.violations.is_empty(),
            "seed {seed} fails without a bug: {:?}",
            outcome.violations
        );
    }
    let mut missed = Vec::new();
    for bug in Bug::ALL.into_iter().filter(|b| !ELSEWHERE.contains(b)) {
        planted::enable(&[bug]);
        let runner = runner_for(bug);
        let caught = (0..SEEDS).find_map(|seed| {
            let (outcome, _) = runner.run_seed(seed);
            outcome.violations.first().map(|v| (seed, v.clone()))
        });
        match caught {
            Some((seed, v)) => println!("{:<36} caught at seed {seed}: {v}", bug.name()),
            None => missed.push(bug.name()),
        }
    }
    planted::enable(&[]);
    assert!(
        missed.is_empty(),
        "planted bugs the checkers missed in {SEEDS} seeds: {missed:?}"
    );
}
