//! What a client sees of the simulator's member failures: the probe of `members/probe.rs`
//! (the one `members_etcd.rs` runs on real etcd) on a [`SimCluster`] of three members under
//! turmoil, held to the same assertions. Its figures are the "sim" column of the member table.

#[path = "members/bare.rs"]
mod bare;
#[path = "members/cluster.rs"]
mod cluster;
#[path = "members/probe.rs"]
mod probe;
#[path = "members/sim.rs"]
mod sim;

use std::time::Duration;

use coord_sim::grpc::EtcdVersion;
use sim::{on_the_simulator, ET};

#[test]
fn member_failures_as_a_client_sees_them_on_the_simulator_as_etcd_3_5() {
    probe_the_simulator(EtcdVersion::V3_5);
}

#[test]
fn member_failures_as_a_client_sees_them_on_the_simulator_as_etcd_3_4() {
    probe_the_simulator(EtcdVersion::V3_4);
}

fn probe_the_simulator(version: EtcdVersion) {
    let figures = on_the_simulator(version, |m| async move { probe::probe(&m).await });
    for (what, figure) in figures.rows() {
        println!("measured (sim):  {what:<64} {figure}");
    }
    // etcd's request timeout, as on real etcd: 5 s plus two election timeouts.
    figures.assert_like_etcd(Duration::from_secs(5), ET);
}

#[test]
fn bare_requests_leave_a_sick_member_on_the_simulator_as_etcd_3_5() {
    bare_on_the_simulator(EtcdVersion::V3_5);
}

#[test]
fn bare_requests_leave_a_sick_member_on_the_simulator_as_etcd_3_4() {
    bare_on_the_simulator(EtcdVersion::V3_4);
}

fn bare_on_the_simulator(version: EtcdVersion) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .try_init();
    let bare = on_the_simulator(version, |m| async move { bare::bare_requests(&m).await });
    for (what, figure) in bare.rows {
        println!("measured (sim):  {what:<40} {figure}");
    }
}
