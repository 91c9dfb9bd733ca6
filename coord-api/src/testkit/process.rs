//! Servers that die with the test process, however it dies, and free loopback ports for them:
//! what every backend's harness (etcd's, PostgreSQL's) starts its servers with.
//!
//! `Drop` kills a harness's servers when a test ends or panics, but a test process killed
//! with SIGKILL (a CI timeout, an impatient Ctrl-\, the OOM killer) runs no destructor, and its
//! servers would keep running, holding ports and disk. Linux's parent-death signal ties
//! a child's life to its parent's: the child asks for SIGKILL when its parent goes.
//!
//! Two details make that work here. The workspace forbids unsafe code, so the request is made
//! by util-linux's `setpriv --pdeathsig KILL`, which sets it and then executes the server in the same
//! process (the setting survives exec for a binary that is not set-user-ID). And the "parent"
//! the kernel watches is the *thread* that forked, not the process: a child spawned from a test
//! thread or a runtime's worker would be killed when that thread exits, while the server lives
//! on elsewhere. So every child is spawned by one thread that lives as long as the process.
//!
//! Data directories are named for the test process's pid; a harness starting removes those of
//! processes that no longer exist ([`remove_orphaned_dirs`]).

use std::io;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};

type Request = (Command, mpsc::Sender<io::Result<Child>>);

/// What to tell a user without `setpriv`.
pub const SETPRIV_MISSING: &str = "setpriv not found on PATH: test harnesses run their servers \
     under `setpriv --pdeathsig KILL` so that none outlives a killed test (Debian: apt-get \
     install util-linux)";

/// Finds `setpriv` on `PATH`.
pub fn setpriv() -> Option<PathBuf> {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("setpriv"))
        .find(|p| p.is_file())
}

/// The thread that spawns every child, started on first use and never ended.
fn spawner() -> &'static Mutex<mpsc::Sender<Request>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Request>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Request>();
        std::thread::Builder::new()
            .name("coord-harness-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("cannot start the harness's spawner thread");
        Mutex::new(tx)
    })
}

/// The command that runs `program` and dies with this process; `None` without `setpriv`
/// (see [`SETPRIV_MISSING`]). `setpriv_args` go to `setpriv` before the program (a user to
/// run as, say: `["--reuid=postgres", "--regid=postgres", "--init-groups"]`).
pub fn command(program: impl Into<PathBuf>, setpriv_args: &[&str]) -> Option<Command> {
    let mut cmd = Command::new(setpriv()?);
    cmd.args(setpriv_args)
        .args(["--pdeathsig", "KILL", "--"])
        .arg(program.into());
    Some(cmd)
}

/// Spawns `cmd` (made by [`command`]) from the spawner thread.
pub fn spawn(cmd: Command) -> io::Result<Child> {
    let (tx, rx) = mpsc::channel();
    spawner()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .send((cmd, tx))
        .map_err(|_| io::Error::other("the harness's spawner thread is gone"))?;
    rx.recv()
        .map_err(|_| io::Error::other("the harness's spawner thread is gone"))?
}

/// Removes `<temp>/<prefix><pid>-*` directories whose process `pid` is gone: what a killed test
/// process left. A directory whose pid is alive is left alone, even if the pid was reused.
pub fn remove_orphaned_dirs(prefix: &str) {
    remove_orphaned_dirs_in(&std::env::temp_dir(), prefix);
}

/// [`remove_orphaned_dirs`] under `parent` instead of the temporary directory.
pub fn remove_orphaned_dirs_in(parent: &std::path::Path, prefix: &str) {
    for dir in orphaned_dirs_in(parent, prefix) {
        tracing::debug!(dir = %dir.display(), "removing a dead test's server data");
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// The `<parent>/<prefix><pid>-*` directories whose process `pid` is gone (see
/// [`remove_orphaned_dirs`]), for a harness that has more than files to clean up after them.
pub fn orphaned_dirs_in(parent: &std::path::Path, prefix: &str) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|entry| {
            let name = entry.file_name();
            name.to_str()
                .and_then(|n| n.strip_prefix(prefix))
                .and_then(|rest| rest.split_once('-'))
                .and_then(|(pid, _)| pid.parse::<u32>().ok())
                .is_some_and(|pid| !std::path::Path::new(&format!("/proc/{pid}")).exists())
        })
        .map(|entry| entry.path())
        .collect()
}

/// A free loopback port, below Linux's ephemeral range (32768-60999). A port the OS hands
/// out for `bind(0)` comes from that range, and so does the local port of every outgoing
/// connection: between our check and the server's bind, a client connection could take it.
pub fn free_port() -> io::Result<u16> {
    use std::net::TcpListener;
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let salt = u64::from(std::process::id()).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    for _ in 0..1000 {
        let n = NEXT.fetch_add(1, Ordering::Relaxed).wrapping_mul(7919) ^ salt;
        let port = 20_000 + (n % 12_000) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}
