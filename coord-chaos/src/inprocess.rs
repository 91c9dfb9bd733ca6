//! The in-process world: one [`SimStore`] and every node a client of it, in one runtime's
//! virtual time. Link faults are the store's per-client faults; a crash cuts the node's link
//! and drops its task.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use coord_api::sync::{watch, Stop};
use coord_api::{DynKvLeaseStore, GetRequest, KvLeaseStore, KvLeaseStoreExt};
use coord_sim::{CompactionTask, SimConfig, SimStore};
use tokio::task::{AbortHandle, JoinHandle};
use tokio::time::Instant;

use crate::driver::{actions, Driver, World};
use crate::fault::{Fault, FaultKind};
use crate::first_writer::{Aim, Leases, SetHeld};
use crate::history::{Happening, History, Incarnation};
use crate::recorder::Recorder;
use crate::scenario::Scenario;
use crate::service::{Node, NodeControl, PartStopRequest, Service};

/// The link faults a node is under: a new incarnation starts under them too.
#[derive(Debug, Clone, Copy, Default)]
struct LinkFaults {
    cut: bool,
    deaf: bool,
    held: bool,
    latency: Duration,
    reply_latency: Duration,
}

/// One node's slot: its live incarnation and the handles to hit it with faults.
struct Slot {
    inc: u32,
    client: SimStore,
    /// Older incarnations still running after a rolling restart (until the new one is up,
    /// then while they stop): on the same host, so under the same link faults and killed by
    /// the same crash. (They kept the faults in force at the restart: an old incarnation's
    /// replies stayed 1.2 s slow after the node's slow-replies fault ended, past the
    /// checkers' reply window: `--defaults` seed 2029452's false S1 and S3. And one outlived
    /// a crash of its node, leading and registered beside the incarnation started after it:
    /// seed 2045989's S7.)
    stopping: Vec<Older>,
    task: Option<JoinHandle<()>>,
    control: NodeControl,
    faults: LinkFaults,
    paused: Arc<watch::Sender<bool>>,
    crashed: bool,
}

/// An older incarnation of a node, running beside the live one during a rolling restart.
struct Older {
    inc: u32,
    client: SimStore,
    task: AbortHandle,
    stop: Stop,
}

impl Slot {
    fn apply_link(&self) {
        for c in std::iter::once(&self.client).chain(self.stopping.iter().map(|o| &o.client)) {
            if self.faults.cut || self.crashed {
                c.partition()
            } else {
                c.repair()
            }
            if self.faults.deaf {
                c.partition_oneway()
            } else {
                c.repair_oneway()
            }
            if self.faults.held {
                c.hold()
            } else {
                c.release()
            }
            c.set_latency(self.faults.latency);
            c.set_reply_latency(self.faults.reply_latency);
        }
    }
}

#[derive(Clone)]
struct InProcess {
    store: SimStore,
    service: Arc<dyn Service>,
    scenario: Arc<Scenario>,
    rec: Recorder,
    seed: u64,
    slots: Arc<Mutex<Vec<Slot>>>,
    /// Compaction storms under way; dropping one stops it.
    storms: Arc<Mutex<BTreeMap<Fault, CompactionTask>>>,
    /// The holds waiting for the first node to write.
    aims: Arc<Mutex<BTreeMap<Fault, Aim>>>,
    /// The leases each client holds, for the holds aimed at a write.
    leases: Leases,
    /// When the run started.
    start: Instant,
}

/// Runs `service` on `scenario`'s nodes under `faults`, from `seed`, in virtual time, and
/// returns the history.
///
/// It builds its own single-threaded runtime with paused time, so a run takes only the wall
/// time its computation needs, and the same inputs give the same history, in any build: the
/// recipes' wake-ups happen in a fixed order, and when the scenario explores schedules, the
/// recipes' yields are drawn from the seed.
///
/// # Panics
/// Inside an async context (it blocks on its own runtime).
pub fn simulate_service(
    service: Arc<dyn Service>,
    scenario: &Scenario,
    seed: u64,
    faults: &[Fault],
) -> History {
    let mut builder = tokio::runtime::Builder::new_current_thread();
    builder.enable_time().start_paused(true);
    // Nothing moves this paused clock but the runtime's parks: coord's readings of it are one
    // a turn (they were thousands a simulated second, each a lock and a handle).
    coord_api::hooks::clock::forget_at_parks(&mut builder);
    // Tokio's own random choices (unbiased selects in dependencies) come from the seed too
    // where a build can seed them (`--cfg tokio_unstable`); coord's in-process path makes none.
    #[cfg(tokio_unstable)]
    builder.rng_seed(tokio::runtime::RngSeed::from_bytes(&seed.to_le_bytes()));
    let rt = builder.build().expect("a current-thread runtime builds");
    if scenario.explore {
        coord_api::hooks::explore::enable(seed);
    }
    let turns = coord_api::hooks::clock::read_once_per_turn();
    let history = rt.block_on(drive(
        service,
        Arc::new(scenario.clone()),
        seed,
        faults.to_vec(),
    ));
    coord_api::hooks::explore::disable();
    drop(turns);
    // The nodes' tasks go with the runtime, here rather than at a later drop.
    drop(rt);
    history
}

impl InProcess {
    fn slots(&self) -> MutexGuard<'_, Vec<Slot>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn aims(&self) -> MutexGuard<'_, BTreeMap<Fault, Aim>> {
        self.aims.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts incarnation `inc` of `node`; returns its slot (not yet installed).
    fn start(&self, node: usize, inc: u32, paused: Arc<watch::Sender<bool>>) -> Slot {
        let client = self.store.connect();
        let who = Incarnation { node, inc };
        self.rec.record(Happening::Started {
            who,
            client: client.client_id(),
        });
        let store: Arc<DynKvLeaseStore> = Arc::new(client.clone());
        let (ctx, control) = Node::new(
            who,
            store,
            self.rec.clone(),
            self.scenario.clone(),
            self.seed ^ ((node as u64) << 32 | u64::from(inc)),
            paused.subscribe(),
        );
        let task = tokio::spawn(crate::service::run_node(self.service.clone(), ctx));
        Slot {
            inc,
            client,
            stopping: Vec::new(),
            task: Some(task),
            control,
            faults: LinkFaults::default(),
            paused,
            crashed: false,
        }
    }

    /// Puts a new incarnation in the node's slot, under the faults the node is under;
    /// returns the old one.
    fn install(&self, n: usize, mut fresh: Slot) -> Slot {
        let mut slots = self.slots();
        fresh.faults = slots[n].faults;
        fresh.stopping = std::mem::take(&mut slots[n].stopping);
        fresh.apply_link();
        std::mem::replace(&mut slots[n], fresh)
    }

    fn link(&self, node: usize, change: impl FnOnce(&mut LinkFaults)) {
        let mut slots = self.slots();
        change(&mut slots[node].faults);
        slots[node].apply_link();
    }

    /// A rolling restart: the new incarnation comes up, then the old one stops.
    async fn rolling_restart(self, n: usize) {
        let (inc, paused) = {
            let slots = self.slots();
            let slot = &slots[n];
            if slot.crashed || slot.task.is_none() {
                return;
            }
            (slot.inc + 1, slot.paused.clone())
        };
        let fresh = self.start(n, inc, paused);
        let mut ready = fresh.control.ready.clone();
        let mut old = self.install(n, fresh);
        let old_client = old.client.client_id();
        if let Some(task) = &old.task {
            self.slots()[n].stopping.push(Older {
                inc: old.inc,
                client: old.client.clone(),
                task: task.abort_handle(),
                stop: old.control.stop.clone(),
            });
        }
        // Bounded: a new incarnation that cannot come up (its link is faulty) does not keep
        // the old one alive forever.
        let _ = tokio::time::timeout(self.scenario.ttl * 2, ready.wait_for(|r| *r)).await;
        // The node runs its newest incarnation: every older one stops, not only this
        // restart's. (A restart begun before this one may still wait for an incarnation this
        // one replaced before it was up, and left its old one running beside the newest for
        // up to 2 TTL: `--defaults` seed 2112955's S7.) A crash took those it killed off
        // the list.
        for older in &self.slots()[n].stopping {
            older.stop.stop();
        }
        if let Some(task) = old.task.take() {
            let _ = task.await;
        }
        self.slots()[n]
            .stopping
            .retain(|o| o.client.client_id() != old_client);
    }
}

impl World for InProcess {
    fn record(&mut self, what: Happening) {
        self.rec.record(what);
    }

    fn partition(&mut self, node: usize, on: bool) {
        self.link(node, |f| f.cut = on);
    }

    fn partition_oneway(&mut self, node: usize, on: bool) {
        self.link(node, |f| f.deaf = on);
    }

    fn hold(&mut self, node: usize, on: bool) {
        self.link(node, |f| f.held = on);
    }

    fn sees_writes(&self) -> bool {
        true
    }

    fn hold_first_writer(&mut self, fault: &Fault, on: bool) {
        if !on {
            if let Some(aim) = self.aims().remove(fault) {
                aim.end();
            }
            return;
        }
        let clients = self
            .slots()
            .iter()
            .map(|s| (!s.crashed).then(|| s.client.clone()))
            .collect();
        let slots = Arc::downgrade(&self.slots);
        let set_held: SetHeld = Arc::new(move |n, on| {
            if let Some(slots) = slots.upgrade() {
                let mut slots = slots.lock().unwrap_or_else(|p| p.into_inner());
                slots[n].faults.held = on;
                slots[n].apply_link();
            }
        });
        // Released at the heal at the latest, as every scheduled fault is.
        let latest = self.start + self.scenario.heal_at();
        let aim = Aim::arm(fault, clients, &self.leases, &self.rec, set_held, latest);
        self.aims().insert(fault.clone(), aim);
    }

    fn pause(&mut self, node: usize, on: bool) {
        self.slots()[node].paused.send_replace(on);
    }

    fn latency(&mut self, node: usize, extra: Duration) {
        self.link(node, |f| f.latency = extra);
    }

    fn reply_latency(&mut self, node: usize, extra: Duration) {
        self.link(node, |f| f.reply_latency = extra);
    }

    fn overtake(&mut self, node: usize, from: Duration, until: Duration) {
        let world = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(from).await;
            // The incarnation's client then; a later one's link starts clean.
            let (client, inc) = {
                let slot = &world.slots()[node];
                (slot.client.clone(), slot.inc)
            };
            client.hold_sent();
            tokio::time::sleep(until.saturating_sub(from)).await;
            // Recorded only when it held something: a hold with nothing on the way did
            // nothing.
            let calls = client.release_sent();
            if calls > 0 {
                let who = Incarnation { node, inc };
                world.clone().record(Happening::Overtaken { who, calls });
            }
        });
    }

    fn lose_replies(&mut self, node: usize, count: u32) {
        self.slots()[node].client.lose_replies(count);
    }

    fn close_streams(&mut self) {
        self.store.close_streams();
    }

    fn leader_change(&mut self) {
        self.store.leader_change(self.scenario.election_timeout);
    }

    fn store_down(&mut self, down: bool) {
        if down {
            self.store.crash();
        } else {
            self.store.restart(self.scenario.election_timeout);
        }
    }

    fn compaction(&mut self, storm: &Fault, on: bool) {
        let mut storms = self.storms.lock().unwrap_or_else(|p| p.into_inner());
        if on {
            storms.insert(
                storm.clone(),
                self.store.compact_every(storm.compaction_period()),
            );
        } else {
            storms.remove(storm);
        }
    }

    fn operator(&mut self, fault: &Fault) {
        let (store, fault) = (self.store.connect(), fault.clone());
        let (targets, rec) = (self.service.operator_prefixes(), self.rec.clone());
        tokio::spawn(async move { operate(&store, &fault, &targets, &rec).await });
    }

    fn crash(&mut self, n: usize) {
        let mut slots = self.slots();
        let slot = &mut slots[n];
        if slot.crashed {
            return;
        }
        // The link dies first, so nothing the incarnation left behind (a clean-up task)
        // reaches the store; then everything it ran is dropped.
        slot.crashed = true;
        slot.apply_link();
        // The host goes down with everything on it: an older incarnation still running
        // after a rolling restart too (its link cut above; oldest first).
        for old in std::mem::take(&mut slot.stopping) {
            let who = Incarnation {
                node: n,
                inc: old.inc,
            };
            self.rec.mute(who);
            old.task.abort();
            self.rec.record(Happening::Crashed(who));
        }
        self.rec.mute(Incarnation {
            node: n,
            inc: slot.inc,
        });
        if let Some(task) = slot.task.take() {
            task.abort();
        }
        self.rec.record(Happening::Crashed(Incarnation {
            node: n,
            inc: slot.inc,
        }));
    }

    fn recover(&mut self, n: usize) {
        let (inc, paused) = {
            let slots = self.slots();
            if !slots[n].crashed {
                return;
            }
            (slots[n].inc + 1, slots[n].paused.clone())
        };
        let fresh = self.start(n, inc, paused);
        self.install(n, fresh);
    }

    fn rolling_restart(&mut self, n: usize) -> bool {
        let runs = {
            let slots = self.slots();
            !slots[n].crashed && slots[n].task.is_some()
        };
        if runs {
            tokio::spawn(self.clone().rolling_restart(n));
        }
        runs
    }

    fn stop_part(&mut self, n: usize, request: PartStopRequest) -> bool {
        self.slots()[n].control.part_stops.send(request)
    }

    // One store, no members: member faults are never drawn in-process.
    fn members(&self) -> usize {
        1
    }

    fn member_down(&mut self, _member: usize, _down: bool) {}

    fn member_isolated(&mut self, _member: Option<usize>) {}

    fn member_stalled(&mut self, _member: usize, _stalled: bool) {}

    fn member_slowed(&mut self, _member: usize, _late: Duration) {}

    fn leader(&mut self) -> Option<usize> {
        None
    }

    fn transfer_leader(&mut self, _to: usize) -> bool {
        false
    }
}

/// An operator revokes or deletes one of the nodes' keys (hosts and election candidates),
/// picked by the fault.
/// An operator's revoke or delete: of a key drawn from those under `targets` (the service's
/// [`operator_prefixes`](Service::operator_prefixes)). Recorded as it acts (after the
/// listing, before the revoke or delete), and not at all when there is nothing to act on.
pub(crate) async fn operate(
    store: &dyn KvLeaseStore,
    f: &Fault,
    targets: &[String],
    rec: &Recorder,
) {
    let mut keys = Vec::new();
    for prefix in targets {
        match store.get(GetRequest::prefix(prefix.as_str())).await {
            Ok(listing) => keys.extend(listing.kvs),
            Err(_) => return,
        }
    }
    if keys.is_empty() {
        return;
    }
    let kv = &keys[(f.pick % keys.len() as u64) as usize];
    rec.record(Happening::FaultStart(f.clone()));
    if f.kind == FaultKind::Revoke {
        let _ = store.revoke(kv.lease).await;
    } else {
        let _ = store.delete_key(kv.key.to_vec()).await;
    }
}

/// About how many records a run of `s` writes: the store's renewals (each host's session
/// renews every renewal interval) and about one and a half more a host a second for coord's
/// own nodes (views, emits, commits, metadata; 2.2 a host a second in all at the 3 s TTL).
/// Capped at 16 M records (1.5 GB of address space): a longer run's history grows as needed.
fn expected_records(s: &Scenario) -> usize {
    let every = s
        .renew_interval
        .unwrap_or(s.ttl / 3)
        .as_secs_f64()
        .max(0.01);
    let per_host_second = 1.0 / every + 1.5;
    let records = s.hosts as f64 * s.duration.as_secs_f64() * per_host_second;
    (records as usize).min(1 << 24)
}

async fn drive(
    service: Arc<dyn Service>,
    scenario: Arc<Scenario>,
    seed: u64,
    faults: Vec<Fault>,
) -> History {
    let start = Instant::now();
    let rec = Recorder::new(start);
    rec.reserve(expected_records(&scenario));
    let store = SimStore::with_config(
        SimConfig::default()
            .with_seed(seed)
            .with_latency(scenario.latency)
            .with_request_timeout(scenario.request_timeout),
    );
    let sink = rec.clone();
    let leases = Leases::default();
    let noted = leases.clone();
    store.on_journal(move |at, entry| {
        noted.note(&entry);
        sink.record_at(at, Happening::Store(entry));
    });
    let mut world = InProcess {
        store,
        service,
        scenario: scenario.clone(),
        rec: rec.clone(),
        seed,
        slots: Arc::default(),
        storms: Arc::default(),
        aims: Arc::default(),
        leases,
        start,
    };
    for n in 0..scenario.hosts {
        let slot = world.start(n, 0, Arc::new(watch::Sender::new(false)));
        world.slots().push(slot);
    }
    let mut driver = Driver::default();
    let mut healed = false;
    for action in actions(&faults, |_| true) {
        if !healed && action.at >= scenario.heal_at() {
            tokio::time::sleep_until(start + scenario.heal_at()).await;
            driver.heal(&mut world, scenario.hosts);
            healed = true;
        }
        tokio::time::sleep_until(start + action.at).await;
        driver.apply(&mut world, &action);
    }
    if !healed {
        tokio::time::sleep_until(start + scenario.heal_at()).await;
        driver.heal(&mut world, scenario.hosts);
    }
    tokio::time::sleep_until(start + scenario.duration).await;
    // The end of the run: stop every node where it stands (no more history).
    let history = rec.take();
    for slot in world.slots().iter_mut() {
        slot.client.partition();
        if let Some(t) = slot.task.take() {
            t.abort();
        }
    }
    history
}
