//! The chaos runner: runs many seeds of a scenario with coord's own service on the embedded
//! simulator, checks every run's history against the invariants, and prints a summary.
//! `--seed S` replays one seed and prints its timeline (and `--svg FILE` draws it). Exit
//! status 1 on any violation.
//!
//! ```text
//! cargo run -p coord-chaos-cli -- --help
//! ```

// See the dependency's note in Cargo.toml.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod allocator;

use std::process::ExitCode;
use std::time::{Duration, Instant};

use coord_chaos::{
    timeline, timeline_svg, timeline_with_store, CoordService, EtcdRelease, FaultKind, Runner,
    Scenario,
};

const HELP: &str = "\
coord chaos runner: the coord recipes under injected faults, in virtual time, checked.

USAGE: chaos [OPTIONS]

Runs --seeds seeds (base-seed, base-seed + 1, ...) of one scenario with coord's own service
(every node registers, changes its metadata, campaigns in every election and writes through
the fence while it leads; the first nodes watch the cluster) and checks each run's history
against the invariants (S1-S9, W1, L1-L8, M1, P1-P4, C1).

OPTIONS:
  --seeds N          seeds to run (default 500)
  --base-seed S      first seed (default 0); pick another to explore new schedules
  --seed S           replay seed S alone and print its timeline
  --svg FILE         with --seed: draw the timeline as an SVG picture
  --store            with --seed: the store's journal in the timeline too (every commit,
                     lease grant, renewal and lease end, and by whom)
  --failing FILE     write every failing seed to FILE, one a line with its first violation
                     (the summary shows ten): a nightly run's list to triage
  --jobs N           threads (default: the machine's cores); for long runs (a nightly
                     --seeds 50000) give it every core
  --defaults         every timing at the library's defaults (TTL 10 s, renewals every
                     TTL/3, backoff 100 ms to 30 s, 5 s request timeout), 300 s per seed
  --hosts N          nodes (default 5)
  --elections N      elections every node campaigns in (default 2)
  --watchers N       nodes that also run a cluster watcher (default 2)
  --ttl SECS         lease TTL (default 3)
  --duration SECS    simulated length of a run, quiet phase included (default 120)
  --faults LIST      fault kinds, comma-separated, or 'all', 'members' or 'none' (default
                     all): partition, one-way, hold, latency, slow-replies, lost-replies,
                     close-streams, leader-change, store-crash, compact, revoke, delete,
                     crash, pause, restart, stop; with --turmoil, the members' too
                     ('members'): member-crash, member-isolation, leader-crash,
                     leader-transfer, member-stall, member-slow, leader-stall
  --members N        with --turmoil: etcd members the store is served as (default 3; each
                     node's EtcdStore knows them all)
  --etcd VERSION     with --turmoil: the etcd the members answer as, 3.4 or 3.5 (default:
                     drawn from each seed; on 3.4 a leader replaced while stalled revokes
                     the leases it saw overdue on resuming, etcd#15247)
  --rate N           faults per simulated minute, per kind (default 2)
  --latency MS       base one-way latency of every message (default 1)
  --tick MS          with --turmoil: simulated time per turmoil step (default 10)
  --no-explore       do not explore schedules (the recipes never yield at their await points)
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
    /// With `--seed`: the store's journal in the timeline.
    store: bool,
    failing: Option<String>,
    jobs: usize,
    bug: Option<String>,
    turmoil: bool,
    members: Option<usize>,
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
        store: false,
        failing: None,
        jobs: std::thread::available_parallelism().map_or(1, |n| n.get()),
        bug: None,
        turmoil: false,
        members: None,
        flags: Vec::new(),
    };
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    // --defaults first: the other flags refine it.
    if let Some(i) = args.iter().position(|f| f == "--defaults") {
        args.remove(i);
        a.scenario = Scenario::defaults();
        a.flags.push("--defaults".into());
    }
    let mut it = args.into_iter();
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "-h" | "--help" => {
                print!("{HELP}");
                std::process::exit(0);
            }
            "--turmoil" => {
                a.turmoil = true;
                a.flags.push(flag);
                continue;
            }
            "--no-explore" => {
                a.scenario.explore = false;
                a.flags.push(flag);
                continue;
            }
            "--store" => {
                a.store = true;
                continue;
            }
            _ => {}
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
            "--failing" => a.failing = Some(value.clone()),
            "--jobs" => a.jobs = num(&value)?.max(1) as usize,
            "--bug" => a.bug = Some(value.clone()),
            "--hosts" => s.hosts = num(&value)?.max(1) as usize,
            "--members" => a.members = Some(num(&value)?.max(1) as usize),
            "--etcd" => {
                s.etcd_version = Some(match value.as_str() {
                    "3.4" => EtcdRelease::V3_4,
                    "3.5" => EtcdRelease::V3_5,
                    other => return Err(format!("--etcd: 3.4 or 3.5, not {other}")),
                })
            }
            "--elections" => s.elections = num(&value)? as usize,
            "--watchers" => s.watchers = num(&value)? as usize,
            "--ttl" => s.ttl = Duration::from_secs(num(&value)?.max(2)),
            "--duration" => s.duration = Duration::from_secs(num(&value)?),
            "--latency" => s.latency = Duration::from_millis(num(&value)?),
            "--tick" => s.turmoil_tick = Duration::from_millis(num(&value)?.max(1)),
            "--rate" => {
                s.faults_per_minute = value
                    .parse()
                    .map_err(|_| format!("--rate: not a number: {value}"))?
            }
            "--faults" => {
                s.fault_kinds = match value.as_str() {
                    "all" => FaultKind::ALL.into_iter().collect(),
                    "members" => FaultKind::MEMBERS.into_iter().collect(),
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
            "--seeds" | "--base-seed" | "--seed" | "--svg" | "--failing" | "--jobs"
        ) {
            a.flags.push(flag);
            a.flags.push(value);
        }
    }
    a.scenario.watchers = a.scenario.watchers.min(a.scenario.hosts);
    Ok(a)
}

fn replay_command(turmoil: bool, bug: Option<&str>, flags: &[String], seed: u64) -> String {
    let mut cmd = String::from("cargo run -p coord-chaos-cli");
    let features: Vec<&str> = [bug.map(|_| "planted-bugs"), turmoil.then_some("turmoil")]
        .into_iter()
        .flatten()
        .collect();
    if !features.is_empty() {
        cmd.push_str(&format!(" --features {}", features.join(",")));
    }
    cmd.push_str(&format!(" -- --seed {seed}"));
    for f in flags {
        cmd.push(' ');
        cmd.push_str(f);
    }
    cmd
}

/// Stamps log lines with simulated time: turmoil's clock over turmoil, else the virtual time of
/// the runtime the line comes from.
struct SimTime;

impl tracing_subscriber::fmt::time::FormatTime for SimTime {
    fn format_time(&self, w: &mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result {
        #[cfg(feature = "turmoil")]
        if let Some(t) = turmoil::sim_elapsed() {
            return write!(w, "{:>9.3}s", t.as_secs_f64());
        }
        thread_local! {
            static START: std::cell::OnceCell<tokio::time::Instant> = const { std::cell::OnceCell::new() };
        }
        let since = START.with(|s| s.get_or_init(tokio::time::Instant::now).elapsed());
        write!(w, "{:>9.3}s", since.as_secs_f64())
    }
}

fn main() -> ExitCode {
    allocator::keep_freed_memory();
    // Logs of the recipes and the simulator, with RUST_LOG (for a replayed seed, say).
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_timer(SimTime)
            .with_writer(std::io::stderr)
            .init();
    }
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("chaos: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(name) = &args.bug {
        let Some(bug) = coord_api::hooks::planted::Bug::from_name(name) else {
            eprintln!("chaos: no planted bug named {name}");
            return ExitCode::from(2);
        };
        if !coord_api::hooks::planted::AVAILABLE {
            eprintln!("chaos: --bug needs the planted-bugs feature (cargo run -p coord-chaos-cli --features planted-bugs ...)");
            return ExitCode::from(2);
        }
        coord_api::hooks::planted::enable(&[bug]);
    }
    if args.turmoil && !cfg!(feature = "turmoil") {
        eprintln!("chaos: --turmoil needs the turmoil feature (cargo run --features turmoil ...)");
        return ExitCode::from(2);
    }
    let (turmoil, bug, flags) = (args.turmoil, args.bug.clone(), args.flags.clone());
    let runner = Runner::new(CoordService)
        .scenario(args.scenario.clone())
        .jobs(args.jobs)
        .progress(true)
        .replay_with(move |seed| replay_command(turmoil, bug.as_deref(), &flags, seed));
    #[cfg(feature = "turmoil")]
    let runner = runner.turmoil(args.turmoil);
    let runner = match args.members {
        Some(n) => runner.members(n),
        None => runner,
    };
    match args.seed {
        Some(seed) => replay(&args, &runner, seed),
        None => many(&args, &runner),
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
    let members = if s.members > 1 {
        format!("{} etcd members, ", s.members)
    } else {
        String::new()
    };
    format!(
        "{members}{} hosts, {} elections, {} watchers, TTL {} s, {} s simulated per seed; faults: {kinds} at {}/min each{}",
        s.hosts,
        s.elections,
        s.watchers,
        s.ttl.as_secs(),
        s.duration.as_secs(),
        s.faults_per_minute,
        if s.explore { "; schedules explored" } else { "" }
    )
}

fn many(args: &Args, runner: &Runner) -> ExitCode {
    println!(
        "coord chaos: {} seeds from {}, {}; {}",
        args.seeds,
        args.base_seed,
        if args.turmoil {
            match runner.scenario_ref().etcd_version {
                Some(v) => format!("EtcdStore over turmoil, etcd {v}"),
                None => "EtcdStore over turmoil, etcd 3.4 or 3.5 drawn per seed".to_owned(),
            }
        } else {
            "in-process simulator".to_owned()
        },
        describe(runner.scenario_ref())
    );
    let report = runner.run(args.base_seed..args.base_seed + args.seeds);
    println!();
    print!("{}", report.summary());
    if let Some(path) = &args.failing {
        let mut list = String::new();
        for o in report.failed() {
            let first = o
                .violations
                .first()
                .map(|v| v.to_string())
                .unwrap_or_default();
            list.push_str(&format!("{} {first}\n", o.seed));
        }
        if let Err(e) = std::fs::write(path, list) {
            eprintln!("--failing: cannot write {path}: {e}");
            return ExitCode::FAILURE;
        }
    }
    if report.failed().next().is_none() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn replay(args: &Args, runner: &Runner, seed: u64) -> ExitCode {
    let s = runner.scenario_ref();
    let etcd = if args.turmoil {
        format!("etcd {}; ", EtcdRelease::of_run(s.etcd_version, seed))
    } else {
        String::new()
    };
    println!("coord chaos: seed {seed}; {etcd}{}", describe(s));
    let started = Instant::now();
    let (outcome, history) = runner.run_seed(seed);
    let wall = started.elapsed();
    println!();
    if args.store {
        print!("{}", timeline_with_store(&history));
    } else {
        print!("{}", timeline(&history));
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
    if outcome.violations.is_empty() {
        println!("all invariants held.");
        ExitCode::SUCCESS
    } else {
        for v in &outcome.violations {
            println!("VIOLATION {v}");
        }
        ExitCode::FAILURE
    }
}
