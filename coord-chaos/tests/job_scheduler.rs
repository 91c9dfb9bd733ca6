//! The job-scheduler example under chaos: the correct scheduler holds its promises and the
//! generic invariants over the CI seeds, and its planted bug (writes without the fence) is
//! caught in most seeds.

#[path = "../examples/job_scheduler.rs"]
#[allow(dead_code)]
mod example;

use coord_chaos::Runner;
use example::JobScheduler;

#[test]
fn the_scheduler_keeps_its_promises() {
    let runner = Runner::new(JobScheduler { fenced: true }).replay_with(|seed| {
        format!("CHAOS_SEED={seed} cargo run -p coord-chaos --example job_scheduler")
    });
    let seeds = runner.seeds_from_env(0..100);
    runner.run(seeds).assert_clean();
}

/// The schedule aims at a write in flight (half the holds wait for one), so a service's
/// unfenced write is caught in most seeds, not now and then: in at least half of 500 and in
/// one of the first ten. Each catch names the writer.
#[test]
fn an_unfenced_write_is_caught_in_most_seeds() {
    let report = Runner::new(JobScheduler { fenced: false }).run(0..500);
    let caught: Vec<u64> = report
        .failed()
        .filter(|o| o.violations.iter().any(|v| v.invariant == "S1"))
        .map(|o| o.seed)
        .collect();
    println!("the unfenced write caught in {} of 500 seeds", caught.len());
    assert!(
        caught.len() >= 250,
        "caught in only {} of 500 seeds",
        caught.len()
    );
    assert!(caught.iter().any(|s| *s < 10), "not caught in seeds 0-9");
    for o in report.failed() {
        for v in o.violations.iter().filter(|v| v.invariant == "S1") {
            assert_eq!(v.nodes.len(), 1, "S1 names its writer: {v}");
        }
    }
}
