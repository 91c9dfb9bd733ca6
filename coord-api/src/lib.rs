//! Coordination over a key-value store with leases, written once against one contract.
//!
//! `coord-api` defines [`KvLeaseStore`]: the parts of etcd's v3 API that coordination needs
//! (KV with revisions, transactions, leases with keep-alive, watch from a revision,
//! compaction), with etcd's semantics as the reference, and elections built on them with
//! etcd's own algorithm. Backends implement it; everything else is written against
//! `Arc<dyn KvLeaseStore>` and so runs unchanged on all of them.
//!
//! ```no_run
//! use std::{sync::Arc, time::Duration};
//! use bytes::Bytes;
//! use coord_api::{DynKvLeaseStore, KvLeaseStore, Result};
//!
//! async fn lead(store: Arc<DynKvLeaseStore>) -> Result<()> {
//!     let lease = store.grant(Duration::from_secs(10)).await?;
//!     let leader = store.campaign("jobs/scheduler", Bytes::from("node-a"), lease.id).await?;
//!     // `leader.token` (the key's create revision) grows with every new leader.
//!     println!("leading with token {}", leader.token);
//!     store.resign(&leader).await
//! }
//! ```
//!
//! # Recipes
//!
//! [`recipes`] holds what services use coord for, written once on the trait: a [`Session`]
//! with a local deadline, a self-healing [`HostRegistration`], a gap-free [`ClusterWatcher`],
//! [`Election`]s whose [`Leadership`] carries a fencing token, and an [`ElectionPool`].
//!
//! [`Session`]: recipes::Session
//! [`HostRegistration`]: recipes::HostRegistration
//! [`ClusterWatcher`]: recipes::ClusterWatcher
//! [`Election`]: recipes::Election
//! [`Leadership`]: recipes::Leadership
//! [`ElectionPool`]: recipes::ElectionPool
//!
//! # Metrics
//!
//! The recipes record renewals, lost leases, heals, re-lists, campaigns, leadership changes
//! and fenced-out writes through the `metrics` facade; [`metrics`] lists every name in one
//! table. The library installs no recorder.
//!
//! # Backends
//!
//! * `coord-sim`: `SimStore`, an in-memory store that behaves like etcd 3.4, in virtual time.
//! * `coord-etcd`: `EtcdStore`, the production backend on a real etcd cluster.
//!
//! # Errors
//!
//! One [`Error`] enum, by condition, each variant in one [`ErrorClass`] that says whether the
//! request was applied, may be retried, or has an unknown outcome.
//!
//! # Feature flags
//!
//! | feature     | what it adds |
//! |-------------|--------------|
//! | `test-util` | `testkit`: the conformance suite every backend runs, and `conformance_tests!`. Not API-stable. |
//! | `tower` | discovery: a `ClusterWatcher` as a `tower::discover::Discover` stream (`recipes::discover`), which tonic's balanced channel follows. |
//! | `serde` | typed metadata: registrations and watchers over a serde type, encoded as JSON (`recipes::typed`). |
//! | `planted-bugs` | deliberate defects in the recipes, each switched on at run time, for proving the chaos checkers (not part of the API). Never in production. |
//!
//! # Cancellation and shutdown
//!
//! Every returned future may be dropped. A dropped write may still apply. A dropped campaign
//! deletes its candidate key in the background. Dropping a watch stream cancels the watch.

#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]

pub mod elections;
mod error;
mod ext;
mod forward;
#[doc(hidden)]
pub mod hooks;
mod into_bytes;
mod leader_key;
pub mod metrics;
mod namespace;
pub mod recipes;
mod request;
pub mod retry;
mod store;
pub mod sync;
mod txn;
mod types;
pub mod validate;
mod watch_stream;

#[cfg(any(test, feature = "test-util"))]
#[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
pub mod testkit;

pub use elections::candidate_key;
pub use error::{BoxError, Error, ErrorClass, Result};
pub use ext::KvLeaseStoreExt;
pub use forward::Forward;
pub use into_bytes::IntoBytes;
pub use leader_key::LeaderKey;
pub use namespace::Namespaced;
pub use request::{
    DeleteRequest, DeleteResponse, GetRequest, GetResponse, LeaseGrant, LeaseTimeToLive,
    PutRequest, PutResponse, SortOrder, SortTarget, WatchRequest, WatchResponse,
};
pub use store::{DynKvLeaseStore, KeepAlive, KvLeaseStore, LeaderStream, WatchStream};
pub use txn::{Compare, CompareOp, CompareTarget, TxnOp, TxnOpResponse, TxnRequest, TxnResponse};
pub use types::{Event, EventKind, KeyRange, KeyValue, LeaseId, Limits, Revision};

// Re-exported so backends and users name the same versions.
pub use async_trait::async_trait;
pub use bytes::Bytes;

/// The crate's README, whose examples are compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
