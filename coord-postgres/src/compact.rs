//! Compaction: history below the compaction point is no longer read, except each key's value
//! as of the point.
//!
//! The rows go a minute later ([`RETENTION`]), at a later compaction: a watch that was up to
//! date when the compaction came (etcd's "synced" watcher, which a compaction never cuts off)
//! may not have read them yet, since a watch here reads when it is polled. Only a watch that
//! fell a minute behind is cut off, as etcd cuts off a slow watcher.

use std::time::Duration;

use coord_api::{Result, Revision};
use tokio_postgres::types::Type;

use crate::kv::{before, Writer};

/// How long the rows a compaction makes unreadable stay for synced watches.
pub(crate) const RETENTION: Duration = Duration::from_secs(60);

/// Compacts at `revision` inside `w`'s transaction (which holds the writers' lock, so no
/// write lands halfway through).
pub(crate) async fn compact(w: &Writer<'_>, revision: Revision) -> Result<()> {
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
             WHERE at <= clock_timestamp() - $1 * interval '1 second'",
            &[(&(RETENTION.as_secs() as i64), Type::INT8)],
        )
        .await
        .map_err(before("compact"))?;
    let Some(purge) = due.first().and_then(|r| r.get::<_, Option<i64>>(0)) else {
        return Ok(());
    };
    c.execute_typed(
        "DELETE FROM coord_history h WHERE h.revision < $1 AND (h.deleted OR EXISTS \
         (SELECT 1 FROM coord_history n WHERE n.key = h.key AND n.revision > h.revision \
         AND n.revision <= $1))",
        &[(&purge, Type::INT8)],
    )
    .await
    .map_err(before("compact"))?;
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
    Ok(())
}
