//! The simulator served as etcd: etcd's KV, Lease, Watch and Maintenance gRPC services over a
//! [`SimStore`](crate::SimStore), so that the production `EtcdStore` (and any etcd client) can run against it,
//! over turmoil's simulated network in this crate's use.
//!
//! Elections need no service: coord runs them on the client, over KV, Lease and Watch.

mod cluster;
mod convert;
mod gate;
mod host;
mod members;
mod net;
mod services;

pub use cluster::{ClusterBuilder, SimCluster};
pub use host::{add_etcd_host, DurableStore, ETCD_PORT};
pub use members::EtcdVersion;
pub use net::{channel, channel_as, dial, dial_as, incoming, SimTcp};
pub use services::{Clients, EtcdService};
