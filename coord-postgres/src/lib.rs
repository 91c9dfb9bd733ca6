//! coord's [`KvLeaseStore`](coord_api::KvLeaseStore) on PostgreSQL: etcd's revisions,
//! leases, watches and elections over SQL, so every coord recipe runs unchanged on a database
//! a team already operates.
//!
//! * **Revisions** come from one counter row that every writing transaction locks first, so
//!   commit order is revision order and there are no gaps (no sequences, no placeholders).
//! * **Leases** expire on the server's clock: a deadline is set by `clock_timestamp()` when a
//!   grant or renewal runs, and every connected client sweeps expired leases, deleting their
//!   keys in one revision.
//! * **Watches** read the history table from their next revision; `LISTEN/NOTIFY` only wakes
//!   them, so a lost notification costs latency, never an event.
//! * **Elections** are etcd's algorithm on those primitives ([`coord_api::elections`]); no
//!   advisory locks.
//! * **Every request is bounded** by the request timeout, and a connection that failed or
//!   timed out is closed, never reused: a frozen connection costs one request, not the store.
//! * **TLS** through rustls ([`TlsConfig`]); passwords in the connection string.
//!
//! ```no_run
//! # async fn run() -> coord_api::Result<()> {
//! use coord_api::recipes::{HostRegistration, RegistrationConfig};
//! use coord_postgres::{PostgresConfig, PostgresStore};
//!
//! let store = PostgresStore::connect(PostgresConfig::new(
//!     "host=127.0.0.1 port=5432 user=coord password=secret dbname=coord",
//! ))
//! .await?;
//! let registration =
//!     HostRegistration::start(store.into(), RegistrationConfig::new("hosts/a", "10.0.0.1:80"))
//!         .await?;
//! # registration.stop().await?;
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)]

mod compact;
mod config;
mod conn;
mod error;
mod kv;
mod lease;
mod range;
mod schema;
mod store;
#[cfg(feature = "test-util")]
pub mod testing;
mod tls;
mod watch;

pub use config::PostgresConfig;
pub use store::PostgresStore;
pub use tls::TlsConfig;

/// The name errors and traces give this backend.
pub(crate) const BACKEND: &str = "postgres";
