//! The values a store hands back: key-values with their revisions, leases, watch events.

use std::fmt;
use std::time::Duration;

use bytes::Bytes;

/// A lease's identifier, as the store assigned it. Displayed in lowercase hex, the way etcd
/// and its election keys (`name/<lease hex>`) write it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct LeaseId(pub i64);

impl LeaseId {
    /// "No lease": the id a key carries when it is not attached to one.
    pub const NONE: LeaseId = LeaseId(0);

    /// True for [`LeaseId::NONE`].
    pub fn is_none(self) -> bool {
        self.0 == 0
    }
}

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:x}", self.0)
    }
}

/// A revision of the store: its one counter, which every write transaction advances by one.
/// A key carries the revision that created it and the one that last changed it; a
/// leadership's fencing token is its key's create revision. Displayed as the number.
///
/// ```
/// use coord_api::Revision;
/// let r = Revision(41);
/// assert_eq!(r.next(), Revision(42));
/// assert!(Revision::ZERO < r);
/// assert_eq!(r.to_string(), "41");
/// assert!(r > 40 && r == 41);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Revision(pub i64);

impl Revision {
    /// "No revision": what a missing key's create and mod revisions compare equal to, and
    /// what a watch from "now" starts at.
    pub const ZERO: Revision = Revision(0);

    /// The revision after this one.
    pub fn next(self) -> Revision {
        Revision(self.0 + 1)
    }

    /// The revision before this one.
    pub fn prev(self) -> Revision {
        Revision(self.0 - 1)
    }

    /// The number.
    pub fn get(self) -> i64 {
        self.0
    }

    /// True for [`Revision::ZERO`].
    pub fn is_zero(self) -> bool {
        self.0 == 0
    }
}

impl fmt::Display for Revision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl From<i64> for Revision {
    fn from(r: i64) -> Self {
        Revision(r)
    }
}

impl From<Revision> for i64 {
    fn from(r: Revision) -> Self {
        r.0
    }
}

impl PartialEq<i64> for Revision {
    fn eq(&self, other: &i64) -> bool {
        self.0 == *other
    }
}

impl PartialOrd<i64> for Revision {
    fn partial_cmp(&self, other: &i64) -> Option<std::cmp::Ordering> {
        Some(self.0.cmp(other))
    }
}

impl std::ops::Add<i64> for Revision {
    type Output = Revision;
    fn add(self, n: i64) -> Revision {
        Revision(self.0 + n)
    }
}

impl std::ops::Sub<i64> for Revision {
    type Output = Revision;
    fn sub(self, n: i64) -> Revision {
        Revision(self.0 - n)
    }
}

/// One key as stored, with etcd's per-key metadata.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KeyValue {
    /// The key.
    pub key: Bytes,
    /// The value (empty in a delete event).
    pub value: Bytes,
    /// The revision of the write that created this incarnation of the key.
    pub create_revision: Revision,
    /// The revision of the last write to the key (for a delete event: the delete's revision).
    pub mod_revision: Revision,
    /// Writes to this incarnation of the key, starting at 1; 0 in a delete event.
    pub version: i64,
    /// The lease the key is attached to, or [`LeaseId::NONE`].
    pub lease: LeaseId,
}

impl KeyValue {
    /// The key as UTF-8, lossily (for logs and examples).
    pub fn key_str(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(&self.key)
    }

    /// The value as UTF-8, lossily (for logs and examples).
    pub fn value_str(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(&self.value)
    }
}

/// Which keys a get, delete or watch applies to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum KeyRange {
    /// Exactly this key.
    Key(Bytes),
    /// Every key that starts with these bytes.
    Prefix(Bytes),
}

impl KeyRange {
    /// The key, or the prefix, this range starts at.
    pub fn start(&self) -> &Bytes {
        match self {
            KeyRange::Key(k) | KeyRange::Prefix(k) => k,
        }
    }

    /// True when `key` falls in this range.
    pub fn contains(&self, key: &[u8]) -> bool {
        match self {
            KeyRange::Key(k) => k.as_ref() == key,
            KeyRange::Prefix(p) => key.starts_with(p),
        }
    }

    /// The exclusive end of the range in etcd's encoding: empty for a single key, the prefix
    /// with its last byte below 0xff incremented for a prefix, and `"\0"` (every key from
    /// the start on) for a prefix made only of 0xff bytes.
    pub fn etcd_range_end(&self) -> Vec<u8> {
        match self {
            KeyRange::Key(_) => Vec::new(),
            KeyRange::Prefix(p) => prefix_end(p),
        }
    }
}

/// etcd's `GetPrefixRangeEnd`.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// What happened to a key in a watch event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// The key was created or overwritten.
    Put,
    /// The key was deleted (explicitly, or with its lease).
    Delete,
}

/// One change to one key, as a watch delivers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Put or delete.
    pub kind: EventKind,
    /// The key after the change. For a delete: the key, an empty value, `mod_revision` set to
    /// the delete's revision and every other field zero, as etcd sends it.
    pub kv: KeyValue,
    /// The key before the change, when the watch asked for previous values and there was one.
    pub prev_kv: Option<KeyValue>,
}

/// What a backend accepts and how its time behaves; the conformance suite and the recipes
/// read these instead of assuming etcd's defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Limits {
    /// The smallest TTL the store grants; shorter requests are raised to it (etcd: 1.5 x the
    /// election timeout, rounded up to a second; 2 s by default).
    pub min_lease_ttl: Duration,
    /// The largest TTL the store accepts (etcd: 9,000,000,000 s).
    pub max_lease_ttl: Duration,
    /// The largest request the store accepts, key and value together (etcd: 1.5 MiB).
    pub max_request_bytes: usize,
    /// How late after its TTL a lease may be expired (etcd checks every 500 ms).
    pub expiry_granularity: Duration,
    /// How often a watch that asked for progress notifications gets one while idle.
    pub progress_notify_interval: Duration,
}

impl Limits {
    /// etcd 3.4's defaults.
    pub const ETCD_DEFAULTS: Limits = Limits {
        min_lease_ttl: Duration::from_secs(2),
        max_lease_ttl: Duration::from_secs(9_000_000_000),
        max_request_bytes: 1536 * 1024,
        expiry_granularity: Duration::from_millis(500),
        progress_notify_interval: Duration::from_secs(600),
    };
}

impl Default for Limits {
    fn default() -> Self {
        Limits::ETCD_DEFAULTS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_increments_the_last_byte_below_0xff() {
        assert_eq!(prefix_end(b"a/"), b"a0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
    }

    #[test]
    fn lease_ids_display_as_hex_like_etcd_election_keys() {
        assert_eq!(LeaseId(0x694d_7a3b).to_string(), "694d7a3b");
    }

    #[test]
    fn a_prefix_range_contains_exactly_the_keys_with_the_prefix() {
        let r = KeyRange::Prefix(Bytes::from_static(b"h/"));
        assert!(r.contains(b"h/"));
        assert!(r.contains(b"h/x"));
        assert!(!r.contains(b"h0"));
        assert!(!r.contains(b"h"));
    }
}
