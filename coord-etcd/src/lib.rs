//! `coord-etcd`: the production [`KvLeaseStore`](coord_api::KvLeaseStore) on etcd v3, and (with
//! the `test-util` feature) a harness that runs real etcd processes for tests.
//!
//! ```no_run
//! # async fn run() -> coord_api::Result<()> {
//! use std::{sync::Arc, time::Duration};
//! use coord_api::DynKvLeaseStore;
//! use coord_etcd::{EtcdConfig, EtcdStore};
//!
//! let config = EtcdConfig::new(["10.0.0.1:2379", "10.0.0.2:2379", "10.0.0.3:2379"])
//!     .with_request_timeout(Duration::from_secs(3));
//! let store: Arc<DynKvLeaseStore> = Arc::new(EtcdStore::connect(config).await?);
//! # Ok(()) }
//! ```
//!
//! # Feature flags
//!
//! | feature     | what it adds |
//! |-------------|--------------|
//! | `test-util` | `testing`: start one etcd or a three-member cluster on free loopback ports; kill, pause, restart members; a TCP proxy to cut a client off. Needs the `etcd` binary (Debian: `etcd-server`). |

#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]

mod channel;
mod config;
mod convert;
mod dial;
mod error;
mod gather;
mod keepalive;
mod liveness;
mod pool;
mod settle;
mod store;
mod watch;

#[cfg(feature = "test-util")]
#[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
pub mod testing;

pub use config::{EtcdConfig, TlsConfig};
pub use dial::{member_dialer, Dialing, MemberDialer, MemberIo};
pub use store::{EtcdStore, MemberChannel};

/// The crate's README, whose examples are compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
