//! One incarnation of a node: it registers itself, campaigns in every election and acts as
//! leader through the fence, and (on watcher nodes) follows the cluster, recording each
//! belief and output as it changes.

use std::sync::Arc;
use std::time::Duration;

use coord_api::recipes::{
    ClusterEvent, ClusterWatcher, ClusterWatcherConfig, ElectionPool, HostRegistration, Leadership,
    RegistrationConfig, RegistrationStatus, SessionConfig,
};
use coord_api::{DynKvLeaseStore, PutRequest, TxnRequest};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::history::{Emitted, Happening, Incarnation};
use crate::recorder::Recorder;
use crate::rng::Rng;
use crate::scenario::Scenario;

/// The prefix every node registers under.
pub const HOSTS: &str = "hosts/";

/// The name of election `e`.
pub fn election_name(e: usize) -> String {
    format!("elections/e{e}")
}

/// The key leaders of election `e` write through the fence.
pub fn work_key(e: usize) -> String {
    format!("work/e{e}")
}

/// The key node `node` registers.
pub fn host_key(node: usize) -> String {
    format!("{HOSTS}n{node}")
}

/// What an incarnation needs from its driver.
pub(crate) struct NodeContext {
    pub who: Incarnation,
    pub store: Arc<DynKvLeaseStore>,
    pub scenario: Arc<Scenario>,
    pub rec: Recorder,
    pub seed: u64,
    /// True while the node is paused (a GC pause): it takes no action.
    pub paused: watch::Receiver<bool>,
    /// Cancelled to stop the incarnation gracefully.
    pub stop: CancellationToken,
    /// Set once the registration is first in place.
    pub registered: watch::Sender<bool>,
}

/// Runs an incarnation until it is stopped (gracefully) or dropped (a crash).
pub(crate) async fn run(ctx: NodeContext) {
    let ctx = Arc::new(ctx);
    let mut tasks = JoinSet::new();
    let Some(registration) = register(&ctx).await else {
        return;
    };
    tasks.spawn(follow_registration(ctx.clone(), registration.subscribe()));
    if ctx.who.node < ctx.scenario.watchers {
        if let Some(w) = start_watcher(&ctx).await {
            tasks.spawn(follow_watcher(ctx.clone(), w));
        }
    }
    let pool = Arc::new(ElectionPool::new(
        ctx.store.clone(),
        SessionConfig::default().with_ttl(ctx.scenario.ttl),
    ));
    let mut rng = Rng::new(ctx.seed);
    for e in 0..ctx.scenario.elections {
        tasks.spawn(campaign_loop(ctx.clone(), pool.clone(), e, rng.fork()));
    }
    ctx.stop.cancelled().await;
    ctx.rec.log(Happening::Stopping(ctx.who));
    // The campaign loops resign on the same cancellation; wait for them first, so the pool
    // is idle when it closes.
    let mut clean = true;
    while let Some(r) = tasks.join_next().await {
        clean &= r.is_ok();
    }
    clean &= registration.stop().await.is_ok();
    clean &= pool.close().await.is_ok();
    ctx.rec.log(Happening::Stopped {
        who: ctx.who,
        clean,
    });
}

/// Registers, retrying until it works or the incarnation stops.
async fn register(ctx: &NodeContext) -> Option<HostRegistration> {
    let config = RegistrationConfig::new(host_key(ctx.who.node), ctx.who.to_string())
        .with_ttl(ctx.scenario.ttl)
        .with_backoff(Duration::from_millis(100), ctx.scenario.max_backoff)
        .with_backoff_seed(ctx.seed);
    loop {
        tokio::select! {
            biased;
            _ = ctx.stop.cancelled() => return None,
            r = HostRegistration::start(ctx.store.clone(), config.clone()) => match r {
                Ok(reg) => return Some(reg),
                Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
            },
        }
    }
}

/// Records the registration's status as the node's belief.
async fn follow_registration(
    ctx: Arc<NodeContext>,
    mut status: coord_api::sync::watch::Receiver<RegistrationStatus>,
) {
    let mut believed = None;
    loop {
        let now = status.get_and_update();
        let lease = match now {
            RegistrationStatus::Registered { lease } => Some(lease),
            _ => None,
        };
        if lease != believed {
            ctx.rec.log(match lease {
                Some(l) => Happening::Registered(ctx.who, l),
                None => Happening::Unregistered(ctx.who),
            });
            if lease.is_some() {
                ctx.registered.send_replace(true);
            }
            believed = lease;
        }
        tokio::select! {
            biased;
            _ = ctx.stop.cancelled() => return,
            changed = status.changed() => if changed.is_err() { return },
        }
    }
}

async fn start_watcher(ctx: &NodeContext) -> Option<ClusterWatcher> {
    loop {
        tokio::select! {
            biased;
            _ = ctx.stop.cancelled() => return None,
            r = ClusterWatcher::start(ctx.store.clone(), ClusterWatcherConfig::new(HOSTS)) => match r {
                Ok(w) => return Some(w),
                Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
            },
        }
    }
}

/// Records every view the watcher publishes and every event it emits.
async fn follow_watcher(ctx: Arc<NodeContext>, mut watcher: ClusterWatcher) {
    let mut views = watcher.subscribe_view();
    let mut last_revision = None;
    loop {
        // Record the view first: the watcher publishes a view before the event it explains.
        let view = views.get_and_update();
        if last_revision != Some(view.revision) {
            ctx.rec.log(Happening::View {
                who: ctx.who,
                revision: view.revision,
                hosts: view.hosts.keys().cloned().collect(),
            });
            last_revision = Some(view.revision);
        }
        tokio::select! {
            biased;
            _ = ctx.stop.cancelled() => {
                watcher.stop().await;
                return;
            }
            changed = views.changed() => if changed.is_err() { return },
            event = watcher.next() => {
                let Some(event) = event else { return };
                ctx.rec.log(Happening::Emitted(ctx.who, emitted(event)));
            }
        }
    }
}

fn emitted(e: ClusterEvent) -> Emitted {
    match e {
        ClusterEvent::HostUp { host, revision, .. } => Emitted::Up(host, revision),
        ClusterEvent::HostUpdated { host, revision, .. } => Emitted::Updated(host, revision),
        ClusterEvent::HostDown { host, revision, .. } => Emitted::Down(host, revision),
        ClusterEvent::Resynced { revision } => Emitted::Resynced(revision),
    }
}

/// Campaigns in election `e` for as long as the incarnation lives; leads while it can.
async fn campaign_loop(ctx: Arc<NodeContext>, pool: Arc<ElectionPool>, e: usize, mut rng: Rng) {
    let name = election_name(e);
    loop {
        let won = tokio::select! {
            biased;
            _ = ctx.stop.cancelled() => return,
            r = pool.campaign(&name, ctx.who.to_string()) => r,
        };
        match won {
            Ok(leadership) => {
                let token = leadership.token();
                ctx.rec.log(Happening::LeaderStart {
                    who: ctx.who,
                    election: e,
                    token,
                });
                let resigned = lead(&ctx, &leadership, e, &mut rng).await;
                // A node that resigns stops believing before it asks the store to delete its
                // key (the delete may apply long before its reply arrives, if ever).
                ctx.rec.log(Happening::LeaderEnd {
                    who: ctx.who,
                    election: e,
                    token,
                    resigned,
                });
                if resigned {
                    let _ = leadership.resign().await;
                }
                if ctx.stop.is_cancelled() {
                    return;
                }
                // After handing over, let someone else win.
                if resigned {
                    tokio::time::sleep(ctx.scenario.ttl).await;
                }
            }
            Err(_) => {
                let delay = Duration::from_millis(rng.between(100, 500));
                tokio::time::sleep(delay).await;
            }
        }
    }
}

/// Acts as leader every TTL/4 until the leadership is lost (false) or the node resigns
/// (true): on stop, or now and then, to hand over.
async fn lead(ctx: &NodeContext, leadership: &Leadership, e: usize, rng: &mut Rng) -> bool {
    let every = ctx.scenario.ttl / 4;
    loop {
        tokio::select! {
            biased;
            _ = ctx.stop.cancelled() => return true,
            _ = leadership.lost() => return false,
            _ = tokio::time::sleep(every) => {}
        }
        if !leadership.is_leader() {
            continue;
        }
        // A paused process checked its leadership, then stalls before acting: the act comes
        // late, and only the fence stops it from doing harm. (The pause stalls the action,
        // not the process's clock: the belief still ends on time, and is recorded so.)
        let mut paused = ctx.paused.clone();
        let act = async {
            while *paused.borrow_and_update() {
                if paused.changed().await.is_err() {
                    break;
                }
            }
            let token = leadership.token();
            let txn = leadership.fence(
                TxnRequest::new().and_then([PutRequest::new(work_key(e), token.to_string())]),
            );
            ctx.store.txn(txn).await.ok().map(|r| r.succeeded)
        };
        // A leader stuck in an act (a slow or lost reply) still stops believing when the
        // leadership ends; the abandoned write may apply later, and the fence judges it.
        let accepted = tokio::select! {
            biased;
            _ = leadership.lost() => return false,
            accepted = act => accepted,
        };
        let token = leadership.token();
        ctx.rec.log(Happening::Act {
            who: ctx.who,
            election: e,
            token,
            accepted,
        });
        if rng.chance(0.05) {
            return true;
        }
    }
}
