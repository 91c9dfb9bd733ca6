//! Your service under chaos: what a node of it runs, and what it gets from the run.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use coord_api::sync::{watch, Stop};
use coord_api::{DynKvLeaseStore, Revision};
use futures::future::BoxFuture;
use tokio::sync::mpsc;

use crate::check::Invariant;
use crate::history::{Happening, Incarnation};
use crate::recorder::Recorder;
use crate::scenario::Scenario;

/// A service the chaos runner runs on every node: coord's own ([`CoordService`]), or yours.
///
/// Each node runs [`run`](Service::run) once per incarnation: a crash drops the future where
/// it stands (its tasks with it, its connection cut), a restart runs it again as a new
/// incarnation, a graceful stop fires [`Node::stopping`] and waits for it to return. What it
/// believes and outputs, it records on the run's history through its [`Node`]; the runner
/// checks that history against the generic invariants and the service's own.
///
/// [`CoordService`]: crate::CoordService
pub trait Service: Send + Sync + 'static {
    /// A short name, for reports.
    fn name(&self) -> &str;

    /// Runs one incarnation of a node, until [`Node::stopping`] fires (stop what it holds,
    /// then return) or the future is dropped (a crash).
    fn run(&self, node: Node) -> BoxFuture<'static, ()>;

    /// What this service promises, beyond the generic invariants every run is held to.
    fn invariants(&self, scenario: &Scenario) -> Vec<Box<dyn Invariant>> {
        let _ = scenario;
        Vec::new()
    }

    /// The key prefixes an operator's faults act on: a `revoke` fault revokes the lease of a
    /// key drawn from the keys under them, a `delete` fault deletes one (as an operator's
    /// `etcdctl lease revoke` or `etcdctl del` would). Name the service's coordination keys
    /// here: its registrations, its elections, its locks (for an election named `jobs`, the
    /// prefix `jobs/`), not data whose loss is no coordination fault. None by default:
    /// operator faults then find nothing to act on and are neither recorded nor counted.
    fn operator_prefixes(&self) -> Vec<String> {
        Vec::new()
    }
}

/// A request to stop one part of a node for a while (the `stop` fault kind): the stops a real
/// process makes of its own accord (a component restarted, a leadership handed over, a
/// worker recycled), at moments the seed draws.
///
/// What a part is, is the service's business: take the requests with
/// [`Node::take_part_stops`], choose a part from `pick` (`pick % parts`), stop it the way the
/// service would (a graceful stop: resign, release, deregister), and start it again after
/// `length`. coord's own nodes pick their registration, their election pool or one
/// leadership. A service that never takes them gets no `stop` faults, and the run's summary
/// counts none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartStopRequest {
    /// A number to pick the part with.
    pub pick: u64,
    /// How long the part stays stopped before it starts again.
    pub length: Duration,
}

/// What one incarnation of a node gets from the run: who it is, its connection to the store,
/// the history to record on, and the run's signals. Cheap to clone.
#[derive(Clone)]
pub struct Node {
    inner: Arc<Inner>,
}

struct Inner {
    who: Incarnation,
    store: Arc<DynKvLeaseStore>,
    recorder: Recorder,
    scenario: Arc<Scenario>,
    seed: u64,
    paused: watch::Receiver<bool>,
    stop: Stop,
    ready: watch::Sender<bool>,
    part_stops: Mutex<Option<mpsc::UnboundedReceiver<PartStopRequest>>>,
    part_stops_taken: Arc<AtomicBool>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("who", &self.inner.who)
            .finish()
    }
}

/// Runs one incarnation of `service` on `node`: a panic is recorded on the history (an
/// inconsistency, which fails the run), never lost with the task.
pub(crate) async fn run_node(service: Arc<dyn Service>, node: Node) {
    use futures::FutureExt;
    let who = node.who();
    let recorder = node.inner.recorder.clone();
    // Every log line of the node (the recipes' tasks follow their caller's span) names it.
    let span = tracing::info_span!("node", who = %who);
    let run =
        std::panic::AssertUnwindSafe(tracing::Instrument::instrument(service.run(node), span))
            .catch_unwind();
    if let Err(panic) = run.await {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic".to_owned());
        recorder.record(Happening::Inconsistent {
            who,
            detail: format!("the node panicked: {what}"),
        });
    }
}

/// The run's side of a [`Node`]: how a world signals it (its pauses come from the world's
/// own switch, which outlives incarnations).
pub(crate) struct NodeControl {
    pub(crate) stop: Stop,
    pub(crate) ready: watch::Receiver<bool>,
    pub(crate) part_stops: PartStops,
}

/// Where a world sends an incarnation its part-stop requests.
#[derive(Clone)]
pub(crate) struct PartStops {
    tx: mpsc::UnboundedSender<PartStopRequest>,
    taken: Arc<AtomicBool>,
}

impl PartStops {
    /// Sends `request`; whether it reached a service that takes part stops (it acts).
    pub(crate) fn send(&self, request: PartStopRequest) -> bool {
        self.taken.load(Ordering::Acquire) && self.tx.send(request).is_ok()
    }
}

impl Node {
    /// A node and the handles a world keeps to drive it.
    pub(crate) fn new(
        who: Incarnation,
        store: Arc<DynKvLeaseStore>,
        recorder: Recorder,
        scenario: Arc<Scenario>,
        seed: u64,
        paused: watch::Receiver<bool>,
    ) -> (Node, NodeControl) {
        let (ready, ready_rx) = watch::channel(false);
        let (parts_tx, parts) = mpsc::unbounded_channel();
        let taken = Arc::new(AtomicBool::new(false));
        let stop = Stop::new();
        let node = Node {
            inner: Arc::new(Inner {
                who,
                store,
                recorder,
                scenario,
                seed,
                paused,
                stop: stop.clone(),
                ready,
                part_stops: Mutex::new(Some(parts)),
                part_stops_taken: taken.clone(),
            }),
        };
        let control = NodeControl {
            stop,
            ready: ready_rx,
            part_stops: PartStops {
                tx: parts_tx,
                taken,
            },
        };
        (node, control)
    }

    /// Which node, which incarnation.
    pub fn who(&self) -> Incarnation {
        self.inner.who
    }

    /// This incarnation's connection to the store: faults on the node's link hit it.
    pub fn store(&self) -> &Arc<DynKvLeaseStore> {
        &self.inner.store
    }

    /// The scenario being run.
    pub fn scenario(&self) -> &Scenario {
        &self.inner.scenario
    }

    /// A seed for the node's own random choices (drawn from the run's seed, distinct per
    /// incarnation), so that they replay too.
    pub fn seed(&self) -> u64 {
        self.inner.seed
    }

    /// Records something on the run's history, now.
    pub fn record(&self, what: Happening) {
        self.inner.recorder.record_by(self.inner.who, what);
    }

    /// Records a note of the service's own (`kind`, `detail`), for its invariants.
    pub fn note(&self, kind: impl Into<String>, detail: impl Into<String>) {
        self.record(Happening::Note {
            who: self.who(),
            kind: kind.into(),
            detail: detail.into(),
        });
    }

    /// Records that this node now believes it leads `election` with `token` (the generic
    /// election invariants then hold it to exclusivity, growing tokens and failover).
    pub fn leader_start(&self, election: &str, token: Revision) {
        self.record(Happening::LeaderStart {
            who: self.who(),
            election: election.to_owned(),
            token,
        });
    }

    /// Records that this node no longer believes it leads `election` (`resigned`: it gave the
    /// leadership up, rather than lost it). Record it before resigning: the delete may land
    /// long before its reply comes back, and a delete of the node's own that lands while it
    /// still believes breaks S9.
    pub fn leader_end(&self, election: &str, token: Revision, resigned: bool) {
        self.record(Happening::LeaderEnd {
            who: self.who(),
            election: election.to_owned(),
            token,
            resigned,
        });
    }

    /// Records that this node now believes it holds a permit of `semaphore` with `token`
    /// (a [`Permits`](crate::Permits) invariant holds it to the semaphore's count).
    pub fn permit_start(&self, semaphore: &str, token: Revision) {
        self.record(Happening::PermitStart {
            who: self.who(),
            semaphore: semaphore.to_owned(),
            token,
        });
    }

    /// Records that this node no longer believes it holds the permit (`released`: it let it
    /// go, rather than lost it). Record it before releasing, as with
    /// [`leader_end`](Self::leader_end).
    pub fn permit_end(&self, semaphore: &str, token: Revision, released: bool) {
        self.record(Happening::PermitEnd {
            who: self.who(),
            semaphore: semaphore.to_owned(),
            token,
            released,
        });
    }

    /// Records that the work of this node's term `token` in `election` began, and returns a
    /// guard that records its end when dropped (the work returned, or was dropped). W1 holds
    /// the work of two terms to never overlap.
    pub fn work_started(&self, election: &str, token: Revision) -> WorkGuard {
        self.record(Happening::WorkStarted {
            who: self.who(),
            election: election.to_owned(),
            token,
        });
        WorkGuard {
            node: self.clone(),
            election: election.to_owned(),
            token,
        }
    }

    /// Resolves when the node is asked to stop gracefully.
    ///
    /// In a select loop, make one for the loop and poll it by reference (`tokio::pin!`, then
    /// `&mut stopping`): polled again it costs a load, where a fresh one each turn registers
    /// and unregisters a waiter, a lock each.
    pub async fn stopping(&self) {
        self.inner.stop.stopped().await
    }

    /// Whether the node is asked to stop.
    pub fn is_stopping(&self) -> bool {
        self.inner.stop.is_stopped()
    }

    /// Waits while a pause (a GC pause, the `pause` fault) stalls the node's actions: call it
    /// between deciding to act and acting, where a real pause would hurt.
    pub async fn unpaused(&self) {
        let mut paused = self.inner.paused.clone();
        let _ = paused.wait_for(|p| !*p).await;
    }

    /// Tells a rolling restart that this incarnation is up, so that the old one is stopped
    /// now.
    ///
    /// A rolling restart (the `restart` fault) starts the new incarnation beside the old one
    /// and stops the old one when the new one says it is ready, as an orchestrator waits for
    /// a readiness probe; call it once the node serves (its session granted, its
    /// registration up). A node that never calls it is stopped after 2 TTL all the same, so
    /// restarts then overlap for that long.
    pub fn ready(&self) {
        self.inner.ready.send_replace(true);
    }

    /// The requests to stop one of this incarnation's parts for a while (the `stop` fault
    /// kind; see [`PartStopRequest`] for what to do with them); `None` after the first call.
    /// Until a node takes them, it gets none.
    pub fn take_part_stops(&self) -> Option<mpsc::UnboundedReceiver<PartStopRequest>> {
        let taken = self
            .inner
            .part_stops
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if taken.is_some() {
            self.inner.part_stops_taken.store(true, Ordering::Release);
        }
        taken
    }
}

/// Records the end of a term's work when dropped; from [`Node::work_started`].
#[derive(Debug)]
pub struct WorkGuard {
    node: Node,
    election: String,
    token: Revision,
}

impl Drop for WorkGuard {
    fn drop(&mut self) {
        self.node.record(Happening::WorkEnded {
            who: self.node.who(),
            election: std::mem::take(&mut self.election),
            token: self.token,
        });
    }
}
