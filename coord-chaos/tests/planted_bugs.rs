//! Every planted bug is caught by the chaos checkers within a bounded number of seeds.
//!
//! Built only with `--features planted-bugs` (coord-api then compiles its planted defects
//! in, all off); this test switches them on one at a time, process-wide, so it is one test.

use coord_api::planted::{self, Bug};
use coord_chaos::{check, schedule, simulate, Rng, Scenario};

/// Seeds tried per bug before declaring it missed. Measured catch rates are 35-100 % per
/// seed (see the note of the chaos issue), so a miss here is a checker that lost its teeth,
/// not bad luck: the seeds are fixed, and the result is the same on every run.
const SEEDS: u64 = 40;

#[test]
fn every_planted_bug_is_caught() {
    let scenario = Scenario::default();
    // With no bug planted, these seeds are clean: a catch below is the bug's doing.
    planted::enable(&[]);
    let mut missed = Vec::new();
    for bug in Bug::ALL {
        planted::enable(&[bug]);
        let caught = (0..SEEDS).find_map(|seed| {
            let faults = schedule(&scenario, &mut Rng::new(seed));
            let violations = check(&scenario, &simulate(&scenario, seed, &faults));
            violations.first().map(|v| (seed, v.clone()))
        });
        match caught {
            Some((seed, v)) => println!("{:<32} caught at seed {seed}: {v}", bug.name()),
            None => missed.push(bug.name()),
        }
    }
    planted::enable(&[]);
    for seed in 0..5 {
        let faults = schedule(&scenario, &mut Rng::new(seed));
        let violations = check(&scenario, &simulate(&scenario, seed, &faults));
        assert!(
            violations.is_empty(),
            "seed {seed} fails without a bug: {violations:?}"
        );
    }
    assert!(
        missed.is_empty(),
        "planted bugs the checkers missed in {SEEDS} seeds: {missed:?}"
    );
}
