//! One PostgreSQL server per test, started from a data directory initialised once per test
//! process and copied (initdb takes seconds; a copy and a start take a fraction of one).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use coord_api::testkit::process;
use tokio::time::Instant;

use crate::{PostgresConfig, PostgresStore};

/// Why a server could not be started.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HarnessError {
    /// No PostgreSQL server binaries.
    #[error(
        "PostgreSQL's initdb and postgres not found: set PG_BIN to the directory holding them \
         (Debian: apt-get install postgresql, which puts them in /usr/lib/postgresql/<version>/bin)"
    )]
    NotFound,
    /// No `setpriv`.
    #[error("{}", process::SETPRIV_MISSING)]
    SetprivNotFound,
    /// Running as root, and no `postgres` user to run the server as.
    #[error(
        "running as root, and there is no `postgres` user to run PostgreSQL as (it refuses root)"
    )]
    NoPostgresUser,
    /// A step failed; `log` says what the server or initdb printed.
    #[error("{step} failed: {log}")]
    Failed {
        /// What was being done.
        step: &'static str,
        /// Its output.
        log: String,
    },
    /// An I/O error.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

const DIR_PREFIX: &str = "coord-pg-";

/// Where the servers' data (copies of the template) goes: `/dev/shm` where it is a writable memory filesystem, else the
/// temporary directory. Copying a data directory there took 0.04 s against 0.8 s on a CI
/// machine's disk, which made starting a server twice as slow as running most cases.
fn data_root() -> PathBuf {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        let shm = PathBuf::from("/dev/shm");
        let probe = shm.join(format!("{DIR_PREFIX}{}-probe", std::process::id()));
        if std::fs::create_dir_all(&probe).is_ok() {
            let _ = std::fs::remove_dir_all(&probe);
            shm
        } else {
            std::env::temp_dir()
        }
    })
    .clone()
}

/// The directory holding `initdb` and `postgres`: `PG_BIN`, or the newest of Debian's
/// `/usr/lib/postgresql/<version>/bin`.
pub fn postgres_bin_dir() -> Result<PathBuf, HarnessError> {
    let has_both = |dir: &Path| dir.join("initdb").is_file() && dir.join("postgres").is_file();
    if let Some(dir) = std::env::var_os("PG_BIN").map(PathBuf::from) {
        return if has_both(&dir) {
            Ok(dir)
        } else {
            Err(HarnessError::NotFound)
        };
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            has_both(&bin).then_some((version, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, b)| b).ok_or(HarnessError::NotFound)
}

/// The user the server runs as: `postgres` when this process is root, else this process's.
#[derive(Debug, Clone, Copy)]
struct RunAs {
    ids: Option<(u32, u32)>,
}

impl RunAs {
    fn find() -> Result<RunAs, HarnessError> {
        if !is_root() {
            return Ok(RunAs { ids: None });
        }
        let passwd = std::fs::read_to_string("/etc/passwd")?;
        let ids = passwd
            .lines()
            .find_map(|line| {
                let f: Vec<&str> = line.split(':').collect();
                (f.first() == Some(&"postgres") && f.len() > 3)
                    .then(|| Some((f[2].parse().ok()?, f[3].parse().ok()?)))
                    .flatten()
            })
            .ok_or(HarnessError::NoPostgresUser)?;
        Ok(RunAs { ids: Some(ids) })
    }

    fn own(&self, path: &Path) -> std::io::Result<()> {
        match self.ids {
            Some((uid, gid)) => std::os::unix::fs::chown(path, Some(uid), Some(gid)),
            None => Ok(()),
        }
    }

    fn command(&self, program: PathBuf) -> Result<Command, HarnessError> {
        let args: Vec<String> = match self.ids {
            Some((uid, gid)) => vec![
                format!("--reuid={uid}"),
                format!("--regid={gid}"),
                "--init-groups".into(),
            ],
            None => Vec::new(),
        };
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        process::command(program, &args).ok_or(HarnessError::SetprivNotFound)
    }
}

fn is_root() -> bool {
    // The real uid, from the kernel's own account of this process.
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|l| l.split_whitespace().next().map(|u| u == "0"))
        })
        .unwrap_or(false)
}

/// The data directory every server of this process starts from a copy of.
fn template(bin: &Path, run_as: RunAs) -> Result<(PathBuf, TemplateLease), HarnessError> {
    let mut made = TEMPLATE.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(dir) = made.data.clone() {
        made.live += 1;
        return Ok((dir, TemplateLease));
    }
    process::remove_orphaned_dirs(DIR_PREFIX);
    for dir in process::orphaned_dirs_in(&data_root(), DIR_PREFIX) {
        remove_shared_memory(&dir.join("data"));
        let _ = std::fs::remove_dir_all(dir);
    }
    // On disk, and memory for the copies servers run on. It goes with the last server that
    // uses it (a killed process's is removed by the next process).
    let root = std::env::temp_dir().join(format!("{DIR_PREFIX}{}-template", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root)?;
    run_as.own(&root)?;
    let data = root.join("data");
    let out = run_as
        .command(bin.join("initdb"))?
        .args([
            "-A",
            "trust",
            "-U",
            "coord",
            "-E",
            "UTF8",
            "--no-sync",
            "-D",
        ])
        .arg(&data)
        .output()?;
    if !out.status.success() {
        return Err(HarnessError::Failed {
            step: "initdb",
            log: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    made.data = Some(data.clone());
    made.live += 1;
    Ok((data, TemplateLease))
}

/// The template data directory and how many servers hold a lease on it.
struct Template {
    data: Option<PathBuf>,
    live: usize,
}

static TEMPLATE: Mutex<Template> = Mutex::new(Template {
    data: None,
    live: 0,
});

/// A server's hold on the template: the last one dropped removes it, so a test process
/// leaves no directory behind.
#[derive(Debug)]
struct TemplateLease;

impl Drop for TemplateLease {
    fn drop(&mut self) {
        let mut made = TEMPLATE.lock().unwrap_or_else(|p| p.into_inner());
        made.live -= 1;
        if made.live == 0 {
            if let Some(root) = made.data.take().as_deref().and_then(Path::parent) {
                let _ = std::fs::remove_dir_all(root);
            }
        }
    }
}

/// Who may connect to a secured server, and how: the harness's own user as before; the user
/// `certified` over TLS with its client certificate; anyone else over TLS with a password.
const HBA_SECURED: &str = "\
local all all trust
host all coord 127.0.0.1/32 trust
hostssl all certified 127.0.0.1/32 cert
hostssl all all 127.0.0.1/32 scram-sha-256
";

/// Removes the System V shared memory segment a killed postmaster of `data` left, named in
/// its `postmaster.pid` (line 7: key and id). PostgreSQL removes it only when it shuts down
/// cleanly, and the kernel allows 4,096 segments by default: as many killed servers, and no
/// server starts on the machine any more.
fn remove_shared_memory(data: &Path) {
    let Ok(pid_file) = std::fs::read_to_string(data.join("postmaster.pid")) else {
        return;
    };
    if let Some(id) = pid_file
        .lines()
        .nth(6)
        .and_then(|line| line.split_whitespace().nth(1))
    {
        let _ = Command::new("ipcrm")
            .args(["-m", id])
            .stderr(Stdio::null())
            .status();
    }
}

/// A PostgreSQL server of its own for one test; killed (SIGKILL) and removed when dropped.
#[derive(Debug)]
pub struct PostgresServer {
    bin: PathBuf,
    run_as: RunAs,
    dir: PathBuf,
    port: u16,
    /// TLS and the rules that ask for it, when started [`secured`](PostgresServer::start_secured).
    secured: bool,
    child: Mutex<Option<Child>>,
    /// Dropped after the server's own `drop` has killed it and removed its copy.
    _template: TemplateLease,
}

impl PostgresServer {
    /// Starts a server on a free loopback port and waits until it accepts connections.
    pub async fn start() -> Result<Self, HarnessError> {
        Self::start_as(None).await
    }

    /// As [`start`](Self::start), with TLS on (`cert_pem` and `key_pem` the server's
    /// certificate and key; client certificates checked against `ca_pem`) and every user but
    /// the harness's own (`coord`, trusted, for its controls) required to come over TLS: the
    /// user `certified` with a client certificate whose common name is `certified`, any other
    /// with a password (SCRAM). Create users with [`create_user`](Self::create_user).
    pub async fn start_secured(
        cert_pem: &str,
        key_pem: &str,
        ca_pem: &str,
    ) -> Result<Self, HarnessError> {
        Self::start_as(Some((cert_pem, key_pem, ca_pem))).await
    }

    async fn start_as(tls: Option<(&str, &str, &str)>) -> Result<Self, HarnessError> {
        use std::sync::atomic::{AtomicU32, Ordering};
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let bin = postgres_bin_dir()?;
        let run_as = RunAs::find()?;
        let (template, lease) = {
            let bin = bin.clone();
            tokio::task::spawn_blocking(move || template(&bin, run_as))
                .await
                .map_err(|e| HarnessError::Io(std::io::Error::other(e)))??
        };
        let dir = data_root().join(format!(
            "{DIR_PREFIX}{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        run_as.own(&dir)?;
        let out = Command::new("cp")
            .arg("-a")
            .arg(&template)
            .arg(dir.join("data"))
            .output()?;
        if !out.status.success() {
            return Err(HarnessError::Failed {
                step: "copying the template data directory",
                log: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        }
        if let Some((cert, key, ca)) = tls {
            let files = [
                ("server.crt", cert),
                ("server.key", key),
                ("root.crt", ca),
                ("pg_hba.conf", HBA_SECURED),
            ];
            for (name, text) in files {
                let path = dir.join(name);
                std::fs::write(&path, text)?;
                run_as.own(&path)?;
                // PostgreSQL refuses a key others can read.
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
            }
        }
        let server = PostgresServer {
            bin,
            run_as,
            dir,
            secured: tls.is_some(),
            port: process::free_port()?,
            child: Mutex::new(None),
            _template: lease,
        };
        server.launch().await?;
        Ok(server)
    }

    async fn launch(&self) -> Result<(), HarnessError> {
        let log = std::fs::File::create(self.dir.join("server.log"))?;
        self.run_as.own(&self.dir.join("server.log"))?;
        let mut cmd = self.run_as.command(self.bin.join("postgres"))?;
        cmd.arg("-D")
            .arg(self.dir.join("data"))
            .args(["-p", &self.port.to_string(), "-k"])
            .arg(&self.dir)
            // Loopback only; durability to the OS is enough for tests that kill the server
            // (a kill -9 loses nothing the kernel holds).
            .args(["-c", "listen_addresses=127.0.0.1"])
            .args(["-c", "fsync=off", "-c", "full_page_writes=off"])
            .args(["-c", "max_connections=400", "-c", "shared_buffers=16MB"])
            // Dynamic shared memory in the data directory, not /dev/shm: a killed server's
            // segments go with its directory.
            .args(["-c", "dynamic_shared_memory_type=mmap"]);
        if self.secured {
            let file = |name: &str| self.dir.join(name).display().to_string();
            cmd.args(["-c", "ssl=on"])
                .args(["-c", &format!("ssl_cert_file={}", file("server.crt"))])
                .args(["-c", &format!("ssl_key_file={}", file("server.key"))])
                .args(["-c", &format!("ssl_ca_file={}", file("root.crt"))])
                .args(["-c", &format!("hba_file={}", file("pg_hba.conf"))]);
        }
        cmd.stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let child = process::spawn(cmd)?;
        *self.child.lock().unwrap_or_else(|p| p.into_inner()) = Some(child);
        self.wait_ready(Duration::from_secs(30)).await
    }

    async fn wait_ready(&self, bound: Duration) -> Result<(), HarnessError> {
        let until = Instant::now() + bound;
        let pg: tokio_postgres::Config = self.connection().parse().expect("our own string");
        loop {
            if let Ok((client, conn)) = pg.connect(tokio_postgres::NoTls).await {
                let driver = tokio::spawn(conn);
                let ok = client.simple_query("SELECT 1").await.is_ok();
                drop(client);
                let _ = driver.await;
                if ok {
                    return Ok(());
                }
            }
            let exited = self
                .child
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_mut()
                .is_some_and(|c| matches!(c.try_wait(), Ok(Some(_))));
            if exited || Instant::now() >= until {
                return Err(HarnessError::Failed {
                    step: if exited {
                        "postgres (it exited)"
                    } else {
                        "postgres (not ready in 30 s)"
                    },
                    log: std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default(),
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The server's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A libpq-style connection string for the server (user `coord`, trusted).
    pub fn connection(&self) -> String {
        self.connection_to(self.port)
    }

    /// The same connection string through another port (a proxy's).
    pub fn connection_to(&self, port: u16) -> String {
        format!("host=127.0.0.1 port={port} user=coord dbname=postgres connect_timeout=5")
    }

    /// The store's settings for this server: the defaults, but for progress notifications
    /// every second (as the etcd harness sets its members), so tests of them take seconds.
    pub fn config(&self) -> PostgresConfig {
        PostgresConfig::new(self.connection()).with_progress_notify_interval(Duration::from_secs(1))
    }

    /// A store connected to this server.
    pub async fn store(&self) -> PostgresStore {
        PostgresStore::connect(self.config())
            .await
            .unwrap_or_else(|e| panic!("cannot connect to the test's PostgreSQL: {e:?}"))
    }

    fn pid(&self) -> Option<u32> {
        self.child
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(Child::id)
    }

    /// The postmaster and the processes it started (backends, background workers).
    fn processes(&self) -> Vec<String> {
        let Some(pid) = self.pid() else {
            return Vec::new();
        };
        let children =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        std::iter::once(pid.to_string())
            .chain(children.split_whitespace().map(str::to_owned))
            .collect()
    }

    /// Sends `signal` to the postmaster and every process it started: a signal to the
    /// postmaster alone would leave its backends answering their connections.
    fn signal(&self, signal: &str) {
        let processes = self.processes();
        if !processes.is_empty() {
            // A backend may have exited since it was listed: nothing to report.
            let _ = Command::new("kill")
                .arg(signal)
                .args(&processes)
                .stderr(Stdio::null())
                .status();
        }
    }

    /// kill -9 of the server and every process it started, as a crash of its machine: a
    /// backend left alone would go on answering its connection until it noticed.
    pub fn kill(&self) {
        self.signal("-KILL");
        if let Some(mut child) = self.child.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = child.wait();
            remove_shared_memory(&self.dir.join("data"));
        }
    }

    /// Starts the server again on the same data and port (after [`kill`](Self::kill)).
    pub async fn restart(&self) -> Result<(), HarnessError> {
        self.kill();
        // The killed postmaster's backends hold its shared memory until they exit.
        let until = Instant::now() + Duration::from_secs(10);
        while self.dir.join("data/postmaster.pid").exists() && Instant::now() < until {
            let _ = std::fs::remove_file(self.dir.join("data/postmaster.pid"));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.launch().await
    }

    /// SIGSTOP of the server and its backends, as a frozen machine: connections are accepted
    /// by the kernel and nothing answers.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// SIGCONT of the server and its backends, after [`pause`](Self::pause).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    /// A session of the harness's own user (a superuser) beside the store, for a test's own
    /// statements; its connection is driven until the client is dropped.
    pub async fn admin(&self) -> Result<tokio_postgres::Client, HarnessError> {
        let pg: tokio_postgres::Config = self.connection().parse().expect("our own string");
        let (client, conn) =
            pg.connect(tokio_postgres::NoTls)
                .await
                .map_err(|e| HarnessError::Failed {
                    step: "an admin session",
                    log: e.to_string(),
                })?;
        tokio::spawn(conn);
        Ok(client)
    }

    /// Creates a user that logs in with `password` and may create coord's tables.
    pub async fn create_user(&self, name: &str, password: &str) -> Result<(), HarnessError> {
        let client = self.admin().await?;
        // Names and passwords are the test's own: quoted, not escaped.
        let sql = format!(
            "CREATE ROLE \"{name}\" LOGIN PASSWORD '{password}'; \
             GRANT CREATE ON SCHEMA public TO \"{name}\""
        );
        client
            .batch_execute(&sql)
            .await
            .map_err(|e| HarnessError::Failed {
                step: "creating a user",
                log: e.to_string(),
            })
    }

    /// Terminates every client backend but this call's own (`pg_terminate_backend`), as an
    /// operator or a failover would.
    pub async fn terminate_backends(&self) -> Result<u64, HarnessError> {
        let pg: tokio_postgres::Config = self.connection().parse().expect("our own string");
        let failed = |e: tokio_postgres::Error| HarnessError::Failed {
            step: "pg_terminate_backend",
            log: e.to_string(),
        };
        let (client, conn) = pg.connect(tokio_postgres::NoTls).await.map_err(failed)?;
        let driver = tokio::spawn(conn);
        let row = client
            .query_one(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity \
                 WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()",
                &[],
            )
            .await
            .map_err(failed)?;
        drop(client);
        let _ = driver.await;
        Ok(row.get::<_, i64>(0) as u64)
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        self.resume();
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
