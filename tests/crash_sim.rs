//! A host that crashes leaves no task behind: everything its recipes ran in the background
//! (renewals, heal loops, watches, clean-ups) ends once its handles are gone, even when the
//! store can no longer be reached to clean up. A user's test on `SimStore` that aborts a
//! host's task, and the chaos runner's in-process crash, rely on it: a task that outlived its
//! host would keep a dead incarnation's beliefs and timers running beside the next one.

use std::sync::Arc;
use std::time::Duration;

use coord_api::recipes::{
    Candidate, CandidateConfig, CandidateStatus, ClusterWatcher, ClusterWatcherConfig,
    ElectionPool, HostRegistration, HostSession, Mutex, RegistrationConfig, Semaphore,
    SessionConfig, Term,
};
use coord_api::DynKvLeaseStore;
use coord_sim::SimStore;
use tokio::runtime::Handle;
use tokio::sync::oneshot;

const TTL: Duration = Duration::from_secs(3);

/// Every recipe a host runs, on one store client, until the task is aborted.
async fn host(store: SimStore, up: oneshot::Sender<()>) {
    let store: Arc<DynKvLeaseStore> = Arc::new(store);
    let config = SessionConfig::default().with_ttl(TTL);
    let host = HostSession::new(store.clone(), config.clone());
    let registration = HostRegistration::start_on(&host, RegistrationConfig::new("hosts/a", "m"))
        .await
        .unwrap();
    let watcher = ClusterWatcher::start(store.clone(), ClusterWatcherConfig::new("hosts/"))
        .await
        .unwrap();
    let pool = ElectionPool::new(store.clone(), config);
    let candidate = Candidate::spawn(
        &pool,
        CandidateConfig::new("elections/a", "a"),
        |term: Term| async move { term.over().await },
    );
    let mut status = candidate.subscribe();
    status
        .wait_for(|s| matches!(s, CandidateStatus::Leading { .. }))
        .await
        .unwrap();
    let session = host.session().await.unwrap();
    let guard = Mutex::new(session.clone(), "locks/a").lock().await.unwrap();
    let permit = Semaphore::new(session.clone(), "semaphores/a", 2)
        .acquire()
        .await
        .unwrap();
    // A campaign left waiting behind the guard: its key is withdrawn when it is dropped.
    let other = host.session().await.unwrap();
    let waiting = tokio::spawn(async move { Mutex::new(other, "locks/a").lock().await });
    up.send(()).unwrap();
    let _held = (
        registration,
        watcher,
        candidate,
        guard,
        permit,
        waiting,
        host,
    );
    std::future::pending::<()>().await;
}

async fn crashed_host_leaves_no_task(cut: fn(&SimStore)) {
    let store = SimStore::new();
    let alive = || Handle::current().metrics().num_alive_tasks();
    let before = alive();
    let client = store.connect();
    let (up, is_up) = oneshot::channel();
    let task = tokio::spawn(host(client.clone(), up));
    tokio::time::timeout(Duration::from_secs(30), is_up)
        .await
        .expect("the host comes up within 30 s")
        .unwrap();
    assert!(alive() > before + 3, "the host runs tasks of its own");
    // The crash: the link dies first, so nothing left behind can reach the store; then the
    // host's task goes, and every handle with it.
    cut(&client);
    task.abort();
    // A withdrawal gives up once the lease is surely over (a TTL past the local deadline,
    // itself at most a TTL away), after the request it has in flight (5 s); the revoke of
    // the abandoned lease ends at its first attempt after the last handle on the store went
    // with that request: one more request and one backoff wait (1 s). A TTL of slack, of
    // which a fence's raise started before the lease's end takes one request (5 s): the
    // tasks are gone 19 s after the crash, cut off or deaf.
    let bound = 3 * TTL + Duration::from_secs(11);
    if std::env::var("PROBE").is_ok() {
        for i in 0..60 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            eprintln!("t={}s alive={}", (i + 1), alive() - before);
        }
    }
    let gone = tokio::time::timeout(bound, async {
        while alive() > before {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(
        gone.is_ok(),
        "{} tasks of the crashed host still run {bound:?} after the crash",
        alive() - before
    );
}

#[tokio::test(start_paused = true)]
async fn a_crashed_host_cut_off_leaves_no_task() {
    crashed_host_leaves_no_task(SimStore::partition).await;
}

#[tokio::test(start_paused = true)]
async fn a_crashed_host_deaf_leaves_no_task() {
    crashed_host_leaves_no_task(SimStore::partition_oneway).await;
}

#[tokio::test(start_paused = true)]
async fn a_crashed_host_reachable_leaves_no_task() {
    crashed_host_leaves_no_task(|_| {}).await;
}
