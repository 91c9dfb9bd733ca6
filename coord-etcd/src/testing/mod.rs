//! Real etcd for tests: [`EtcdCluster`] starts etcd processes on free loopback ports (one
//! member or several), and controls them (kill -9, restart on the same data, SIGSTOP and
//! SIGCONT, find and kill the leader, move leadership, cut a member off from its peers, restart
//! them all, replace a member, compact, revoke); [`TcpProxy`] sits between a client and
//! a member to partition them (blackhole, reset, delay).
//!
//! Tests that use it need the `etcd` binary: `ETCD_BIN`, or `etcd` on `PATH` (Debian's
//! `etcd-server` package). Without it they fail with [`HarnessError::EtcdNotFound`], which
//! says so; they never skip.
//!
//! No etcd outlives the test process that started it, even one killed with SIGKILL: each runs
//! under util-linux's `setpriv --pdeathsig KILL` (see `coord_api::testkit::process`).

mod cluster;
mod peer_proxy;

pub use cluster::{etcd_binary, EtcdCluster, EtcdClusterBuilder, HarnessError, ServerTls};
pub use coord_api::testkit::proxy::{ProxyMode, TcpProxy};
