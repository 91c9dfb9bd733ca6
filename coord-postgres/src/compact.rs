//! Compaction: history below the compaction point is no longer read, except each key's value
//! as of the point.
//!
//! The rows go a minute later (`PostgresConfig::with_history_retention`), at a later compaction: a watch that was up to
//! date when the compaction came (etcd's "synced" watcher, which a compaction never cuts off)
//! may not have read them yet, since a watch here reads when it is polled. Only a watch that
//! fell a minute behind is cut off, as etcd cuts off a slow watcher.
//!
//! The compaction itself, under the writers' lock, only moves the points; the rows go after
//! its commit in batches of [`BATCH`], each a short transaction of its own ([`purge`]), so
//! that a compaction of millions of rows never holds the writers up.

use std::time::Duration;

use coord_api::{Result, Revision};
use deadpool_postgres::Pool;
use tokio::time::Instant;
use tokio_postgres::types::Type;

use crate::error::Stage;
use crate::kv::{before, Writer};

/// Compacts at `revision` inside `w`'s transaction (which holds the writers' lock, so no
/// write lands halfway through). Returns the revision below which rows are due to go, once
/// the transaction has committed ([`purge`]).
pub(crate) async fn compact(
    w: &Writer<'_>,
    revision: Revision,
    retention: Duration,
) -> Result<Option<i64>> {
    let meta = w.meta();
    let c = w.client();
    coord_api::validate::compaction(revision, meta.revision, meta.compact_revision)?;
    let record = "INSERT INTO coord_compaction (revision) VALUES ($1)";
    c.execute_typed(record, &[(&revision.get(), Type::INT8)])
        .await
        .map_err(before("compact"))?;
    c.execute_typed(
        "UPDATE coord_meta SET compact_revision = $1 WHERE id = 1",
        &[(&revision.get(), Type::INT8)],
    )
    .await
    .map_err(before("compact"))?;
    // The newest compaction older than the retention: below it, a row goes if it is a
    // tombstone or a later row at or below that point replaces it.
    let due = c
        .query_typed(
            "SELECT max(revision) FROM coord_compaction \
             WHERE at <= clock_timestamp() - $1 * interval '1 millisecond'",
            &[(&(retention.as_millis() as i64), Type::INT8)],
        )
        .await
        .map_err(before("compact"))?;
    let Some(purge) = due.first().and_then(|r| r.get::<_, Option<i64>>(0)) else {
        return Ok(None);
    };
    // From here on no reader goes below `purge`; the rows below it go after the commit.
    c.execute_typed(
        "UPDATE coord_meta SET purged_revision = $1 WHERE id = 1",
        &[(&purge, Type::INT8)],
    )
    .await
    .map_err(before("compact"))?;
    c.execute_typed(
        "DELETE FROM coord_compaction WHERE revision <= $1",
        &[(&purge, Type::INT8)],
    )
    .await
    .map_err(before("compact"))?;
    Ok(Some(purge))
}

/// How many history rows one purge transaction deletes.
const BATCH: i64 = 1000;

/// Deletes the history rows below `purge` that nothing reads any more: a tombstone, or a row
/// a later one at or below `purge` replaces. [`BATCH`] rows a transaction, without the
/// writers' lock: no reader goes below `purge`, and writes only add rows above it. A purge cut
/// short (an error, the process gone) leaves rows the next one deletes, since a row
/// deletable at one point stays so at every later one.
pub(crate) async fn purge(pool: Pool, purge: i64, timeout: Duration) {
    let mut deleted = 0;
    loop {
        let batch = crate::conn::single(
            &pool,
            Instant::now() + timeout,
            "compact",
            Stage::Before,
            |c| {
                Box::pin(async move {
                    c.execute_typed(
                        "DELETE FROM coord_history WHERE ctid = ANY(ARRAY( \
                         SELECT h.ctid FROM coord_history h WHERE h.revision < $1 AND (h.deleted \
                         OR EXISTS (SELECT 1 FROM coord_history n WHERE n.key = h.key \
                         AND n.revision > h.revision AND n.revision <= $1)) LIMIT $2))",
                        &[(&purge, Type::INT8), (&BATCH, Type::INT8)],
                    )
                    .await
                    .map_err(before("compact"))
                })
            },
        )
        .await;
        match batch {
            Ok(n) => {
                deleted += n;
                if n < BATCH as u64 {
                    tracing::debug!(purge, deleted, "coord-postgres: compacted history purged");
                    return;
                }
            }
            Err(e) => {
                tracing::debug!(purge, deleted, error = %e, "coord-postgres: purge cut short; the next compaction finishes it");
                return;
            }
        }
    }
}
