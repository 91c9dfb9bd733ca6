//! The store's journal: every change the state machine makes, with who caused it, kept in
//! full (compaction does not touch it). History checkers read it as the truth.

use std::time::Duration;

use coord_api::{Event, LeaseId, Revision};

/// Who caused a change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Origin {
    /// A request from the client with this id (see [`SimStore::client_id`](crate::SimStore::client_id)).
    Client(u64),
    /// The store's own clock: a lease expired.
    Expiry,
    /// The store itself, outside any request (a fault such as a leader change).
    Store,
    /// A raft leader replaced while it was paused, revoking on resume the leases it saw
    /// overdue (etcd#15247; etcd 3.4 in the simulator, see `EtcdVersion`).
    StaleLeader,
}

/// One entry of the journal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// A write committed at `revision` with these events.
    Commit {
        /// The new revision.
        revision: Revision,
        /// The cause.
        origin: Origin,
        /// What changed, in order.
        events: Vec<Event>,
    },
    /// A lease was granted.
    Grant {
        /// The lease.
        lease: LeaseId,
        /// Its TTL.
        ttl: Duration,
        /// Who asked.
        origin: Origin,
    },
    /// A lease was renewed to its full TTL.
    Renew {
        /// The lease.
        lease: LeaseId,
        /// Who renewed it.
        origin: Origin,
    },
    /// A lease ended (revoked by a client, or expired).
    LeaseEnd {
        /// The lease.
        lease: LeaseId,
        /// Who ended it ([`Origin::Expiry`] for an expiry).
        origin: Origin,
    },
    /// Every lease's deadline was pushed to its TTL plus this, as a new etcd leader does.
    Promote {
        /// The extension beyond each lease's TTL.
        extend: Duration,
    },
    /// History before `revision` was compacted.
    Compact {
        /// The new compaction point.
        revision: Revision,
    },
}
