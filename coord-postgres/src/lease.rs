//! Leases on the server's clock: a deadline is `clock_timestamp() + ttl` as the database
//! sees it when the grant or renewal runs, never a client's clock, and any connected client
//! sweeps expired leases (their keys deleted in one revision, as a revocation does).

use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use coord_api::{Error, KeepAlive, LeaseGrant, LeaseId, LeaseTimeToLive, Result};
use tokio_postgres::types::Type;
use tokio_postgres::Client;

use crate::kv::{before, Writer};
use crate::store::PostgresStore;

/// Grants a lease of `ttl` (validated and rounded by the caller), its id drawn by the server.
pub(crate) async fn grant(c: &Client, ttl: Duration) -> Result<LeaseGrant> {
    let secs = ttl.as_secs() as i64;
    // Ids look like etcd's (large, positive, unordered); a clash with a live lease draws again.
    let sql = "INSERT INTO coord_lease (id, ttl, expires_at) \
             VALUES (1 + floor(random() * 4611686018427387903)::bigint, $1::bigint, \
             clock_timestamp() + $1::bigint * interval '1 second') \
             ON CONFLICT (id) DO NOTHING RETURNING id";
    loop {
        let rows = c
            .query_typed(sql, &[(&secs, Type::INT8)])
            .await
            .map_err(before("grant"))?;
        if let Some(row) = rows.first() {
            return Ok(LeaseGrant::new(LeaseId(row.get(0)), ttl));
        }
    }
}

/// Renews a lease that has not yet expired; returns its TTL.
pub(crate) async fn renew(c: &Client, lease: LeaseId) -> Result<Duration> {
    let rows = c
        .query_typed(
            "UPDATE coord_lease SET expires_at = clock_timestamp() + ttl * interval '1 second' \
             WHERE id = $1 AND expires_at > clock_timestamp() RETURNING ttl",
            &[(&lease.0, Type::INT8)],
        )
        .await
        .map_err(before("keep_alive"))?;
    match rows.first() {
        Some(row) => Ok(Duration::from_secs(row.get::<_, i64>(0) as u64)),
        None => Err(Error::LeaseNotFound { lease }),
    }
}

/// A lease's remaining time (whole seconds, rounded down, as etcd reports it) and keys.
pub(crate) async fn time_to_live(c: &Client, lease: LeaseId) -> Result<LeaseTimeToLive> {
    let rows = c
        .query_typed(
            "SELECT l.ttl, floor(extract(epoch FROM l.expires_at - clock_timestamp()))::bigint, \
             k.key FROM coord_lease l LEFT JOIN coord_kv k ON k.lease = l.id \
             WHERE l.id = $1 AND l.expires_at > clock_timestamp() ORDER BY k.key",
            &[(&lease.0, Type::INT8)],
        )
        .await
        .map_err(before("time_to_live"))?;
    let first = rows.first().ok_or(Error::LeaseNotFound { lease })?;
    let granted = Duration::from_secs(first.get::<_, i64>(0) as u64);
    let left = Duration::from_secs(first.get::<_, i64>(1).max(0) as u64).min(granted);
    let keys = rows
        .iter()
        .filter_map(|r| r.get::<_, Option<Vec<u8>>>(2))
        .map(Bytes::from)
        .collect();
    Ok(LeaseTimeToLive::new(lease, left, granted, keys))
}

/// Removes a lease and deletes its keys in one revision, inside `w`'s transaction; with
/// `only_expired`, only if its deadline has passed (a sweep racing a renewal loses). Returns
/// whether the lease was there to remove.
pub(crate) async fn remove(w: &mut Writer<'_>, lease: LeaseId, only_expired: bool) -> Result<bool> {
    let operation = if only_expired { "expire" } else { "revoke" };
    let gone = w
        .client()
        .query_typed(
            "DELETE FROM coord_lease WHERE id = $1 AND (NOT $2 OR expires_at <= clock_timestamp()) \
             RETURNING id",
            &[(&lease.0, Type::INT8), (&only_expired, Type::BOOL)],
        )
        .await
        .map_err(before(operation))?;
    if gone.is_empty() {
        return Ok(false);
    }
    w.delete_leased(lease).await?;
    Ok(true)
}

/// The leases past their deadline, oldest first, at most `limit` of them.
pub(crate) async fn expired(c: &Client, limit: i64) -> Result<Vec<LeaseId>> {
    let rows = c
        .query_typed(
            "SELECT id FROM coord_lease WHERE expires_at <= clock_timestamp() \
             ORDER BY expires_at LIMIT $1",
            &[(&limit, Type::INT8)],
        )
        .await
        .map_err(before("expire"))?;
    Ok(rows.iter().map(|r| LeaseId(r.get(0))).collect())
}

/// A keep-alive channel: each renewal is one statement on a pooled connection, so a lost
/// connection costs one renewal, never the channel.
#[derive(Debug)]
pub(crate) struct PgKeepAlive {
    pub(crate) store: PostgresStore,
    pub(crate) lease: LeaseId,
}

#[async_trait]
impl KeepAlive for PgKeepAlive {
    fn lease(&self) -> LeaseId {
        self.lease
    }

    async fn renew(&mut self) -> Result<Duration> {
        self.store.renew(self.lease).await
    }
}
