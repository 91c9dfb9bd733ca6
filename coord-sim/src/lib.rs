//! `coord-sim`: an in-memory store that behaves like etcd, for deterministic tests.
//!
//! [`SimStore`] implements [`coord_api::KvLeaseStore`] in-process, with etcd 3.4's semantics
//! for everything the trait exposes: one global revision, MVCC reads at past revisions,
//! transactions, leases that expire on `tokio::time`, watches from any retained revision,
//! compaction and its errors, and (through the trait's provided methods) etcd's election
//! algorithm. It passes the same conformance suite as the etcd backend, so a test that passes
//! here predicts the behaviour on etcd.
//!
//! Use it wherever you would otherwise need an etcd: one store per test is cheap, and under
//! `#[tokio::test(start_paused = true)]` lease TTLs pass in virtual time.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> coord_api::Result<()> {
//! use std::{sync::Arc, time::Duration};
//! use coord_api::{Bytes, DynKvLeaseStore, KvLeaseStore};
//! use coord_sim::SimStore;
//!
//! let store: Arc<DynKvLeaseStore> = Arc::new(SimStore::new());
//! let lease = store.grant(Duration::from_secs(5)).await?;
//! let leader = store.campaign("jobs", Bytes::from("me"), lease.id).await?;
//! assert_eq!(store.leader("jobs").await?.key, leader.key);
//! # Ok(()) }
//! ```
//!
//! # Faults
//!
//! In process, without a simulated network: [`SimStore::close_streams`] ends every keep-alive
//! channel and watch (a lost connection, an etcd leader change), [`SimStore::connect`] plus
//! [`SimStore::set_cut_off`] cuts one client off, [`SimConfig::with_latency`] (every client) or
//! [`SimStore::set_latency`] (one client) makes calls take time, [`SimStore::lose_replies`] applies writes but loses their replies,
//! [`SimStore::leader_change`] closes streams and refreshes leases as a new etcd leader does,
//! [`SimStore::compact_every`] compacts on a cadence, and the trait itself revokes leases,
//! deletes keys and compacts from outside.
//!
//! # Determinism
//!
//! All time comes from `tokio::time`, lease ids from [`SimConfig::seed`], and every collection
//! the store iterates is ordered, so the same operations give the same results and the same
//! ids, run after run.
//!
//! # Layout
//!
//! [`state`] is the store itself, a pure synchronous state machine; [`SimStore`] serves it
//! in-process. Keeping them apart lets the same state machine be served over a simulated
//! network later.

#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod chaos;
#[cfg(feature = "turmoil")]
#[cfg_attr(docsrs, doc(cfg(feature = "turmoil")))]
pub mod grpc;
pub mod journal;
mod link;
pub mod state;
mod store;

pub use store::{CompactionTask, SimConfig, SimStore};
