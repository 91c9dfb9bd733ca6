//! Reads: a key or a range at the current or a past revision, as etcd serves them.

use super::*;

impl State {
    pub(super) fn check_read_revision(&self, rev: Revision) -> Result<()> {
        coord_api::validate::read_revision(rev, self.revision, self.compact_revision)
    }

    pub(super) fn versions_in<'a>(
        &'a self,
        range: &'a KeyRange,
    ) -> Box<dyn Iterator<Item = (&'a Bytes, &'a Vec<Version>)> + 'a> {
        Self::versions_of(&self.keys, range)
    }

    pub(super) fn versions_of<'a>(
        keys: &'a Keys,
        range: &'a KeyRange,
    ) -> Box<dyn Iterator<Item = (&'a Bytes, &'a Vec<Version>)> + 'a> {
        use std::ops::Bound;
        match range {
            KeyRange::Key(k) => Box::new(keys.get_key_value(k).into_iter()),
            KeyRange::Prefix(p) => {
                // The keys from the prefix up to (not including) the first key past it, as
                // etcd's range end for a prefix: no comparison of each key with the prefix.
                let end = prefix_end(p);
                let end = end.as_deref().map_or(Bound::Unbounded, Bound::Excluded);
                Box::new(keys.range(Bound::Included(p.as_ref()), end))
            }
        }
    }

    /// The live value of a key as of `rev` (the latest when `rev` is `None`).
    pub(super) fn value_at(versions: &[Version], rev: Option<Revision>) -> Option<&KeyValue> {
        let v = match rev {
            None => versions.last(),
            Some(r) => versions.iter().rev().find(|v| v.revision() <= r),
        };
        match v {
            Some(Version::Live(kv)) => Some(kv),
            _ => None,
        }
    }

    pub(super) fn current(&self, key: &[u8]) -> Option<&KeyValue> {
        self.keys.get(key).and_then(|v| Self::value_at(v, None))
    }

    pub(super) fn range(&mut self, req: &GetRequest, header: Revision) -> GetResponse {
        let rev = req.revision.filter(|r| *r > 0);
        let limit = req.limit.filter(|l| *l > 0).map(|l| l as usize);
        if let Some(answer) = self.range_in_create_order(req, rev, limit, header) {
            return answer;
        }
        let visible = self
            .versions_in(&req.range)
            .filter_map(|(_, versions)| Self::value_at(versions, rev));
        // As etcd's range: `count` is the whole range; the revision filters and the sort apply
        // to it before the limit; only the kept keys are copied.
        let mut count = 0u64;
        let mut kept: Vec<&KeyValue> = Vec::new();
        let mut matched = 0usize;
        // Stable, on key order, as etcd's sort is on the small ranges where ties can be seen
        // (its insertion sort, with the comparator reversed for descending): keys with the
        // same version or value keep key order, either way.
        let order = req.sort.and_then(|(target, order)| {
            let desc = order == SortOrder::Descend;
            let by = move |o: std::cmp::Ordering| if desc { o.reverse() } else { o };
            let cmp: fn(&KeyValue, &KeyValue) -> std::cmp::Ordering = match target {
                SortTarget::Version => |a, b| a.version.cmp(&b.version),
                SortTarget::Create => |a, b| a.create_revision.cmp(&b.create_revision),
                SortTarget::Mod => |a, b| a.mod_revision.cmp(&b.mod_revision),
                SortTarget::Value => |a, b| a.value.cmp(&b.value),
                _ => return None,
            };
            Some(move |a: &KeyValue, b: &KeyValue| by(cmp(a, b)))
        });
        // A bound of 0 is no bound, as etcd reads it.
        let bound = |b: Option<Revision>| b.filter(|r| !r.is_zero());
        let (min_create, max_create) = (
            bound(req.min_create_revision),
            bound(req.max_create_revision),
        );
        let (min_mod, max_mod) = (bound(req.min_mod_revision), bound(req.max_mod_revision));
        let keep = |kv: &KeyValue| {
            min_create.is_none_or(|r| kv.create_revision >= r)
                && max_create.is_none_or(|r| kv.create_revision <= r)
                && min_mod.is_none_or(|r| kv.mod_revision >= r)
                && max_mod.is_none_or(|r| kv.mod_revision <= r)
        };
        // With a small limit, only the best `limit` keys are kept as the range is walked (a
        // campaign asks for the one key just ahead of it in a queue of thousands): the same
        // keys, in the same order, as sorting the whole range and cutting it.
        let select = limit.filter(|l| order.is_some() && *l <= 8);
        for kv in visible {
            count += 1;
            if !keep(kv) {
                continue;
            }
            matched += 1;
            match (select, &order) {
                (Some(l), Some(cmp)) => {
                    let at = kept.partition_point(|k| cmp(k, kv) != std::cmp::Ordering::Greater);
                    if at < l {
                        kept.insert(at, kv);
                        kept.truncate(l);
                    }
                }
                _ => kept.push(kv),
            }
        }
        if select.is_none() {
            match (req.sort, &order) {
                (Some((SortTarget::Key, SortOrder::Descend)), _) => kept.reverse(),
                (_, Some(cmp)) => kept.sort_by(|a, b| cmp(a, b)),
                _ => {}
            }
        }
        let more = limit.is_some_and(|l| matched > l);
        if let Some(l) = limit {
            kept.truncate(l);
        }
        let kvs = kept.into_iter().cloned().collect();
        GetResponse::new(header, kvs).with_count(count, more)
    }

    /// A queue's read (the live keys of a prefix, sorted by create revision, a small limit,
    /// no mod-revision filter, at the current revision) from the create-order index: the
    /// same answer as walking the range, in the keys it returns. `None` for any other read.
    pub(super) fn range_in_create_order(
        &mut self,
        req: &GetRequest,
        rev: Option<Revision>,
        limit: Option<usize>,
        header: Revision,
    ) -> Option<GetResponse> {
        let bound = |b: Option<Revision>| b.filter(|r| !r.is_zero());
        let (KeyRange::Prefix(prefix), None, Some((SortTarget::Create, order)), Some(limit)) =
            (&req.range, rev, req.sort, limit)
        else {
            return None;
        };
        if limit > 8
            || bound(req.min_mod_revision).is_some()
            || bound(req.max_mod_revision).is_some()
        {
            return None;
        }
        let keys = &self.keys;
        let live = || -> Box<dyn Iterator<Item = &KeyValue>> {
            Box::new(
                Self::versions_of(keys, &req.range).filter_map(|(_, v)| Self::value_at(v, None)),
            )
        };
        if !self.created.ensure(prefix, live) {
            return None;
        }
        let answer = self.created.read(
            prefix,
            order,
            limit,
            bound(req.min_create_revision),
            bound(req.max_create_revision),
        );
        let kvs = answer
            .keys
            .iter()
            .map(|(_, key)| self.current(key).cloned().expect("an indexed key is live"))
            .collect();
        Some(GetResponse::new(header, kvs).with_count(answer.count, answer.more))
    }

    /// Reads a key or a prefix.
    pub fn get(&mut self, now: Instant, req: &GetRequest) -> Result<GetResponse> {
        self.expire(now);
        if let Some(rev) = req.revision {
            self.check_read_revision(rev)?;
        }
        let header = self.revision;
        Ok(self.range(req, header))
    }
}
