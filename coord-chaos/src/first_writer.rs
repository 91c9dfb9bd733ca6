//! Holds aimed at a write, in-process: the first node to send a write after the hold begins
//! is held from that write on, the write first, until every lease its client holds has
//! ended at the store. The write lands just after the store let the node's keys go (and, in
//! an election, made its successor the leader): a process paused or a link stalled past its
//! TTL in the middle of a write, the moment a write without the fence does its damage.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use coord_api::sync::watch;
use coord_api::LeaseId;
use coord_sim::journal::{Entry, Origin};
use coord_sim::SimStore;

use crate::fault::Fault;
use crate::history::Happening;
use crate::recorder::Recorder;

/// The leases each client holds, from the store's journal.
#[derive(Clone)]
pub(crate) struct Leases {
    inner: Arc<Mutex<LeasesInner>>,
    /// Bumped as a lease ends.
    ended: Arc<watch::Sender<u64>>,
}

#[derive(Default)]
struct LeasesInner {
    by_client: BTreeMap<u64, BTreeSet<LeaseId>>,
    owner: BTreeMap<LeaseId, u64>,
}

impl Default for Leases {
    fn default() -> Self {
        Leases {
            inner: Arc::default(),
            ended: Arc::new(watch::Sender::new(0)),
        }
    }
}

impl Leases {
    /// Takes in one journal entry.
    pub(crate) fn note(&self, entry: &Entry) {
        match entry {
            Entry::Grant {
                lease,
                origin: Origin::Client(c),
                ..
            } => {
                let mut l = self.lock();
                l.by_client.entry(*c).or_default().insert(*lease);
                l.owner.insert(*lease, *c);
            }
            Entry::LeaseEnd { lease, .. } => {
                {
                    let mut l = self.lock();
                    if let Some(c) = l.owner.remove(lease) {
                        if let Some(set) = l.by_client.get_mut(&c) {
                            set.remove(lease);
                        }
                    }
                }
                self.ended.send_modify(|n| *n += 1);
            }
            _ => {}
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LeasesInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn holds_any(&self, client: u64) -> bool {
        self.lock()
            .by_client
            .get(&client)
            .is_some_and(|s| !s.is_empty())
    }

    /// Resolves once `client` holds no lease.
    async fn none_left(&self, client: u64) {
        let mut ended = self.ended.subscribe();
        while self.holds_any(client) {
            if ended.changed().await.is_err() {
                return;
            }
        }
    }
}

/// What a node's link is set to: the world's own setter, so that the hold nests with its
/// other link faults.
pub(crate) type SetHeld = Arc<dyn Fn(usize, bool) + Send + Sync>;

/// One hold waiting for the first writer among `clients` (the nodes' live clients).
pub(crate) struct Aim {
    clients: Vec<SimStore>,
}

impl Aim {
    /// Arms `fault` on every client in `clients` (node `n`'s at index `n`, `None` for a node
    /// that is down). The first to send a write is held (through `set_held`), the fault
    /// recorded on its node; it is released, and the fault recorded as ended, once the
    /// node's client holds no lease, or at `latest`, whichever comes first.
    pub(crate) fn arm(
        fault: &Fault,
        clients: Vec<Option<SimStore>>,
        leases: &Leases,
        rec: &Recorder,
        set_held: SetHeld,
        latest: tokio::time::Instant,
    ) -> Aim {
        // Set by the first node to write: the others' callbacks then do nothing.
        let hit: Arc<Mutex<Option<Fault>>> = Arc::default();
        for (n, client) in clients.iter().enumerate() {
            let Some(client) = client else { continue };
            let (fault, leases, rec, set_held) =
                (fault.clone(), leases.clone(), rec.clone(), set_held.clone());
            let (hit, id) = (hit.clone(), client.client_id());
            client.on_next_write(move || {
                let mut hit = hit.lock().unwrap_or_else(|p| p.into_inner());
                if hit.is_some() {
                    return;
                }
                let fault = Fault { node: n, ..fault };
                rec.record(Happening::FaultStart(fault.clone()));
                *hit = Some(fault.clone());
                set_held(n, true);
                let until = latest.max(tokio::time::Instant::now());
                tokio::spawn(async move {
                    tokio::select! {
                        () = leases.none_left(id) => {}
                        () = tokio::time::sleep_until(until) => {}
                    }
                    set_held(n, false);
                    rec.record(Happening::FaultEnd(fault));
                });
            });
        }
        Aim {
            clients: clients.into_iter().flatten().collect(),
        }
    }

    /// The hold's scheduled end: a node not hit by then is spared. (One that was hit stays
    /// held until its leases are gone.)
    pub(crate) fn end(self) {
        for c in &self.clients {
            c.call_off_next_write();
        }
    }
}
