//! The keys and values of coord's own nodes (`CoordService`): where they register, what they
//! campaign in, what their leaders write, and how their metadata reads; shared by the nodes
//! and the checkers that read their history.

use crate::history::Incarnation;

/// The prefix every node registers under.
pub const HOSTS: &str = "hosts/";

/// The name of election `e`.
pub fn election_name(e: usize) -> String {
    format!("elections/e{e}")
}

/// The key leaders of election `e` write through the fence.
pub fn work_key(e: usize) -> String {
    format!("work/{}/token", election_name(e))
}

/// The key node `node` registers.
pub fn host_key(node: usize) -> String {
    format!("{HOSTS}n{node}")
}

/// The metadata a node registers: who it is, and a generation that grows with each update.
pub(crate) fn metadata(who: Incarnation, generation: u64) -> String {
    format!("{who}#{generation}")
}

/// The generation of a node's metadata (see [`metadata`]).
pub(crate) fn metadata_generation(value: &[u8]) -> Option<u64> {
    std::str::from_utf8(value)
        .ok()?
        .rsplit_once('#')?
        .1
        .parse()
        .ok()
}
