//! A three-member cluster the member suites fail, on real etcd (`members_etcd.rs`) or on the
//! simulator (`members/sim.rs`): the one interface the probe and the bare-request case use.

use std::time::Duration;

use etcd_client::{Client, ConnectOptions};

/// A cluster whose members a case can fail, on real etcd or on the simulator.
#[async_trait::async_trait]
pub(crate) trait Members: Send + Sync {
    /// A client of member `i` alone, sending etcd's require-leader metadata or not.
    async fn client(&self, i: usize, require_leader: bool) -> Result<Client, String>;
    /// The raft leader's index.
    async fn leader(&self) -> usize;
    /// Kills member `i` (SIGKILL; a turmoil crash).
    async fn kill(&self, i: usize);
    /// Starts killed member `i` again on its data.
    async fn restart(&self, i: usize);
    /// Cuts member `i` off from its peers; clients still reach it.
    async fn isolate(&self, i: usize);
    /// Ends [`isolate`](Self::isolate).
    async fn rejoin(&self);
    /// Hands raft leadership to member `to`.
    async fn move_leader(&self, to: usize);
    /// Stalls member `i` (SIGSTOP: its kernel still accepts, nothing answers).
    async fn stall(&self, i: usize);
    /// Ends [`stall`](Self::stall) (SIGCONT).
    async fn thaw(&self, i: usize);
    /// The members' election timeout.
    fn election_timeout(&self) -> Duration;
    /// An `EtcdStore` given every member, starting from member `first`, at the library's
    /// defaults.
    async fn store(&self, first: usize) -> coord_etcd::EtcdStore;
}

/// Connect options for the probe's clients of one member.
pub(crate) fn options(require_leader: bool) -> ConnectOptions {
    ConnectOptions::new()
        .with_require_leader(require_leader)
        .with_connect_timeout(Duration::from_secs(1))
}
