//! Keys and ranges as SQL bounds, rows as keys, and etcd's range semantics (filters, sort,
//! count, limit) over the rows a query returned.

use std::cmp::Ordering;

use bytes::Bytes;
use coord_api::{
    GetRequest, GetResponse, KeyRange, KeyValue, LeaseId, Revision, SortOrder, SortTarget,
};
use tokio_postgres::Row;

/// A range as `key >= lo AND (hi IS NULL OR key < hi)`: bytea compares bytewise, as etcd's
/// keys do. A single key's `hi` is the key with a zero byte appended, the next key after it.
pub(crate) fn bounds(range: &KeyRange) -> (Vec<u8>, Option<Vec<u8>>) {
    match range {
        KeyRange::Key(k) => {
            let mut hi = k.to_vec();
            hi.push(0);
            (k.to_vec(), Some(hi))
        }
        KeyRange::Prefix(p) => {
            let end = range.etcd_range_end();
            // etcd's "\0" range end means "to the end of the keyspace".
            let hi = (end != [0]).then_some(end);
            (p.to_vec(), hi)
        }
    }
}

/// The SQL condition for a range on column `key`, with its bounds at `$lo` and `$hi`.
pub(crate) fn condition(column: &str, lo: usize, hi: usize) -> String {
    format!("{column} >= ${lo} AND (${hi}::bytea IS NULL OR {column} < ${hi})")
}

/// A key from the columns `key, value, create_revision, mod_revision, version, lease`
/// starting at `at`; `None` when the key column is NULL (an empty outer join).
pub(crate) fn kv_at(row: &Row, at: usize) -> Option<KeyValue> {
    let key: Option<Vec<u8>> = row.get(at);
    Some(KeyValue {
        key: Bytes::from(key?),
        value: Bytes::from(row.get::<_, Vec<u8>>(at + 1)),
        create_revision: Revision(row.get(at + 2)),
        mod_revision: Revision(row.get(at + 3)),
        version: row.get(at + 4),
        lease: LeaseId(row.get(at + 5)),
    })
}

/// etcd's range over `visible` (the range's live keys in key order, as of the read's
/// revision): `count` is every visible key; the revision filters and the sort apply before
/// the limit; `more` says the limit cut matches off.
pub(crate) fn select(req: &GetRequest, visible: Vec<KeyValue>, header: Revision) -> GetResponse {
    let count = visible.len() as u64;
    // A bound of 0 is no bound, as etcd reads it.
    let bound = |b: Option<Revision>| b.filter(|r| !r.is_zero());
    let (min_create, max_create) = (
        bound(req.min_create_revision),
        bound(req.max_create_revision),
    );
    let (min_mod, max_mod) = (bound(req.min_mod_revision), bound(req.max_mod_revision));
    let mut kept: Vec<KeyValue> = visible
        .into_iter()
        .filter(|kv| {
            min_create.is_none_or(|r| kv.create_revision >= r)
                && max_create.is_none_or(|r| kv.create_revision <= r)
                && min_mod.is_none_or(|r| kv.mod_revision >= r)
                && max_mod.is_none_or(|r| kv.mod_revision <= r)
        })
        .collect();
    if let Some((target, order)) = req.sort {
        let cmp = |a: &KeyValue, b: &KeyValue| -> Ordering {
            match target {
                SortTarget::Version => a.version.cmp(&b.version),
                SortTarget::Create => a.create_revision.cmp(&b.create_revision),
                SortTarget::Mod => a.mod_revision.cmp(&b.mod_revision),
                SortTarget::Value => a.value.cmp(&b.value),
                _ => a.key.cmp(&b.key),
            }
        };
        // Stable, so ties keep key order either way, as etcd's sort does.
        match order {
            SortOrder::Ascend => kept.sort_by(cmp),
            SortOrder::Descend => kept.sort_by(|a, b| cmp(b, a)),
        }
    }
    let limit = req.limit.filter(|l| *l > 0).map(|l| l as usize);
    let more = limit.is_some_and(|l| kept.len() > l);
    if let Some(l) = limit {
        kept.truncate(l);
    }
    GetResponse::new(header, kept).with_count(count, more)
}
