//! The turmoil world: each node a turmoil host running its service on the production
//! `EtcdStore` (etcd-client, tonic, h2) over turmoil's simulated TCP, against the simulator
//! served as etcd on a host of its own. Link faults are turmoil's (partitions both ways and one
//! way, holds, link latency); crashes are turmoil crashes and bounces, of a node or of the
//! store; store-side faults go through a small agent on the store's host.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use coord_api::sync::watch;
use coord_etcd::{EtcdConfig, EtcdStore};
use coord_sim::grpc::{channel, incoming, Clients, EtcdService, ETCD_PORT};
use coord_sim::{CompactionTask, SimConfig, SimStore};
use tokio::sync::mpsc;

use crate::driver::{actions, Driver, World};
use crate::fault::{Fault, FaultKind};
use crate::history::{Happening, History, Incarnation};
use crate::inprocess::operate;
use crate::recorder::Recorder;
use crate::scenario::Scenario;
use crate::service::{Node, PartStopRequest, Service};

const ETCD: &str = "etcd";

/// Whether a turmoil run can inject `kind` (a rolling restart needs two incarnations of one
/// host at once, which a turmoil host cannot be).
pub fn turmoil_supports(kind: FaultKind) -> bool {
    kind != FaultKind::Restart
}

/// The fault kinds a turmoil run injects.
pub fn turmoil_fault_kinds() -> impl Iterator<Item = FaultKind> {
    FaultKind::ALL.into_iter().filter(|k| turmoil_supports(*k))
}

/// What the store's host does on the driver's behalf, on the host's own runtime and clock.
#[derive(Debug)]
enum Command {
    CloseStreams,
    LeaderChange(Duration),
    Storm(Fault, bool),
    Operator(Fault),
}

type Agent = Arc<Mutex<Option<mpsc::UnboundedSender<Command>>>>;

/// Per node: the live incarnation's way to ask for a part stop.
type PartStops = Arc<Mutex<BTreeMap<usize, mpsc::UnboundedSender<PartStopRequest>>>>;

/// Per node: the reply latency its link is under, which a new incarnation's store client
/// starts with too (turmoil's own link latency goes both ways; slow replies are the store's
/// to make, on the node's client).
type ReplyLatencies = Arc<Mutex<BTreeMap<usize, Duration>>>;

/// Runs coord's own service over turmoil; see [`simulate_service_turmoil`].
///
/// # Panics
/// When turmoil fails (a host returned an error).
pub fn simulate_turmoil(scenario: &Scenario, seed: u64, faults: &[Fault]) -> History {
    simulate_service_turmoil(Arc::new(crate::CoordService), scenario, seed, faults)
}

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
        coord_api::sync::explore::enable(seed);
    }
    let rec = Recorder::turmoil(scenario.turmoil_tick);
    let durable: Arc<Mutex<Option<SimStore>>> = Arc::default();
    let clients = Clients::default();
    let agent = Agent::default();
    let parts = PartStops::default();
    let slow = ReplyLatencies::default();
    add_store_host(&mut sim, &scenario, seed, &rec, &durable, &clients, &agent);
    let mut paused = Vec::new();
    let mut incs = Vec::new();
    for n in 0..scenario.hosts {
        let switch = Arc::new(watch::Sender::new(false));
        paused.push(switch.clone());
        let inc = Arc::new(AtomicU32::new(0));
        incs.push(inc.clone());
        let host = NodeHost {
            service: service.clone(),
            scenario: scenario.clone(),
            seed,
            rec: rec.clone(),
            durable: durable.clone(),
            clients: clients.clone(),
            parts: parts.clone(),
            slow: slow.clone(),
            n,
            inc,
            paused: switch,
        };
        host.add(&mut sim);
    }
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
            agent: &agent,
            clients: &clients,
            slow: &slow,
            paused: &paused,
            incs: &incs,
            parts: &parts,
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
    coord_api::sync::explore::disable();
    rec.take()
}

/// What a node's host needs to start an incarnation, every time turmoil starts it.
#[derive(Clone)]
struct NodeHost {
    service: Arc<dyn Service>,
    scenario: Arc<Scenario>,
    seed: u64,
    rec: Recorder,
    durable: Arc<Mutex<Option<SimStore>>>,
    clients: Clients,
    parts: PartStops,
    slow: ReplyLatencies,
    n: usize,
    inc: Arc<AtomicU32>,
    paused: Arc<watch::Sender<bool>>,
}

impl NodeHost {
    fn add(self, sim: &mut turmoil::Sim<'_>) {
        let n = self.n;
        sim.host(format!("n{n}"), move || {
            let host = self.clone();
            let who = Incarnation {
                node: n,
                inc: host.inc.fetch_add(1, Ordering::SeqCst),
            };
            async move { host.run(who).await }
        });
    }

    async fn run(self, who: Incarnation) -> turmoil::Result {
        // The store's host creates the store on its first start.
        let store = loop {
            if let Some(s) = self
                .durable
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone()
            {
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
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(turmoil::lookup(format!("n{}", self.n)), client.clone());
        self.rec.record(Happening::Started {
            who,
            client: client.client_id(),
        });
        let config = EtcdConfig::new([format!("http://{ETCD}:{ETCD_PORT}")])
            .with_limits(store.config().limits.clone())
            .with_request_timeout(self.scenario.request_timeout);
        let etcd = EtcdStore::from_channel_factory(|| channel(ETCD, ETCD_PORT), config).await?;
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
        crate::service::run_node(self.service.clone(), node).await;
        drop(control);
        Ok(())
    }
}

fn add_store_host(
    sim: &mut turmoil::Sim<'_>,
    scenario: &Arc<Scenario>,
    seed: u64,
    rec: &Recorder,
    durable: &Arc<Mutex<Option<SimStore>>>,
    clients: &Clients,
    agent: &Agent,
) {
    let (scenario, rec, durable, clients, agent) = (
        scenario.clone(),
        rec.clone(),
        durable.clone(),
        clients.clone(),
        agent.clone(),
    );
    sim.host(ETCD, move || {
        let (scenario, rec, durable, clients, agent) = (
            scenario.clone(),
            rec.clone(),
            durable.clone(),
            clients.clone(),
            agent.clone(),
        );
        async move {
            let store = {
                let mut slot = durable.lock().unwrap_or_else(|p| p.into_inner());
                match slot.as_ref() {
                    Some(store) => {
                        store.resume_on_current_runtime(scenario.election_timeout);
                        store.clone()
                    }
                    None => {
                        let store = SimStore::with_config(SimConfig::default().with_seed(seed));
                        let sink = rec.clone();
                        store.on_journal(move |at, e| sink.record_at(at, Happening::Store(e)));
                        slot.insert(store).clone()
                    }
                }
            };
            let (tx, rx) = mpsc::unbounded_channel();
            *agent.lock().unwrap_or_else(|p| p.into_inner()) = Some(tx);
            tokio::spawn(run_agent(store.clone(), rx));
            EtcdService::with_clients(store, clients)
                .serve(incoming(ETCD_PORT))
                .await?;
            Ok(())
        }
    });
}

async fn run_agent(store: SimStore, mut rx: mpsc::UnboundedReceiver<Command>) {
    let mut storms: BTreeMap<Fault, CompactionTask> = BTreeMap::new();
    while let Some(cmd) = rx.recv().await {
        match cmd {
            Command::CloseStreams => store.close_streams(),
            Command::LeaderChange(et) => store.leader_change(et),
            Command::Storm(f, true) => {
                let storm = store.compact_every(f.compaction_period());
                storms.insert(f, storm);
            }
            Command::Storm(f, false) => {
                storms.remove(&f);
            }
            Command::Operator(f) => operate(&store, &f).await,
        }
    }
}

/// The world as the driver sees it between two steps of the simulation.
struct Turmoil<'a, 'b> {
    sim: &'a mut turmoil::Sim<'b>,
    scenario: &'a Scenario,
    rec: &'a Recorder,
    agent: &'a Agent,
    clients: &'a Clients,
    slow: &'a ReplyLatencies,
    paused: &'a [Arc<watch::Sender<bool>>],
    incs: &'a [Arc<AtomicU32>],
    parts: &'a PartStops,
}

impl Turmoil<'_, '_> {
    fn tell(&self, cmd: Command) {
        if let Some(tx) = self
            .agent
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            let _ = tx.send(cmd);
        }
    }

    fn host(node: usize) -> String {
        format!("n{node}")
    }

    /// The live incarnation's store client (the store side of the node's link).
    fn client(&self, node: usize) -> Option<SimStore> {
        let ip: IpAddr = self.sim.lookup(Self::host(node).as_str());
        self.clients
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&ip)
            .cloned()
    }
}

impl World for Turmoil<'_, '_> {
    fn record(&mut self, what: Happening) {
        self.rec.record_elapsed(self.sim.elapsed(), what);
    }

    fn partition(&mut self, node: usize, on: bool) {
        let host = Self::host(node);
        if on {
            self.sim.partition(host.as_str(), ETCD);
        } else {
            self.sim.repair(host.as_str(), ETCD);
        }
    }

    fn partition_oneway(&mut self, node: usize, on: bool) {
        let host = Self::host(node);
        if on {
            self.sim.partition_oneway(ETCD, host.as_str());
        } else {
            self.sim.repair_oneway(ETCD, host.as_str());
        }
    }

    fn hold(&mut self, node: usize, on: bool) {
        let host = Self::host(node);
        if on {
            self.sim.hold(host.as_str(), ETCD);
        } else {
            self.sim.release(host.as_str(), ETCD);
        }
    }

    fn pause(&mut self, node: usize, on: bool) {
        self.paused[node].send_replace(on);
    }

    fn latency(&mut self, node: usize, extra: Duration) {
        let host = Self::host(node);
        self.sim
            .set_link_latency(host.as_str(), ETCD, self.scenario.latency + extra);
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
        self.tell(Command::CloseStreams);
    }

    fn leader_change(&mut self) {
        self.tell(Command::LeaderChange(self.scenario.election_timeout));
    }

    fn store_down(&mut self, down: bool) {
        if down {
            self.sim.crash(ETCD);
        } else {
            self.sim.bounce(ETCD);
        }
    }

    fn compaction(&mut self, storm: &Fault, on: bool) {
        self.tell(Command::Storm(storm.clone(), on));
    }

    fn operator(&mut self, fault: &Fault) {
        self.tell(Command::Operator(fault.clone()));
    }

    fn crash(&mut self, node: usize) {
        let who = Incarnation {
            node,
            inc: self.incs[node].load(Ordering::SeqCst).saturating_sub(1),
        };
        self.rec.mute(who);
        self.sim.crash(Self::host(node).as_str());
        self.record(Happening::Crashed(who));
    }

    fn recover(&mut self, node: usize) {
        self.sim.bounce(Self::host(node).as_str());
    }

    fn rolling_restart(&mut self, _node: usize) {
        // Not supported over turmoil (see `turmoil_supports`); never scheduled.
    }

    fn stop_part(&mut self, node: usize, request: PartStopRequest) {
        if let Some(tx) = self
            .parts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&node)
        {
            let _ = tx.send(request);
        }
    }
}
