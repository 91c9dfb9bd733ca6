//! Starts a three-member etcd cluster with the test harness, says so on stdout, and holds it
//! until killed. `tests/harness_etcd.rs` kills this process with SIGKILL (no destructor runs)
//! and checks that its etcd processes die with it.

use std::io::Write;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let cluster = coord_etcd::testing::EtcdCluster::three()
        .await
        .unwrap_or_else(|e| panic!("cannot start etcd: {e}"));
    println!("ready {}", cluster.endpoints().join(","));
    std::io::stdout().flush().expect("stdout");
    std::future::pending::<()>().await;
}
