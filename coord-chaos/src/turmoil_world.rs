//! The turmoil world: each node a turmoil host running its service on the production
//! `EtcdStore` (etcd-client, tonic, h2) over turmoil's simulated TCP, against the simulator
//! served as an etcd cluster (`Scenario::members` members, each a host of its own; every
//! node's store knows them all, starting from a different one). Link faults are turmoil's
//! (partitions both ways and one way, holds, link latency, between the node and every
//! member); node crashes are turmoil crashes and bounces; member faults and store-side faults
//! are the cluster's.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use coord_api::sync::{watch, Stop};
use coord_etcd::{member_dialer, EtcdConfig, EtcdStore};
use coord_sim::grpc::{dial_as, Clients, EtcdVersion, SimCluster, ETCD_PORT};
use coord_sim::journal::{Entry, Origin};
use coord_sim::{CompactionTask, SimConfig, SimStore};

use crate::driver::{actions, Driver, World};
use crate::fault::{Fault, FaultKind};
use crate::history::{Happening, History, Incarnation};
use crate::inprocess::operate;
use crate::recorder::Recorder;
use crate::scenario::{EtcdRelease, Scenario};
use crate::service::{self, Node, PartStopRequest, Service};

/// Whether a turmoil run can inject `kind`: every kind. (A rolling restart runs two
/// incarnations of one node at once: both are tasks of the node's one turmoil host, which a
/// crash takes down together.)
pub fn turmoil_supports(_kind: FaultKind) -> bool {
    true
}

/// The fault kinds a turmoil run injects.
pub fn turmoil_fault_kinds() -> impl Iterator<Item = FaultKind> {
    FaultKind::ALL.into_iter().filter(|k| turmoil_supports(*k))
}

/// Per node: the live incarnation's way to ask for a part stop.
type PartStops = Arc<Mutex<BTreeMap<usize, service::PartStops>>>;

/// Per node: the reply latency its link is under, which a new incarnation's store client
/// starts with too (turmoil's own link latency goes both ways; slow replies are the store's
/// to make, on the node's client).
type ReplyLatencies = Arc<Mutex<BTreeMap<usize, Duration>>>;

/// Runs `service` on `scenario`'s nodes, each a turmoil host on the production `EtcdStore`
/// with `EtcdConfig`'s defaults (but the scenario's request timeout), under `faults`, from
/// `seed`, and returns the history. The same seed gives the same history when the build seeds
/// tokio's own random choices (`--cfg tokio_unstable`: tonic's server makes unbiased selects).
///
/// # Panics
/// When turmoil fails (a host returned an error).
pub fn simulate_service_turmoil(
    service: Arc<dyn Service>,
    scenario: &Scenario,
    seed: u64,
    faults: &[Fault],
) -> History {
    let scenario = Arc::new(scenario.clone());
    let mut sim = turmoil::Builder::new()
        .rng_seed(seed)
        .tick_duration(scenario.turmoil_tick)
        .simulation_duration(scenario.duration + Duration::from_secs(60))
        .min_message_latency(scenario.latency)
        .max_message_latency(scenario.latency)
        // The store's host takes every node's connections; turmoil's default socket buffer
        // (64 messages) overflows with tens of nodes.
        .tcp_capacity(256 * scenario.hosts.max(1))
        .build();
    if scenario.explore {
        coord_api::hooks::explore::enable(seed);
    }
    let rec = Recorder::turmoil(scenario.turmoil_tick);
    let clients = Clients::default();
    let parts = PartStops::default();
    let slow = ReplyLatencies::default();
    let sink = rec.clone();
    let version = match EtcdRelease::of_run(scenario.etcd_version, seed) {
        EtcdRelease::V3_4 => EtcdVersion::V3_4,
        EtcdRelease::V3_5 => EtcdVersion::V3_5,
    };
    let cluster = SimCluster::builder()
        .members(scenario.members.max(1))
        .election_timeout(scenario.election_timeout)
        .version(version)
        .config(SimConfig::default().with_seed(seed))
        .clients(clients.clone())
        .on_create(move |store| {
            let sink = sink.clone();
            store.on_journal(move |at, e| {
                // What a stale leader revoked on resuming acted as a fault: recorded as one,
                // per lease, when it happened.
                if let Entry::LeaseEnd {
                    lease,
                    origin: Origin::StaleLeader,
                } = &e
                {
                    let fault = Fault {
                        at: turmoil::sim_elapsed().unwrap_or_default(),
                        kind: FaultKind::ResumeRevoke,
                        node: 0,
                        length: Duration::ZERO,
                        pick: lease.0 as u64,
                    };
                    sink.record_at(at, Happening::FaultStart(fault));
                }
                sink.record_at(at, Happening::Store(e));
            });
        })
        .add_to(&mut sim);
    let storms = Storms::default();
    let mut paused = Vec::new();
    let mut nodes = Vec::new();
    for n in 0..scenario.hosts {
        let switch = Arc::new(watch::Sender::new(false));
        paused.push(switch.clone());
        let state = Arc::new(NodeState::default());
        nodes.push(state.clone());
        let host = NodeHost {
            service: service.clone(),
            scenario: scenario.clone(),
            seed,
            rec: rec.clone(),
            cluster: cluster.clone(),
            clients: clients.clone(),
            parts: parts.clone(),
            slow: slow.clone(),
            n,
            state,
            paused: switch,
        };
        host.add(&mut sim);
    }
    let targets = service.operator_prefixes();
    let mut driver = Driver::default();
    let actions = actions(faults, turmoil_supports);
    let mut next = 0;
    let mut healed = false;
    while sim.elapsed() < scenario.duration {
        let now = sim.elapsed();
        let mut world = Turmoil {
            sim: &mut sim,
            scenario: &scenario,
            rec: &rec,
            cluster: &cluster,
            storms: &storms,
            clients: &clients,
            slow: &slow,
            paused: &paused,
            nodes: &nodes,
            parts: &parts,
            targets: &targets,
        };
        if !healed && now >= scenario.heal_at() {
            driver.heal(&mut world, scenario.hosts);
            healed = true;
        }
        while next < actions.len() && actions[next].at <= now {
            driver.apply(&mut world, &actions[next]);
            next += 1;
        }
        if let Err(e) = sim.step() {
            panic!("turmoil failed at {:?}: {e}", sim.elapsed());
        }
    }
    coord_api::hooks::explore::disable();
    rec.take()
}

/// A node across its incarnations, shared by the driver and the node's host.
#[derive(Default)]
struct NodeState {
    /// The next incarnation's number.
    next: AtomicU32,
    /// The incarnations running on the host now (two during a rolling restart): a crash
    /// takes them all.
    live: Mutex<BTreeSet<u32>>,
    /// Counts the rolling restarts asked for; the host's supervisor follows it.
    restarts: tokio::sync::watch::Sender<u32>,
}

impl NodeState {
    fn live(&self) -> std::sync::MutexGuard<'_, BTreeSet<u32>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// An incarnation's stop and readiness, once it has them (after it connected).
type Controls = tokio::sync::watch::Receiver<Option<(Stop, watch::Receiver<bool>)>>;

/// What a node's host needs to start an incarnation, every time turmoil starts it.
#[derive(Clone)]
struct NodeHost {
    service: Arc<dyn Service>,
    scenario: Arc<Scenario>,
    seed: u64,
    rec: Recorder,
    cluster: SimCluster,
    clients: Clients,
    parts: PartStops,
    slow: ReplyLatencies,
    n: usize,
    state: Arc<NodeState>,
    paused: Arc<watch::Sender<bool>>,
}

impl NodeHost {
    fn add(self, sim: &mut turmoil::Sim<'_>) {
        let n = self.n;
        sim.host(format!("n{n}"), move || {
            let host = self.clone();
            async move { host.supervise().await }
        });
    }

    /// The host's software: runs the node's newest incarnation, and on a rolling restart
    /// starts the next one beside it, waits until it is ready (2 TTL at most, as in-process),
    /// then stops every older one. A crash drops the host's runtime, and every incarnation
    /// on it.
    async fn supervise(self) -> turmoil::Result {
        let mut restarts = self.state.restarts.subscribe();
        restarts.mark_unchanged();
        let mut incarnations = tokio::task::JoinSet::new();
        let mut newest = self.start(&mut incarnations);
        let mut older = Vec::new();
        loop {
            tokio::select! {
                done = incarnations.join_next() => match done {
                    Some(Ok(r)) => r?,
                    Some(Err(e)) => return Err(e.into()),
                    None => return Ok(()),
                },
                changed = restarts.changed() => {
                    if changed.is_err() {
                        continue;
                    }
                    older.push(std::mem::replace(&mut newest, self.start(&mut incarnations)));
                    let (mut fresh, stops) = (newest.clone(), older.clone());
                    let wait = self.scenario.ttl * 2;
                    incarnations.spawn(async move {
                        let up = async {
                            let ready = fresh.wait_for(Option::is_some).await.ok()?.clone();
                            let (_, mut ready) = ready?;
                            ready.wait_for(|r| *r).await.ok()
                        };
                        let _ = tokio::time::timeout(wait, up).await;
                        // Every older one, not only this restart's (as in-process).
                        for mut s in stops {
                            if let Ok(c) = s.wait_for(Option::is_some).await {
                                if let Some((stop, _)) = &*c {
                                    stop.stop();
                                }
                            }
                        }
                        Ok(())
                    });
                }
            }
        }
    }

    /// Starts the node's next incarnation as a task in `set`; its controls once it has them.
    fn start(&self, set: &mut tokio::task::JoinSet<Result<(), String>>) -> Controls {
        let who = Incarnation {
            node: self.n,
            inc: self.state.next.fetch_add(1, Ordering::SeqCst),
        };
        self.state.live().insert(who.inc);
        let (controls, seen) = tokio::sync::watch::channel(None);
        let host = self.clone();
        set.spawn(async move {
            // turmoil's error is not `Send`; its text crosses the task.
            let r = host
                .clone()
                .run(who, controls)
                .await
                .map_err(|e| e.to_string());
            host.state.live().remove(&who.inc);
            r
        });
        seen
    }

    async fn run(
        self,
        who: Incarnation,
        controls: tokio::sync::watch::Sender<Option<(Stop, watch::Receiver<bool>)>>,
    ) -> turmoil::Result {
        // The store's host creates the store on its first start.
        let store = loop {
            if let Some(s) = self.cluster.store() {
                break s;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        };
        // A store client of its own, so that the journal names this incarnation.
        let client = store.connect();
        if let Some(d) = self
            .slow
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&self.n)
        {
            client.set_reply_latency(*d);
        }
        self.clients
            .insert(turmoil::lookup(format!("n{}", self.n)), client.clone());
        self.rec.record(Happening::Started {
            who,
            client: client.client_id(),
        });
        // Every member, starting from a different one per node, as a fleet's configurations
        // spread their first endpoints.
        let members = self.cluster.len();
        let dialers = (0..members)
            .map(|k| {
                let host = self.cluster.host((self.n + k) % members).to_owned();
                // Each connection served as this incarnation's: during a rolling restart two
                // share the host's IP.
                let (client, clients) = (client.clone(), self.clients.clone());
                member_dialer(move || {
                    dial_as(host.clone(), ETCD_PORT, client.clone(), clients.clone())
                })
            })
            .collect();
        // The dialers say where the members are; the config's endpoint is never dialled. The
        // channel over them is the one production runs, with the same settings.
        let config = EtcdConfig::new(["http://etcd:2379"])
            .with_limits(store.config().limits.clone())
            .with_request_timeout(self.scenario.request_timeout);
        let etcd = EtcdStore::from_member_dialers(dialers, config).await?;
        let (node, control) = Node::new(
            who,
            Arc::new(etcd),
            self.rec.clone(),
            self.scenario.clone(),
            self.seed ^ ((self.n as u64) << 32 | u64::from(who.inc)),
            self.paused.subscribe(),
        );
        self.parts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(self.n, control.part_stops.clone());
        controls.send_replace(Some((control.stop.clone(), control.ready.clone())));
        crate::service::run_node(self.service.clone(), node).await;
        drop(control);
        Ok(())
    }
}

/// The compaction storms running, by fault: each a task on the store's host, ended by
/// dropping it.
type Storms = Arc<Mutex<BTreeMap<Fault, CompactionTask>>>;

/// The world as the driver sees it between two steps of the simulation.
struct Turmoil<'a, 'b> {
    sim: &'a mut turmoil::Sim<'b>,
    scenario: &'a Scenario,
    rec: &'a Recorder,
    cluster: &'a SimCluster,
    storms: &'a Storms,
    clients: &'a Clients,
    slow: &'a ReplyLatencies,
    paused: &'a [Arc<watch::Sender<bool>>],
    nodes: &'a [Arc<NodeState>],
    parts: &'a PartStops,
    /// The service's operator prefixes.
    targets: &'a [String],
}

impl Turmoil<'_, '_> {
    /// Every member's host: a node's link faults cut, hold or slow its link to each.
    fn member_hosts(&self) -> impl Iterator<Item = String> + '_ {
        (0..self.cluster.len()).map(|i| self.cluster.host(i).to_owned())
    }

    fn host(node: usize) -> String {
        format!("n{node}")
    }

    /// The live incarnation's store client (the store side of the node's link).
    fn client(&self, node: usize) -> Option<SimStore> {
        let ip: IpAddr = self.sim.lookup(Self::host(node).as_str());
        self.clients.get(ip)
    }
}

impl World for Turmoil<'_, '_> {
    fn record(&mut self, what: Happening) {
        self.rec.record_elapsed(self.sim.elapsed(), what);
    }

    fn partition(&mut self, node: usize, on: bool) {
        let host = Self::host(node);
        for m in self.member_hosts().collect::<Vec<_>>() {
            if on {
                self.sim.partition(host.as_str(), m.as_str());
            } else {
                self.sim.repair(host.as_str(), m.as_str());
            }
        }
    }

    fn partition_oneway(&mut self, node: usize, on: bool) {
        let host = Self::host(node);
        for m in self.member_hosts().collect::<Vec<_>>() {
            if on {
                self.sim.partition_oneway(m.as_str(), host.as_str());
            } else {
                self.sim.repair_oneway(m.as_str(), host.as_str());
            }
        }
    }

    fn hold(&mut self, node: usize, on: bool) {
        let host = Self::host(node);
        for m in self.member_hosts().collect::<Vec<_>>() {
            if on {
                self.sim.hold(host.as_str(), m.as_str());
            } else {
                self.sim.release(host.as_str(), m.as_str());
            }
        }
    }

    fn pause(&mut self, node: usize, on: bool) {
        self.paused[node].send_replace(on);
    }

    fn latency(&mut self, node: usize, extra: Duration) {
        let host = Self::host(node);
        for m in self.member_hosts().collect::<Vec<_>>() {
            self.sim
                .set_link_latency(host.as_str(), m.as_str(), self.scenario.latency + extra);
        }
    }

    fn reply_latency(&mut self, node: usize, extra: Duration) {
        self.slow
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(node, extra);
        if let Some(c) = self.client(node) {
            c.set_reply_latency(extra);
        }
    }

    fn lose_replies(&mut self, node: usize, count: u32) {
        if let Some(c) = self.client(node) {
            c.lose_replies(count);
        }
    }

    fn close_streams(&mut self) {
        self.cluster
            .on_store(|store| async move { store.close_streams() });
    }

    fn leader_change(&mut self) {
        let et = self.scenario.election_timeout;
        self.cluster
            .on_store(move |store| async move { store.leader_change(et) });
    }

    fn store_down(&mut self, down: bool) {
        if down {
            self.cluster.crash_all();
        } else {
            self.cluster.restart_all();
        }
    }

    fn compaction(&mut self, storm: &Fault, on: bool) {
        let (storm, storms) = (storm.clone(), self.storms.clone());
        if on {
            self.cluster.on_store(move |store| async move {
                let task = store.compact_every(storm.compaction_period());
                storms
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(storm, task);
            });
        } else {
            self.cluster.on_store(move |_| async move {
                storms
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&storm);
            });
        }
    }

    fn operator(&mut self, fault: &Fault) {
        let (fault, targets, rec) = (fault.clone(), self.targets.to_vec(), self.rec.clone());
        self.cluster
            .on_store(move |store| async move { operate(&store, &fault, &targets, &rec).await });
    }

    fn members(&self) -> usize {
        self.cluster.len()
    }

    fn member_down(&mut self, member: usize, down: bool) {
        if down {
            self.cluster.kill(self.sim, member);
        } else {
            self.cluster.restart(member);
        }
    }

    fn member_isolated(&mut self, member: Option<usize>) {
        match member {
            Some(m) => self.cluster.isolate(self.sim, m),
            None => self.cluster.rejoin(self.sim),
        }
    }

    fn member_stalled(&mut self, member: usize, stalled: bool) {
        if stalled {
            self.cluster.stall(self.sim, member);
        } else {
            self.cluster.thaw(member);
        }
    }

    fn member_slowed(&mut self, member: usize, late: Duration) {
        self.cluster.slow(member, late);
    }

    fn leader(&mut self) -> Option<usize> {
        self.cluster.leader(self.sim)
    }

    fn transfer_leader(&mut self, to: usize) -> bool {
        self.cluster.transfer_leader(self.sim, to)
    }

    fn crash(&mut self, node: usize) {
        // Every incarnation on the host goes down with it, oldest first.
        let live = std::mem::take(&mut *self.nodes[node].live());
        for &inc in &live {
            self.rec.mute(Incarnation { node, inc });
        }
        self.sim.crash(Self::host(node).as_str());
        for inc in live {
            self.record(Happening::Crashed(Incarnation { node, inc }));
        }
    }

    fn recover(&mut self, node: usize) {
        self.sim.bounce(Self::host(node).as_str());
    }

    fn rolling_restart(&mut self, node: usize) -> bool {
        // The host's supervisor acts on it (see `NodeHost::supervise`); a crashed host has
        // none, and a later start does not take it.
        let runs = !self.nodes[node].live().is_empty();
        if runs {
            self.nodes[node].restarts.send_modify(|n| *n += 1);
        }
        runs
    }

    fn stop_part(&mut self, node: usize, request: PartStopRequest) -> bool {
        self.parts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&node)
            .is_some_and(|parts| parts.send(request))
    }
}
