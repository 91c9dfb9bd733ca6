//! The live keys of a few prefixes in create order, so that the read every queue recipe
//! makes (a prefix, sorted by create revision, a small limit: "the key just ahead of mine",
//! "the oldest key") costs the keys it returns, not the queue's length.
//!
//! A prefix is indexed from the first such read of it on, and kept up to date by every
//! write after. etcd answers the same read by walking the whole range (it sorts before it
//! limits); the answer, `count` and `more` included, is the same.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;

use bytes::Bytes;
use coord_api::{KeyValue, Revision, SortOrder};

/// How many prefixes are indexed at most: each write checks every indexed prefix, so a
/// workload that reads many different prefixes in create order falls back to walking them.
const MAX_PREFIXES: usize = 64;

/// The indexed prefixes, each with its live keys by (create revision, key).
#[derive(Debug, Default)]
pub(crate) struct Created {
    prefixes: BTreeMap<Bytes, BTreeSet<(Revision, Bytes)>>,
}

/// What [`Created::read`] answers: the kept keys (in order, at most the limit), whether
/// more matched, and how many keys the prefix holds.
pub(crate) struct Answer {
    pub(crate) keys: Vec<(Revision, Bytes)>,
    pub(crate) more: bool,
    pub(crate) count: u64,
}

impl Created {
    /// Whether `prefix` is indexed, indexing it from `live` (its live keys) if there is room.
    pub(crate) fn ensure<'a>(
        &mut self,
        prefix: &Bytes,
        live: impl FnOnce() -> Box<dyn Iterator<Item = &'a KeyValue> + 'a>,
    ) -> bool {
        if self.prefixes.contains_key(prefix) {
            return true;
        }
        if self.prefixes.len() >= MAX_PREFIXES {
            return false;
        }
        let keys = live()
            .map(|kv| (kv.create_revision, kv.key.clone()))
            .collect();
        self.prefixes.insert(prefix.clone(), keys);
        true
    }

    /// A key was created.
    pub(crate) fn created(&mut self, key: &Bytes, revision: Revision) {
        for (prefix, keys) in &mut self.prefixes {
            if key.starts_with(prefix) {
                keys.insert((revision, key.clone()));
            }
        }
    }

    /// A key created at `revision` was deleted.
    pub(crate) fn deleted(&mut self, key: &Bytes, revision: Revision) {
        for (prefix, keys) in &mut self.prefixes {
            if key.starts_with(prefix) {
                keys.remove(&(revision, key.clone()));
            }
        }
    }

    /// The first `limit` (at least one) live keys of an indexed `prefix` created within
    /// `[min, max]` (`None`: unbounded), in create order, ties in key order either way (as
    /// the full range's stable sort leaves them).
    pub(crate) fn read(
        &self,
        prefix: &Bytes,
        order: SortOrder,
        limit: usize,
        min: Option<Revision>,
        max: Option<Revision>,
    ) -> Answer {
        debug_assert!(limit > 0, "a limit of 0 is no limit, read by walking");
        let keys = &self.prefixes[prefix];
        let count = keys.len() as u64;
        if min.zip(max).is_some_and(|(min, max)| min > max) {
            // Nothing is created after it was created (and a B-tree range must not be
            // reversed).
            return Answer {
                keys: Vec::new(),
                more: false,
                count,
            };
        }
        let lower = min.map_or(Bound::Unbounded, |r| Bound::Included((r, Bytes::new())));
        let upper = max.map_or(Bound::Unbounded, |r| {
            Bound::Excluded((r.next(), Bytes::new()))
        });
        let within = keys.range((lower, upper));
        let walk: Box<dyn Iterator<Item = &(Revision, Bytes)>> = match order {
            SortOrder::Ascend => Box::new(within),
            SortOrder::Descend => Box::new(within.rev()),
        };
        // Walk until one key past the limit proves there is more, having taken every key
        // that ties with the last one kept (descending, the walk meets ties in reverse key
        // order; the sort below puts them back).
        let mut kept: Vec<(Revision, Bytes)> = Vec::with_capacity(limit + 1);
        for k in walk {
            let past = kept.len() >= limit && kept.get(limit - 1).is_some_and(|l| l.0 != k.0);
            kept.push(k.clone());
            if past {
                break;
            }
        }
        let more = kept.len() > limit;
        match order {
            SortOrder::Ascend => kept.sort(),
            SortOrder::Descend => kept.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1))),
        }
        kept.truncate(limit);
        Answer {
            keys: kept,
            more,
            count,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use coord_api::{
        DeleteRequest, GetRequest, GetResponse, PutRequest, Revision, SortOrder, SortTarget,
        TxnRequest,
    };
    use proptest::prelude::*;
    use tokio::time::Instant;

    use crate::state::State;

    const KEYS: [&str; 7] = ["q/1", "q/2", "q/3", "q/a/1", "q/a/2", "q/b", "r"];
    const PREFIXES: [&str; 3] = ["q/", "q/a/", "q/b"];

    #[derive(Debug, Clone)]
    enum Op {
        /// Puts these keys in one transaction (several keys created at one revision tie).
        Put(Vec<usize>, bool),
        Delete(usize),
        DeletePrefix(usize),
        /// Revokes the lease every leased put went under (it deletes their keys).
        Revoke,
        Read {
            prefix: usize,
            desc: bool,
            limit: u64,
            min: Option<i64>,
            max: Option<i64>,
        },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (prop::collection::vec(0..KEYS.len(), 1..4), any::<bool>())
                .prop_map(|(k, leased)| Op::Put(k, leased)),
            2 => (0..KEYS.len()).prop_map(Op::Delete),
            1 => (0..PREFIXES.len()).prop_map(Op::DeletePrefix),
            1 => Just(Op::Revoke),
            4 => (0..PREFIXES.len(), any::<bool>(), 1..10u64,
                  prop::option::of(0..30i64), prop::option::of(0..30i64))
                .prop_map(|(prefix, desc, limit, min, max)| Op::Read { prefix, desc, limit, min, max }),
        ]
    }

    fn read(s: &mut State, req: &GetRequest) -> GetResponse {
        s.get(Instant::now(), req)
            .expect("a read at the latest revision")
    }

    proptest! {
        /// The index answers a queue's read exactly as walking the range does (a mod-revision
        /// filter that every key passes sends the same read down the walk).
        #[test]
        fn the_index_answers_as_the_walk_does(ops in prop::collection::vec(op(), 1..60)) {
            let mut s = State::new(1, Duration::from_secs(1));
            let mut lease = s.grant(Instant::now(), Duration::from_secs(60)).id;
            for op in ops {
                match op {
                    Op::Put(keys, leased) => {
                        let puts = keys.iter().map(|k| {
                            let p = PutRequest::new(KEYS[*k], "v");
                            if leased { p.with_lease(lease) } else { p }
                        });
                        s.txn(Instant::now(), &TxnRequest::new().and_then(puts)).unwrap();
                    }
                    Op::Delete(k) => {
                        s.delete(Instant::now(), &DeleteRequest::key(KEYS[k])).unwrap();
                    }
                    Op::DeletePrefix(p) => {
                        s.delete(Instant::now(), &DeleteRequest::prefix(PREFIXES[p])).unwrap();
                    }
                    Op::Revoke => {
                        s.revoke(Instant::now(), lease).unwrap();
                        lease = s.grant(Instant::now(), Duration::from_secs(60)).id;
                    }
                    Op::Read { prefix, desc, limit, min, max } => {
                        let order = if desc { SortOrder::Descend } else { SortOrder::Ascend };
                        let mut req = GetRequest::prefix(PREFIXES[prefix])
                            .with_sort(SortTarget::Create, order)
                            .with_limit(limit);
                        if let Some(r) = min {
                            req = req.with_min_create_revision(Revision(r));
                        }
                        if let Some(r) = max {
                            req = req.with_max_create_revision(Revision(r));
                        }
                        let walked = read(&mut s, &req.clone().with_min_mod_revision(Revision(1)));
                        prop_assert_eq!(read(&mut s, &req), walked);
                    }
                }
            }
        }
    }
}
