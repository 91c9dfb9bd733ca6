//! The real-etcd harness itself: no etcd process outlives the test process that started it,
//! even one killed with SIGKILL, which runs no destructor; its data is removed by the next
//! harness to start.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A process's command name, state and parent, from `/proc/<pid>/stat`; `None` once it is gone.
fn stat(pid: u32) -> Option<(String, char, u32)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split at the last ')'.
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text[open + 1..close].to_owned();
    let mut rest = text[close + 1..].split_whitespace();
    let state = rest.next()?.chars().next()?;
    let ppid = rest.next()?.parse().ok()?;
    Some((comm, state, ppid))
}

/// The etcd processes whose parent is `parent`.
fn etcd_children(parent: u32) -> Vec<u32> {
    let mut pids: Vec<u32> = std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(
            |pid| matches!(stat(*pid), Some((comm, _, ppid)) if comm == "etcd" && ppid == parent),
        )
        .collect();
    pids.sort_unstable();
    pids
}

/// Whether `pid` is still a running etcd (a zombie waiting for its new parent to reap it has
/// stopped running; a reused pid is another program).
fn etcd_running(pid: u32) -> bool {
    matches!(stat(pid), Some((comm, state, _)) if comm == "etcd" && !matches!(state, 'Z' | 'X'))
}

/// The data directories the harness made for process `pid`.
fn data_dirs(pid: u32) -> Vec<std::path::PathBuf> {
    let prefix = format!("coord-etcd-{pid}-");
    std::fs::read_dir(std::env::temp_dir())
        .expect("temp dir")
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
        .collect()
}

#[test]
fn a_test_process_killed_with_sigkill_leaves_no_etcd_behind() {
    let mut holder = Command::new(env!("CARGO_BIN_EXE_hold-etcd"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start hold-etcd");
    let stdout = holder.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx.recv_timeout(Duration::from_secs(60)).unwrap_or_default();
    if !line.starts_with("ready") {
        let _ = holder.kill();
        panic!(
            "hold-etcd did not start its cluster (said {line:?}, exit {:?})",
            holder.wait()
        );
    }
    let members = etcd_children(holder.id());
    assert_eq!(members.len(), 3, "hold-etcd's etcd processes: {members:?}");

    holder.kill().expect("SIGKILL hold-etcd");
    holder.wait().expect("reap hold-etcd");
    let killed = Instant::now();
    // The kernel sends the parent-death signal as the process exits; the bound is slack for
    // a loaded machine to schedule the members' deaths.
    let bound = Duration::from_secs(5);
    let gone = loop {
        let running: Vec<u32> = members
            .iter()
            .copied()
            .filter(|p| etcd_running(*p))
            .collect();
        if running.is_empty() {
            break killed.elapsed();
        }
        if killed.elapsed() > bound {
            // Leave nothing behind, then fail.
            let _ = Command::new("kill")
                .arg("-KILL")
                .args(running.iter().map(u32::to_string))
                .status();
            panic!("etcd processes {running:?} still ran {bound:?} after their test process was killed");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    // Its data directories went with it only in part: nothing ran to remove them. The next
    // harness to start removes them.
    let left = data_dirs(holder.id());
    assert!(
        !left.is_empty(),
        "a killed process leaves its data directory"
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let _next = rt
        .block_on(coord_etcd::testing::EtcdCluster::single())
        .unwrap_or_else(|e| panic!("cannot start etcd: {e}"));
    assert_eq!(data_dirs(holder.id()), Vec::<std::path::PathBuf>::new());
    println!(
        "measured: the 3 etcd members of a SIGKILLed test process gone {gone:?} after it; its data removed by the next harness"
    );
}
