//! [`LeaderKey`]: a candidate's key in an election, as the store's election methods take
//! and return it.

use bytes::Bytes;

use crate::txn::{Compare, CompareOp};
use crate::types::{LeaseId, Revision};

/// A candidate's key in an election: what [`KvLeaseStore::campaign`](crate::KvLeaseStore::campaign)
/// returns, and what proclaim and resign take to prove who is asking.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LeaderKey {
    /// The election's name.
    pub name: String,
    /// The candidate key, `name/<lease hex>`.
    pub key: Bytes,
    /// The key's create revision: a fencing token that only grows from one leader to the next.
    pub token: Revision,
    /// The lease the key lives under.
    pub lease: LeaseId,
}

impl LeaderKey {
    /// A compare that holds only while this key still stands as created. Put it in a
    /// transaction to make a write conditional on still being this candidate.
    pub fn is_current(&self) -> Compare {
        Compare::create_revision(self.key.to_vec(), CompareOp::Equal, self.token)
    }
}
