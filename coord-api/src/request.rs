//! Requests to a [`KvLeaseStore`](crate::KvLeaseStore) and their responses.
//!
//! Requests are plain structs with public fields and `with_*` builders, so a backend can read
//! them field by field and a caller can write them in one expression:
//!
//! ```
//! use coord_api::{GetRequest, PutRequest, LeaseId};
//! let put = PutRequest::new("hosts/a", "10.0.0.1").with_lease(LeaseId(7)).with_prev_kv();
//! let get = GetRequest::prefix("hosts/").with_limit(10);
//! # let _ = (put, get);
//! ```

use std::time::Duration;

use bytes::Bytes;

use crate::into_bytes::IntoBytes;
use crate::types::{Event, KeyRange, KeyValue, LeaseId, Revision};

/// Read one key or a prefix, at the latest or a past revision.
///
/// Beyond the range and the revision, as etcd's range request: keep only keys created or
/// modified within bounds, sort by a field, and return at most `limit` keys. Filters and
/// sorting apply before the limit; `count` counts the whole range, before filtering (as etcd
/// reports it).
///
/// ```
/// use coord_api::{GetRequest, Revision, SortOrder, SortTarget};
/// // The newest key of an election's queue created before revision 42: who waits just
/// // ahead of the candidate created at 42.
/// let ahead = GetRequest::prefix("jobs/")
///     .with_max_create_revision(Revision(41))
///     .with_sort(SortTarget::Create, SortOrder::Descend)
///     .with_limit(1);
/// # let _ = ahead;
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct GetRequest {
    /// The keys to read.
    pub range: KeyRange,
    /// Read at this revision instead of the latest; it must not be compacted or in the future.
    pub revision: Option<Revision>,
    /// Return at most this many keys (after filtering and sorting); `count` still counts them
    /// all.
    pub limit: Option<u64>,
    /// Sort by this field in this order; `None` is key order.
    pub sort: Option<(SortTarget, SortOrder)>,
    /// Keep only keys created at or after this revision.
    pub min_create_revision: Option<Revision>,
    /// Keep only keys created at or before this revision.
    pub max_create_revision: Option<Revision>,
    /// Keep only keys last modified at or after this revision.
    pub min_mod_revision: Option<Revision>,
    /// Keep only keys last modified at or before this revision.
    pub max_mod_revision: Option<Revision>,
}

/// The field a [`GetRequest`] sorts by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SortTarget {
    /// The key.
    Key,
    /// The key's version (how many times it was written since it was created). Keys with
    /// the same version come in no specified order.
    Version,
    /// The create revision.
    Create,
    /// The last modification's revision.
    Mod,
    /// The value, as bytes. Keys with the same value come in no specified order.
    Value,
}

/// The order a [`GetRequest`] sorts in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SortOrder {
    /// Smallest first.
    Ascend,
    /// Largest first.
    Descend,
}

impl GetRequest {
    /// Read one key.
    pub fn key(key: impl IntoBytes) -> Self {
        Self::range(KeyRange::Key(key.into_bytes()))
    }

    /// Read every key with this prefix.
    pub fn prefix(prefix: impl IntoBytes) -> Self {
        Self::range(KeyRange::Prefix(prefix.into_bytes()))
    }

    /// Read a [`KeyRange`].
    pub fn range(range: KeyRange) -> Self {
        GetRequest {
            range,
            revision: None,
            limit: None,
            sort: None,
            min_create_revision: None,
            max_create_revision: None,
            min_mod_revision: None,
            max_mod_revision: None,
        }
    }

    /// Read at a past revision.
    pub fn with_revision(mut self, revision: impl Into<Revision>) -> Self {
        self.revision = Some(revision.into());
        self
    }

    /// Return at most `limit` keys.
    pub fn with_limit(mut self, limit: u64) -> Self {
        self.limit = Some(limit);
        self
    }

    /// Sort by `target` in `order`.
    pub fn with_sort(mut self, target: SortTarget, order: SortOrder) -> Self {
        self.sort = Some((target, order));
        self
    }

    /// Keep only keys created at or after `revision`.
    pub fn with_min_create_revision(mut self, revision: impl Into<Revision>) -> Self {
        self.min_create_revision = Some(revision.into());
        self
    }

    /// Keep only keys created at or before `revision`.
    pub fn with_max_create_revision(mut self, revision: impl Into<Revision>) -> Self {
        self.max_create_revision = Some(revision.into());
        self
    }

    /// Keep only keys last modified at or after `revision`.
    pub fn with_min_mod_revision(mut self, revision: impl Into<Revision>) -> Self {
        self.min_mod_revision = Some(revision.into());
        self
    }

    /// Keep only keys last modified at or before `revision`.
    pub fn with_max_mod_revision(mut self, revision: impl Into<Revision>) -> Self {
        self.max_mod_revision = Some(revision.into());
        self
    }

    /// Whether the request filters or sorts (so the whole range is read before the limit).
    pub fn filters_or_sorts(&self) -> bool {
        self.sort.is_some()
            || self.min_create_revision.is_some()
            || self.max_create_revision.is_some()
            || self.min_mod_revision.is_some()
            || self.max_mod_revision.is_some()
    }
}

/// What a get returns.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct GetResponse {
    /// The store's revision when it served the read (the latest, even for a read at a past
    /// revision, as etcd reports it).
    pub revision: Revision,
    /// The keys found, in key order (or the requested sort), at most `limit` of them.
    pub kvs: Vec<KeyValue>,
    /// How many keys the range holds, regardless of `limit` and of the revision filters.
    pub count: u64,
    /// True when `limit` cut the (filtered) result short.
    pub more: bool,
}

impl GetResponse {
    /// A response at `revision` with `kvs`, the whole range (`count` is their number).
    pub fn new(revision: Revision, kvs: Vec<KeyValue>) -> Self {
        GetResponse {
            revision,
            count: kvs.len() as u64,
            kvs,
            more: false,
        }
    }

    /// The range holds `count` keys in all; `more` when `limit` cut the result short.
    pub fn with_count(mut self, count: u64, more: bool) -> Self {
        self.count = count;
        self.more = more;
        self
    }
}

/// Write one key.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PutRequest {
    /// The key; must not be empty.
    pub key: Bytes,
    /// The value; may be empty.
    pub value: Bytes,
    /// Attach the key to this lease: it is deleted when the lease ends. `None` detaches it.
    pub lease: Option<LeaseId>,
    /// Return the key as it was before this write.
    pub prev_kv: bool,
}

impl PutRequest {
    /// Write `value` at `key`.
    pub fn new(key: impl IntoBytes, value: impl IntoBytes) -> Self {
        PutRequest {
            key: key.into_bytes(),
            value: value.into_bytes(),
            lease: None,
            prev_kv: false,
        }
    }

    /// Attach the key to a lease.
    pub fn with_lease(mut self, lease: LeaseId) -> Self {
        self.lease = Some(lease);
        self
    }

    /// Return the previous value.
    pub fn with_prev_kv(mut self) -> Self {
        self.prev_kv = true;
        self
    }
}

/// What a put returns.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct PutResponse {
    /// The revision of this write.
    pub revision: Revision,
    /// The key before the write, if asked for and it existed.
    pub prev_kv: Option<KeyValue>,
}

impl PutResponse {
    /// A write at `revision`, with the key as it was before (if asked for).
    pub fn new(revision: Revision, prev_kv: Option<KeyValue>) -> Self {
        PutResponse { revision, prev_kv }
    }
}

/// Delete one key or a prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeleteRequest {
    /// The keys to delete.
    pub range: KeyRange,
    /// Return the deleted keys.
    pub prev_kv: bool,
}

impl DeleteRequest {
    /// Delete one key.
    pub fn key(key: impl IntoBytes) -> Self {
        Self::range(KeyRange::Key(key.into_bytes()))
    }

    /// Delete every key with this prefix.
    pub fn prefix(prefix: impl IntoBytes) -> Self {
        Self::range(KeyRange::Prefix(prefix.into_bytes()))
    }

    /// Delete a [`KeyRange`].
    pub fn range(range: KeyRange) -> Self {
        DeleteRequest {
            range,
            prev_kv: false,
        }
    }

    /// Return the deleted keys.
    pub fn with_prev_kv(mut self) -> Self {
        self.prev_kv = true;
        self
    }
}

/// What a delete returns.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct DeleteResponse {
    /// The revision of this delete; the unchanged current revision when nothing was deleted.
    pub revision: Revision,
    /// How many keys were deleted.
    pub deleted: u64,
    /// The deleted keys, if asked for.
    pub prev_kvs: Vec<KeyValue>,
}

impl DeleteResponse {
    /// A delete at `revision` of `deleted` keys, with their previous values (if asked for).
    pub fn new(revision: Revision, deleted: u64, prev_kvs: Vec<KeyValue>) -> Self {
        DeleteResponse {
            revision,
            deleted,
            prev_kvs,
        }
    }
}

/// A lease as granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseGrant {
    /// The lease's id.
    pub id: LeaseId,
    /// The TTL the store granted: the request rounded up to whole seconds, raised to the
    /// store's minimum.
    pub ttl: Duration,
}

impl LeaseGrant {
    /// Lease `id`, granted with `ttl`.
    pub fn new(id: LeaseId, ttl: Duration) -> Self {
        LeaseGrant { id, ttl }
    }
}

/// A live lease's remaining time.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseTimeToLive {
    /// The lease.
    pub id: LeaseId,
    /// Time left before it expires, in whole seconds rounded down (as etcd reports it).
    pub ttl: Duration,
    /// The TTL it was granted with.
    pub granted_ttl: Duration,
    /// The keys attached to it, in key order.
    pub keys: Vec<Bytes>,
}

impl LeaseTimeToLive {
    /// Lease `id` with `ttl` left of `granted_ttl`, and the keys attached to it.
    pub fn new(id: LeaseId, ttl: Duration, granted_ttl: Duration, keys: Vec<Bytes>) -> Self {
        LeaseTimeToLive {
            id,
            ttl,
            granted_ttl,
            keys,
        }
    }
}

/// Watch one key or a prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct WatchRequest {
    /// The keys to watch.
    pub range: KeyRange,
    /// The first revision to deliver. `None` starts after the current revision. A revision
    /// older than the compaction point ends the stream with [`Error::Compacted`](crate::Error::Compacted).
    pub start_revision: Option<Revision>,
    /// Attach each event's previous value.
    pub prev_kv: bool,
    /// Send an empty [`WatchResponse`] (a progress notification) when the watch has been idle
    /// for the store's progress interval.
    pub progress_notify: bool,
}

impl WatchRequest {
    /// Watch one key.
    pub fn key(key: impl IntoBytes) -> Self {
        Self::range(KeyRange::Key(key.into_bytes()))
    }

    /// Watch every key with this prefix.
    pub fn prefix(prefix: impl IntoBytes) -> Self {
        Self::range(KeyRange::Prefix(prefix.into_bytes()))
    }

    /// Watch a [`KeyRange`].
    pub fn range(range: KeyRange) -> Self {
        WatchRequest {
            range,
            start_revision: None,
            prev_kv: false,
            progress_notify: false,
        }
    }

    /// Start at this revision (inclusive).
    pub fn with_start_revision(mut self, revision: impl Into<Revision>) -> Self {
        self.start_revision = Some(revision.into());
        self
    }

    /// Attach previous values.
    pub fn with_prev_kv(mut self) -> Self {
        self.prev_kv = true;
        self
    }

    /// Ask for progress notifications.
    pub fn with_progress_notify(mut self) -> Self {
        self.progress_notify = true;
        self
    }
}

/// One batch from a watch: the events of one or more whole revisions, in revision order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct WatchResponse {
    /// The store's revision when the batch was sent. For a progress notification: every event
    /// up to this revision has been delivered. For a progress answer: nothing more than the
    /// store's revision (see [`is_progress_answer`](Self::is_progress_answer)).
    pub revision: Revision,
    /// The events; empty for a progress notification or answer.
    pub events: Vec<Event>,
    /// Whether this answers [`WatchStream::request_progress`](crate::WatchStream::request_progress).
    pub progress_answer: bool,
}

impl WatchResponse {
    /// A batch sent at `revision` with `events` (none: a progress notification).
    pub fn new(revision: Revision, events: Vec<Event>) -> Self {
        WatchResponse {
            revision,
            events,
            progress_answer: false,
        }
    }

    /// The answer to a progress request, sent when the store was at `revision`.
    pub fn progress_answer(revision: Revision) -> Self {
        WatchResponse {
            revision,
            events: Vec::new(),
            progress_answer: true,
        }
    }

    /// True for a progress notification: no events, and every event up to `revision` has
    /// been delivered.
    pub fn is_progress_notify(&self) -> bool {
        self.events.is_empty() && !self.progress_answer
    }

    /// True for the answer to a progress request: the stream is alive and the store was at
    /// `revision`, but events up to it may still follow (etcd 3.4 sends the answer ahead of
    /// events already queued for the watch).
    pub fn is_progress_answer(&self) -> bool {
        self.progress_answer
    }
}
