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
//! In process, without a simulated network. Per client ([`SimStore::connect`] makes one):
//! [`SimStore::partition`] and [`SimStore::repair`] (both ways: requests and replies vanish),
//! [`SimStore::partition_oneway`] and [`SimStore::repair_oneway`] (requests apply, replies
//! vanish), [`SimStore::hold`] and [`SimStore::release`] (messages stall until released),
//! [`SimStore::hold_sent`] and [`SimStore::release_sent`] (calls already on their way stall
//! while later ones pass them: a write landing after the delete sent behind it),
//! [`SimStore::set_latency`] (requests arrive late), [`SimStore::set_reply_latency`] (replies
//! and watch deliveries come back late), [`SimStore::lose_replies`]. Store-wide:
//! [`SimStore::close_streams`], [`SimStore::leader_change`] (streams close, leases refreshed as a
//! new etcd leader does), [`SimStore::crash`] and [`SimStore::restart`],
//! [`SimStore::compact_every`]; and the trait itself revokes leases, deletes keys and compacts
//! from outside. [`SimStore::on_journal`] records every change with its cause.
//!
//! # Over a simulated network
//!
//! With the `grpc` feature, the `grpc` module serves the store as etcd's KV, Lease, Watch and
//! Maintenance gRPC services on a turmoil host, so that any etcd client (coord's production
//! `EtcdStore` among them) runs against it over turmoil's simulated TCP.
//!
//! The chaos runner, which drives the recipes on many nodes under scheduled faults and checks
//! every history against invariants, lives in the `coord-chaos` crate.
//!
//! # Determinism
//!
//! All time comes from `tokio::time`, lease ids from [`SimConfig::seed`], and every collection
//! the store iterates is ordered, so the same operations give the same results and the same
//! ids, run after run. The store and coord's recipes leave nothing to tokio's own random
//! choices (their channels are `coord_api::sync`'s, which wake waiters in order), so an
//! in-process simulation replays from its seed in any build, a user's included (the
//! downstream example's determinism test holds it to that without `--cfg tokio_unstable`).
//! Only the gRPC service over turmoil (feature `grpc`) runs tonic's server, whose unbiased
//! selects a build seeds only with `--cfg tokio_unstable`.
//!
//! Over turmoil, one piece of real time remains in the stack: HTTP/2 (h2) remembers a stream
//! it reset for a second of the system clock, and a late frame for it draws a reset back only
//! after that second, one message more on turmoil's network. The channels of `grpc` forget a
//! reset stream at once, so a history does not depend on how fast the machine ran it, and so
//! does `coord_etcd`'s own channel, which `EtcdStore` runs over `grpc::dial`'s connections as
//! it runs in production; a channel of your own to the simulated members wants the same
//! (`Endpoint::http2_max_concurrent_reset_streams(0)`). The server's side of a connection
//! keeps hyper's setting, which tonic does not expose: a frame the client sent before the
//! server reset its stream, reaching the server more than a second of real time later (on a
//! held or slow link of a busy machine), can still add that message.
//!
//! # Layout
//!
//! [`state`] is the store itself, a pure synchronous state machine; [`SimStore`] serves it
//! in-process (each client over a link of its own) and `grpc` (feature `grpc`) over a simulated
//! network; its clock expires leases and syncs watches; its faults are verbs on [`SimStore`];
//! [`journal`] is its record of changes.

#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]

mod arrivals;
mod clock;
mod config;
mod created;
mod deadlines;
mod faults;
#[cfg(feature = "grpc")]
#[cfg_attr(docsrs, doc(cfg(feature = "grpc")))]
pub mod grpc;
pub mod journal;
mod keepalive;
mod link;
mod mailbox;
pub mod state;
mod store;
mod versions;
mod waker;
mod watch;

pub use config::SimConfig;
pub use faults::{CompactionTask, LessorSnapshot};
pub use store::SimStore;

/// The crate's README, whose examples are compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
