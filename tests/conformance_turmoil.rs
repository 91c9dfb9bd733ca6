//! The conformance suite through the production path, simulated: `EtcdStore` (the real
//! adapter, over etcd-client, tonic and h2) talking to the simulator served as etcd's gRPC
//! services, over turmoil's simulated network, in virtual time. The same cases, with the same
//! assertions, as on `SimStore` in-process and on real etcd.

use std::sync::Arc;
use std::time::Duration;

use coord_api::testkit::{Case, Ctx, Harness};
use coord_etcd::{member_dialer, EtcdConfig, EtcdStore};
use coord_sim::grpc::{add_etcd_host, dial, ETCD_PORT};
use coord_sim::SimConfig;

struct TurmoilHarness;

impl Harness for TurmoilHarness {
    fn run(&self, case: &Case) {
        let mut sim = turmoil::Builder::new()
            .rng_seed(0x5eed)
            .simulation_duration(Duration::from_secs(600))
            .build();
        // Notifications every second, as the real-etcd harness runs etcd: the case waits on
        // them, and turmoil's run is bounded.
        let sim_config = SimConfig::default().with_progress_notify_interval(Duration::from_secs(1));
        let limits = sim_config.limits.clone();
        add_etcd_host(&mut sim, "etcd", sim_config, Duration::from_secs(1));
        let case = *case;
        sim.client("case", async move {
            let config = EtcdConfig::new([format!("http://etcd:{ETCD_PORT}")]).with_limits(limits);
            let dial = member_dialer(|| dial("etcd".to_owned(), ETCD_PORT));
            let store = EtcdStore::from_member_dialers(vec![dial], config).await?;
            let cx = Ctx::new(Arc::new(store), format!("conformance/{}/", case.name));
            (case.run)(cx).await;
            Ok(())
        });
        if let Err(e) = sim.run() {
            panic!("{}: {e}", case.name);
        }
    }
}

coord_api::conformance_tests!(TurmoilHarness);
