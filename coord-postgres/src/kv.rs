//! Reads and writes of keys inside one database transaction: the rules of etcd's MVCC store
//! (revisions, versions, tombstones, compare-and-swap) over `coord_kv` and `coord_history`.

use coord_api::{
    Compare, DeleteRequest, DeleteResponse, Error, GetRequest, GetResponse, KeyRange, KeyValue,
    LeaseId, PutRequest, PutResponse, Result, Revision,
};
use tokio_postgres::types::Type;
use tokio_postgres::Client;

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
        coord_api::validate::read_revision(rev, self.revision, self.compact_revision)
    }
}

/// Shorthand for a query's failure in a read or before the commit: nothing applied.
pub(crate) fn before(operation: &'static str) -> impl Fn(tokio_postgres::Error) -> Error {
    move |e| from_pg(operation, Stage::Before, e)
}

/// The live keys of `range` as of `rev` (now, when `None`), in key order, with the meta row
/// read in the same statement, so in the same snapshot.
async fn visible(
    c: &Client,
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
            c.query_typed(&sql, &[(&lo, Type::BYTEA), (&hi, Type::BYTEA)])
                .await
                .map_err(before("get"))?
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
            c.query_typed(
                &sql,
                &[
                    (&lo, Type::BYTEA),
                    (&hi, Type::BYTEA),
                    (&rev.get(), Type::INT8),
                ],
            )
            .await
            .map_err(before("get"))?
        }
    };
    let first = rows.first().ok_or_else(no_meta)?;
    let meta = Meta {
        revision: Revision(first.get(0)),
        compact_revision: Revision(first.get(1)),
    };
    Ok((meta, rows.iter().filter_map(|r| kv_at(r, 2)).collect()))
}

/// A read outside any write: one statement, one snapshot.
pub(crate) async fn get(c: &Client, req: &GetRequest) -> Result<GetResponse> {
    let rev = req.revision.filter(|r| *r > 0);
    let (meta, kvs) = visible(c, &req.range, rev).await?;
    if let Some(rev) = rev {
        meta.check_read(rev)?;
    }
    Ok(select(req, kvs, meta.revision))
}

/// The statement that locks the meta row for a writing transaction: from its answer until
/// commit no other writer runs.
const LOCK_META: &str = "SELECT revision, compact_revision FROM coord_meta WHERE id = 1 FOR UPDATE";

/// The planted bug [`PostgresRevisionFromSequence`](coord_api::hooks::planted::Bug): the pending
/// revision from a sequence, and no lock until the revision is written at commit.
const UNLOCKED_FROM_A_SEQUENCE: &str = "SELECT nextval('coord_planted_revision') - 1, \
     compact_revision FROM coord_meta WHERE id = 1";

pub(crate) fn from_a_sequence() -> bool {
    coord_api::hooks::planted::enabled(coord_api::hooks::planted::Bug::PostgresRevisionFromSequence)
}

fn meta_of(row: &tokio_postgres::Row) -> Meta {
    Meta {
        revision: Revision(row.get(0)),
        compact_revision: Revision(row.get(1)),
    }
}

/// One writing transaction on `c`, opened by [`begin`](Writer::begin): every write it makes
/// shares the revision after the locked one, which [`finish`](Writer::finish) takes (and
/// announces) only if something was written.
///
/// Round trips are the cost of a write over a slow link, so statements that do not wait on
/// each other's answers go together: `BEGIN`, the lock and the compares in one, each write in
/// one statement, and the revision's advance with `COMMIT` in one.
pub(crate) struct Writer<'c> {
    c: &'c Client,
    meta: Meta,
    /// Events written so far at the pending revision; their order within it.
    seq: i32,
    operation: &'static str,
    /// The revision committed with the last write ([`put_last`](Self::put_last)), if so.
    committed: Option<Revision>,
    /// Whether `COMMIT` has gone out (with the last write): from then on, a request that
    /// times out or loses its connection may have applied.
    commit_sent: bool,
}

impl<'c> Writer<'c> {
    /// Sends `BEGIN`, locks the meta row and evaluates `compares` against the locked state,
    /// in one round trip. Returns whether every compare held.
    ///
    /// After an error the connection is mid-transaction: the caller rolls back or drops it.
    pub(crate) async fn begin(
        c: &'c Client,
        operation: &'static str,
        compares: &[Compare],
    ) -> Result<(Self, bool)> {
        let fail = before(operation);
        let ranges: Vec<(Vec<u8>, Option<Vec<u8>>)> = compares
            .iter()
            .map(|cmp| {
                bounds(&if cmp.prefix {
                    KeyRange::Prefix(cmp.key.clone())
                } else {
                    KeyRange::Key(cmp.key.clone())
                })
            })
            .collect();
        let sql = format!(
            "SELECT {KV_COLUMNS} FROM coord_kv WHERE {} ORDER BY key",
            condition("key", 1, 2)
        );
        let reads = ranges.iter().map(|(lo, hi)| {
            let sql = &sql;
            async move {
                c.query_typed(sql, &[(lo, Type::BYTEA), (hi, Type::BYTEA)])
                    .await
            }
        });
        // Polled in order, so sent in order: the reads run after the lock is taken.
        let lock = if from_a_sequence() {
            UNLOCKED_FROM_A_SEQUENCE
        } else {
            LOCK_META
        };
        let (began, locked, read) = futures::join!(
            c.batch_execute("BEGIN"),
            c.query_typed(lock, &[]),
            futures::future::join_all(reads)
        );
        began.map_err(&fail)?;
        let meta = meta_of(locked.map_err(&fail)?.first().ok_or_else(no_meta)?);
        let mut held = true;
        for (cmp, rows) in compares.iter().zip(read) {
            let kvs: Vec<KeyValue> = rows
                .map_err(&fail)?
                .iter()
                .filter_map(|r| kv_at(r, 0))
                .collect();
            // etcd: on a prefix every key must pass, and no key at all is one missing key.
            let ok = if kvs.is_empty() {
                cmp.matches(None)
            } else {
                kvs.iter().all(|kv| cmp.matches(Some(kv)))
            };
            held &= ok;
        }
        let w = Writer {
            c,
            meta,
            seq: 0,
            operation,
            committed: None,
            commit_sent: false,
        };
        Ok((w, held))
    }

    /// Whether `COMMIT` may have been sent: a failure from here on may have applied.
    pub(crate) fn commit_sent(&self) -> bool {
        self.commit_sent
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

    pub(crate) fn client(&self) -> &'c Client {
        self.c
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

    /// Writes one key in one statement: the previous value, the new one (version and create
    /// revision carried over), its history row, and the lease's existence checked (a lease
    /// past its deadline that no sweep has removed yet still exists, as in etcd until its
    /// lessor revokes it).
    pub(crate) async fn put(&mut self, req: &PutRequest) -> Result<PutResponse> {
        self.put_then(req, false).await
    }

    /// [`put`](Self::put) as the transaction's last write, sent with the commit: one round
    /// trip for both. A lease not found fails the put inside the server, which aborts the
    /// transaction, so the commit sent behind it commits nothing.
    pub(crate) async fn put_last(&mut self, req: &PutRequest) -> Result<PutResponse> {
        self.put_then(req, true).await
    }

    async fn put_then(&mut self, req: &PutRequest, commit: bool) -> Result<PutResponse> {
        let lease = req.lease.unwrap_or(LeaseId::NONE);
        let sql = format!(
            "WITH prev AS (SELECT {KV_COLUMNS} FROM coord_kv WHERE key = $1), \
             ok AS (SELECT coord_require_lease($4) AS lease_ok), \
             up AS (INSERT INTO coord_kv AS k ({KV_COLUMNS}) \
               SELECT $1, $2, $3, $3, 1, $4 FROM ok WHERE lease_ok \
               ON CONFLICT (key) DO UPDATE SET value = $2, mod_revision = $3, \
               version = k.version + 1, lease = $4 RETURNING k.*), \
             h AS (INSERT INTO coord_history (revision, seq, key, deleted, value, \
               create_revision, version, lease) \
               SELECT $3, $5, key, false, value, create_revision, version, lease FROM up) \
             SELECT ok.lease_ok, p.key, p.value, p.create_revision, p.mod_revision, p.version, \
             p.lease FROM ok LEFT JOIN prev p ON true"
        );
        let revision = Revision(self.pending());
        let (key, value, rev) = (req.key.as_ref(), req.value.as_ref(), revision.get());
        let params: [(&(dyn tokio_postgres::types::ToSql + Sync), Type); 5] = [
            (&key, Type::BYTEA),
            (&value, Type::BYTEA),
            (&rev, Type::INT8),
            (&lease.0, Type::INT8),
            (&self.seq, Type::INT4),
        ];
        let put = self.c.query_typed(&sql, &params);
        let (put, committed) = if commit {
            let sql = self.commit_sql(revision);
            // Set before the first poll sends it: a timeout that cancels this future at any
            // point after must be reported as possibly applied.
            self.commit_sent = true;
            let (put, committed) = futures::join!(put, self.c.batch_execute(&sql));
            (put, Some(committed))
        } else {
            (put.await, None)
        };
        let rows = match put {
            Ok(rows) => rows,
            Err(e) if e.code().is_some_and(|c| c.code() == "CL404") => {
                return Err(Error::LeaseNotFound { lease });
            }
            // A commit sent behind a put whose answer was lost may have applied.
            Err(e) if committed.is_some() => return Err(self.commit_failed(e)),
            Err(e) => return Err(self.fail()(e)),
        };
        if let Some(done) = committed {
            done.map_err(|e| self.commit_failed(e))?;
            self.committed = Some(revision);
        }
        // A missing lease never gets here: `coord_require_lease` failed the statement.
        let row = rows.first().ok_or_else(no_meta)?;
        self.seq += 1;
        let prev = kv_at(row, 1);
        Ok(PutResponse::new(
            Revision(self.pending()),
            if req.prev_kv { prev } else { None },
        ))
    }

    /// Deletes the keys of `range`, or those attached to `lease`, each with a tombstone, in
    /// one statement; returns them in key order.
    async fn delete_where(
        &mut self,
        range: Option<&KeyRange>,
        lease: LeaseId,
    ) -> Result<Vec<KeyValue>> {
        let (lo, hi) = range.map(bounds).unwrap_or_default();
        let which = match range {
            Some(_) => condition("key", 1, 2),
            // The range's bounds go unread; the lease is never NONE here.
            None => "lease = $3 AND lease <> 0".to_owned(),
        };
        let sql = format!(
            "WITH gone AS (DELETE FROM coord_kv WHERE {which} RETURNING {KV_COLUMNS}), \
             h AS (INSERT INTO coord_history (revision, seq, key, deleted, value, \
               create_revision, version, lease) \
               SELECT $4, $5 + row_number() OVER (ORDER BY key) - 1, key, true, '', 0, 0, 0 \
               FROM gone) \
             SELECT {KV_COLUMNS} FROM gone ORDER BY key"
        );
        let rows = self
            .c
            .query_typed(
                &sql,
                &[
                    (&lo, Type::BYTEA),
                    (&hi, Type::BYTEA),
                    (&lease.0, Type::INT8),
                    (&self.pending(), Type::INT8),
                    (&self.seq, Type::INT4),
                ],
            )
            .await
            .map_err(self.fail())?;
        let deleted: Vec<KeyValue> = rows.iter().filter_map(|r| kv_at(r, 0)).collect();
        self.seq += deleted.len() as i32;
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

    /// Advances the revision if anything was written (telling watchers at commit) and
    /// commits, in one round trip. Returns the revision the answer reports.
    ///
    /// # Errors
    /// As for a commit: `Indeterminate` when the answer is lost.
    pub(crate) async fn commit(self) -> Result<Revision> {
        if let Some(revision) = self.committed {
            return Ok(revision);
        }
        let revision = self.seen();
        if self.seq == 0 {
            self.c
                .batch_execute("COMMIT")
                .await
                .map_err(|e| self.commit_failed(e))?;
            return Ok(revision);
        }
        let sql = self.commit_sql(revision);
        self.c
            .batch_execute(&sql)
            .await
            .map_err(|e| self.commit_failed(e))?;
        Ok(revision)
    }

    /// The statements that make `revision` the store's, tell watchers, and commit.
    fn commit_sql(&self, revision: Revision) -> String {
        // Our own integer, inlined: the simple protocol takes several statements at once.
        let advance = if from_a_sequence() {
            format!("GREATEST(revision, {})", revision.get())
        } else {
            revision.get().to_string()
        };
        format!(
            "UPDATE coord_meta SET revision = {advance} WHERE id = 1; \
             SELECT pg_notify('coord_revision', '{r}'); COMMIT",
            r = revision.get()
        )
    }

    fn commit_failed(&self, e: tokio_postgres::Error) -> Error {
        crate::error::from_pg(self.operation, crate::error::Stage::Commit, e)
    }
}

pub(crate) fn no_meta() -> Error {
    Error::invalid("coord's schema has no meta row")
}
