//! Real PostgreSQL for tests: [`PostgresServer`] runs a server of its own on a free loopback
//! port, from a data directory of its own, and controls it (kill -9, restart on the same data,
//! SIGSTOP and SIGCONT, a server-side kill of every client's backend); [`TcpProxy`] sits
//! between a client and it, to cut the client off (partitions, resets, delays).
//!
//! Tests that use it need PostgreSQL's server binaries (`initdb`, `postgres`): `PG_BIN` (the
//! directory holding them), or Debian's `postgresql` package under `/usr/lib/postgresql`.
//! Without them they fail with [`HarnessError::NotFound`], which says so; they never skip.
//! PostgreSQL refuses to run as root, so a root test process runs it as the `postgres` system
//! user. No server outlives the test process that started it, even one killed with SIGKILL:
//! each runs under `setpriv --pdeathsig KILL` (see `coord_api::testkit::process`).

mod server;

pub use coord_api::testkit::proxy::{ProxyMode, TcpProxy};
pub use server::{postgres_bin_dir, HarnessError, PostgresServer};
