//! Every key's history (MVCC versions), found by key for the point look-ups that writes,
//! compares and single-key reads make, and in key order for range reads.
//!
//! The keys of a coordination workload share long prefixes (`elections/e0/…`, `hosts/…`), and
//! a search of an ordered map compares the key with a dozen others on its way down, each a
//! `memcmp` through a pointer to a line of its own. A hash of the key finds it with one
//! comparison; the ordered set of keys beside it serves ranges. The hash is fixed (no random
//! seed), and nothing iterates the hash map: order comes from the set alone, so nothing
//! observable depends on hash order.

use std::collections::hash_map::Entry;
use std::collections::{BTreeSet, HashMap};
use std::ops::Bound;

use bytes::Bytes;
use coord_api::{KeyValue, Revision};

/// One version of a key in its history.
#[derive(Debug, Clone)]
pub(crate) enum Version {
    Live(KeyValue),
    /// Deleted at this revision.
    Tombstone(Revision),
}

impl Version {
    pub(crate) fn revision(&self) -> Revision {
        match self {
            Version::Live(kv) => kv.mod_revision,
            Version::Tombstone(rev) => *rev,
        }
    }
}

/// Every key with a history (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Keys {
    versions: HashMap<Bytes, Vec<Version>, foldhash::fast::FixedState>,
    order: BTreeSet<Bytes>,
}

impl Keys {
    pub(crate) fn get(&self, key: &[u8]) -> Option<&Vec<Version>> {
        self.versions.get(key)
    }

    pub(crate) fn get_key_value(&self, key: &[u8]) -> Option<(&Bytes, &Vec<Version>)> {
        self.versions.get_key_value(key)
    }

    pub(crate) fn get_mut(&mut self, key: &[u8]) -> Option<&mut Vec<Version>> {
        self.versions.get_mut(key)
    }

    /// The key's history, empty and in place if it had none.
    pub(crate) fn history(&mut self, key: &Bytes) -> &mut Vec<Version> {
        match self.versions.entry(key.clone()) {
            Entry::Occupied(o) => o.into_mut(),
            Entry::Vacant(v) => {
                self.order.insert(key.clone());
                v.insert(Vec::new())
            }
        }
    }

    /// The keys from `start` to `end`, in key order, with their histories.
    pub(crate) fn range<'a>(
        &'a self,
        start: Bound<&[u8]>,
        end: Bound<&[u8]>,
    ) -> impl Iterator<Item = (&'a Bytes, &'a Vec<Version>)> + 'a {
        self.order
            .range::<[u8], _>((start, end))
            .map(|k| (k, &self.versions[k]))
    }

    /// Keeps the histories `keep` says to (it may trim them), in key order.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&mut Vec<Version>) -> bool) {
        let versions = &mut self.versions;
        self.order.retain(|k| {
            let history = versions
                .get_mut(k)
                .expect("every ordered key has a history");
            let kept = keep(history);
            if !kept {
                versions.remove(k);
            }
            kept
        });
    }
}
