//! Real etcd processes for tests: one member or a cluster, on free loopback ports.

use std::fs::File;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use coord_api::testkit::process;
use coord_api::{KvLeaseStore, LeaseId, Limits};
use tokio::time::Instant;

use super::peer_proxy::{Isolation, PeerProxy};
use crate::{EtcdConfig, EtcdStore};

mod faults;

/// Why the harness could not give a test its etcd.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HarnessError {
    /// No etcd binary to run.
    #[error(
        "etcd not found: set ETCD_BIN, or put etcd on PATH (Debian: apt-get install etcd-server)"
    )]
    EtcdNotFound,
    /// No `setpriv`, which ties each etcd process's life to the test process's.
    #[error(
        "setpriv not found on PATH: the harness runs etcd under `setpriv --pdeathsig KILL` so \
         that no etcd outlives a killed test (Debian: apt-get install util-linux)"
    )]
    SetprivNotFound,
    /// A member did not become ready in time; `log` is the end of its log.
    #[error("etcd member {member} did not become ready within {waited:?}; its log ends:\n{log}")]
    NotReady {
        /// The member's index.
        member: usize,
        /// How long the harness waited.
        waited: Duration,
        /// The end of the member's log.
        log: String,
    },
    /// A request the harness made of the cluster (membership, leadership) failed.
    #[error("etcd harness: {0}")]
    Admin(String),
    /// Starting a process or creating a directory failed.
    #[error("etcd harness: {0}")]
    Io(#[from] std::io::Error),
}

/// The members' data directories are `<temp>/coord-etcd-<test pid>-<random>`.
const DIR_PREFIX: &str = "coord-etcd-";

/// Finds the etcd binary: `ETCD_BIN`, else `etcd` on `PATH`.
pub fn etcd_binary() -> Result<PathBuf, HarnessError> {
    if let Some(bin) = std::env::var_os("ETCD_BIN") {
        let p = PathBuf::from(bin);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(HarnessError::EtcdNotFound)
        };
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("etcd"))
        .find(|p| p.is_file())
        .ok_or(HarnessError::EtcdNotFound)
}

/// TLS for the members' client port: PEM files the members read.
#[derive(Debug, Clone)]
pub struct ServerTls {
    /// The server certificate (its names must include 127.0.0.1).
    pub cert_file: PathBuf,
    /// The server certificate's key.
    pub key_file: PathBuf,
    /// The CA that signs client certificates.
    pub ca_file: PathBuf,
    /// Require and verify client certificates (`--client-cert-auth`).
    pub client_cert_auth: bool,
}

/// How to start a cluster; see [`EtcdCluster::builder`].
#[derive(Debug, Clone)]
pub struct EtcdClusterBuilder {
    members: usize,
    fast_elections: bool,
    progress_notify_interval: Duration,
    extra_args: Vec<String>,
    server_tls: Option<ServerTls>,
    client_tls: Option<crate::TlsConfig>,
    peer_proxies: bool,
}

impl EtcdClusterBuilder {
    /// How many members (1 or 3 make sense).
    pub fn members(mut self, n: usize) -> Self {
        self.members = n.max(1);
        self
    }

    /// Heartbeat 25 ms and election timeout 250 ms, for failover in about 0.3 s instead of
    /// 1-2 s. It also lowers etcd's minimum lease TTL to 1 s.
    pub fn fast_elections(mut self, on: bool) -> Self {
        self.fast_elections = on;
        self
    }

    /// Serve clients over TLS; the harness itself connects with `client` (which must trust
    /// the server, and carry a client certificate if the server requires one).
    pub fn tls(mut self, server: ServerTls, client: crate::TlsConfig) -> Self {
        self.server_tls = Some(server);
        self.client_tls = Some(client);
        self
    }

    /// Put a proxy on each member's peer port, so that a test can cut one member off from the
    /// others while its clients still reach it ([`EtcdCluster::isolate`]).
    pub fn peer_proxies(mut self, on: bool) -> Self {
        self.peer_proxies = on;
        self
    }

    /// How often idle watches that ask for progress notifications get one (default 1 s, for
    /// tests that wait on them; etcd's own default is 10 minutes).
    pub fn progress_notify_interval(mut self, every: Duration) -> Self {
        self.progress_notify_interval = every;
        self
    }

    /// Extra command-line flags for every member.
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.extra_args.push(arg.into());
        self
    }

    /// Starts the members and waits until the cluster serves linearizable reads.
    pub async fn start(self) -> Result<EtcdCluster, HarnessError> {
        // Another process can still take a port between our check and etcd's bind: then try
        // again on other ports.
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.clone().start_once().await {
                Err(e) if attempt < 5 && e.to_string().contains("address already in use") => {}
                other => return other,
            }
        }
    }

    async fn start_once(self) -> Result<EtcdCluster, HarnessError> {
        let bin = etcd_binary()?;
        process::remove_orphaned_dirs(DIR_PREFIX);
        let dir = tempfile::Builder::new()
            .prefix(&format!("{DIR_PREFIX}{}-", std::process::id()))
            .tempdir()?;
        let isolation = Isolation::new();
        let mut members = Vec::with_capacity(self.members);
        let mut peer_proxies = Vec::new();
        for i in 0..self.members {
            let peer_listen_port = process::free_port()?;
            let peer_port = if self.peer_proxies {
                let target = ([127, 0, 0, 1], peer_listen_port).into();
                let proxy = PeerProxy::start(i, target, isolation.clone()).await?;
                let port = proxy.port();
                peer_proxies.push(proxy);
                port
            } else {
                peer_listen_port
            };
            members.push(Member {
                name: format!("m{i}"),
                client_port: process::free_port()?,
                peer_port,
                peer_listen_port,
                child: Mutex::new(None),
            });
        }
        let mut limits = Limits::ETCD_DEFAULTS;
        limits.progress_notify_interval = self.progress_notify_interval;
        if self.fast_elections {
            limits.min_lease_ttl = Duration::from_secs(1);
        }
        let cluster = EtcdCluster {
            bin,
            dir,
            members,
            builder: self,
            limits,
            isolation,
            _peer_proxies: peer_proxies,
        };
        for i in 0..cluster.members.len() {
            cluster.spawn(i, true)?;
        }
        for i in 0..cluster.members.len() {
            cluster.wait_ready(i, Duration::from_secs(30)).await?;
        }
        if cluster.builder.peer_proxies {
            cluster.learn_member_ids().await?;
        }
        Ok(cluster)
    }
}

#[derive(Debug)]
struct Member {
    name: String,
    client_port: u16,
    /// The peer port the member advertises (its proxy's, with peer proxies).
    peer_port: u16,
    /// The peer port the member listens on.
    peer_listen_port: u16,
    child: Mutex<Option<Child>>,
}

/// Real etcd members on loopback ports, in a temporary directory, killed (SIGKILL) and
/// removed when dropped, even when the test panics. The counterpart of Curator's
/// `TestingServer`/`TestingCluster`.
///
/// ```no_run
/// # async fn t() -> Result<(), Box<dyn std::error::Error>> {
/// use coord_etcd::testing::EtcdCluster;
/// let cluster = EtcdCluster::single().await?;
/// let store = cluster.store().await;
/// cluster.kill(0);
/// cluster.restart(0).await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct EtcdCluster {
    bin: PathBuf,
    dir: tempfile::TempDir,
    members: Vec<Member>,
    builder: EtcdClusterBuilder,
    limits: Limits,
    isolation: Isolation,
    _peer_proxies: Vec<PeerProxy>,
}

impl EtcdCluster {
    /// A builder: one member, etcd's default timing, progress notifications every second.
    pub fn builder() -> EtcdClusterBuilder {
        EtcdClusterBuilder {
            members: 1,
            fast_elections: false,
            progress_notify_interval: Duration::from_secs(1),
            extra_args: Vec::new(),
            server_tls: None,
            client_tls: None,
            peer_proxies: false,
        }
    }

    /// One member with etcd's default timing.
    pub async fn single() -> Result<Self, HarnessError> {
        Self::builder().start().await
    }

    /// Three members with fast elections.
    pub async fn three() -> Result<Self, HarnessError> {
        Self::builder()
            .members(3)
            .fast_elections(true)
            .start()
            .await
    }

    /// How many members the cluster has.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Always false: a cluster has at least one member.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Member `i`'s client endpoint: `127.0.0.1:port`, or `https://127.0.0.1:port` with TLS.
    pub fn endpoint(&self, i: usize) -> String {
        match self.builder.server_tls {
            Some(_) => format!("https://127.0.0.1:{}", self.members[i].client_port),
            None => format!("127.0.0.1:{}", self.members[i].client_port),
        }
    }

    /// Every member's client endpoint.
    pub fn endpoints(&self) -> Vec<String> {
        (0..self.members.len()).map(|i| self.endpoint(i)).collect()
    }

    /// The limits this cluster runs with.
    pub fn limits(&self) -> Limits {
        self.limits.clone()
    }

    /// A configuration for every member, with the cluster's limits and short timeouts.
    pub fn config(&self) -> EtcdConfig {
        let config = EtcdConfig::new(self.endpoints())
            .with_limits(self.limits())
            .with_connect_timeout(Duration::from_secs(1))
            .with_request_timeout(Duration::from_secs(5));
        match &self.builder.client_tls {
            Some(tls) => config.with_tls(tls.clone()),
            None => config,
        }
    }

    /// A store connected to every member.
    ///
    /// # Panics
    /// If no member answers.
    pub async fn store(&self) -> EtcdStore {
        EtcdStore::connect(self.config())
            .await
            .expect("connect to the test cluster")
    }

    /// The directory holding the members' data and logs.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn log_path(&self, i: usize) -> PathBuf {
        self.dir
            .path()
            .join(format!("{}.log", self.members[i].name))
    }

    fn spawn(&self, i: usize, new: bool) -> Result<(), HarnessError> {
        let m = &self.members[i];
        let peer = |m: &Member| format!("http://127.0.0.1:{}", m.peer_port);
        let scheme = if self.builder.server_tls.is_some() {
            "https"
        } else {
            "http"
        };
        let client = format!("{scheme}://127.0.0.1:{}", m.client_port);
        let initial: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("{}={}", m.name, peer(m)))
            .collect();
        let mut cmd = process::command(&self.bin, &[]).ok_or(HarnessError::SetprivNotFound)?;
        cmd.arg("--name")
            .arg(&m.name)
            .arg("--data-dir")
            .arg(self.dir.path().join(&m.name))
            .arg("--listen-client-urls")
            .arg(&client)
            .arg("--advertise-client-urls")
            .arg(&client)
            .arg("--listen-peer-urls")
            .arg(format!("http://127.0.0.1:{}", m.peer_listen_port))
            .arg("--initial-advertise-peer-urls")
            .arg(peer(m))
            .arg("--initial-cluster")
            .arg(initial.join(","))
            .arg("--initial-cluster-state")
            .arg(if new { "new" } else { "existing" })
            .arg("--initial-cluster-token")
            .arg(format!("coord-{}", self.members[0].peer_port))
            // Test data need not survive a power cut; fsync would dominate the run time.
            .arg("--unsafe-no-fsync")
            .arg("--logger")
            .arg("zap")
            .arg("--log-level")
            .arg("warn")
            .arg(format!(
                "--experimental-watch-progress-notify-interval={}ms",
                self.builder.progress_notify_interval.as_millis()
            ));
        if self.builder.fast_elections {
            cmd.args(["--heartbeat-interval", "25", "--election-timeout", "250"]);
        }
        if let Some(tls) = &self.builder.server_tls {
            cmd.arg("--cert-file")
                .arg(&tls.cert_file)
                .arg("--key-file")
                .arg(&tls.key_file)
                .arg("--trusted-ca-file")
                .arg(&tls.ca_file);
            if tls.client_cert_auth {
                cmd.arg("--client-cert-auth");
            }
        }
        cmd.args(&self.builder.extra_args);
        let log = File::options()
            .create(true)
            .append(true)
            .open(self.log_path(i))?;
        cmd.stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log));
        let child = process::spawn(cmd)?;
        *m.child.lock().unwrap_or_else(|p| p.into_inner()) = Some(child);
        Ok(())
    }

    fn log_tail(&self, i: usize) -> String {
        let text = std::fs::read_to_string(self.log_path(i)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// What member `i`'s log says of its death: from its first panic on (Go prints the
    /// goroutine's stack after it, the cause first), or else its last lines.
    fn log_of_death(&self, i: usize) -> String {
        let text = std::fs::read_to_string(self.log_path(i)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        match lines.iter().position(|l| l.contains("panic")) {
            // zap's structured line carries the whole stack on one line: its start says it.
            Some(at) => lines[at..lines.len().min(at + 12)]
                .iter()
                .map(|l| l.chars().take(400).collect::<String>())
                .collect::<Vec<_>>()
                .join("\n"),
            None => self.log_tail(i),
        }
    }

    /// The exit status of member `i` if it ended without the harness killing it.
    fn died_on_its_own(&self, i: usize) -> Option<std::process::ExitStatus> {
        let mut guard = self.members[i]
            .child
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        guard.as_mut()?.try_wait().ok().flatten()
    }

    fn exited(&self, i: usize) -> bool {
        let mut guard = self.members[i]
            .child
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        match guard.as_mut() {
            Some(c) => c.try_wait().ok().flatten().is_some(),
            None => true,
        }
    }

    /// Waits until member `i` serves a linearizable read (so it has a leader).
    pub async fn wait_ready(&self, i: usize, bound: Duration) -> Result<(), HarnessError> {
        let start = Instant::now();
        let mut config = EtcdConfig::new([self.endpoint(i)])
            .with_limits(self.limits())
            .with_connect_timeout(Duration::from_millis(500))
            .with_request_timeout(Duration::from_millis(500));
        if let Some(tls) = &self.builder.client_tls {
            config = config.with_tls(tls.clone());
        }
        loop {
            if let Ok(store) = EtcdStore::connect(config.clone()).await {
                if store
                    .get(coord_api::GetRequest::key(vec![0u8]))
                    .await
                    .is_ok()
                {
                    return Ok(());
                }
            }
            if self.exited(i) || start.elapsed() > bound {
                return Err(HarnessError::NotReady {
                    member: i,
                    waited: start.elapsed(),
                    log: self.log_tail(i),
                });
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    fn pid(&self, i: usize) -> Option<u32> {
        self.members[i]
            .child
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(Child::id)
    }
}
impl Drop for EtcdCluster {
    fn drop(&mut self) {
        // A member that died on its own (no `kill` took its child) leaves the only account
        // of why in its log, which goes with the directory: print it where the failing
        // test's output shows it.
        for i in 0..self.members.len() {
            if let Some(status) = self.died_on_its_own(i) {
                eprintln!(
                    "etcd member {} exited on its own ({status}); its log says:\n{}",
                    self.members[i].name,
                    self.log_of_death(i)
                );
            }
        }
        // SIGKILL, not SIGTERM: a member of a cluster that lost quorum takes seconds to
        // shut down gracefully (docs/ETCD-BEHAVIOUR.md 4.1), and a paused member dies just the same.
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}

/// Whether every thread of process `pid` is stopped by a signal (state `T` in
/// `/proc/<pid>/task/*/stat`); false when that cannot be read.
fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    let mut any = false;
    for task in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            return false;
        };
        // `pid (comm) state ...`: the state follows the last ')', comm may hold anything.
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next());
        if !matches!(state, Some("T" | "t")) {
            return false;
        }
        any = true;
    }
    any
}
