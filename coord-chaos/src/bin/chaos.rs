//! The chaos runner: runs many seeds of a scenario on the embedded simulator, checks every
//! run's history against the invariants, and prints a summary. `--seed S` replays one seed
//! and prints its timeline (and `--svg FILE` draws it). Exit status 1 on any violation.
//!
//! ```text
//! cargo run -p coord-chaos --bin chaos -- --help
//! ```

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use coord_chaos::{
    check, schedule, simulate, timeline_svg, Emitted, FaultKind, Happening, History, Rng, Scenario,
    Violation, INVARIANTS,
};

const HELP: &str = "\
coord chaos runner: the coord recipes under injected faults, in virtual time, checked.

USAGE: chaos [OPTIONS]

Runs --seeds seeds (base-seed, base-seed + 1, ...) of one scenario and checks each run's
history against the invariants (S1-S7, L1, L3-L7 of RELIABILITY.md).

OPTIONS:
  --seeds N          seeds to run (default 500)
  --base-seed S      first seed (default 0); pick another to explore new schedules
  --seed S           replay seed S alone and print its timeline
  --svg FILE         with --seed: draw the timeline as an SVG picture
  --hosts N          nodes, each registering and campaigning (default 5)
  --elections N      elections every node campaigns in (default 2)
  --watchers N       nodes that also run a cluster watcher (default 2)
  --ttl SECS         lease TTL (default 3)
  --duration SECS    simulated length of a run, quiet phase included (default 120)
  --faults LIST      fault kinds, comma-separated, or 'all' or 'none' (default all):
                     partition, one-way, hold, latency, lost-replies, close-streams,
                     leader-change, store-crash, compact, revoke, delete, crash, pause, restart
  --rate N           faults per simulated minute, per kind (default 2)
  --latency MS       base one-way latency of every call (default 1)
  --jobs N           threads (default: the machine's cores)
  --bug NAME         switch a planted bug on (needs --features planted-bugs), to watch it
                     being caught
  --turmoil          run each node as a turmoil host on the production EtcdStore, over
                     simulated TCP, against the simulator served as etcd (needs
                     --features turmoil, and protoc); slower, and closer to production
  -h, --help         this text
";

struct Args {
    scenario: Scenario,
    seeds: u64,
    base_seed: u64,
    seed: Option<u64>,
    svg: Option<String>,
    jobs: usize,
    bug: Option<String>,
    turmoil: bool,
    /// The scenario flags as given, for replay commands.
    flags: Vec<String>,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        scenario: Scenario::default(),
        seeds: 500,
        base_seed: 0,
        seed: None,
        svg: None,
        jobs: std::thread::available_parallelism().map_or(1, |n| n.get()),
        bug: None,
        turmoil: false,
        flags: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "-h" || flag == "--help" {
            print!("{HELP}");
            std::process::exit(0);
        }
        if flag == "--turmoil" {
            a.turmoil = true;
            a.flags.push(flag);
            continue;
        }
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let num = |v: &str| {
            v.parse::<u64>()
                .map_err(|_| format!("{flag}: not a number: {v}"))
        };
        let s = &mut a.scenario;
        match flag.as_str() {
            "--seeds" => a.seeds = num(&value)?,
            "--base-seed" => a.base_seed = num(&value)?,
            "--seed" => a.seed = Some(num(&value)?),
            "--svg" => a.svg = Some(value.clone()),
            "--jobs" => a.jobs = num(&value)?.max(1) as usize,
            "--bug" => a.bug = Some(value.clone()),
            "--hosts" => s.hosts = num(&value)?.max(1) as usize,
            "--elections" => s.elections = num(&value)? as usize,
            "--watchers" => s.watchers = num(&value)? as usize,
            "--ttl" => s.ttl = Duration::from_secs(num(&value)?.max(2)),
            "--duration" => s.duration = Duration::from_secs(num(&value)?),
            "--latency" => s.latency = Duration::from_millis(num(&value)?),
            "--rate" => {
                s.faults_per_minute = value
                    .parse()
                    .map_err(|_| format!("--rate: not a number: {value}"))?
            }
            "--faults" => {
                s.fault_kinds = match value.as_str() {
                    "all" => FaultKind::ALL.into_iter().collect(),
                    "none" => Default::default(),
                    list => list
                        .split(',')
                        .map(|k| {
                            FaultKind::from_name(k.trim())
                                .ok_or_else(|| format!("--faults: no fault kind named {k}"))
                        })
                        .collect::<Result<_, _>>()?,
                }
            }
            other => return Err(format!("unknown option {other} (see --help)")),
        }
        if !matches!(
            flag.as_str(),
            "--seeds" | "--base-seed" | "--seed" | "--svg" | "--jobs"
        ) {
            a.flags.push(flag);
            a.flags.push(value);
        }
    }
    a.scenario.watchers = a.scenario.watchers.min(a.scenario.hosts);
    if a.turmoil {
        // A rolling restart needs two incarnations of one host at once; a turmoil host is one.
        a.scenario.fault_kinds.remove(&FaultKind::Restart);
    }
    Ok(a)
}

/// One seed's outcome.
struct Run {
    seed: u64,
    faults: BTreeMap<FaultKind, u64>,
    violations: Vec<Violation>,
}

fn run_seed(scenario: &Scenario, seed: u64, turmoil: bool) -> (Run, History) {
    let faults = schedule(scenario, &mut Rng::new(seed));
    let history = if turmoil {
        simulate_on_turmoil(scenario, seed, &faults)
    } else {
        simulate(scenario, seed, &faults)
    };
    let mut counts = BTreeMap::new();
    for f in &faults {
        *counts.entry(f.kind).or_insert(0) += 1;
    }
    let violations = check(scenario, &history);
    (
        Run {
            seed,
            faults: counts,
            violations,
        },
        history,
    )
}

#[cfg(feature = "turmoil")]
fn simulate_on_turmoil(scenario: &Scenario, seed: u64, faults: &[coord_chaos::Fault]) -> History {
    coord_chaos::simulate_turmoil(scenario, seed, faults)
}

#[cfg(not(feature = "turmoil"))]
fn simulate_on_turmoil(_: &Scenario, _: u64, _: &[coord_chaos::Fault]) -> History {
    unreachable!("--turmoil is refused without the turmoil feature")
}

fn replay_command(args: &Args, seed: u64) -> String {
    let mut cmd = String::from("cargo run -p coord-chaos --bin chaos");
    let features: Vec<&str> = [
        args.bug.as_ref().map(|_| "planted-bugs"),
        args.turmoil.then_some("turmoil"),
    ]
    .into_iter()
    .flatten()
    .collect();
    if !features.is_empty() {
        cmd.push_str(&format!(" --features {}", features.join(",")));
    }
    cmd.push_str(&format!(" -- --seed {seed}"));
    for f in &args.flags {
        cmd.push(' ');
        cmd.push_str(f);
    }
    cmd
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("chaos: {e}");
            return ExitCode::from(2);
        }
    };
    if !cfg!(tokio_unstable) {
        eprintln!(
            "chaos: warning: built without --cfg tokio_unstable (see .cargo/config.toml): \
             tokio's own random choices are not seeded, so a seed may not replay exactly"
        );
    }
    if let Some(name) = &args.bug {
        let Some(bug) = coord_api::planted::Bug::from_name(name) else {
            eprintln!("chaos: no planted bug named {name}");
            return ExitCode::from(2);
        };
        if !coord_api::planted::AVAILABLE {
            eprintln!("chaos: --bug needs the planted-bugs feature (cargo run --features planted-bugs ...)");
            return ExitCode::from(2);
        }
        coord_api::planted::enable(&[bug]);
    }
    if args.turmoil && !cfg!(feature = "turmoil") {
        eprintln!("chaos: --turmoil needs the turmoil feature (cargo run --features turmoil ...)");
        return ExitCode::from(2);
    }
    match args.seed {
        Some(seed) => replay(&args, seed),
        None => many(&args),
    }
}

fn describe(s: &Scenario) -> String {
    let kinds = if s.fault_kinds.len() == FaultKind::ALL.len() {
        "all".to_owned()
    } else if s.fault_kinds.is_empty() {
        "none".to_owned()
    } else {
        s.fault_kinds
            .iter()
            .map(|k| k.name())
            .collect::<Vec<_>>()
            .join(",")
    };
    format!(
        "{} hosts, {} elections, {} watchers, TTL {} s, {} s simulated per seed; faults: {kinds} at {}/min each",
        s.hosts,
        s.elections,
        s.watchers,
        s.ttl.as_secs(),
        s.duration.as_secs(),
        s.faults_per_minute
    )
}

fn many(args: &Args) -> ExitCode {
    let s = &args.scenario;
    println!(
        "coord chaos: {} seeds from {}, {}; {}",
        args.seeds,
        args.base_seed,
        if args.turmoil {
            "EtcdStore over turmoil"
        } else {
            "in-process simulator"
        },
        describe(s)
    );
    let started = Instant::now();
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let runs = Mutex::new(Vec::new());
    let progress = std::io::stderr().is_terminal();
    std::thread::scope(|scope| {
        for _ in 0..args.jobs.min(args.seeds as usize).max(1) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::SeqCst) as u64;
                if i >= args.seeds {
                    return;
                }
                let (run, _) = run_seed(s, args.base_seed + i, args.turmoil);
                let failed = !run.violations.is_empty();
                let seed = run.seed;
                runs.lock().unwrap_or_else(|p| p.into_inner()).push(run);
                let n = done.fetch_add(1, Ordering::SeqCst) + 1;
                if failed {
                    eprintln!(
                        "{}seed {seed}: VIOLATION",
                        if progress { "\r\x1b[K" } else { "" }
                    );
                }
                if progress {
                    bar(n, args.seeds as usize, started.elapsed());
                }
            });
        }
    });
    if progress {
        eprint!("\r\x1b[K");
    }
    let wall = started.elapsed();
    let mut runs = runs.into_inner().unwrap_or_else(|p| p.into_inner());
    runs.sort_by_key(|r| r.seed);
    let mut faults: BTreeMap<FaultKind, u64> = BTreeMap::new();
    for r in &runs {
        for (k, n) in &r.faults {
            *faults.entry(*k).or_insert(0) += n;
        }
    }
    let failed: Vec<&Run> = runs.iter().filter(|r| !r.violations.is_empty()).collect();
    let simulated = s.duration.as_secs_f64() * runs.len() as f64;
    let checks = INVARIANTS.len() * runs.len();
    let broken: usize = failed
        .iter()
        .map(|r| {
            let mut ids: Vec<_> = r.violations.iter().map(|v| v.invariant).collect();
            ids.dedup();
            ids.len()
        })
        .sum();
    println!();
    println!("  seeds run          {}", runs.len());
    println!(
        "  simulated          {:.2} h ({:.0} s per seed)",
        simulated / 3600.0,
        s.duration.as_secs_f64()
    );
    println!("  faults injected    {}", faults.values().sum::<u64>());
    for (k, n) in &faults {
        println!("    {:<16} {n}", k.name());
    }
    println!(
        "  invariant checks   {} passed of {checks} ({} invariants x {} seeds)",
        checks - broken,
        INVARIANTS.len(),
        runs.len()
    );
    println!(
        "  violations         {} in {} seeds",
        failed.iter().map(|r| r.violations.len()).sum::<usize>(),
        failed.len()
    );
    println!(
        "  wall time          {:.2} s on {} threads",
        wall.as_secs_f64(),
        args.jobs
    );
    println!(
        "  speed              {:.0}x simulated/wall ({:.0} seeds per minute)",
        simulated / wall.as_secs_f64(),
        runs.len() as f64 * 60.0 / wall.as_secs_f64()
    );
    if failed.is_empty() {
        println!("\nall invariants held.");
        return ExitCode::SUCCESS;
    }
    println!();
    for r in failed.iter().take(10) {
        println!("seed {}:", r.seed);
        for v in r.violations.iter().take(5) {
            println!("  {v}");
        }
        if r.violations.len() > 5 {
            println!("  ... and {} more", r.violations.len() - 5);
        }
        println!("  replay: {}", replay_command(args, r.seed));
    }
    if failed.len() > 10 {
        println!("... and {} more failing seeds", failed.len() - 10);
    }
    ExitCode::FAILURE
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

fn replay(args: &Args, seed: u64) -> ExitCode {
    let s = &args.scenario;
    println!("coord chaos: seed {seed}; {}", describe(s));
    let started = Instant::now();
    let (run, history) = run_seed(s, seed, args.turmoil);
    let wall = started.elapsed();
    println!();
    for r in &history.records {
        if let Some(line) = timeline_line(&r.what) {
            println!("{:>9.3}s  {line}", r.at.as_secs_f64());
        }
    }
    println!();
    println!(
        "{} records, history digest {:016x}, {:.3} s wall for {} s simulated",
        history.records.len(),
        history.digest(),
        wall.as_secs_f64(),
        s.duration.as_secs()
    );
    if let Some(path) = &args.svg {
        match std::fs::write(path, timeline_svg(s, &history)) {
            Ok(()) => println!("timeline drawn to {path}"),
            Err(e) => eprintln!("chaos: could not write {path}: {e}"),
        }
    }
    if run.violations.is_empty() {
        println!("all invariants held.");
        ExitCode::SUCCESS
    } else {
        for v in &run.violations {
            println!("VIOLATION {v}");
        }
        ExitCode::FAILURE
    }
}

/// The timeline's line for a record, if it belongs on the timeline (the store's own
/// changes, views and acts are left out: the checkers read them).
fn timeline_line(what: &Happening) -> Option<String> {
    Some(match what {
        Happening::FaultStart(f) => format!("FAULT  {}", f.what()),
        Happening::FaultEnd(f) => format!("healed {} n{}", f.kind, f.node),
        Happening::Heal => "--- every fault is over: quiet phase ---".to_owned(),
        Happening::Started { who, .. } => format!("{who}  started"),
        Happening::Crashed(who) => format!("{who}  CRASHED"),
        Happening::Stopping(who) => format!("{who}  stopping"),
        Happening::Stopped { who, clean } => format!(
            "{who}  stopped{}",
            if *clean { "" } else { " (with errors)" }
        ),
        Happening::Registered(who, lease) => format!("{who}  registered (lease {lease})"),
        Happening::Unregistered(who) => format!("{who}  not registered"),
        Happening::LeaderStart {
            who,
            election,
            token,
        } => format!("{who}  leads e{election} (token {token})"),
        Happening::LeaderEnd {
            who,
            election,
            token,
            resigned,
        } => format!(
            "{who}  {} e{election} (token {token})",
            if *resigned {
                "resigns"
            } else {
                "no longer leads"
            }
        ),
        Happening::Emitted(who, Emitted::Up(h, rev)) => format!("{who}  sees {h} up @{rev}"),
        Happening::Emitted(who, Emitted::Down(h, rev)) => format!("{who}  sees {h} down @{rev}"),
        Happening::Emitted(who, Emitted::Resynced(rev)) => {
            format!("{who}  watcher resynced @{rev}")
        }
        _ => return None,
    })
}
