//! Input checks every backend runs before sending, so that bad input gets the same typed
//! [`Error::InvalidArgument`] from every backend and never reaches the store.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::request::{DeleteRequest, GetRequest, PutRequest, WatchRequest};
use crate::txn::{TxnOp, TxnRequest};
use crate::types::Revision;
use crate::types::{KeyRange, Limits};

fn key(what: &str, key: &[u8]) -> Result<()> {
    if key.is_empty() {
        return Err(Error::invalid(format!("{what}: empty key")));
    }
    Ok(())
}

fn range(what: &str, range: &KeyRange) -> Result<()> {
    match range {
        KeyRange::Key(k) => key(what, k),
        KeyRange::Prefix(p) if p.is_empty() => Err(Error::invalid(format!(
            "{what}: empty prefix (a prefix must name at least one byte)"
        ))),
        KeyRange::Prefix(_) => Ok(()),
    }
}

fn revision(what: &str, rev: Option<Revision>) -> Result<()> {
    match rev {
        Some(r) if r.get() < 0 => Err(Error::invalid(format!("{what}: negative revision {r}"))),
        _ => Ok(()),
    }
}

fn size(what: &str, bytes: usize, limits: &Limits) -> Result<()> {
    if bytes > limits.max_request_bytes {
        return Err(Error::invalid(format!(
            "{what}: request of {bytes} bytes exceeds the store's limit of {} bytes",
            limits.max_request_bytes
        )));
    }
    Ok(())
}

/// Checks a get.
pub fn get(req: &GetRequest) -> Result<()> {
    range("get", &req.range)?;
    revision("get", req.revision)
}

/// Checks a put, including its size against the store's request limit.
pub fn put(req: &PutRequest, limits: &Limits) -> Result<()> {
    key("put", &req.key)?;
    size("put", req.key.len() + req.value.len(), limits)
}

/// Checks a delete.
pub fn delete(req: &DeleteRequest) -> Result<()> {
    range("delete", &req.range)
}

/// Checks a watch.
pub fn watch(req: &WatchRequest) -> Result<()> {
    range("watch", &req.range)?;
    revision("watch", req.start_revision)
}

/// Checks a transaction: every op and compare, the total size, and that no branch writes the
/// same key twice (etcd refuses that as "duplicate key given in txn request").
pub fn txn(req: &TxnRequest, limits: &Limits) -> Result<()> {
    let mut bytes = 0;
    for c in &req.compares {
        key("txn compare", &c.key)?;
        if c.prefix && c.key.is_empty() {
            return Err(Error::invalid("txn compare: empty prefix"));
        }
        bytes += c.key.len();
    }
    for branch in [&req.success, &req.failure] {
        let mut puts: Vec<&[u8]> = Vec::new();
        let mut deletes: Vec<&KeyRange> = Vec::new();
        for op in branch {
            match op {
                TxnOp::Get(g) => {
                    get(g)?;
                    bytes += g.range.start().len();
                }
                TxnOp::Put(p) => {
                    key("txn put", &p.key)?;
                    bytes += p.key.len() + p.value.len();
                    puts.push(&p.key);
                }
                TxnOp::Delete(d) => {
                    delete(d)?;
                    bytes += d.range.start().len();
                    deletes.push(&d.range);
                }
            }
        }
        for (i, k) in puts.iter().enumerate() {
            let twice = puts[..i].contains(k) || deletes.iter().any(|d| d.contains(k));
            if twice {
                return Err(Error::invalid(format!(
                    "txn: key {:?} is written twice in one branch",
                    String::from_utf8_lossy(k)
                )));
            }
        }
    }
    size("txn", bytes, limits)
}

/// Checks a lease TTL: not zero, not beyond the store's maximum.
pub fn ttl(ttl: Duration, limits: &Limits) -> Result<()> {
    if ttl.is_zero() {
        return Err(Error::invalid("grant: TTL must be positive, got 0"));
    }
    if ttl > limits.max_lease_ttl {
        return Err(Error::invalid(format!(
            "grant: TTL of {} s exceeds the store's maximum of {} s",
            ttl.as_secs(),
            limits.max_lease_ttl.as_secs()
        )));
    }
    Ok(())
}

/// The TTL a store grants for a request: whole seconds rounded up, at least the minimum.
/// Call after [`ttl`].
pub fn granted_ttl(requested: Duration, limits: &Limits) -> Duration {
    let secs = requested.as_secs() + u64::from(requested.subsec_nanos() > 0);
    Duration::from_secs(secs).max(limits.min_lease_ttl)
}

/// Checks an election name: not empty, and not ending in `/` (candidate keys are
/// `name/<lease hex>`, so a trailing slash would put them under a different prefix than
/// other clients of the same election use).
pub fn election_name(name: &str) -> Result<()> {
    if name.is_empty() {
        return Err(Error::invalid("election: empty name"));
    }
    if name.ends_with('/') {
        return Err(Error::invalid(format!(
            "election: name {name:?} must not end with '/'"
        )));
    }
    Ok(())
}

/// Checks a read at revision `requested` against a store at `current` whose history starts at
/// `compact_revision` (for backends, with their own state's figures; 0 reads the latest).
///
/// # Errors
/// [`Compacted`](Error::Compacted) below the compaction point;
/// [`FutureRevision`](Error::FutureRevision) above the current revision.
pub fn read_revision(
    requested: Revision,
    current: Revision,
    compact_revision: Revision,
) -> Result<()> {
    if requested > 0 && requested < compact_revision {
        return Err(Error::Compacted {
            requested,
            compact_revision,
        });
    }
    if requested > current {
        return Err(Error::FutureRevision { requested, current });
    }
    Ok(())
}

/// Checks a compaction at `requested` against a store at `current` already compacted at
/// `compact_revision`.
///
/// # Errors
/// [`Compacted`](Error::Compacted) at or below the compaction point;
/// [`FutureRevision`](Error::FutureRevision) above the current revision.
pub fn compaction(
    requested: Revision,
    current: Revision,
    compact_revision: Revision,
) -> Result<()> {
    if requested <= compact_revision {
        return Err(Error::Compacted {
            requested,
            compact_revision,
        });
    }
    if requested > current {
        return Err(Error::FutureRevision { requested, current });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::DeleteRequest;

    #[test]
    fn ttl_rounds_up_to_seconds_and_respects_the_minimum() {
        let l = Limits::ETCD_DEFAULTS;
        assert_eq!(
            granted_ttl(Duration::from_millis(1), &l),
            Duration::from_secs(2)
        );
        assert_eq!(
            granted_ttl(Duration::from_millis(4100), &l),
            Duration::from_secs(5)
        );
        assert_eq!(
            granted_ttl(Duration::from_secs(7), &l),
            Duration::from_secs(7)
        );
    }

    #[test]
    fn a_branch_may_not_put_a_key_it_also_deletes() {
        let l = Limits::ETCD_DEFAULTS;
        let t = TxnRequest::new().and_then([
            TxnOp::Delete(DeleteRequest::prefix("a/")),
            TxnOp::Put(PutRequest::new("a/x", "1")),
        ]);
        assert!(matches!(txn(&t, &l), Err(Error::InvalidArgument { .. })));
        let ok = TxnRequest::new()
            .and_then([PutRequest::new("a", "1")])
            .or_else([PutRequest::new("a", "2")]);
        assert!(txn(&ok, &l).is_ok());
    }

    #[test]
    fn names_that_would_split_the_queue_are_refused() {
        assert!(election_name("").is_err());
        assert!(election_name("jobs/").is_err());
        assert!(election_name("jobs/leader").is_ok());
    }
}
