//! The chaos run over turmoil: the same nodes and recipes, but each node is a turmoil host
//! using the production `EtcdStore` (etcd-client, tonic, h2) over turmoil's simulated TCP,
//! against the simulator served as etcd on a host of its own. Network faults are turmoil's
//! (partitions both ways and one way, holds, latency); crashes are turmoil crashes and
//! bounces, of a node or of the store; store-side faults go through a small agent on the
//! store's host.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use coord_api::{GetRequest, KvLeaseStore, KvLeaseStoreExt};
use coord_etcd::{EtcdConfig, EtcdStore};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::fault::{Fault, FaultKind};
use crate::history::{Happening, History, Incarnation};
use crate::node::{self, NodeContext};
use crate::recorder::Recorder;
use crate::scenario::Scenario;
use coord_sim::grpc::{channel, incoming, Clients, EtcdService, ETCD_PORT};
use coord_sim::{CompactionTask, SimConfig, SimStore};

const ETCD: &str = "etcd";

/// The fault kinds the turmoil run injects (a rolling restart needs two incarnations of one
/// host at once, which a turmoil host cannot be).
pub fn turmoil_fault_kinds() -> impl Iterator<Item = FaultKind> {
    FaultKind::ALL
        .into_iter()
        .filter(|k| *k != FaultKind::Restart)
}

/// What the store's host does on the driver's behalf, on the host's own runtime and clock.
#[derive(Debug)]
enum Command {
    CloseStreams,
    LeaderChange(Duration),
    StormStart(Fault),
    StormEnd(Fault),
    Operator(Fault),
    LoseReplies(std::net::IpAddr, u32),
}

type Agent = Arc<Mutex<Option<mpsc::UnboundedSender<Command>>>>;

/// Runs `scenario` with `faults` from `seed` under turmoil and returns its history.
///
/// # Panics
/// When turmoil fails (a host returned an error).
pub fn simulate_turmoil(scenario: &Scenario, seed: u64, faults: &[Fault]) -> History {
    let scenario = Arc::new(scenario.clone());
    let mut sim = turmoil::Builder::new()
        .rng_seed(seed)
        .simulation_duration(scenario.duration + Duration::from_secs(60))
        .min_message_latency(scenario.latency)
        .max_message_latency(scenario.latency)
        // The store's host takes every node's connections; turmoil's default socket buffer
        // (64 messages) overflows with tens of nodes.
        .tcp_capacity(256 * scenario.hosts.max(1))
        .build();
    let rec = Recorder::turmoil();
    let durable: Arc<Mutex<Option<SimStore>>> = Arc::default();
    let clients = Clients::default();
    let agent = Agent::default();
    add_store_host(&mut sim, &scenario, seed, &rec, &durable, &clients, &agent);
    let mut paused = Vec::new();
    let mut incs = Vec::new();
    for n in 0..scenario.hosts {
        let (tx, rx) = watch::channel(false);
        paused.push(tx);
        let inc = Arc::new(AtomicU32::new(0));
        incs.push(inc.clone());
        add_node_host(
            &mut sim, &scenario, seed, &rec, &durable, &clients, n, inc, rx,
        );
    }
    let mut driver = Driver {
        scenario: scenario.clone(),
        rec: rec.clone(),
        agent,
        paused,
        incs,
        counts: BTreeMap::new(),
        store_down: 0,
    };
    // Every start and end, in time order.
    let mut actions: Vec<(Duration, bool, Fault)> = Vec::new();
    for f in faults.iter().filter(|f| f.kind != FaultKind::Restart) {
        actions.push((f.at, true, f.clone()));
        if f.kind.lasts() {
            actions.push((f.at + f.length, false, f.clone()));
        }
    }
    actions.sort_by_key(|a| (a.0, !a.1));
    let mut next = 0;
    let mut healed = false;
    while sim.elapsed() < scenario.duration {
        let now = sim.elapsed();
        while next < actions.len() && actions[next].0 <= now {
            let (_, start, f) = &actions[next];
            if *start {
                rec.log_elapsed(now, Happening::FaultStart(f.clone()));
                driver.begin(&mut sim, f);
            } else {
                driver.end(&mut sim, f);
                rec.log_elapsed(now, Happening::FaultEnd(f.clone()));
            }
            next += 1;
        }
        if !healed && now >= scenario.heal_at() {
            rec.log_elapsed(now, Happening::Heal);
            healed = true;
        }
        if let Err(e) = sim.step() {
            panic!("turmoil failed at {:?}: {e}", sim.elapsed());
        }
    }
    rec.take()
}

#[allow(clippy::too_many_arguments)]
fn add_node_host(
    sim: &mut turmoil::Sim<'_>,
    scenario: &Arc<Scenario>,
    seed: u64,
    rec: &Recorder,
    durable: &Arc<Mutex<Option<SimStore>>>,
    clients: &Clients,
    n: usize,
    inc: Arc<AtomicU32>,
    paused: watch::Receiver<bool>,
) {
    let (scenario, rec, durable, clients) = (
        scenario.clone(),
        rec.clone(),
        durable.clone(),
        clients.clone(),
    );
    sim.host(format!("n{n}"), move || {
        let (scenario, rec, durable, clients, paused) = (
            scenario.clone(),
            rec.clone(),
            durable.clone(),
            clients.clone(),
            paused.clone(),
        );
        let who = Incarnation {
            node: n,
            inc: inc.fetch_add(1, Ordering::SeqCst),
        };
        async move {
            // The store's host creates the store on its first start.
            let store = loop {
                if let Some(s) = durable.lock().unwrap_or_else(|p| p.into_inner()).clone() {
                    break s;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            };
            // A store client of its own, so that the journal names this incarnation.
            let client = store.connect();
            clients
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(turmoil::lookup(format!("n{n}")), client.clone());
            rec.log(Happening::Started {
                who,
                client: client.client_id(),
            });
            // A request that gets no answer within a third of the TTL replaces the
            // connection, well before the session's deadline (see EtcdStore::reconnect).
            let config = EtcdConfig::new([format!("http://{ETCD}:{ETCD_PORT}")])
                .with_limits(store.config().limits.clone())
                .with_request_timeout(scenario.ttl / 3);
            let etcd = EtcdStore::from_channel_factory(|| channel(ETCD, ETCD_PORT), config).await?;
            let (registered, _) = watch::channel(false);
            node::run(NodeContext {
                who,
                store: Arc::new(etcd),
                scenario,
                rec,
                seed: seed ^ ((n as u64) << 32 | u64::from(who.inc)),
                paused,
                stop: CancellationToken::new(),
                registered,
            })
            .await;
            Ok(())
        }
    });
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
                        store.on_journal(move |at, e| sink.log_at(at, Happening::Store(e)));
                        slot.insert(store).clone()
                    }
                }
            };
            let (tx, rx) = mpsc::unbounded_channel();
            *agent.lock().unwrap_or_else(|p| p.into_inner()) = Some(tx);
            tokio::spawn(run_agent(store.clone(), clients.clone(), rx));
            EtcdService::with_clients(store, clients)
                .serve(incoming(ETCD_PORT))
                .await?;
            Ok(())
        }
    });
}

async fn run_agent(store: SimStore, clients: Clients, mut rx: mpsc::UnboundedReceiver<Command>) {
    let mut storms: Vec<(Fault, CompactionTask)> = Vec::new();
    while let Some(cmd) = rx.recv().await {
        match cmd {
            Command::CloseStreams => store.close_streams(),
            Command::LeaderChange(et) => store.leader_change(et),
            Command::StormStart(f) => {
                let storm = store.compact_every(f.compaction_period());
                storms.push((f, storm));
            }
            Command::StormEnd(f) => storms.retain(|(g, _)| *g != f),
            Command::LoseReplies(ip, n) => {
                if let Some(c) = clients.lock().unwrap_or_else(|p| p.into_inner()).get(&ip) {
                    c.lose_replies(n);
                }
            }
            Command::Operator(f) => {
                let mut keys = Vec::new();
                for prefix in [node::HOSTS, "elections/"] {
                    if let Ok(listing) = store.get(GetRequest::prefix(prefix)).await {
                        keys.extend(listing.kvs);
                    }
                }
                if keys.is_empty() {
                    continue;
                }
                let kv = &keys[(f.pick % keys.len() as u64) as usize];
                if f.kind == FaultKind::Revoke {
                    let _ = store.revoke(kv.lease).await;
                } else {
                    let _ = store.delete_key(kv.key.to_vec()).await;
                }
            }
        }
    }
}

struct Driver {
    scenario: Arc<Scenario>,
    rec: Recorder,
    agent: Agent,
    paused: Vec<watch::Sender<bool>>,
    incs: Vec<Arc<AtomicU32>>,
    /// Overlapping faults of one kind on one node nest.
    counts: BTreeMap<(FaultKind, usize), u32>,
    store_down: u32,
}

impl Driver {
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

    /// Counts a nested fault in (`+1`) or out (`-1`); true when it is the first in or the
    /// last out.
    fn nest(&mut self, kind: FaultKind, node: usize, into: bool) -> bool {
        let c = self.counts.entry((kind, node)).or_insert(0);
        if into {
            *c += 1;
            *c == 1
        } else {
            *c = c.saturating_sub(1);
            *c == 0
        }
    }

    // The nesting counters change state, so they stay in the arms rather than in guards.
    #[allow(clippy::collapsible_match)]
    fn begin(&mut self, sim: &mut turmoil::Sim<'_>, f: &Fault) {
        let host = format!("n{}", f.node);
        match f.kind {
            FaultKind::Partition => {
                if self.nest(f.kind, f.node, true) {
                    sim.partition(host.as_str(), ETCD);
                }
            }
            FaultKind::OneWay => {
                if self.nest(f.kind, f.node, true) {
                    sim.partition_oneway(ETCD, host.as_str());
                }
            }
            FaultKind::Hold | FaultKind::Pause => {
                if self.nest(FaultKind::Hold, f.node, true) {
                    sim.hold(host.as_str(), ETCD);
                }
                if f.kind == FaultKind::Pause {
                    self.paused[f.node].send_replace(true);
                }
            }
            FaultKind::Latency => sim.set_link_latency(
                host.as_str(),
                ETCD,
                self.scenario.latency + f.added_latency(),
            ),
            FaultKind::LostReplies => self.tell(Command::LoseReplies(
                sim.lookup(host.as_str()),
                f.length.as_millis() as u32,
            )),
            FaultKind::CloseStreams => self.tell(Command::CloseStreams),
            FaultKind::LeaderChange => {
                self.tell(Command::LeaderChange(self.scenario.election_timeout))
            }
            FaultKind::Compact => self.tell(Command::StormStart(f.clone())),
            FaultKind::Revoke | FaultKind::Delete => self.tell(Command::Operator(f.clone())),
            FaultKind::StoreCrash => {
                self.store_down += 1;
                if self.store_down == 1 {
                    sim.crash(ETCD);
                }
            }
            FaultKind::Crash => {
                if self.nest(f.kind, f.node, true) {
                    let inc = self.incs[f.node].load(Ordering::SeqCst).saturating_sub(1);
                    sim.crash(host.as_str());
                    self.rec.log_elapsed(
                        sim.elapsed(),
                        Happening::Crashed(Incarnation { node: f.node, inc }),
                    );
                }
            }
            FaultKind::Restart => {}
        }
    }

    #[allow(clippy::collapsible_match)]
    fn end(&mut self, sim: &mut turmoil::Sim<'_>, f: &Fault) {
        let host = format!("n{}", f.node);
        match f.kind {
            FaultKind::Partition => {
                if self.nest(f.kind, f.node, false) {
                    sim.repair(host.as_str(), ETCD);
                }
            }
            FaultKind::OneWay => {
                if self.nest(f.kind, f.node, false) {
                    sim.repair_oneway(ETCD, host.as_str());
                }
            }
            FaultKind::Hold | FaultKind::Pause => {
                if self.nest(FaultKind::Hold, f.node, false) {
                    sim.release(host.as_str(), ETCD);
                }
                if f.kind == FaultKind::Pause {
                    self.paused[f.node].send_replace(false);
                }
            }
            FaultKind::Latency => sim.set_link_latency(host.as_str(), ETCD, self.scenario.latency),
            FaultKind::Compact => self.tell(Command::StormEnd(f.clone())),
            FaultKind::StoreCrash => {
                self.store_down = self.store_down.saturating_sub(1);
                if self.store_down == 0 {
                    sim.bounce(ETCD);
                }
            }
            FaultKind::Crash => {
                if self.nest(f.kind, f.node, false) {
                    sim.bounce(host.as_str());
                }
            }
            _ => {}
        }
    }
}
