//! The simulator served as a cluster of etcd members under turmoil: one store (one
//! linearizable state machine, as raft makes of etcd's members), served by each member from
//! a turmoil host of its own, so that a client holds a connection per member and a member
//! can crash, restart, stall, answer late or be cut off from its peers while the others
//! serve. What each member answers meanwhile follows etcd 3.5 or 3.4, as chosen (see the
//! `members` module); the store itself, its
//! clock and the faults on it run on one more host, which never fails.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;

use super::members::{EtcdVersion, Members};
use super::net::incoming_until;
use super::{Clients, DurableStore, EtcdService, ETCD_PORT};
use crate::{LessorSnapshot, SimConfig, SimStore};
use tokio_util::sync::CancellationToken;

type Job = Box<dyn FnOnce(SimStore) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

type Init = Arc<dyn Fn(&SimStore) + Send + Sync>;

/// Builds a [`SimCluster`] on a turmoil simulation.
pub struct ClusterBuilder {
    members: usize,
    prefix: String,
    config: SimConfig,
    election_timeout: Duration,
    version: EtcdVersion,
    clients: Clients,
    init: Option<Init>,
}

impl std::fmt::Debug for ClusterBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterBuilder")
            .field("members", &self.members)
            .field("prefix", &self.prefix)
            .field("election_timeout", &self.election_timeout)
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

impl ClusterBuilder {
    /// How many members (3 by default).
    pub fn members(mut self, n: usize) -> Self {
        self.members = n.max(1);
        self
    }

    /// The members' hosts are `{prefix}0`, `{prefix}1`, ... (`etcd` by default); the
    /// store's own host is `{prefix}-raft`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The store's configuration.
    pub fn config(mut self, config: SimConfig) -> Self {
        self.config = config;
        self
    }

    /// The members' election timeout (etcd's default, 1 s, by default): how long a member
    /// follows a leader it cannot hear, and what a new leader adds to every lease.
    pub fn election_timeout(mut self, et: Duration) -> Self {
        self.election_timeout = et;
        self
    }

    /// Which etcd the members answer as, where clients can tell (3.5 by default).
    pub fn version(mut self, version: EtcdVersion) -> Self {
        self.version = version;
        self
    }

    /// Serves a peer listed in `clients` through its own store client (see
    /// [`EtcdService::with_clients`]).
    pub fn clients(mut self, clients: Clients) -> Self {
        self.clients = clients;
        self
    }

    /// Runs `init` on the store once, when it is created (a journal, say), before any member
    /// serves it.
    pub fn on_create(mut self, init: impl Fn(&SimStore) + Send + Sync + 'static) -> Self {
        self.init = Some(Arc::new(init));
        self
    }

    /// Adds the store's host and the members' hosts to `sim`.
    pub fn add_to(self, sim: &mut turmoil::Sim<'_>) -> SimCluster {
        let (jobs, rx) = mpsc::unbounded_channel::<Job>();
        let rx = Arc::new(Mutex::new(Some(rx)));
        let cluster = SimCluster {
            members: Members::new(self.members, self.election_timeout, self.version),
            store: DurableStore::default(),
            names: (0..self.members)
                .map(|i| format!("{}{i}", self.prefix))
                .collect(),
            jobs,
            stale_lessor: Arc::default(),
        };
        let (durable, config, init) = (cluster.store.clone(), self.config, self.init);
        sim.host(format!("{}-raft", self.prefix), move || {
            let (durable, config, init, rx) =
                (durable.clone(), config.clone(), init.clone(), rx.clone());
            async move {
                let store = SimStore::with_config(config);
                store.count_in_simulated_time();
                if let Some(init) = init {
                    init(&store);
                }
                *durable.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(store.clone());
                let taken = rx.lock().unwrap_or_else(|p| p.into_inner()).take();
                let Some(mut rx) = taken else {
                    return Err("the store's host of a SimCluster cannot restart".into());
                };
                while let Some(job) = rx.recv().await {
                    tokio::spawn(job(store.clone()));
                }
                Ok(())
            }
        });
        for (i, name) in cluster.names.iter().enumerate() {
            let (durable, members, clients) = (
                cluster.store.clone(),
                cluster.members.clone(),
                self.clients.clone(),
            );
            sim.host(name.as_str(), move || {
                let (durable, members, clients) =
                    (durable.clone(), members.clone(), clients.clone());
                async move {
                    let store = loop {
                        if let Some(s) = durable.get() {
                            break s;
                        }
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    };
                    let service =
                        EtcdService::with_clients(store, clients).member_of(members.clone(), i);
                    let mut changes = members.subscribe();
                    loop {
                        while !members.is_up(i) {
                            changes.changed().await?;
                        }
                        // A killed member's listener closes (new connections are refused)
                        // and its connections drop; a restart listens anew.
                        let kill = CancellationToken::new();
                        let serving = service
                            .clone()
                            .serve(incoming_until(ETCD_PORT, Some(kill.clone())));
                        tokio::select! {
                            served = serving => return Ok(served?),
                            _ = async {
                                while members.is_up(i) {
                                    if changes.changed().await.is_err() {
                                        std::future::pending::<()>().await;
                                    }
                                }
                            } => kill.cancel(),
                        }
                    }
                }
            });
        }
        cluster
    }
}

/// A simulated etcd cluster on a turmoil simulation: see the module docs. Its faults are
/// called between the simulation's steps, with the simulation at hand.
///
/// ```no_run
/// use coord_sim::grpc::SimCluster;
///
/// let mut sim = turmoil::Builder::new().build();
/// let cluster = SimCluster::builder().members(3).add_to(&mut sim);
/// // Clients connect to `cluster.host(i)` on `ETCD_PORT`; between steps:
/// cluster.kill(&sim, 0);
/// sim.step().unwrap();
/// cluster.restart(0);
/// ```
#[derive(Clone)]
pub struct SimCluster {
    members: Members,
    store: DurableStore,
    names: Vec<String>,
    jobs: mpsc::UnboundedSender<Job>,
    /// A stalled raft leader's view of the leases, for its resume on etcd 3.4.
    stale_lessor: Arc<Mutex<Option<(usize, LessorSnapshot)>>>,
}

impl std::fmt::Debug for SimCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimCluster")
            .field("members", &self.names)
            .finish_non_exhaustive()
    }
}

impl SimCluster {
    /// A builder: three members named `etcd0` to `etcd2`, etcd's 1 s election timeout,
    /// answering as etcd 3.5.
    pub fn builder() -> ClusterBuilder {
        ClusterBuilder {
            members: 3,
            prefix: "etcd".to_owned(),
            config: SimConfig::default(),
            election_timeout: Duration::from_secs(1),
            version: EtcdVersion::default(),
            clients: Clients::default(),
            init: None,
        }
    }

    /// How many members.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Whether there are none (never: a cluster has at least one member).
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// Member `i`'s host name; it serves on [`ETCD_PORT`].
    pub fn host(&self, i: usize) -> &str {
        &self.names[i]
    }

    /// The store, once its host has started (for checks and faults from outside the
    /// network; what changes it must run on its host: [`on_store`](Self::on_store)).
    pub fn store(&self) -> Option<SimStore> {
        self.store.get()
    }

    /// Runs `job` on the store's own host, on its clock: a fault on the store (an
    /// operator's revoke, a compaction storm, a crash).
    pub fn on_store<F, Fut>(&self, job: F)
    where
        F: FnOnce(SimStore) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let _ = self.jobs.send(Box::new(move |s| Box::pin(job(s))));
    }

    /// The raft leader at the simulation's time, if one is elected.
    pub fn leader(&self, sim: &turmoil::Sim<'_>) -> Option<usize> {
        self.members.leader(sim.elapsed())
    }

    /// Whether member `i` is up.
    pub fn is_up(&self, i: usize) -> bool {
        self.members.is_up(i)
    }

    /// A new leader refreshes every lease to its TTL plus an election timeout, from when it
    /// is elected (etcd's lessor promotion).
    fn promote_at(&self, elected_at: Duration) {
        let et = self.members.election_timeout();
        self.on_store(move |store| async move {
            let now = turmoil::sim_elapsed().unwrap_or_default();
            store.promote((elected_at + et).saturating_sub(now));
        });
    }

    /// Fault: member `i` is killed: its connections drop and new ones are refused. If it led,
    /// the others follow it for an election timeout (a proposal forwarded to it meanwhile is
    /// lost), then elect the next one, which refreshes every lease.
    pub fn kill(&self, sim: &turmoil::Sim<'_>, i: usize) {
        if let Some(at) = self.members.kill(i, sim.elapsed()) {
            self.promote_at(at);
        }
    }

    /// Member `i` starts again on its data and follows the leader.
    pub fn restart(&self, i: usize) {
        self.members.restart(i);
    }

    /// Fault: member `i` is cut off from the others, while clients still reach it. It follows
    /// its leader for an election timeout, then knows it has none: it refuses require-leader
    /// requests with `no leader` and ends its require-leader streams three election timeouts
    /// later; it holds every other request until etcd's request timeout; its watchers see
    /// nothing new. If it led, the others elect a new leader.
    pub fn isolate(&self, sim: &turmoil::Sim<'_>, i: usize) {
        if let Some(at) = self.members.isolate(i, sim.elapsed()) {
            self.promote_at(at);
        }
    }

    /// Ends [`isolate`](Self::isolate): the member rejoins. On etcd 3.4, its term raised by
    /// its lone campaigns, it forces an election (no pre-vote); on 3.5 it follows the leader.
    pub fn rejoin(&self, sim: &turmoil::Sim<'_>) {
        if let Some(at) = self.members.rejoin(sim.elapsed()) {
            self.promote_at(at);
        }
    }

    /// Fault: member `i` stalls (SIGSTOP, a long GC or a stuck disk): it keeps accepting
    /// connections and what is sent on them, and answers nothing (no reply, no status, no
    /// watch event, no keep-alive answer) until [`thaw`](Self::thaw), when it answers all of
    /// it. A write whose client gave up on it meanwhile is applied at the thaw one draw in
    /// three, as etcd's race between the request and the reset goes. Its peers count it gone:
    /// if it led, they elect another after an election timeout, which refreshes every lease.
    pub fn stall(&self, sim: &turmoil::Sim<'_>, i: usize) {
        if let Some(at) = self.members.stall(i, sim.elapsed()) {
            if self.members.version().revokes_on_resume() {
                // What the stalled leader's lessor knows, kept for its resume.
                let lessor = self.stale_lessor.clone();
                self.on_store(move |store| async move {
                    let snapshot = store.lessor_snapshot();
                    *lessor.lock().unwrap_or_else(|p| p.into_inner()) = Some((i, snapshot));
                });
            }
            self.promote_at(at);
        }
    }

    /// Ends [`stall`](Self::stall): member `i` answers what it was sent meanwhile, and
    /// follows the current leader. On etcd 3.4 a leader that was replaced while stalled
    /// first revokes every lease it saw overdue, however its successor renewed them
    /// (etcd#15247): their keys go, journalled as [`Origin::StaleLeader`](crate::journal::Origin::StaleLeader).
    pub fn thaw(&self, i: usize) {
        let Some(successor_led_at) = self.members.thaw(i) else {
            return;
        };
        let snapshot = self
            .stale_lessor
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let Some((_, snapshot)) = snapshot.filter(|(m, _)| *m == i) else {
            return;
        };
        self.on_store(move |store| async move {
            // Thawed before its successor led: it still leads, and its view is the truth.
            if turmoil::sim_elapsed().unwrap_or_default() >= successor_led_at {
                store.revoke_as_stale_leader(&snapshot);
            }
        });
    }

    /// Fault: member `i` answers `late` late (zero: on time again): every reply, status and
    /// stream message, while its peers see nothing wrong (a slow link or a slow disk on its
    /// client side).
    pub fn slow(&self, i: usize, late: Duration) {
        self.members.slow(i, late);
    }

    /// Fault: leadership handed to member `to` (`etcdctl move-leader`); it refreshes every
    /// lease. Returns whether it moved (not during an election, a cut-off or to the leader).
    pub fn transfer_leader(&self, sim: &turmoil::Sim<'_>, to: usize) -> bool {
        let moved = self.members.transfer(to, sim.elapsed());
        if moved {
            self.promote_at(sim.elapsed());
        }
        moved
    }

    /// Fault: every member down at once, the store's data kept (a power cut): nothing
    /// answers and no lease expires until [`restart_all`](Self::restart_all).
    pub fn crash_all(&self) {
        self.on_store(|store| async move { store.crash() });
        self.members.set_all_up(false);
    }

    /// Ends [`crash_all`](Self::crash_all): every member back, every lease refreshed to its
    /// TTL plus an election timeout.
    pub fn restart_all(&self) {
        let et = self.members.election_timeout();
        self.on_store(move |store| async move { store.restart(et) });
        self.members.set_all_up(true);
    }
}
