//! Reads and writes of keys inside one database transaction: the rules of etcd's MVCC store
//! (revisions, versions, tombstones, compare-and-swap) over `coord_kv` and `coord_history`.

use bytes::Bytes;
use coord_api::{
    Compare, DeleteRequest, DeleteResponse, Error, GetRequest, GetResponse, KeyRange, KeyValue,
    LeaseId, PutRequest, PutResponse, Result, Revision,
};
use deadpool_postgres::GenericClient;

use crate::error::{from_pg, Stage};
use crate::range::{bounds, condition, kv_at, select};

/// The columns of a key, in [`kv_at`]'s order.
const KV_COLUMNS: &str = "key, value, create_revision, mod_revision, version, lease";

/// The store's revision and compaction point, as one snapshot saw them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Meta {
    pub(crate) revision: Revision,
    pub(crate) compact_revision: Revision,
}

impl Meta {
    /// Refuses a read at a revision compacted away or not yet written.
    pub(crate) fn check_read(&self, rev: Revision) -> Result<()> {
        if rev > 0 && rev < self.compact_revision {
            return Err(Error::Compacted {
                requested: rev,
                compact_revision: self.compact_revision,
            });
        }
        if rev > self.revision {
            return Err(Error::FutureRevision {
                requested: rev,
                current: self.revision,
            });
        }
        Ok(())
    }
}

/// Shorthand for a query's failure in a read or before the commit: nothing applied.
pub(crate) fn before(operation: &'static str) -> impl Fn(tokio_postgres::Error) -> Error {
    move |e| from_pg(operation, Stage::Before, e)
}

/// The live keys of `range` as of `rev` (now, when `None`), in key order, with the meta row
/// read in the same statement, so in the same snapshot.
async fn visible(
    c: &impl GenericClient,
    range: &KeyRange,
    rev: Option<Revision>,
) -> Result<(Meta, Vec<KeyValue>)> {
    let (lo, hi) = bounds(range);
    let rows = match rev {
        None => {
            let sql = format!(
                "SELECT m.revision, m.compact_revision, k.key, k.value, k.create_revision, \
                 k.mod_revision, k.version, k.lease FROM coord_meta m LEFT JOIN LATERAL \
                 (SELECT {KV_COLUMNS} FROM coord_kv WHERE {}) k ON true \
                 WHERE m.id = 1 ORDER BY k.key",
                condition("key", 1, 2)
            );
            let stmt = c.prepare_cached(&sql).await.map_err(before("get"))?;
            c.query(&stmt, &[&lo, &hi]).await.map_err(before("get"))?
        }
        Some(rev) => {
            let sql = format!(
                "SELECT m.revision, m.compact_revision, h.key, h.value, h.create_revision, \
                 h.revision, h.version, h.lease FROM coord_meta m LEFT JOIN LATERAL \
                 (SELECT * FROM (SELECT DISTINCT ON (key) key, deleted, value, create_revision, \
                 revision, version, lease FROM coord_history WHERE {} AND revision <= $3 \
                 ORDER BY key, revision DESC, seq DESC) v WHERE NOT v.deleted) h ON true \
                 WHERE m.id = 1 ORDER BY h.key",
                condition("key", 1, 2)
            );
            let stmt = c.prepare_cached(&sql).await.map_err(before("get"))?;
            c.query(&stmt, &[&lo, &hi, &rev.get()])
                .await
                .map_err(before("get"))?
        }
    };
    let first = rows
        .first()
        .ok_or_else(|| Error::invalid("coord's schema has no meta row"))?;
    let meta = Meta {
        revision: Revision(first.get(0)),
        compact_revision: Revision(first.get(1)),
    };
    Ok((meta, rows.iter().filter_map(|r| kv_at(r, 2)).collect()))
}

/// A read outside any write: one statement, one snapshot.
pub(crate) async fn get(c: &impl GenericClient, req: &GetRequest) -> Result<GetResponse> {
    let rev = req.revision.filter(|r| *r > 0);
    let (meta, kvs) = visible(c, &req.range, rev).await?;
    if let Some(rev) = rev {
        meta.check_read(rev)?;
    }
    Ok(select(req, kvs, meta.revision))
}

/// The meta row, locked for this transaction: from here until commit no other writer runs.
pub(crate) async fn lock_meta(c: &impl GenericClient, operation: &'static str) -> Result<Meta> {
    let stmt = c
        .prepare_cached("SELECT revision, compact_revision FROM coord_meta WHERE id = 1 FOR UPDATE")
        .await
        .map_err(before(operation))?;
    let row = c.query_one(&stmt, &[]).await.map_err(before(operation))?;
    Ok(Meta {
        revision: Revision(row.get(0)),
        compact_revision: Revision(row.get(1)),
    })
}

/// One writing transaction, after [`lock_meta`]: every write it makes shares the revision
/// after the locked one, and it is advanced (and announced) at [`finish`](Writer::finish)
/// only if something was written.
pub(crate) struct Writer<'c, C> {
    c: &'c C,
    meta: Meta,
    /// Events written so far at the pending revision; their order within it.
    seq: i32,
    operation: &'static str,
}

impl<'c, C: GenericClient> Writer<'c, C> {
    pub(crate) async fn begin(c: &'c C, operation: &'static str) -> Result<Self> {
        let meta = lock_meta(c, operation).await?;
        Ok(Writer {
            c,
            meta,
            seq: 0,
            operation,
        })
    }

    /// The revision as the transaction's own reads see it: the pending one once it wrote.
    pub(crate) fn seen(&self) -> Revision {
        if self.seq > 0 {
            self.meta.revision.next()
        } else {
            self.meta.revision
        }
    }

    pub(crate) fn meta(&self) -> Meta {
        self.meta
    }

    fn pending(&self) -> i64 {
        self.meta.revision.next().get()
    }

    fn fail(&self) -> impl Fn(tokio_postgres::Error) -> Error {
        before(self.operation)
    }

    /// A read inside the transaction (it sees the transaction's earlier writes).
    pub(crate) async fn get(&self, req: &GetRequest) -> Result<GetResponse> {
        let rev = req.revision.filter(|r| *r > 0);
        if let Some(rev) = rev {
            self.meta.check_read(rev)?;
        }
        let (_, kvs) = visible(self.c, &req.range, rev).await?;
        Ok(select(req, kvs, self.seen()))
    }

    async fn current(&self, key: &[u8]) -> Result<Option<KeyValue>> {
        let sql = format!("SELECT {KV_COLUMNS} FROM coord_kv WHERE key = $1");
        let stmt = self.c.prepare_cached(&sql).await.map_err(self.fail())?;
        let row = self
            .c
            .query_opt(&stmt, &[&key])
            .await
            .map_err(self.fail())?;
        Ok(row.and_then(|r| kv_at(&r, 0)))
    }

    /// Refuses a lease that does not exist (a lease past its deadline that no sweep has
    /// removed yet still does, as in etcd until its lessor revokes it).
    async fn check_lease(&self, lease: LeaseId) -> Result<()> {
        let stmt = self
            .c
            .prepare_cached("SELECT 1 FROM coord_lease WHERE id = $1")
            .await
            .map_err(self.fail())?;
        match self
            .c
            .query_opt(&stmt, &[&lease.0])
            .await
            .map_err(self.fail())?
        {
            Some(_) => Ok(()),
            None => Err(Error::LeaseNotFound { lease }),
        }
    }

    async fn record(&mut self, kv: &KeyValue, deleted: bool) -> Result<()> {
        let stmt = self
            .c
            .prepare_cached(
                "INSERT INTO coord_history (revision, seq, key, deleted, value, create_revision, \
                 version, lease) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            )
            .await
            .map_err(self.fail())?;
        self.c
            .execute(
                &stmt,
                &[
                    &self.pending(),
                    &self.seq,
                    &kv.key.as_ref(),
                    &deleted,
                    &kv.value.as_ref(),
                    &kv.create_revision.get(),
                    &kv.version,
                    &kv.lease.0,
                ],
            )
            .await
            .map_err(self.fail())?;
        self.seq += 1;
        Ok(())
    }

    pub(crate) async fn put(&mut self, req: &PutRequest) -> Result<PutResponse> {
        let lease = req.lease.unwrap_or(LeaseId::NONE);
        if !lease.is_none() {
            self.check_lease(lease).await?;
        }
        let prev = self.current(&req.key).await?;
        let pending = Revision(self.pending());
        let kv = KeyValue {
            key: req.key.clone(),
            value: req.value.clone(),
            create_revision: prev.as_ref().map_or(pending, |p| p.create_revision),
            mod_revision: pending,
            version: prev.as_ref().map_or(1, |p| p.version + 1),
            lease,
        };
        let stmt = self
            .c
            .prepare_cached(&format!(
                "INSERT INTO coord_kv ({KV_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6) \
                 ON CONFLICT (key) DO UPDATE SET value = $2, mod_revision = $4, version = $5, \
                 lease = $6"
            ))
            .await
            .map_err(self.fail())?;
        self.c
            .execute(
                &stmt,
                &[
                    &kv.key.as_ref(),
                    &kv.value.as_ref(),
                    &kv.create_revision.get(),
                    &kv.mod_revision.get(),
                    &kv.version,
                    &kv.lease.0,
                ],
            )
            .await
            .map_err(self.fail())?;
        self.record(&kv, false).await?;
        Ok(PutResponse::new(
            pending,
            if req.prev_kv { prev } else { None },
        ))
    }

    /// Deletes the keys of `range`, or those attached to `lease`, each with a tombstone.
    async fn delete_where(
        &mut self,
        range: Option<&KeyRange>,
        lease: LeaseId,
    ) -> Result<Vec<KeyValue>> {
        let rows = match range {
            Some(range) => {
                let (lo, hi) = bounds(range);
                let sql = format!(
                    "DELETE FROM coord_kv WHERE {} RETURNING {KV_COLUMNS}",
                    condition("key", 1, 2)
                );
                let stmt = self.c.prepare_cached(&sql).await.map_err(self.fail())?;
                self.c
                    .query(&stmt, &[&lo, &hi])
                    .await
                    .map_err(self.fail())?
            }
            None => {
                let sql = format!("DELETE FROM coord_kv WHERE lease = $1 RETURNING {KV_COLUMNS}");
                let stmt = self.c.prepare_cached(&sql).await.map_err(self.fail())?;
                self.c
                    .query(&stmt, &[&lease.0])
                    .await
                    .map_err(self.fail())?
            }
        };
        let mut deleted: Vec<KeyValue> = rows.iter().filter_map(|r| kv_at(r, 0)).collect();
        deleted.sort_by(|a, b| a.key.cmp(&b.key));
        for kv in &deleted {
            let tombstone = KeyValue {
                key: kv.key.clone(),
                value: Bytes::new(),
                create_revision: Revision::ZERO,
                mod_revision: Revision::ZERO,
                version: 0,
                lease: LeaseId::NONE,
            };
            self.record(&tombstone, true).await?;
        }
        Ok(deleted)
    }

    pub(crate) async fn delete(&mut self, req: &DeleteRequest) -> Result<DeleteResponse> {
        let deleted = self.delete_where(Some(&req.range), LeaseId::NONE).await?;
        let n = deleted.len() as u64;
        Ok(DeleteResponse::new(
            self.seen(),
            n,
            if req.prev_kv { deleted } else { Vec::new() },
        ))
    }

    /// Deletes every key attached to `lease` (its revocation or expiry).
    pub(crate) async fn delete_leased(&mut self, lease: LeaseId) -> Result<()> {
        self.delete_where(None, lease).await.map(drop)
    }

    /// etcd's compare: on a prefix every key must pass, and no key at all is judged as one
    /// missing key.
    pub(crate) async fn compare(&self, c: &Compare) -> Result<bool> {
        let range = if c.prefix {
            KeyRange::Prefix(c.key.clone())
        } else {
            KeyRange::Key(c.key.clone())
        };
        let (_, kvs) = visible(self.c, &range, None).await?;
        if kvs.is_empty() {
            return Ok(c.matches(None));
        }
        Ok(kvs.iter().all(|kv| c.matches(Some(kv))))
    }

    /// Advances the revision if anything was written, and tells watchers at commit. Returns
    /// the revision the transaction's answer reports.
    pub(crate) async fn finish(self) -> Result<Revision> {
        if self.seq == 0 {
            return Ok(self.meta.revision);
        }
        let stmt = self
            .c
            .prepare_cached(
                "WITH up AS (UPDATE coord_meta SET revision = $1 WHERE id = 1) \
                 SELECT pg_notify('coord_revision', $1::text)",
            )
            .await
            .map_err(self.fail())?;
        self.c
            .execute(&stmt, &[&self.pending()])
            .await
            .map_err(self.fail())?;
        Ok(Revision(self.pending()))
    }
}
