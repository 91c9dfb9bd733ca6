//! Pooled connections on loan, each request within its deadline.
//!
//! A connection whose request failed on the link or ran out of time is closed, never handed
//! to the next request: a frozen connection (a middlebox forgot it; nothing comes back) would
//! hold every request after it, and one cancelled mid-transaction would hand its open
//! transaction, and the writers' lock, to the next.

use deadpool_postgres::{Object, Pool};
use futures::future::BoxFuture;
use tokio::time::{timeout_at, Instant};

use coord_api::{Error, Result};

use crate::error::{from_pool, timed_out, Stage};
use crate::BACKEND;

/// A pooled connection on loan to one request. Unless the request gives it back in a known
/// state, it is closed when the loan ends: a request cancelled mid-transaction (its future
/// dropped) must not hand the next request an open transaction holding the writers' lock.
/// Closing it makes the server roll the transaction back.
pub(crate) struct Checkout {
    conn: Option<Object>,
}

impl Checkout {
    /// A connection from `pool`, waiting no later than `deadline`.
    pub(crate) async fn take(
        pool: &Pool,
        operation: &'static str,
        deadline: Instant,
    ) -> Result<Checkout> {
        let conn = timeout_at(deadline, pool.get())
            .await
            .map_err(|_| timed_out(operation, Stage::Before))?
            .map_err(|e| from_pool(operation, e))?;
        Ok(Checkout { conn: Some(conn) })
    }

    pub(crate) fn client(&self) -> &tokio_postgres::Client {
        self.conn.as_ref().expect("on loan")
    }

    /// Returns the connection to the pool.
    pub(crate) fn give_back(mut self) {
        drop(self.conn.take());
    }
}

impl Drop for Checkout {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            drop(Object::take(conn));
        }
    }
}

/// Runs one statement's worth of work (autocommit) on a pooled connection by `deadline`; a
/// timeout or a lost connection is reported at `stage`, and closes the connection.
pub(crate) async fn single<T>(
    pool: &Pool,
    deadline: Instant,
    operation: &'static str,
    stage: Stage,
    run: impl for<'a> FnOnce(&'a tokio_postgres::Client) -> BoxFuture<'a, Result<T>>,
) -> Result<T> {
    let conn = Checkout::take(pool, operation, deadline).await?;
    let result = match timeout_at(deadline, run(conn.client())).await {
        Ok(r) => r,
        Err(_) => Err(timed_out(operation, stage)),
    };
    let result = match (result, stage) {
        (Err(Error::Unavailable { source, .. }), Stage::Commit) if !answered(&source) => {
            Err(Error::Indeterminate {
                backend: BACKEND,
                operation,
                source,
            })
        }
        (r, _) => r,
    };
    if !result.as_ref().is_err_and(failed_link) {
        conn.give_back();
    }
    result
}

/// True for a source that is the server's own answer (nothing applied).
fn answered(source: &coord_api::BoxError) -> bool {
    source
        .downcast_ref::<tokio_postgres::Error>()
        .is_some_and(|e| e.as_db_error().is_some())
}

/// Whether `e` leaves its connection in an unknown state (closed rather than reused).
pub(crate) fn failed_link(e: &Error) -> bool {
    matches!(e, Error::Unavailable { .. } | Error::Indeterminate { .. })
}
