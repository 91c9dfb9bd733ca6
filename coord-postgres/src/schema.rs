//! The tables, created and migrated on connect, one numbered step at a time.
//!
//! * `coord_meta`: one row, the store's revision, its compaction point and the point below
//!   which history rows are gone (`compact.rs` says why the two differ). Every writing
//!   transaction locks it first, so writers take revisions one after another and commit in
//!   revision order: a reader that sees revision R sees every write up to R, with no gaps.
//! * `coord_kv`: each live key as it is now.
//! * `coord_history`: every write of every key (tombstones for deletes), by revision: reads at
//!   a past revision and watches both read it; compaction trims it.
//! * `coord_lease`: leases, with the deadline the server's own clock set.
//! * `coord_compaction`: the compactions whose rows are not yet gone, and when each was made.

use tokio_postgres::Client;

/// The migrations, in order; the schema's version is how many have run.
const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE coord_meta (
    id smallint PRIMARY KEY CHECK (id = 1),
    revision bigint NOT NULL,
    compact_revision bigint NOT NULL
);
INSERT INTO coord_meta VALUES (1, 1, 0);
CREATE TABLE coord_kv (
    key bytea PRIMARY KEY,
    value bytea NOT NULL,
    create_revision bigint NOT NULL,
    mod_revision bigint NOT NULL,
    version bigint NOT NULL,
    lease bigint NOT NULL
);
CREATE INDEX coord_kv_lease ON coord_kv (lease) WHERE lease <> 0;
CREATE TABLE coord_history (
    revision bigint NOT NULL,
    seq integer NOT NULL,
    key bytea NOT NULL,
    deleted boolean NOT NULL,
    value bytea NOT NULL,
    create_revision bigint NOT NULL,
    version bigint NOT NULL,
    lease bigint NOT NULL,
    PRIMARY KEY (revision, seq)
);
CREATE INDEX coord_history_key ON coord_history (key, revision);
CREATE TABLE coord_lease (
    id bigint PRIMARY KEY,
    ttl bigint NOT NULL,
    expires_at timestamptz NOT NULL
);
CREATE INDEX coord_lease_expiry ON coord_lease (expires_at);
"#,
    r#"
ALTER TABLE coord_meta ADD COLUMN purged_revision bigint NOT NULL DEFAULT 0;
CREATE TABLE coord_compaction (
    revision bigint PRIMARY KEY,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
"#,
    r#"
CREATE FUNCTION coord_require_lease(lease bigint) RETURNS boolean LANGUAGE plpgsql AS $f$
BEGIN
    IF lease <> 0 AND NOT EXISTS (SELECT 1 FROM coord_lease WHERE id = lease) THEN
        RAISE EXCEPTION 'lease % not found', lease USING ERRCODE = 'CL404';
    END IF;
    RETURN true;
END
$f$;
"#,
];

/// How many migrations this build knows: the schema version it writes.
pub(crate) const VERSION: usize = MIGRATIONS.len();

/// Brings the database's schema to the newest version and returns the version found (a
/// version above [`VERSION`] was written by a newer coord, and is left alone). Safe when several clients connect at
/// once: an advisory lock held for the transaction lets one migrate while the others wait.
pub(crate) async fn migrate(client: &mut Client) -> Result<usize, tokio_postgres::Error> {
    let tx = client.transaction().await?;
    // A transaction-scoped lock on a constant: released at commit, never left behind.
    tx.execute("SELECT pg_advisory_xact_lock(7263245917)", &[])
        .await?;
    tx.batch_execute("CREATE TABLE IF NOT EXISTS coord_schema (version integer NOT NULL)")
        .await?;
    let row = tx
        .query_opt("SELECT version FROM coord_schema", &[])
        .await?;
    let at = match row {
        Some(row) => row.get::<_, i32>(0) as usize,
        None => {
            tx.execute("INSERT INTO coord_schema VALUES (0)", &[])
                .await?;
            0
        }
    };
    if at >= VERSION {
        tx.commit().await?;
        return Ok(at);
    }
    for (i, step) in MIGRATIONS.iter().enumerate().skip(at) {
        tracing::info!(version = i + 1, "migrating coord's schema");
        tx.batch_execute(step).await?;
    }
    tx.execute("UPDATE coord_schema SET version = $1", &[&(VERSION as i32)])
        .await?;
    tx.commit().await?;
    Ok(at)
}
