//! The simulator's side of the member suites: three members of a [`SimCluster`] under turmoil,
//! failed on a case's request between the simulation's steps.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use coord_etcd::{member_dialer, EtcdConfig, EtcdStore};
use coord_sim::grpc::{channel, dial, EtcdVersion, SimCluster, ETCD_PORT};
use etcd_client::Client;
use tokio::sync::oneshot;

use super::cluster::{options, Members};

/// The simulated members' election timeout, as the real suites' (`fast_elections`).
pub(crate) const ET: Duration = Duration::from_millis(250);

/// What the probe asks of the simulation's driver, which alone can crash and bounce hosts.
enum Ask {
    Leader(oneshot::Sender<Option<usize>>),
    Kill(usize, oneshot::Sender<()>),
    Restart(usize, oneshot::Sender<()>),
    Isolate(usize, oneshot::Sender<()>),
    Rejoin(oneshot::Sender<()>),
    MoveLeader(usize, oneshot::Sender<()>),
    Stall(usize, oneshot::Sender<()>),
    Thaw(usize, oneshot::Sender<()>),
}

type Asks = Arc<Mutex<Vec<Ask>>>;

pub(crate) struct Simulated {
    hosts: Vec<String>,
    asks: Asks,
}

impl Simulated {
    async fn ask<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> Ask) -> T {
        let (tx, rx) = oneshot::channel();
        self.asks.lock().unwrap().push(make(tx));
        rx.await.expect("the driver answers")
    }
}

#[async_trait::async_trait]
impl Members for Simulated {
    async fn client(&self, i: usize, require_leader: bool) -> Result<Client, String> {
        Client::from_channel(
            etcd_client::Channel::Tonic(channel(&self.hosts[i], ETCD_PORT)),
            Some(options(require_leader)),
        )
        .await
        .map_err(|e| e.to_string())
    }

    async fn leader(&self) -> usize {
        loop {
            if let Some(l) = self.ask(Ask::Leader).await {
                return l;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn kill(&self, i: usize) {
        self.ask(|tx| Ask::Kill(i, tx)).await;
    }

    async fn restart(&self, i: usize) {
        self.ask(|tx| Ask::Restart(i, tx)).await;
    }

    async fn isolate(&self, i: usize) {
        self.ask(|tx| Ask::Isolate(i, tx)).await;
    }

    async fn rejoin(&self) {
        self.ask(Ask::Rejoin).await;
    }

    async fn move_leader(&self, to: usize) {
        self.ask(|tx| Ask::MoveLeader(to, tx)).await;
    }

    async fn stall(&self, i: usize) {
        self.ask(|tx| Ask::Stall(i, tx)).await;
    }

    async fn thaw(&self, i: usize) {
        self.ask(|tx| Ask::Thaw(i, tx)).await;
    }

    fn election_timeout(&self) -> Duration {
        ET
    }

    async fn store(&self, first: usize) -> EtcdStore {
        let dialers = (0..self.hosts.len())
            .map(|k| {
                let host = self.hosts[(first + k) % self.hosts.len()].clone();
                member_dialer(move || dial(host.clone(), ETCD_PORT))
            })
            .collect();
        // The dialers say where the members are; the config's endpoint is never dialled.
        EtcdStore::from_member_dialers(dialers, EtcdConfig::new(["http://etcd:2379"]))
            .await
            .expect("a store of every member")
    }
}

/// Runs `body` as a client of three simulated members at `version`, doing what it asks of
/// the members between the simulation's steps; returns what it returned.
pub(crate) fn on_the_simulator<T, F, Fut>(version: EtcdVersion, body: F) -> T
where
    T: Send + 'static,
    F: FnOnce(Simulated) -> Fut + 'static,
    Fut: std::future::Future<Output = T> + 'static,
{
    let mut sim = turmoil::Builder::new()
        .rng_seed(1)
        .tick_duration(Duration::from_millis(1))
        .min_message_latency(Duration::from_millis(1))
        .max_message_latency(Duration::from_millis(1))
        .simulation_duration(Duration::from_secs(300))
        .build();
    let cluster = SimCluster::builder()
        .members(3)
        .election_timeout(ET)
        .version(version)
        .add_to(&mut sim);
    let asks = Asks::default();
    let result = Arc::new(Mutex::new(None));
    let m = Simulated {
        hosts: (0..cluster.len())
            .map(|i| cluster.host(i).to_owned())
            .collect(),
        asks: asks.clone(),
    };
    let out = result.clone();
    sim.client("probe", async move {
        // Let the members start.
        tokio::time::sleep(Duration::from_millis(50)).await;
        *out.lock().unwrap() = Some(body(m).await);
        Ok(())
    });
    loop {
        for ask in std::mem::take(&mut *asks.lock().unwrap()) {
            let done = match ask {
                Ask::Leader(tx) => {
                    let _ = tx.send(cluster.leader(&sim));
                    continue;
                }
                Ask::Kill(i, tx) => {
                    cluster.kill(&sim, i);
                    tx
                }
                Ask::Restart(i, tx) => {
                    cluster.restart(i);
                    tx
                }
                Ask::Isolate(i, tx) => {
                    cluster.isolate(&sim, i);
                    tx
                }
                Ask::Rejoin(tx) => {
                    cluster.rejoin(&sim);
                    tx
                }
                Ask::MoveLeader(i, tx) => {
                    cluster.transfer_leader(&sim, i);
                    tx
                }
                Ask::Stall(i, tx) => {
                    cluster.stall(&sim, i);
                    tx
                }
                Ask::Thaw(i, tx) => {
                    cluster.thaw(i);
                    tx
                }
            };
            let _ = done.send(());
        }
        if sim.step().expect("the simulation runs") {
            break;
        }
    }
    let result = result.lock().unwrap().take();
    result.expect("the client finished")
}
