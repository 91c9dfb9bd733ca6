//! coord's own service: each node holds one lease (a `HostSession`), registers itself under
//! it (and changes its metadata now and then), runs a `Candidate` in every election on it
//! whose work writes through the fence while it leads (and now and then hands its term over
//! to a newer campaign of its own, which rejoins the key), takes a shared lock and a permit
//! of a shared semaphore now and then (`coord_locker`), and (on the first nodes) follows the
//! cluster. Every belief and output is recorded as it changes; every consumer reads the
//! recipe's state at each event it gets and records what disagrees. The `stop` fault stops
//! one of its parts for a while: the registration, the pool, a candidate.

use std::sync::Arc;
use std::time::Duration;

use coord_api::recipes::{
    Candidate, ClusterWatcher, ClusterWatcherConfig, ElectionPool, HostRegistration, HostSession,
    Leadership, RegistrationStatus, Term,
};
use coord_api::sync::{watch, Stop};
use coord_api::Revision;
use futures::future::BoxFuture;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::{sleep_until, Instant};
use tracing::Instrument;

use super::host_key_writes::HostKeyWrites;
use super::locker::{
    locker, Shared, LOCK, LOCK_WORK_PREFIX, PERMITS, PERMIT_WORK_PREFIX, SEMAPHORE,
};
use crate::check::{self, FencedWrites, Invariant, PermitHeld, Permits};
use crate::fenced_act::write_through;
use crate::history::{Happening, Part};
use crate::keys::{election_name, host_key, metadata, work_key, HOSTS};
use crate::rng::Rng;
use crate::scenario::Scenario;
use crate::service::{Node, PartStopRequest, Service};

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

    fn operator_prefixes(&self) -> Vec<String> {
        vec![HOSTS.to_owned(), "elections/".to_owned()]
    }

    fn invariants(&self, scenario: &Scenario) -> Vec<Box<dyn Invariant>> {
        let mut all = check::recipes();
        all.push(Box::new(PermitHeld::new(SEMAPHORE)));
        for e in 0..scenario.elections {
            let prefix = format!("work/{}/", election_name(e));
            all.push(Box::new(FencedWrites::new(election_name(e), prefix, token)));
        }
        all.push(Box::new(FencedWrites::new(LOCK, LOCK_WORK_PREFIX, token)));
        all.push(Box::new(Permits::new(
            SEMAPHORE,
            PERMITS as usize,
            PERMIT_WORK_PREFIX,
            token,
        )));
        all
    }
}

/// One incarnation: see the module docs.
async fn run(node: Node) {
    let mut rng = Rng::new(node.seed());
    let mut parts = node.take_part_stops().expect("the node's own");
    let s = node.scenario();
    let config = s.session_config();
    // The host's store records each write of the host key as it is sent (L7).
    let store = HostKeyWrites::new(&node, &host_key(node.who().node));
    let host = HostSession::new(Arc::new(store), config);
    let mut registration = Registration::start(&node, &host, 0);
    // Helper tasks sit in a JoinSet, which aborts them when dropped: a crash (this task
    // aborted) takes them down with the incarnation, as a process's crash would.
    let watcher = (node.who().node < node.scenario().watchers).then(|| {
        let mut set = JoinSet::new();
        set.spawn(follow_watcher(node.clone()).in_current_span());
        set
    });
    let mut pool = Some(Pool::start(&node, &host, &mut rng));
    // One timer each for the loop's life, moved when their instant changes: a select builds
    // its branches afresh each turn, and fresh timers were registered and torn down at every
    // wake-up of a thousand nodes. The part timers wait only while their part is stopped.
    let metadata_timer = sleep_until(Instant::now() + metadata_period(&mut rng, node.scenario()));
    let registration_timer = sleep_until(Instant::now());
    let pool_timer = sleep_until(Instant::now());
    tokio::pin!(metadata_timer, registration_timer, pool_timer);
    let mut generation = 0;
    let mut registration_back = false;
    let mut pool_back = false;
    // One wait for the whole loop: each turn polls it again, and a fresh one each turn would
    // register and unregister a waiter every time.
    let stopping = node.stopping();
    tokio::pin!(stopping);
    loop {
        tokio::select! {
            biased;
            _ = &mut stopping => break,
            Some(req) = parts.recv() => match req.pick % 3 {
                0 => if let Some(r) = registration.take_running().await {
                    let _ = stop_part(&node, Part::Registration, r.stop()).await;
                    registration_timer.as_mut().reset(Instant::now() + req.length);
                    registration_back = true;
                },
                1 => if let Some(p) = pool.take() {
                    let _ = stop_part(&node, Part::Pool, p.stop()).await;
                    pool_timer.as_mut().reset(Instant::now() + req.length);
                    pool_back = true;
                },
                _ => if let Some(p) = &pool {
                    p.resign(req);
                },
            },
            _ = metadata_timer.as_mut(), if registration.is_running() => {
                generation += 1;
                // An update waits up to the request timeout when the store is slow; a stop
                // (the rolling restart's new incarnation is up) must not wait for it.
                tokio::select! {
                    biased;
                    _ = &mut stopping => break,
                    _ = registration.update(&node, generation) => {}
                }
                let next = coord_api::hooks::clock::now() + metadata_period(&mut rng, node.scenario());
                metadata_timer.as_mut().reset(next);
            }
            _ = registration_timer.as_mut(), if registration_back => {
                registration_back = false;
                node.record(Happening::PartStarted { who: node.who(), part: Part::Registration });
                registration = Registration::start(&node, &host, generation);
            }
            _ = pool_timer.as_mut(), if pool_back => {
                pool_back = false;
                node.record(Happening::PartStarted { who: node.who(), part: Part::Pool });
                pool = Some(Pool::start(&node, &host, &mut rng));
            }
        }
    }
    node.record(Happening::Stopping(node.who()));
    let mut clean = true;
    // The registration's key goes first, as a service leaves its peers' views before it
    // lets go of its work: a slow stop of the candidates and lock holders (a round trip each
    // on a slow link) must not keep an old incarnation's key over a new one's (S7). Then the
    // candidates and holders let go, then the host's lease.
    if let Some(r) = registration.take_running().await {
        clean &= r.stop().await.is_ok();
    }
    if let Some(p) = pool {
        clean &= p.stop().await.is_ok();
    }
    clean &= host.stop().await.is_ok();
    if let Some(mut w) = watcher {
        while w.join_next().await.is_some() {}
    }
    node.record(Happening::Stopped {
        who: node.who(),
        clean,
    });
}

/// Records the stop of a part (or the end of a hold) around it, for L7; returns its result.
pub(crate) async fn stop_part(
    node: &Node,
    part: Part,
    stop: impl std::future::Future<Output = coord_api::Result<()>>,
) -> coord_api::Result<()> {
    node.record(Happening::PartStopping {
        who: node.who(),
        part: part.clone(),
    });
    let result = stop.await;
    node.record(Happening::PartStopped {
        who: node.who(),
        part,
        clean: result.is_ok(),
    });
    result
}

fn metadata_period(rng: &mut Rng, s: &Scenario) -> Duration {
    let ms = s.ttl.as_millis() as u64;
    Duration::from_millis(rng.between(ms / 2, ms * 3))
}

/// The node's registration, and the task that follows its status.
enum Registration {
    /// The follower in a set of its own, aborted with it (see `run`).
    Running(Arc<HostRegistration>, JoinSet<()>),
    Stopped,
}

impl Registration {
    /// Registers (with metadata of `generation`) on the host's session, in the background:
    /// the registration comes up whenever the store answers.
    fn start(node: &Node, host: &HostSession, generation: u64) -> Registration {
        let s = node.scenario();
        let config = s
            .registration_config(host_key(node.who().node), metadata(node.who(), generation))
            .with_backoff_seed(node.seed());
        let reg = Arc::new(HostRegistration::spawn_on(host, config).expect("a valid key"));
        let mut follower = JoinSet::new();
        follower.spawn(follow_registration(node.clone(), reg.clone()).in_current_span());
        Registration::Running(reg, follower)
    }

    fn is_running(&self) -> bool {
        matches!(self, Registration::Running(..))
    }

    async fn take_running(&mut self) -> Option<HostRegistration> {
        match std::mem::replace(self, Registration::Stopped) {
            Registration::Running(reg, mut follower) => {
                follower.abort_all();
                // The follower held the other handle; it is gone once the task is.
                while follower.join_next().await.is_some() {}
                Arc::into_inner(reg)
            }
            Registration::Stopped => None,
        }
    }

    /// Changes the metadata; recorded once the update returned, when every write of the key
    /// sent later carries it.
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

/// Records every view the watcher publishes and every event it emits, until the node stops.
async fn follow_watcher(node: Node) {
    let Some(watcher) = start_watcher(&node).await else {
        return;
    };
    let recorder = node.clone();
    let stopping = node.clone();
    crate::watcher_record::record_watcher(
        watcher,
        node.who(),
        move |h| recorder.record(h),
        async move { stopping.stopping().await },
    )
    .await;
}

/// The node's election pool, on the host's session, and a candidate per election.
struct Pool {
    pool: ElectionPool,
    /// The lock and semaphore parts (`coord_locker`), stopped with the candidates.
    lock: JoinSet<coord_api::Result<()>>,
    loops: JoinSet<()>,
    stop: Stop,
    /// Per election: resign now, then wait this long before campaigning again.
    resign: Vec<Arc<watch::Sender<Option<PartStopRequest>>>>,
}

impl Pool {
    fn start(node: &Node, host: &HostSession, rng: &mut Rng) -> Pool {
        let pool = ElectionPool::on(host);
        let stop = Stop::new();
        let mut loops = JoinSet::new();
        let mut resign = Vec::new();
        for e in 0..node.scenario().elections {
            let signal = Arc::new(watch::Sender::new(None));
            resign.push(signal.clone());
            loops.spawn(
                candidacy(
                    node.clone(),
                    pool.clone(),
                    e,
                    rng.fork(),
                    stop.clone(),
                    signal,
                )
                .in_current_span(),
            );
        }
        // In a set of its own: dropped with the pool (a crash), it is aborted.
        let mut lock = JoinSet::new();
        for what in [Shared::Lock, Shared::Permit] {
            let part = locker(what, node.clone(), host.clone(), rng.fork(), stop.clone());
            lock.spawn(part.in_current_span());
        }
        Pool {
            pool,
            lock,
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

    /// Stops the candidates (each resigns what it leads), then the pool (its candidate keys
    /// deleted; the host's lease lives on).
    async fn stop(mut self) -> coord_api::Result<()> {
        self.stop.stop();
        while self.loops.join_next().await.is_some() {}
        let mut parts = Ok(());
        while let Some(part) = self.lock.join_next().await {
            if let Ok(Err(e)) = part {
                parts = Err(e);
            }
        }
        let pool = self.pool.stop().await;
        parts.and(pool)
    }
}

/// The token coord's nodes write through a fence: the value is the token alone.
fn token(value: &[u8]) -> Option<Revision> {
    std::str::from_utf8(value).ok()?.parse().ok().map(Revision)
}

/// Runs a candidate in election `e` until stopped; when told to resign, stops it for a while;
/// when a term hands over to a newer campaign of the node's own, leads on with that one.
async fn candidacy(
    node: Node,
    pool: ElectionPool,
    e: usize,
    mut rng: Rng,
    stop: Stop,
    resign: Arc<watch::Sender<Option<PartStopRequest>>>,
) {
    let name = election_name(e);
    let mut told = resign.subscribe();
    let _ = told.get_and_update();
    let s = node.scenario();
    let config = s.candidate_config(name.clone(), node.who().to_string());
    loop {
        // A channel per candidate: what a term hands over is answered before the next
        // candidate runs.
        let (handoff, mut handoffs) = mpsc::unbounded_channel();
        let work = work(node.clone(), e, rng.fork(), pool.clone(), handoff);
        let candidate = Candidate::spawn(&pool, config.clone(), work);
        let next = loop {
            tokio::select! {
                biased;
                _ = stop.stopped() => {
                    let _ = candidate.stop().await;
                    let_go_of(&node, &name, &mut handoffs).await;
                    return;
                }
                Some(h) = handoffs.recv() => break Next::Hold(h),
                changed = told.changed() => {
                    if changed.is_err() {
                        continue;
                    }
                    // A candidate that leads is told to hand over; one still campaigning
                    // (or resting between terms) gives up its place in the queue (its
                    // campaign's write maybe still on its way, or its last term's key
                    // maybe left by a failed resignation).
                    if let Some(req) = told.get() {
                        if candidate.is_leader() {
                            break Next::Rest(req, Part::Leadership(name.clone()));
                        }
                        if let Some(session) = pool.host().current() {
                            let of = name.clone();
                            break Next::Rest(req, Part::Queue { of, lease: session.lease() });
                        }
                    }
                }
            }
        };
        match next {
            Next::Rest(req, part) => {
                let _ = stop_part(&node, part.clone(), candidate.stop()).await;
                // A hand-over sent as the candidate was told to stop.
                let_go_of(&node, &name, &mut handoffs).await;
                tokio::select! {
                    biased;
                    _ = stop.stopped() => return,
                    _ = tokio::time::sleep(req.length) => {}
                }
                node.record(Happening::PartStarted {
                    who: node.who(),
                    part,
                });
            }
            Next::Hold(h) => {
                // The term's leadership resigns as the candidate stops: it must leave the key
                // to the newer campaign, which the node still believes in.
                let _ = candidate.stop().await;
                let_go_of(&node, &name, &mut handoffs).await;
                if !hold(&node, e, h, &stop, &mut rng).await {
                    return;
                }
            }
        }
    }
}

/// What the candidacy does once its candidate's loop is interrupted.
enum Next {
    /// Told to stop: stop the candidate (what it held: a leadership or a place in the
    /// queue), rest for the request's length.
    Rest(PartStopRequest, Part),
    /// A term handed over to a newer campaign of the node's own: lead on with it.
    Hold(Handoff),
}

/// A leadership a term handed over to: a newer campaign of the node, on its pool's session.
struct Handoff {
    newer: Leadership,
    /// The newer campaign rejoined the term's key (the same token): the node's belief
    /// carries on unbroken. Otherwise (the pool's session changed) it is a leadership of its
    /// own, not yet believed.
    continues: bool,
}

/// Ends the beliefs of hand-overs nobody will hold, and resigns them.
async fn let_go_of(node: &Node, name: &str, handoffs: &mut mpsc::UnboundedReceiver<Handoff>) {
    while let Ok(h) = handoffs.try_recv() {
        if h.continues {
            node.leader_end(name, h.newer.token(), true);
        }
        let _ = h.newer.resign().await;
    }
}

/// Leads on with a leadership a term handed over to: a few acts through its fence, then
/// resigns it (which deletes the key: it is the newest campaign). Returns `false` when the
/// candidacy was stopped meanwhile.
async fn hold(node: &Node, e: usize, h: Handoff, stop: &Stop, rng: &mut Rng) -> bool {
    let name = election_name(e);
    let Handoff { newer, continues } = h;
    let token = newer.token();
    if !continues {
        node.leader_start(&name, token);
    }
    let work = node.work_started(&name, token);
    let every = node.scenario().ttl / 4;
    let mut lost = false;
    let mut stopped = false;
    for _ in 0..rng.between(1, 4) {
        tokio::select! {
            biased;
            _ = stop.stopped() => {
                stopped = true;
                break;
            }
            _ = newer.lost() => {
                lost = true;
                break;
            }
            _ = tokio::time::sleep(every) => {}
        }
        tokio::select! {
            biased;
            _ = newer.lost() => {
                lost = true;
                break;
            }
            _ = write_through(node, work_key(e), name.clone(), token, newer.fence()) => {}
        }
    }
    node.leader_end(&name, token, !lost);
    drop(work);
    if !lost {
        let _ = newer.resign().await;
    }
    !stopped
}

/// The work of each term the node's candidate in election `e` wins.
fn work(
    node: Node,
    e: usize,
    mut rng: Rng,
    pool: ElectionPool,
    handoff: mpsc::UnboundedSender<Handoff>,
) -> impl FnMut(Term) -> BoxFuture<'static, ()> {
    move |term| {
        Box::pin(lead(
            node.clone(),
            e,
            term,
            rng.fork(),
            pool.clone(),
            handoff.clone(),
        ))
    }
}

/// How a term's work ended.
enum TermEnd {
    /// The term is over.
    Over,
    /// The node hands over to whoever campaigns next.
    HandedOver,
    /// The node hands over to a newer campaign of its own, which leads already.
    ToNewer(Leadership),
}

/// Acts as leader every TTL/4 until the term is over (or, now and then, hands over: to
/// whoever campaigns next, or to a newer campaign of its own on the same session, which
/// rejoins the key and leads on); then winds down, sometimes for longer than the
/// candidate's grace, sometimes never on its own.
async fn lead(
    node: Node,
    e: usize,
    term: Term,
    mut rng: Rng,
    pool: ElectionPool,
    handoff: mpsc::UnboundedSender<Handoff>,
) {
    let name = election_name(e);
    let token = term.token();
    node.leader_start(&name, token);
    let _work = node.work_started(&name, token);
    let ttl = node.scenario().ttl;
    let every = ttl / 4;
    let end = loop {
        tokio::select! {
            biased;
            _ = term.over() => break TermEnd::Over,
            _ = tokio::time::sleep(every) => {}
        }
        tokio::select! {
            biased;
            _ = term.over() => break TermEnd::Over,
            _ = write_through(&node, work_key(e), name.clone(), token, term.fence()) => {}
        }
        if rng.chance(0.05) {
            if !rng.chance(0.5) {
                break TermEnd::HandedOver;
            }
            let newer = tokio::select! {
                biased;
                _ = term.over() => break TermEnd::Over,
                r = pool.try_campaign(&name, node.who().to_string()) => r,
            };
            match newer {
                Ok(Some(newer)) => break TermEnd::ToNewer(newer),
                _ => break TermEnd::HandedOver,
            }
        }
    };
    if let TermEnd::ToNewer(newer) = end {
        let continues = newer.token() == token;
        if !continues {
            node.leader_end(&name, token, true);
        }
        // The belief carries on with the newer leadership; the candidate resigns the term's
        // as this returns, which must leave the key to it.
        if let Err(mpsc::error::SendError(h)) = handoff.send(Handoff { newer, continues }) {
            if continues {
                node.leader_end(&name, token, true);
            }
            let _ = h.newer.resign().await;
        }
        return;
    }
    // A node that hands over stops believing before the candidate resigns (the delete may
    // apply long before its reply arrives, if ever); so does one whose term was declared
    // over before its deadline.
    let handed_over = matches!(end, TermEnd::HandedOver);
    node.leader_end(&name, token, handed_over || term.loss().is_none());
    // Finishing the job in hand takes a while: up to half a TTL, longer than the default
    // grace (a quarter) now and then, so the candidate must cut it short; and now and then
    // the work ignores the end altogether and never returns on its own (a loop that checks
    // nothing), so the candidate must drop it at its grace, on a loss and on a stop alike.
    // (A hand-over is the work's own return: that one returns.)
    if !handed_over && rng.chance(0.1) {
        std::future::pending::<()>().await;
    }
    let ms = (ttl / 2).as_millis() as u64;
    tokio::time::sleep(Duration::from_millis(rng.between(0, ms))).await;
}
