//! Compaction: history below the compaction point is dropped, except each key's value as of
//! the point, which reads at the point (and a watch's previous values) still need.

use coord_api::{Result, Revision};
use tokio_postgres::types::Type;

use crate::kv::{before, Writer};

/// Compacts at `revision` inside `w`'s transaction (which holds the writers' lock, so no
/// write lands halfway through).
pub(crate) async fn compact(w: &Writer<'_>, revision: Revision) -> Result<()> {
    let meta = w.meta();
    let c = w.client();
    coord_api::validate::compaction(revision, meta.revision, meta.compact_revision)?;
    // A row below the point goes if it is a tombstone or a later row at or below the point
    // replaces it.
    let at = [(
        &revision.get() as &(dyn tokio_postgres::types::ToSql + Sync),
        Type::INT8,
    )];
    c.execute_typed(
        "DELETE FROM coord_history h WHERE h.revision < $1 AND (h.deleted OR EXISTS \
         (SELECT 1 FROM coord_history n WHERE n.key = h.key AND n.revision > h.revision \
         AND n.revision <= $1))",
        &at,
    )
    .await
    .map_err(before("compact"))?;
    c.execute_typed(
        "UPDATE coord_meta SET compact_revision = $1 WHERE id = 1",
        &at,
    )
    .await
    .map_err(before("compact"))?;
    Ok(())
}
