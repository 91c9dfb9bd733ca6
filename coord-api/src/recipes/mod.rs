//! The recipes: what services use coord for, written once on [`KvLeaseStore`] so that every
//! backend (and the simulator) runs the same code.
//!
//! | recipe | what it does |
//! |---|---|
//! | [`Session`] | one lease kept alive at TTL/3, with a local deadline |
//! | [`HostRegistration`] | a host's key under a lease, healing itself, removed by `stop()` |
//! | [`ClusterWatcher`] | the hosts under a prefix: a view and HostUp/HostDown, gap-free across compaction |
//! | [`Election`] / [`Leadership`] | leader election with a fencing token and a loss signal |
//! | [`ElectionPool`] | many elections on one self-replacing session |
//! | [`Mutex`] / [`MutexGuard`] | a lock with a fencing token, sharing etcd's Go and `etcdctl lock` layout |
//! | [`Semaphore`] / [`Permit`] | N permits, each with a fencing token the store checks |
//! | `discover` (feature `tower`) | a `ClusterWatcher` as a `tower::discover::Discover` stream, for tonic's balancing |
//! | `TypedWatcher` (feature `serde`) | a `ClusterWatcher` with each host's metadata decoded from JSON; see `typed` |
//!
//! Every handle ends one way: [`Handle::stop`] ends it now and gives back what is left, and
//! dropping it follows one rule per kind of handle; the table is on [`Handle`].
//!
//! Every recipe logs its lifecycle with `tracing` (registered, healed, lost, leader acquired
//! and lost, watcher resynced) and never installs a subscriber.
//!
//! [`KvLeaseStore`]: crate::KvLeaseStore

mod candidate;
#[cfg(feature = "tower")]
#[cfg_attr(docsrs, doc(cfg(feature = "tower")))]
pub mod discover;
mod election;
mod handle;
mod hold;
mod host;
mod loss;
mod mutex;
mod pool;
mod registration;
mod semaphore;
mod session;
mod task;
mod turn;
#[cfg(feature = "serde")]
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
pub mod typed;
mod watcher;

pub use candidate::{Candidate, CandidateConfig, CandidateStatus, Term, TermEnd};
#[cfg(feature = "tower")]
pub use discover::discover;
pub use election::{Election, Fence, Leadership};
pub use handle::Handle;
pub use hold::HeldKey;
pub use host::{HostLease, HostSession, HostSessionStats};
pub use loss::LossReason;
pub use mutex::{Mutex, MutexGuard};
pub use pool::{ElectionPool, PoolStats};
pub use registration::{
    HostRegistration, RegistrationConfig, RegistrationHealth, RegistrationStatus,
};
pub use semaphore::{Permit, Semaphore};
pub use session::{Session, SessionConfig, SessionEnd, SessionHandle, SessionHealth};
#[cfg(feature = "serde")]
pub use typed::{decode_metadata, encode_metadata, MetadataError, TypedEvent, TypedWatcher};
pub use watcher::{ClusterEvent, ClusterView, ClusterWatcher, ClusterWatcherConfig, HostChange};
