//! coord's own service: each node registers itself (and changes its metadata now and then),
//! campaigns in every election and writes through the fence while it leads, and (on the first
//! nodes) follows the cluster. Every belief and output is recorded as it changes; every
//! consumer reads the recipe's state at each event it gets and records what disagrees. The
//! `stop` fault stops one of its parts for a while: the registration, the pool, a leadership.

use std::sync::Arc;
use std::time::Duration;

use coord_api::recipes::{
    ClusterEvent, ClusterView, ClusterWatcher, ClusterWatcherConfig, ElectionPool,
    HostRegistration, Leadership, RegistrationConfig, RegistrationStatus, SessionConfig,
};
use coord_api::sync::watch;
use coord_api::{Error, PutRequest, TxnRequest};
use futures::future::BoxFuture;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::{sleep_until, Instant};
use tokio_util::sync::CancellationToken;

use crate::check::{self, FencedWrites, Invariant};
use crate::history::{Emitted, Happening, Incarnation, Outcome, Part};
use crate::rng::Rng;
use crate::scenario::Scenario;
use crate::service::{Node, PartStopRequest, Service};

/// The prefix every node registers under.
pub const HOSTS: &str = "hosts/";

/// The name of election `e`.
pub fn election_name(e: usize) -> String {
    format!("elections/e{e}")
}

/// The key leaders of election `e` write through the fence.
pub fn work_key(e: usize) -> String {
    format!("work/{}/token", election_name(e))
}

/// The key node `node` registers.
pub fn host_key(node: usize) -> String {
    format!("{HOSTS}n{node}")
}

/// The metadata a node registers: who it is, and a generation that grows with each update.
fn metadata(who: Incarnation, generation: u64) -> String {
    format!("{who}#{generation}")
}

/// The generation of a node's metadata (see [`metadata`]).
pub(crate) fn metadata_generation(value: &[u8]) -> Option<u64> {
    std::str::from_utf8(value)
        .ok()?
        .rsplit_once('#')?
        .1
        .parse()
        .ok()
}

/// coord's own service: the recipes as a service would use them. See the module docs.
#[derive(Debug, Clone, Copy, Default)]
pub struct CoordService;

impl Service for CoordService {
    fn name(&self) -> &str {
        "coord"
    }

    fn run(&self, node: Node) -> BoxFuture<'static, ()> {
        Box::pin(run(node))
    }

    fn invariants(&self, scenario: &Scenario) -> Vec<Box<dyn Invariant>> {
        let mut all = check::coord();
        for e in 0..scenario.elections {
            let prefix = format!("work/{}/", election_name(e));
            all.push(Box::new(FencedWrites::new(election_name(e), prefix, |v| {
                std::str::from_utf8(v).ok()?.parse().ok()
            })));
        }
        all
    }
}

/// One incarnation: see the module docs.
async fn run(node: Node) {
    let mut rng = Rng::new(node.seed());
    let mut parts = node.take_part_stops().expect("the node's own");
    let Some(mut registration) = Registration::start(&node, 0).await else {
        return;
    };
    let watcher = (node.who().node < node.scenario().watchers)
        .then(|| tokio::spawn(follow_watcher(node.clone())));
    let mut pool = Some(Pool::start(&node, &mut rng));
    let mut next_metadata = Instant::now() + metadata_period(&mut rng, node.scenario());
    let mut generation = 0;
    let mut registration_back: Option<Instant> = None;
    let mut pool_back: Option<Instant> = None;
    let far = || Instant::now() + Duration::from_secs(3600 * 24);
    loop {
        tokio::select! {
            biased;
            _ = node.stopping() => break,
            Some(req) = parts.recv() => match req.pick % 3 {
                0 => if let Some(r) = registration.take_running().await {
                    stop_part(&node, Part::Registration, r.stop()).await;
                    registration_back = Some(Instant::now() + req.length);
                },
                1 => if let Some(p) = pool.take() {
                    stop_part(&node, Part::Pool, p.stop()).await;
                    pool_back = Some(Instant::now() + req.length);
                },
                _ => if let Some(p) = &pool {
                    p.resign(req);
                },
            },
            _ = sleep_until(next_metadata), if registration.is_running() => {
                generation += 1;
                registration.update(&node, generation).await;
                next_metadata = Instant::now() + metadata_period(&mut rng, node.scenario());
            }
            _ = sleep_until(registration_back.unwrap_or_else(far)), if registration_back.is_some() => {
                registration_back = None;
                node.record(Happening::PartStarted { who: node.who(), part: Part::Registration });
                match Registration::start(&node, generation).await {
                    Some(r) => registration = r,
                    None => break,
                }
            }
            _ = sleep_until(pool_back.unwrap_or_else(far)), if pool_back.is_some() => {
                pool_back = None;
                node.record(Happening::PartStarted { who: node.who(), part: Part::Pool });
                pool = Some(Pool::start(&node, &mut rng));
            }
        }
    }
    node.record(Happening::Stopping(node.who()));
    let mut clean = true;
    // The campaign loops resign first, so the pool is idle when it closes.
    if let Some(p) = pool {
        clean &= p.stop().await.is_ok();
    }
    if let Some(r) = registration.take_running().await {
        clean &= r.stop().await.is_ok();
    }
    if let Some(w) = watcher {
        let _ = w.await;
    }
    node.record(Happening::Stopped {
        who: node.who(),
        clean,
    });
}

/// Records the stop of a part around it.
async fn stop_part(
    node: &Node,
    part: Part,
    stop: impl std::future::Future<Output = coord_api::Result<()>>,
) {
    node.record(Happening::PartStopping {
        who: node.who(),
        part: part.clone(),
    });
    let clean = stop.await.is_ok();
    node.record(Happening::PartStopped {
        who: node.who(),
        part,
        clean,
    });
}

fn metadata_period(rng: &mut Rng, s: &Scenario) -> Duration {
    let ms = s.ttl.as_millis() as u64;
    Duration::from_millis(rng.between(ms / 2, ms * 3))
}

/// The node's registration, and the task that follows its status.
enum Registration {
    Running(Arc<HostRegistration>, JoinHandle<()>),
    Stopped,
}

impl Registration {
    /// Registers (with metadata of `generation`), retrying until it works or the node stops.
    async fn start(node: &Node, generation: u64) -> Option<Registration> {
        let s = node.scenario();
        let config =
            RegistrationConfig::new(host_key(node.who().node), metadata(node.who(), generation))
                .with_ttl(s.ttl)
                .with_backoff(s.initial_backoff, s.max_backoff)
                .with_backoff_seed(node.seed());
        let mut retry = Rng::new(node.seed() ^ generation);
        loop {
            tokio::select! {
                biased;
                _ = node.stopping() => return None,
                r = HostRegistration::start(node.store().clone(), config.clone()) => match r {
                    Ok(reg) => {
                        let reg = Arc::new(reg);
                        let follower = tokio::spawn(follow_registration(node.clone(), reg.clone()));
                        return Some(Registration::Running(reg, follower));
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(retry.between(100, 400))).await,
                },
            }
        }
    }

    fn is_running(&self) -> bool {
        matches!(self, Registration::Running(..))
    }

    async fn take_running(&mut self) -> Option<HostRegistration> {
        match std::mem::replace(self, Registration::Stopped) {
            Registration::Running(reg, follower) => {
                follower.abort();
                // The follower held the other handle; it is gone once the task is.
                let _ = follower.await;
                Arc::into_inner(reg)
            }
            Registration::Stopped => None,
        }
    }

    /// Changes the metadata; recorded once the update returned, when every later write of
    /// the key carries it.
    async fn update(&self, node: &Node, generation: u64) {
        let Registration::Running(reg, _) = self else {
            return;
        };
        let value = metadata(node.who(), generation);
        if reg.update_metadata(value.clone()).await.is_ok() {
            node.record(Happening::Metadata {
                who: node.who(),
                key: host_key(node.who().node),
                value,
            });
        }
    }
}

/// Records the registration's status as the node's belief; checks, at each change, that
/// the lease the handle reports is the one the status names.
async fn follow_registration(node: Node, reg: Arc<HostRegistration>) {
    let mut status = reg.subscribe();
    let key = host_key(node.who().node);
    let mut believed = None;
    loop {
        let now = status.get_and_update();
        let lease = match now {
            RegistrationStatus::Registered { lease } => Some(lease),
            _ => None,
        };
        if let Some(l) = lease {
            let reported = reg.lease_id();
            if reported != l {
                node.record(Happening::Inconsistent {
                    who: node.who(),
                    detail: format!(
                        "registration status names lease {l}, lease_id() says {reported}"
                    ),
                });
            }
        }
        if lease != believed {
            node.record(match lease {
                Some(l) => Happening::Registered {
                    who: node.who(),
                    key: key.clone(),
                    lease: l,
                },
                None => Happening::Unregistered {
                    who: node.who(),
                    key: key.clone(),
                },
            });
            if lease.is_some() {
                node.ready();
            }
            believed = lease;
        }
        if status.changed().await.is_err() {
            return;
        }
    }
}

async fn start_watcher(node: &Node) -> Option<ClusterWatcher> {
    let mut retry = Rng::new(node.seed() ^ 0x5eed);
    loop {
        tokio::select! {
            biased;
            _ = node.stopping() => return None,
            r = ClusterWatcher::start(node.store().clone(), ClusterWatcherConfig::new(HOSTS)) => match r {
                Ok(w) => return Some(w),
                Err(_) => tokio::time::sleep(Duration::from_millis(retry.between(100, 400))).await,
            },
        }
    }
}

fn hosts_of(view: &ClusterView) -> Vec<(String, String)> {
    view.hosts
        .iter()
        .map(|(h, m)| (h.clone(), String::from_utf8_lossy(m).into_owned()))
        .collect()
}

/// Records every view the watcher publishes and every event it emits; checks, at each
/// event, that the view already holds it.
async fn follow_watcher(node: Node) {
    let Some(mut watcher) = start_watcher(&node).await else {
        return;
    };
    let mut views = watcher.subscribe_view();
    let mut last_revision = None;
    loop {
        // Record the view first: the watcher publishes a view before the event it explains.
        let view = views.get_and_update();
        if last_revision != Some(view.revision) {
            node.record(Happening::View {
                who: node.who(),
                revision: view.revision,
                hosts: hosts_of(&view),
            });
            last_revision = Some(view.revision);
        }
        tokio::select! {
            biased;
            _ = node.stopping() => {
                // What the view already holds was emitted too: read it to the end.
                watcher.stop().await;
                while let Some(event) = watcher.next().await {
                    node.record(Happening::Emitted(node.who(), emitted(event)));
                }
                return;
            }
            changed = views.changed() => if changed.is_err() { return },
            event = watcher.next() => {
                let Some(event) = event else { return };
                if let Some(wrong) = view_disagrees(&event, &watcher.view()) {
                    node.record(Happening::Inconsistent { who: node.who(), detail: wrong });
                }
                node.record(Happening::Emitted(node.who(), emitted(event)));
            }
        }
    }
}

/// Whether the view a consumer reads on getting `event` is older than the event, or, at the
/// event's own revision, misses its change. (A newer view may have moved on: the host may be
/// back, or gone again.)
fn view_disagrees(event: &ClusterEvent, view: &ClusterView) -> Option<String> {
    let (revision, holds) = match event {
        ClusterEvent::HostUp {
            host,
            metadata,
            revision,
        }
        | ClusterEvent::HostUpdated {
            host,
            metadata,
            revision,
        } => (*revision, view.hosts.get(host) == Some(metadata)),
        ClusterEvent::HostDown { host, revision, .. } => {
            (*revision, !view.hosts.contains_key(host))
        }
        ClusterEvent::Resynced { revision } => (*revision, true),
    };
    let wrong = view.revision < revision || (view.revision == revision && !holds);
    wrong.then(|| {
        format!(
            "the watcher emitted {event:?} while its view was at revision {} ({} hosts)",
            view.revision,
            view.hosts.len()
        )
    })
}

fn emitted(e: ClusterEvent) -> Emitted {
    let md = |m: coord_api::Bytes| String::from_utf8_lossy(&m).into_owned();
    match e {
        ClusterEvent::HostUp {
            host,
            metadata,
            revision,
        } => Emitted::Up(host, md(metadata), revision),
        ClusterEvent::HostUpdated {
            host,
            metadata,
            revision,
        } => Emitted::Updated(host, md(metadata), revision),
        ClusterEvent::HostDown { host, revision, .. } => Emitted::Down(host, revision),
        ClusterEvent::Resynced { revision } => Emitted::Resynced(revision),
    }
}

/// The node's election pool and a campaign loop per election.
struct Pool {
    pool: Arc<ElectionPool>,
    loops: JoinSet<()>,
    stop: CancellationToken,
    /// Per election: resign now, then wait this long before campaigning again.
    resign: Vec<Arc<watch::Sender<Option<PartStopRequest>>>>,
}

impl Pool {
    fn start(node: &Node, rng: &mut Rng) -> Pool {
        let s = node.scenario();
        let mut config = SessionConfig::default().with_ttl(s.ttl);
        if let Some(every) = s.renew_interval {
            config = config.with_renew_interval(every);
        }
        let pool = Arc::new(ElectionPool::new(node.store().clone(), config));
        let stop = CancellationToken::new();
        let mut loops = JoinSet::new();
        let mut resign = Vec::new();
        for e in 0..s.elections {
            let signal = Arc::new(watch::Sender::new(None));
            resign.push(signal.clone());
            loops.spawn(campaign_loop(
                node.clone(),
                pool.clone(),
                e,
                rng.fork(),
                stop.clone(),
                signal,
            ));
        }
        Pool {
            pool,
            loops,
            stop,
            resign,
        }
    }

    fn resign(&self, req: PartStopRequest) {
        let e = (req.pick / 3) as usize % self.resign.len().max(1);
        if let Some(signal) = self.resign.get(e) {
            signal.send_replace(Some(req));
        }
    }

    /// Stops campaigning (each loop resigns what it leads), then closes the pool (its session
    /// revoked).
    async fn stop(mut self) -> coord_api::Result<()> {
        self.stop.cancel();
        while self.loops.join_next().await.is_some() {}
        self.pool.close().await
    }
}

/// Campaigns in election `e` until stopped; leads while it can.
async fn campaign_loop(
    node: Node,
    pool: Arc<ElectionPool>,
    e: usize,
    mut rng: Rng,
    stop: CancellationToken,
    resign: Arc<watch::Sender<Option<PartStopRequest>>>,
) {
    let name = election_name(e);
    let mut resign_rx = resign.subscribe();
    loop {
        let won = tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            _ = node.stopping() => return,
            r = pool.campaign(&name, node.who().to_string()) => r,
        };
        match won {
            Ok(leadership) => {
                let token = leadership.token();
                if !leadership.is_leader() {
                    node.record(Happening::Inconsistent {
                        who: node.who(),
                        detail: format!("campaign in {name} returned a leadership (token {token}) that is not leading: {:?}", leadership.loss()),
                    });
                }
                node.leader_start(&name, token);
                let ended = lead(&node, &leadership, e, &mut rng, &stop, &mut resign_rx).await;
                // A node that resigns stops believing before it asks the store to delete its
                // key (the delete may apply long before its reply arrives, if ever).
                let resigned = !matches!(ended, Ended::Lost);
                node.leader_end(&name, token, resigned);
                match ended {
                    Ended::Lost => {}
                    Ended::Resigned => {
                        let _ = leadership.resign().await;
                        if stop.is_cancelled() || node.is_stopping() {
                            return;
                        }
                        // After handing over, let someone else win.
                        tokio::time::sleep(node.scenario().ttl).await;
                    }
                    Ended::Told(req) => {
                        let part = Part::Leadership(name.clone());
                        stop_part(&node, part.clone(), leadership.resign()).await;
                        tokio::select! {
                            biased;
                            _ = stop.cancelled() => return,
                            _ = tokio::time::sleep(req.length) => {}
                        }
                        node.record(Happening::PartStarted {
                            who: node.who(),
                            part,
                        });
                    }
                }
            }
            Err(_) => {
                let delay = Duration::from_millis(rng.between(100, 500));
                tokio::time::sleep(delay).await;
            }
        }
    }
}

/// How a leadership ended.
enum Ended {
    /// Lost (deadline, key deleted, fenced out).
    Lost,
    /// Resigned: on stop, or now and then to hand over.
    Resigned,
    /// Resigned because a `stop` fault asked for it.
    Told(PartStopRequest),
}

/// Acts as leader every TTL/4 until the leadership ends.
async fn lead(
    node: &Node,
    leadership: &Leadership,
    e: usize,
    rng: &mut Rng,
    stop: &CancellationToken,
    resign: &mut watch::Receiver<Option<PartStopRequest>>,
) -> Ended {
    let every = node.scenario().ttl / 4;
    let name = election_name(e);
    let _ = resign.get_and_update();
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => return Ended::Resigned,
            _ = node.stopping() => return Ended::Resigned,
            _ = leadership.lost() => return Ended::Lost,
            told = resign.changed() => if told.is_ok() {
                if let Some(req) = resign.get() { return Ended::Told(req) }
            },
            _ = tokio::time::sleep(every) => {}
        }
        if !leadership.is_leader() {
            continue;
        }
        // A paused process checked its leadership, then stalls before acting: the act comes
        // late, and only the fence stops it from doing harm. The write goes on in a task of
        // its own: a leader that stops waiting for it (its leadership lost) cannot call back
        // a request already sent, and the store judges it when it lands.
        let fence = leadership.fence();
        let writer = node.clone();
        let (election, token) = (name.clone(), leadership.token());
        let write = tokio::spawn(async move {
            writer.unpaused().await;
            let txn = TxnRequest::new().and_then([PutRequest::new(work_key(e), token.to_string())]);
            let outcome = match fence.txn(txn).await {
                Ok(r) if r.succeeded => Outcome::Accepted,
                Ok(_) => Outcome::Unknown,
                Err(Error::FencedOut { .. }) => Outcome::FencedOut,
                Err(_) => Outcome::Unknown,
            };
            writer.record(Happening::FencedWrite {
                who: writer.who(),
                election,
                token,
                outcome,
            });
        });
        tokio::select! {
            biased;
            _ = leadership.lost() => return Ended::Lost,
            _ = write => {}
        }
        if rng.chance(0.05) {
            return Ended::Resigned;
        }
    }
}
