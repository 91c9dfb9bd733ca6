//! The job-scheduler example under chaos: the correct scheduler holds its promises and the
//! generic invariants over the CI seeds, and its planted bug (writes without the fence) is
//! caught within them.

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

#[test]
fn an_unfenced_write_is_caught() {
    let report = Runner::new(JobScheduler { fenced: false }).run(0..40);
    let caught = report
        .failed()
        .flat_map(|o| o.violations.iter().map(move |v| (o.seed, v)))
        .find(|(_, v)| v.invariant == "S1");
    let (seed, v) =
        caught.expect("the unfenced scheduler's stale writes are caught by the fence invariant");
    println!("caught at seed {seed}: {v}");
}
