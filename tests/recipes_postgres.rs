//! The recipe cases on real PostgreSQL, in real time: the same cases, with the same
//! assertions, as on `SimStore` and etcd (`recipes_sim.rs`, `recipes_etcd.rs`). A test client
//! reaches the server through a TCP proxy, so a test can close its connections or cut it off.
//! Bounds carry stated slack: a lease is swept within 200 ms of its deadline (plus a query),
//! and a loaded CI machine adds scheduling delay, so 1 s.

use std::sync::Arc;
use std::time::Duration;

use coord_api::testkit::recipes::{Case, Client, Fixture};
use coord_api::DynKvLeaseStore;
use coord_etcd::testing::TcpProxy;
use coord_postgres::testing::PostgresServer;
use coord_postgres::{PostgresConfig, PostgresStore};

const TTL: Duration = Duration::from_secs(2);
const SLACK: Duration = Duration::from_secs(1);

#[path = "recipes/proxy_control.rs"]
mod proxy_control;
use proxy_control::ProxyControl;

struct PostgresFixture {
    server: PostgresServer,
    store: Arc<DynKvLeaseStore>,
    /// Proxies the fixture's own clients need for as long as the test runs.
    proxies: std::sync::Mutex<Vec<Arc<TcpProxy>>>,
}

impl PostgresFixture {
    async fn start() -> Self {
        let server = PostgresServer::start()
            .await
            .unwrap_or_else(|e| panic!("cannot start PostgreSQL: {e}"));
        let store: Arc<DynKvLeaseStore> = Arc::new(server.store().await);
        PostgresFixture {
            server,
            store,
            proxies: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// A client through a proxy of its own, with `PostgresConfig`'s default timeouts: the
    /// recipes notice a cut on their own (a session gives up on a renewal at the next one).
    async fn proxied(&self) -> (Arc<DynKvLeaseStore>, Arc<TcpProxy>) {
        let target = ([127, 0, 0, 1], self.server.port()).into();
        let proxy = Arc::new(TcpProxy::start(target).await.expect("a proxy"));
        let port = proxy
            .endpoint()
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("a proxy port");
        let config = PostgresConfig::new(self.server.connection_to(port));
        let store: Arc<DynKvLeaseStore> = Arc::new(
            PostgresStore::connect(config)
                .await
                .expect("connect through the proxy"),
        );
        (store, proxy)
    }
}

#[coord_api::async_trait]
impl Fixture for PostgresFixture {
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
        PostgresConfig::new("").request_timeout()
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
        let fx = PostgresFixture::start().await;
        case(&fx).await;
    });
}

coord_api::recipe_tests!(run);
coord_api::typed_recipe_tests!(run);

// The namespaced run of the recipe cases is the simulator's and etcd's: `Namespaced` is one
// wrapper over any store, and `conformance_postgres` runs every contract case through it here.
