//! Compaction: history below the compaction point is dropped, except each key's value as of
//! the point, which reads at the point (and a watch's previous values) still need.

use coord_api::{Error, Result, Revision};
use deadpool_postgres::GenericClient;

use crate::kv::{before, lock_meta};

/// Compacts at `revision` inside the caller's transaction (which takes the writers' lock, so
/// no write lands halfway through).
pub(crate) async fn compact(c: &impl GenericClient, revision: Revision) -> Result<()> {
    let meta = lock_meta(c, "compact").await?;
    if revision <= meta.compact_revision {
        return Err(Error::Compacted {
            requested: revision,
            compact_revision: meta.compact_revision,
        });
    }
    if revision > meta.revision {
        return Err(Error::FutureRevision {
            requested: revision,
            current: meta.revision,
        });
    }
    // A row below the point goes if it is a tombstone or a later row at or below the point
    // replaces it.
    let stmt = c
        .prepare_cached(
            "DELETE FROM coord_history h WHERE h.revision < $1 AND (h.deleted OR EXISTS \
             (SELECT 1 FROM coord_history n WHERE n.key = h.key AND n.revision > h.revision \
             AND n.revision <= $1))",
        )
        .await
        .map_err(before("compact"))?;
    c.execute(&stmt, &[&revision.get()])
        .await
        .map_err(before("compact"))?;
    let stmt = c
        .prepare_cached("UPDATE coord_meta SET compact_revision = $1 WHERE id = 1")
        .await
        .map_err(before("compact"))?;
    c.execute(&stmt, &[&revision.get()])
        .await
        .map_err(before("compact"))?;
    Ok(())
}
