//! The recipe cases on real etcd, in real time (the same cases as `recipes_sim.rs`), and the
//! figures issue 4 asks for, printed. A test client reaches etcd through the harness's TCP
//! proxy, so a test can close its streams (drop its connections) or cut it off (blackhole).
//! Bounds carry stated slack: etcd checks lease expiry every 500 ms, and a loaded CI machine
//! adds scheduling delay, so 1 s.

use std::sync::Arc;
use std::time::Duration;

use coord_api::recipes::{
    ClusterEvent, ClusterWatcher, ClusterWatcherConfig, Election, HostRegistration, Leadership,
    RegistrationConfig, RegistrationStatus, Session, SessionConfig,
};
use coord_api::testkit::recipes::{Case, Client, Fixture};
use coord_api::testkit::{eventually, within};
use coord_api::{DynKvLeaseStore, KvLeaseStore, KvLeaseStoreExt};
use coord_etcd::testing::{EtcdCluster, TcpProxy};
use coord_etcd::{EtcdConfig, EtcdStore};
use tokio::task::JoinHandle;
use tokio::time::Instant;

#[path = "recipes/proxy_control.rs"]
mod proxy_control;
use proxy_control::ProxyControl;

struct EtcdFixture {
    cluster: EtcdCluster,
    store: Arc<DynKvLeaseStore>,
    /// Proxies the fixture's own clients need for as long as the test runs.
    proxies: std::sync::Mutex<Vec<Arc<TcpProxy>>>,
}

impl EtcdFixture {
    async fn start() -> Self {
        let cluster = EtcdCluster::single()
            .await
            .unwrap_or_else(|e| panic!("cannot start etcd: {e}"));
        let store: Arc<DynKvLeaseStore> = Arc::new(cluster.store().await);
        EtcdFixture {
            cluster,
            store,
            proxies: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// A client through a proxy of its own, with `EtcdConfig`'s default timeouts: the
    /// recipes notice a cut on their own (a session gives up on a renewal at the next one).
    async fn proxied(&self) -> (Arc<DynKvLeaseStore>, Arc<TcpProxy>) {
        let target = self.cluster.endpoint(0).parse().expect("a socket address");
        let proxy = Arc::new(TcpProxy::start(target).await.expect("a proxy"));
        let config = EtcdConfig::new([proxy.endpoint()]).with_limits(self.cluster.limits());
        let store: Arc<DynKvLeaseStore> = Arc::new(
            EtcdStore::connect(config)
                .await
                .expect("connect through the proxy"),
        );
        (store, proxy)
    }
}

#[coord_api::async_trait]
impl Fixture for EtcdFixture {
    fn store(&self) -> Arc<DynKvLeaseStore> {
        self.store.clone()
    }

    async fn client(&self) -> Client {
        let (store, proxy) = self.proxied().await;
        Client::new(store, ProxyControl(proxy))
    }

    fn ttl(&self) -> Duration {
        TTL
    }

    fn slack(&self) -> Duration {
        SLACK
    }

    fn request_timeout(&self) -> Duration {
        EtcdConfig::new(["unused:1"]).request_timeout()
    }

    async fn slow_store(&self) -> Arc<DynKvLeaseStore> {
        let (store, proxy) = self.proxied().await;
        proxy.delay(Duration::from_millis(5));
        self.proxies.lock().unwrap().push(proxy);
        store
    }

    fn stop_offsets(&self) -> Vec<u64> {
        vec![0, 20, 60, 100, 110, 150]
    }
}

fn run(case: Case) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let fx = EtcdFixture::start().await;
        case(&fx).await;
    });
}

coord_api::recipe_tests!(run);
coord_api::typed_recipe_tests!(run);

/// Every case again, through a namespace (`Namespaced`).
mod namespaced {
    use super::*;
    use coord_api::testkit::recipes::InNamespace;

    fn run(case: Case) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        rt.block_on(async {
            let fx = EtcdFixture::start().await;
            case(&InNamespace::new(fx, "tenant/")).await;
        });
    }

    coord_api::recipe_tests!(run);
    coord_api::typed_recipe_tests!(run);
}

// ---- figures ------------------------------------------------------------------------------

const TTL: Duration = Duration::from_secs(2);
const SLACK: Duration = Duration::from_secs(1);

async fn etcd() -> (EtcdCluster, Arc<DynKvLeaseStore>) {
    let cluster = EtcdCluster::single()
        .await
        .unwrap_or_else(|e| panic!("cannot start etcd: {e}"));
    let store: Arc<DynKvLeaseStore> = Arc::new(cluster.store().await);
    (cluster, store)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_to_host_down_at_a_watcher() {
    let (_cluster, store) = etcd().await;
    let mut watcher = ClusterWatcher::start(store.clone(), ClusterWatcherConfig::new("hosts/"))
        .await
        .unwrap();
    let reg = HostRegistration::start(
        store.clone(),
        RegistrationConfig::new("hosts/a", "meta").with_ttl(TTL),
    )
    .await
    .unwrap();
    let up = within(SLACK * 5, "HostUp", watcher.next()).await.unwrap();
    assert!(
        matches!(up, ClusterEvent::HostUp { ref host, .. } if host == "a"),
        "{up:?}"
    );
    let start = Instant::now();
    reg.stop().await.unwrap();
    let down = within(SLACK, "HostDown", watcher.next()).await.unwrap();
    let took = start.elapsed();
    assert!(
        matches!(down, ClusterEvent::HostDown { ref host, ref last_metadata, .. } if host == "a" && last_metadata == "meta"),
        "{down:?}"
    );
    println!("measured: stop() to HostDown at a watcher: {took:?}");
}

/// Session a leads election "jobs"; session b's campaign waits, queued behind it.
async fn leader_and_candidate(
    store: &Arc<DynKvLeaseStore>,
) -> (
    Session,
    Session,
    Leadership,
    JoinHandle<coord_api::Result<Leadership>>,
) {
    let a = Session::new(store.clone(), SessionConfig::default().with_ttl(TTL))
        .await
        .unwrap();
    let b = Session::new(store.clone(), SessionConfig::default().with_ttl(TTL))
        .await
        .unwrap();
    let lead = Election::new(&a, "jobs").campaign("a").await.unwrap();
    let eb = Election::new(&b, "jobs");
    let waiting = tokio::spawn(async move { eb.campaign("b").await });
    eventually(SLACK, "b to queue", || async {
        store.get_prefix("jobs/").await.unwrap().count == 2
    })
    .await;
    (a, b, lead, waiting)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resign_to_successor() {
    let (_cluster, store) = etcd().await;
    let (_a, _b, lead, waiting) = leader_and_candidate(&store).await;
    let start = Instant::now();
    lead.resign().await.unwrap();
    let next = within(SLACK, "the successor", waiting)
        .await
        .unwrap()
        .unwrap();
    let took = start.elapsed();
    assert!(next.token() > 0);
    println!("measured: resign() to the successor's leadership: {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_to_successor_within_one_ttl() {
    let (_cluster, store) = etcd().await;
    let (a, _b, lead, waiting) = leader_and_candidate(&store).await;
    // A crash: renewals stop, nothing is revoked, the key waits for the lease to expire.
    let last_renewal = a.deadline() + a.clock_margin() - TTL;
    let crash = Instant::now();
    drop(lead);
    drop(a);
    let bound = TTL + Duration::from_millis(500) + SLACK;
    let next = within(bound * 2, "the successor", waiting)
        .await
        .unwrap()
        .unwrap();
    let took = crash.elapsed();
    let since_renewal = last_renewal.elapsed();
    assert!(next.token() > 0);
    assert!(
        since_renewal <= bound,
        "successor {since_renewal:?} after the last renewal; bound {bound:?}"
    );
    println!("measured: leader crash to the successor's leadership: {took:?} after the crash, {since_renewal:?} after the last renewal (TTL {TTL:?})");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registration_heals_after_etcd_is_killed_and_restarted() {
    let (cluster, store) = etcd().await;
    let ttl = Duration::from_secs(5);
    let reg = HostRegistration::start(
        store.clone(),
        RegistrationConfig::new("hosts/a", "meta").with_ttl(ttl),
    )
    .await
    .unwrap();
    cluster.kill(0);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let restart = Instant::now();
    cluster.restart(0).await.unwrap();
    let restarted = restart.elapsed();
    // Healed: the key is there under the registration's live lease, and that lease is being
    // renewed again (its remaining TTL returns to the full TTL after a renewal).
    let healed_at = Instant::now();
    eventually(ttl * 3, "the registration to be healthy again", || async {
        let lease = reg.lease_id();
        let key_ok = store
            .get_key("hosts/a")
            .await
            .ok()
            .flatten()
            .is_some_and(|kv| kv.lease == lease && !lease.is_none());
        let renewed = store
            .time_to_live(lease)
            .await
            .is_ok_and(|t| t.ttl + Duration::from_secs(2) >= t.granted_ttl);
        key_ok && renewed && matches!(reg.status(), RegistrationStatus::Registered { .. })
    })
    .await;
    println!(
        "measured: etcd restart took {restarted:?}; registration healthy {:?} after etcd was back (lease {})",
        healed_at.elapsed(),
        reg.lease_id()
    );
    reg.stop().await.unwrap();
    assert!(store.get_key("hosts/a").await.unwrap().is_none());
}
