//! Child processes that die with the test process, however it dies.
//!
//! `Drop` kills the members of a cluster when a test ends or panics, but a test process killed
//! with SIGKILL (a CI timeout, an impatient Ctrl-\, the OOM killer) runs no destructor, and its
//! etcd processes would keep running, holding ports and disk. Linux's parent-death signal ties
//! a child's life to its parent's: the child asks for SIGKILL when its parent goes.
//!
//! Two details make that work here. The workspace forbids unsafe code, so the request is made
//! by util-linux's `setpriv --pdeathsig KILL`, which sets it and then executes etcd in the same
//! process (the setting survives exec for a binary that is not set-user-ID). And the "parent"
//! the kernel watches is the *thread* that forked, not the process: a child spawned from a test
//! thread or a runtime's worker would be killed when that thread exits, while the cluster lives
//! on elsewhere. So every child is spawned by one thread that lives as long as the process.
//!
//! The members' data directories are named for the test process's pid; a harness starting
//! removes those of processes that no longer exist.

use std::io;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};

use super::cluster::HarnessError;

type Request = (Command, mpsc::Sender<io::Result<Child>>);

/// Finds `setpriv` on `PATH`.
fn setpriv() -> Result<PathBuf, HarnessError> {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("setpriv"))
        .find(|p| p.is_file())
        .ok_or(HarnessError::SetprivNotFound)
}

/// The thread that spawns every child, started on first use and never ended.
fn spawner() -> &'static Mutex<mpsc::Sender<Request>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Request>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Request>();
        std::thread::Builder::new()
            .name("coord-etcd-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("cannot start the harness's spawner thread");
        Mutex::new(tx)
    })
}

/// The command that runs `program` with `args` and dies with this process.
pub(crate) fn command(program: impl Into<PathBuf>) -> Result<Command, HarnessError> {
    let mut cmd = Command::new(setpriv()?);
    cmd.args(["--pdeathsig", "KILL", "--"]).arg(program.into());
    Ok(cmd)
}

/// Spawns `cmd` (made by [`command`]) from the spawner thread.
pub(crate) fn spawn(cmd: Command) -> io::Result<Child> {
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
pub(crate) fn remove_orphaned_dirs(prefix: &str) {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(prefix))
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            tracing::debug!(dir = %entry.path().display(), pid, "removing a dead test's etcd data");
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}
