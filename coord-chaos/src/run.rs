//! The driver of one run: builds the store and the nodes in virtual time, injects the
//! schedule's faults, and returns the history.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use coord_api::{DynKvLeaseStore, GetRequest, KvLeaseStore, KvLeaseStoreExt};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::fault::{Fault, FaultKind};
use crate::history::{Happening, History, Incarnation};
use crate::node::{self, NodeContext};
use crate::recorder::Recorder;
use crate::scenario::Scenario;
use coord_sim::{SimConfig, SimStore};

/// Runs `scenario` with `faults` from `seed` in virtual time, and returns its history.
///
/// Builds its own single-threaded runtime with paused time, so a run takes only the wall
/// time its computation needs, and the same inputs give the same history.
///
/// # Panics
/// Inside an async context (it blocks on its own runtime).
pub fn simulate(scenario: &Scenario, seed: u64, faults: &[Fault]) -> History {
    let mut builder = tokio::runtime::Builder::new_current_thread();
    builder.enable_time().start_paused(true);
    // Tokio's own random choices (the wake order of a watch channel's waiters, unbiased
    // selects) come from the seed too; without `tokio_unstable` (set by the repository's
    // .cargo/config.toml) they are random and a seed does not replay exactly.
    #[cfg(tokio_unstable)]
    builder.rng_seed(tokio::runtime::RngSeed::from_bytes(&seed.to_le_bytes()));
    let rt = builder.build().expect("a current-thread runtime builds");
    rt.block_on(drive(Arc::new(scenario.clone()), seed, faults.to_vec()))
}

/// One node's slot: its live incarnation and the handles to hit it with faults.
struct Slot {
    inc: u32,
    client: SimStore,
    task: Option<JoinHandle<()>>,
    stop: CancellationToken,
    registered: watch::Receiver<bool>,
    paused: watch::Sender<bool>,
    /// Overlapping faults of one kind nest: the link is repaired when the last ends.
    cuts: u32,
    deaf: u32,
    holds: u32,
    crashed: bool,
}

struct Cluster {
    store: SimStore,
    scenario: Arc<Scenario>,
    rec: Recorder,
    seed: u64,
    slots: Mutex<Vec<Slot>>,
    store_crashes: Mutex<u32>,
    /// Compaction storms under way; dropping one stops it.
    storms: Mutex<Vec<(Fault, coord_sim::CompactionTask)>>,
}

impl Cluster {
    fn slots(&self) -> std::sync::MutexGuard<'_, Vec<Slot>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts incarnation `inc` of `node`; returns its slot (not yet installed).
    fn start(&self, node: usize, inc: u32) -> Slot {
        let client = self.store.connect();
        let who = Incarnation { node, inc };
        self.rec.log(Happening::Started {
            who,
            client: client.client_id(),
        });
        let (paused_tx, paused) = watch::channel(false);
        let (registered_tx, registered) = watch::channel(false);
        let stop = CancellationToken::new();
        let store: Arc<DynKvLeaseStore> = Arc::new(client.clone());
        let ctx = NodeContext {
            who,
            store,
            scenario: self.scenario.clone(),
            rec: self.rec.clone(),
            seed: self.seed ^ ((node as u64) << 32 | u64::from(inc)),
            paused,
            stop: stop.clone(),
            registered: registered_tx,
        };
        let task = tokio::spawn(node::run(ctx));
        Slot {
            inc,
            client,
            task: Some(task),
            stop,
            registered,
            paused: paused_tx,
            cuts: 0,
            deaf: 0,
            holds: 0,
            crashed: false,
        }
    }

    /// Applies the start of `f`.
    async fn begin(self: &Arc<Self>, f: &Fault) {
        let n = f.node;
        match f.kind {
            FaultKind::Partition => {
                let mut slots = self.slots();
                slots[n].cuts += 1;
                link(&slots[n].client).cut(true);
            }
            FaultKind::OneWay => {
                let mut slots = self.slots();
                slots[n].deaf += 1;
                link(&slots[n].client).deaf(true);
            }
            FaultKind::Hold => {
                let mut slots = self.slots();
                slots[n].holds += 1;
                link(&slots[n].client).held(true);
            }
            FaultKind::Pause => {
                let mut slots = self.slots();
                slots[n].holds += 1;
                link(&slots[n].client).held(true);
                slots[n].paused.send_replace(true);
            }
            FaultKind::Latency => self.slots()[n].client.set_latency(f.added_latency()),
            FaultKind::LostReplies => self.slots()[n]
                .client
                .lose_replies(f.length.as_millis() as u32),
            FaultKind::CloseStreams => self.store.close_streams(),
            FaultKind::LeaderChange => self.store.leader_change(self.scenario.election_timeout),
            FaultKind::StoreCrash => {
                let mut crashes = self.store_crashes.lock().unwrap_or_else(|p| p.into_inner());
                *crashes += 1;
                self.store.crash();
            }
            FaultKind::Compact => {
                let storm = self.store.compact_every(f.compaction_period());
                self.storms
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((f.clone(), storm));
            }
            FaultKind::Revoke | FaultKind::Delete => self.operator(f).await,
            FaultKind::Crash => self.crash(n),
            FaultKind::Restart => {
                let this = self.clone();
                tokio::spawn(async move { this.rolling_restart(n).await });
            }
        }
    }

    /// Applies the end of a lasting fault `f`.
    fn end(&self, f: &Fault) {
        let n = f.node;
        match f.kind {
            FaultKind::Partition => {
                let mut slots = self.slots();
                slots[n].cuts -= 1;
                let cut = slots[n].cuts > 0 || slots[n].crashed;
                link(&slots[n].client).cut(cut);
            }
            FaultKind::OneWay => {
                let mut slots = self.slots();
                slots[n].deaf -= 1;
                let deaf = slots[n].deaf > 0;
                link(&slots[n].client).deaf(deaf);
            }
            FaultKind::Hold | FaultKind::Pause => {
                let mut slots = self.slots();
                slots[n].holds -= 1;
                let held = slots[n].holds > 0;
                link(&slots[n].client).held(held);
                if f.kind == FaultKind::Pause {
                    slots[n].paused.send_replace(false);
                }
            }
            FaultKind::Latency => self.slots()[n].client.set_latency(Duration::ZERO),
            FaultKind::StoreCrash => {
                let mut crashes = self.store_crashes.lock().unwrap_or_else(|p| p.into_inner());
                *crashes -= 1;
                if *crashes == 0 {
                    self.store.restart(self.scenario.election_timeout);
                }
            }
            FaultKind::Crash => self.recover(n),
            FaultKind::Compact => self
                .storms
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .retain(|(g, _)| g != f),
            _ => {}
        }
    }

    /// An operator revokes or deletes one of the nodes' keys, picked by `f.pick`.
    async fn operator(&self, f: &Fault) {
        if self.store.is_down() {
            return;
        }
        let mut keys = Vec::new();
        for prefix in [node::HOSTS, "elections/"] {
            match self.store.get(GetRequest::prefix(prefix)).await {
                Ok(listing) => keys.extend(listing.kvs),
                Err(e) => panic!("the operator's listing of {prefix} failed: {e}"),
            }
        }
        if keys.is_empty() {
            return;
        }
        let kv = &keys[(f.pick % keys.len() as u64) as usize];
        if f.kind == FaultKind::Revoke {
            let _ = self.store.revoke(kv.lease).await;
        } else {
            let _ = self.store.delete_key(kv.key.to_vec()).await;
        }
    }

    /// Crashes the node's live incarnation: its link dies first, so nothing it left
    /// behind (a clean-up task) reaches the store, then everything it ran is dropped.
    fn crash(&self, n: usize) {
        let mut slots = self.slots();
        let slot = &mut slots[n];
        if slot.crashed {
            return;
        }
        slot.crashed = true;
        link(&slot.client).cut(true);
        if let Some(task) = slot.task.take() {
            task.abort();
        }
        self.rec.log(Happening::Crashed(Incarnation {
            node: n,
            inc: slot.inc,
        }));
    }

    /// Starts a crashed node again, as a new incarnation.
    fn recover(&self, n: usize) {
        let inc = {
            let slots = self.slots();
            if !slots[n].crashed {
                return;
            }
            slots[n].inc + 1
        };
        let fresh = self.start(n, inc);
        self.install(n, fresh);
    }

    /// Puts a new incarnation in the node's slot; returns the old one. Faults still active
    /// on the node apply to the new incarnation's link too.
    fn install(&self, n: usize, mut fresh: Slot) -> Slot {
        let mut slots = self.slots();
        let old = &slots[n];
        fresh.cuts = old.cuts;
        fresh.deaf = old.deaf;
        fresh.holds = old.holds;
        link(&fresh.client).cut(fresh.cuts > 0);
        link(&fresh.client).deaf(fresh.deaf > 0);
        link(&fresh.client).held(fresh.holds > 0);
        fresh.paused.send_replace(*old.paused.borrow());
        std::mem::replace(&mut slots[n], fresh)
    }

    /// A rolling restart: the new incarnation registers, then the old one stops.
    async fn rolling_restart(&self, n: usize) {
        let (old_task, old_stop, inc) = {
            let mut slots = self.slots();
            let slot = &mut slots[n];
            if slot.crashed || slot.task.is_none() {
                return;
            }
            (slot.task.take(), slot.stop.clone(), slot.inc + 1)
        };
        let fresh = self.start(n, inc);
        let mut registered = fresh.registered.clone();
        let old = self.install(n, fresh);
        // Bounded: a new incarnation that cannot register (its link is faulty) does not
        // keep the old one alive forever.
        let _ = tokio::time::timeout(self.scenario.ttl * 2, registered.wait_for(|r| *r)).await;
        old_stop.cancel();
        if let Some(task) = old_task {
            let _ = task.await;
        }
        drop(old);
    }
}

async fn drive(scenario: Arc<Scenario>, seed: u64, faults: Vec<Fault>) -> History {
    let start = Instant::now();
    let rec = Recorder::new(start);
    let store = SimStore::with_config(
        SimConfig::default()
            .with_seed(seed)
            .with_latency(scenario.latency)
            // A reply that never comes fails the call after a third of the TTL, as the
            // turmoil runs configure EtcdStore: a client whose request timeout exceeds its
            // lease's TTL loses the lease to one lost reply.
            .with_request_timeout(scenario.ttl / 3),
    );
    let sink = rec.clone();
    store.on_journal(move |at, entry| sink.log_at(at, Happening::Store(entry)));
    let cluster = Arc::new(Cluster {
        store,
        scenario: scenario.clone(),
        rec: rec.clone(),
        seed,
        slots: Mutex::new(Vec::new()),
        store_crashes: Mutex::new(0),
        storms: Mutex::new(Vec::new()),
    });
    for n in 0..scenario.hosts {
        let slot = cluster.start(n, 0);
        cluster.slots().push(slot);
    }
    for f in faults {
        tokio::time::sleep_until(start + f.at).await;
        rec.log(Happening::FaultStart(f.clone()));
        cluster.begin(&f).await;
        if f.kind.lasts() {
            let c = cluster.clone();
            tokio::spawn(async move {
                tokio::time::sleep(f.length).await;
                c.end(&f);
                c.rec.log(Happening::FaultEnd(f));
            });
        }
    }
    tokio::time::sleep_until(start + scenario.heal_at()).await;
    rec.log(Happening::Heal);
    tokio::time::sleep_until(start + scenario.duration).await;
    // The end of the run: stop every node where it stands (no more history).
    let history = rec.take();
    for slot in cluster.slots().iter_mut() {
        link(&slot.client).cut(true);
        if let Some(t) = slot.task.take() {
            t.abort();
        }
    }
    history
}

/// The link faults of one client, as switches.
struct Switches<'a>(&'a SimStore);

fn link(client: &SimStore) -> Switches<'_> {
    Switches(client)
}

impl Switches<'_> {
    fn cut(&self, on: bool) {
        if on {
            self.0.partition()
        } else {
            self.0.repair()
        }
    }

    fn deaf(&self, on: bool) {
        if on {
            self.0.partition_oneway()
        } else {
            self.0.repair_oneway()
        }
    }

    fn held(&self, on: bool) {
        if on {
            self.0.hold()
        } else {
            self.0.release()
        }
    }
}
