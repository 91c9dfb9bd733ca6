//! What a client sees of a real three-member etcd cluster's member failures: the probe of
//! `members/probe.rs`, whose figures are the "real" column of the member table (the simulator's
//! run of the same probe is `members_sim.rs`).

#[path = "members/bare.rs"]
mod bare;
#[path = "members/cluster.rs"]
mod cluster;
#[path = "members/probe.rs"]
mod probe;

use std::time::Duration;

use cluster::{options, Members};
use coord_etcd::testing::EtcdCluster;
use coord_etcd::{EtcdConfig, EtcdStore};
use etcd_client::Client;

struct Real(EtcdCluster);

/// etcd's request timeout: 5 s plus two election timeouts; a held request is answered by it.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

#[async_trait::async_trait]
impl Members for Real {
    async fn client(&self, i: usize, require_leader: bool) -> Result<Client, String> {
        Client::connect([self.0.endpoint(i)], Some(options(require_leader)))
            .await
            .map_err(|e| e.to_string())
    }

    async fn leader(&self) -> usize {
        for _ in 0..100 {
            if let Some(l) = self.0.leader().await {
                return l;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("no leader within 10 s");
    }

    async fn kill(&self, i: usize) {
        self.0.kill(i);
    }

    async fn restart(&self, i: usize) {
        self.0.restart(i).await.expect("restart");
    }

    async fn isolate(&self, i: usize) {
        self.0.isolate(i);
    }

    async fn rejoin(&self) {
        self.0.rejoin();
    }

    async fn move_leader(&self, to: usize) {
        self.0.move_leader(to).await.expect("move leader");
    }

    async fn stall(&self, i: usize) {
        self.0.pause(i);
    }

    async fn thaw(&self, i: usize) {
        self.0.resume(i);
    }

    fn election_timeout(&self) -> Duration {
        Duration::from_millis(250)
    }

    async fn store(&self, first: usize) -> EtcdStore {
        let endpoints = (0..3).map(|k| self.0.endpoint((first + k) % 3));
        EtcdStore::connect(EtcdConfig::new(endpoints))
            .await
            .expect("a store of every member")
    }
}

/// Starts three members that can be cut off from each other.
async fn cluster() -> Real {
    let cluster = EtcdCluster::builder()
        .members(3)
        .fast_elections(true)
        .peer_proxies(true)
        .start()
        .await
        .unwrap_or_else(|e| panic!("cannot start etcd: {e}"));
    Real(cluster)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn member_failures_as_a_client_sees_them_on_etcd() {
    let real = cluster().await;
    let figures = probe::probe(&real).await;
    for (what, figure) in figures.rows() {
        println!("measured (etcd): {what:<64} {figure}");
    }
    figures.assert_like_etcd(REQUEST_TIMEOUT, real.election_timeout());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bare_requests_leave_a_sick_member_on_etcd() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .try_init();
    let real = cluster().await;
    for (what, figure) in bare::bare_requests(&real).await.rows {
        println!("measured (etcd): {what:<40} {figure}");
    }
}
