//! The store itself: a pure, synchronous state machine with etcd 3.4's semantics.
//!
//! Nothing here awaits, spawns, or reads a clock: every operation takes `now` from its caller
//! and returns its result, and watch deliveries are queued in an outbox that the front
//! (in-process [`SimStore`](crate::SimStore), or a gRPC server later) drains while it still
//! holds the lock, so deliveries keep commit order. Every collection that is iterated is
//! ordered; the two hash maps (the keys' histories by key, the single-key watchers by key)
//! serve look-ups only, under a fixed hash, so nothing observable depends on hash order.
//!
//! The model, with etcd's behaviour as the reference:
//! * The store starts at revision 1, as a fresh etcd does. A write transaction that changes
//!   something advances the revision by one; everything else leaves it alone.
//! * Each key keeps its versions (MVCC) until compaction; a read at a past revision takes, for
//!   each key, the last version at or before it.
//! * Each revision's events are kept until compaction, for watches that start in the past.
//!   Such a watch catches up asynchronously, as in etcd: its history arrives at the next
//!   sync (etcd: every 100 ms), and a compaction that overtakes it ends it with `Compacted`.
//! * A lease's keys are deleted in one revision when it is revoked or expires; leases expire
//!   one at a time, each in its own revision, oldest deadline first.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use bytes::Bytes;
use coord_api::{
    Compare, DeleteRequest, DeleteResponse, Error, Event, EventKind, GetRequest, GetResponse,
    KeyRange, KeyValue, LeaseGrant, LeaseId, LeaseTimeToLive, PutRequest, PutResponse, Result,
    Revision, SortOrder, SortTarget, TxnOp, TxnOpResponse, TxnRequest, TxnResponse, WatchRequest,
    WatchResponse,
};
use tokio::time::Instant;

use crate::created::Created;
use crate::deadlines::Deadlines;
use crate::journal::{Entry, Origin};
use crate::versions::{Keys, Version};

#[derive(Debug, Clone)]
struct Lease {
    ttl: Duration,
    deadline: Instant,
    keys: BTreeSet<Bytes>,
}

#[derive(Debug, Clone)]
struct Watcher {
    range: KeyRange,
    prev_kv: bool,
    /// The first revision this watcher has not been sent yet.
    next_revision: Revision,
    /// False while it still has history to catch up on. Like etcd's unsynced watchers, it
    /// gets no live events until [`State::sync_watchers`] has sent it its history, and a
    /// compaction past its next revision before then ends it with `Compacted`.
    synced: bool,
}

/// An identifier for a registered watch, unique within one [`State`].
pub type WatchId = u64;

/// A batch (or the terminal error) for one watch, queued by a write.
#[derive(Debug)]
pub struct Delivery {
    /// The watch it is for.
    pub watch: WatchId,
    /// What to deliver. An `Err` ends the watch.
    pub item: Result<WatchResponse>,
}

/// The state machine. See the module docs.
#[derive(Debug)]
pub struct State {
    revision: Revision,
    compact_revision: Revision,
    keys: Keys,
    /// The live keys of the prefixes read in create order (queues), by create revision.
    created: Created,
    log: BTreeMap<Revision, Vec<Event>>,
    /// Looked up by id (each renewal, each stale deadline dropped), never iterated but in
    /// id order by [`promote`](Self::promote).
    leases: HashMap<LeaseId, Lease, foldhash::fast::FixedState>,
    deadlines: Deadlines,
    lease_rng: u64,
    watchers: BTreeMap<WatchId, Watcher>,
    /// The watchers of single keys, by key (looked up, never iterated), and of prefixes: a
    /// commit looks up only the watchers its keys concern (thousands of watches are open in a
    /// large simulation).
    key_watchers: HashMap<Bytes, BTreeSet<WatchId>, foldhash::fast::FixedState>,
    prefix_watchers: BTreeMap<WatchId, Bytes>,
    /// The watchers still catching up on history.
    unsynced: BTreeSet<WatchId>,
    next_watch: WatchId,
    outbox: Vec<Delivery>,
    /// [`commit`](Self::commit)'s list of the watches a commit concerns, kept empty between.
    concerned: Vec<WatchId>,
    min_ttl: Duration,
    compaction_drops_deletes_at_point: bool,
    /// Who the operation being applied is for.
    origin: Origin,
    /// Every change, when journaling is on (see [`State::set_journaling`]).
    journal: Option<Vec<Entry>>,
}

/// A write transaction in progress: the revision it will commit at, and its events.
struct Pending {
    revision: Revision,
    events: Vec<Event>,
}

impl State {
    /// An empty store at revision 1. Lease ids are drawn from `seed`; `min_ttl` is the
    /// shortest TTL granted.
    pub fn new(seed: u64, min_ttl: Duration) -> Self {
        State {
            revision: Revision(1),
            compact_revision: Revision::ZERO,
            keys: Keys::default(),
            created: Created::default(),
            log: BTreeMap::new(),
            leases: HashMap::default(),
            deadlines: Deadlines::default(),
            lease_rng: seed,
            watchers: BTreeMap::new(),
            key_watchers: HashMap::default(),
            prefix_watchers: BTreeMap::new(),
            unsynced: BTreeSet::new(),
            next_watch: 0,
            outbox: Vec::new(),
            concerned: Vec::new(),
            min_ttl,
            compaction_drops_deletes_at_point: true,
            origin: Origin::Store,
            journal: None,
        }
    }

    /// Starts (or stops) keeping a journal of every change; see [`take_journal`](Self::take_journal).
    pub fn set_journaling(&mut self, on: bool) {
        self.journal = on.then(Vec::new);
    }

    /// Says who the next operations are for, for the journal.
    pub fn set_origin(&mut self, origin: Origin) {
        self.origin = origin;
    }

    /// Takes the journal entries made since the last call (none when journaling is off).
    pub fn take_journal(&mut self) -> Vec<Entry> {
        self.journal
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Swaps the journal for `empty`: the entries made since the last call, in a vector the
    /// caller hands back next time, so that journaling a thousand renewals a second does not
    /// allocate for each.
    pub(crate) fn swap_journal(&mut self, empty: Vec<Entry>) -> Vec<Entry> {
        match &mut self.journal {
            Some(journal) => std::mem::replace(journal, empty),
            None => empty,
        }
    }

    fn record(&mut self, entry: impl FnOnce() -> Entry) {
        if let Some(journal) = &mut self.journal {
            journal.push(entry());
        }
    }

    /// Whether compaction loses the delete events at the compaction revision, as etcd 3.4
    /// does (etcd#19179). On by default, to match etcd 3.4.
    pub fn set_compaction_drops_deletes_at_point(&mut self, on: bool) {
        self.compaction_drops_deletes_at_point = on;
    }

    /// The current revision.
    pub fn revision(&self) -> Revision {
        self.revision
    }

    /// The compaction point (0 before any compaction).
    pub fn compact_revision(&self) -> Revision {
        self.compact_revision
    }

    /// Takes the deliveries queued since the last call, in commit order.
    pub fn take_outbox(&mut self) -> Vec<Delivery> {
        std::mem::take(&mut self.outbox)
    }

    /// Swaps the outbox for `empty`, as [`swap_journal`](Self::swap_journal) does the journal.
    pub(crate) fn swap_outbox(&mut self, empty: Vec<Delivery>) -> Vec<Delivery> {
        std::mem::replace(&mut self.outbox, empty)
    }

    /// The earliest lease deadline, if any lease lives.
    pub fn next_deadline(&mut self) -> Option<Instant> {
        let leases = &self.leases;
        self.deadlines
            .next(|id| leases.get(&id).map(|lease| lease.deadline))
    }

    /// The earliest lease deadline, and its lease.
    fn first_deadline(&mut self) -> Option<(Instant, LeaseId)> {
        let leases = &self.leases;
        self.deadlines
            .first(|id| leases.get(&id).map(|lease| lease.deadline))
    }

    // ---- reads -------------------------------------------------------------------------

    fn check_read_revision(&self, rev: Revision) -> Result<()> {
        coord_api::validate::read_revision(rev, self.revision, self.compact_revision)
    }

    fn versions_in<'a>(
        &'a self,
        range: &'a KeyRange,
    ) -> Box<dyn Iterator<Item = (&'a Bytes, &'a Vec<Version>)> + 'a> {
        Self::versions_of(&self.keys, range)
    }

    fn versions_of<'a>(
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
    fn value_at(versions: &[Version], rev: Option<Revision>) -> Option<&KeyValue> {
        let v = match rev {
            None => versions.last(),
            Some(r) => versions.iter().rev().find(|v| v.revision() <= r),
        };
        match v {
            Some(Version::Live(kv)) => Some(kv),
            _ => None,
        }
    }

    fn current(&self, key: &[u8]) -> Option<&KeyValue> {
        self.keys.get(key).and_then(|v| Self::value_at(v, None))
    }

    fn range(&mut self, req: &GetRequest, header: Revision) -> GetResponse {
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
    fn range_in_create_order(
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

    // ---- writes ------------------------------------------------------------------------

    fn begin(&self) -> Pending {
        Pending {
            revision: self.revision + 1,
            events: Vec::new(),
        }
    }

    /// The revision a response inside the transaction reports: the pending one once the
    /// transaction has written something.
    fn seen_revision(&self, p: &Pending) -> Revision {
        if p.events.is_empty() {
            self.revision
        } else {
            p.revision
        }
    }

    fn apply_put(&mut self, p: &mut Pending, req: &PutRequest) -> PutResponse {
        let lease = req.lease.unwrap_or(LeaseId::NONE);
        // One look-up of the key's history, for reading it and for writing it.
        let versions = self.keys.history(&req.key);
        let prev = Self::value_at(versions, None).cloned();
        let kv = KeyValue {
            key: req.key.clone(),
            value: req.value.clone(),
            create_revision: prev.as_ref().map_or(p.revision, |kv| kv.create_revision),
            mod_revision: p.revision,
            version: prev.as_ref().map_or(1, |kv| kv.version + 1),
            lease,
        };
        versions.push(Version::Live(kv.clone()));
        let old_lease = prev.as_ref().map_or(LeaseId::NONE, |kv| kv.lease);
        // A key rewritten under its lease (a metadata update) stays in that lease's set.
        if old_lease != lease {
            if let Some(l) = self.leases.get_mut(&old_lease) {
                l.keys.remove(&req.key);
            }
            if let Some(l) = self.leases.get_mut(&lease) {
                l.keys.insert(req.key.clone());
            }
        }
        if prev.is_none() {
            self.created.created(&req.key, p.revision);
        }
        p.events.push(Event {
            kind: EventKind::Put,
            kv,
            prev_kv: prev.clone(),
        });
        PutResponse::new(p.revision, if req.prev_kv { prev } else { None })
    }

    fn delete_key(&mut self, p: &mut Pending, key: &Bytes) -> Option<KeyValue> {
        let prev = self.current(key).cloned()?;
        if let Some(l) = self.leases.get_mut(&prev.lease) {
            l.keys.remove(key);
        }
        self.created.deleted(key, prev.create_revision);
        self.keys
            .get_mut(key)
            .expect("a live key has a history")
            .push(Version::Tombstone(p.revision));
        p.events.push(Event {
            kind: EventKind::Delete,
            kv: KeyValue {
                key: key.clone(),
                mod_revision: p.revision,
                ..KeyValue::default()
            },
            prev_kv: Some(prev.clone()),
        });
        Some(prev)
    }

    fn apply_delete(&mut self, p: &mut Pending, req: &DeleteRequest) -> DeleteResponse {
        let live: Vec<Bytes> = self
            .versions_in(&req.range)
            .filter(|(_, v)| Self::value_at(v, None).is_some())
            .map(|(k, _)| k.clone())
            .collect();
        let mut prev_kvs = Vec::new();
        for key in &live {
            if let Some(prev) = self.delete_key(p, key) {
                prev_kvs.push(prev);
            }
        }
        DeleteResponse::new(
            self.seen_revision(p),
            live.len() as u64,
            if req.prev_kv { prev_kvs } else { Vec::new() },
        )
    }

    /// Commits a pending write: advances the revision, logs the events, queues deliveries.
    fn commit(&mut self, p: Pending) {
        if p.events.is_empty() {
            return;
        }
        debug_assert_eq!(p.revision, self.revision + 1);
        self.revision = p.revision;
        // The watches concerned, in id order, each once: a buffer kept from commit to commit
        // (a set built per commit was a tree's nodes allocated and freed each time).
        let mut ids = std::mem::take(&mut self.concerned);
        for e in &p.events {
            if let Some(watching) = self.key_watchers.get(&e.kv.key) {
                ids.extend(watching);
            }
        }
        for (id, prefix) in &self.prefix_watchers {
            if p.events.iter().any(|e| e.kv.key.starts_with(prefix)) {
                ids.push(*id);
            }
        }
        ids.sort_unstable();
        ids.dedup();
        let compact_revision = self.compact_revision;
        for &id in &ids {
            let w = self.watchers.get_mut(&id).expect("listed");
            if !w.synced || w.next_revision > p.revision {
                continue;
            }
            let events = Self::matching(w, &p.events, compact_revision);
            w.next_revision = p.revision + 1;
            if !events.is_empty() {
                self.outbox.push(Delivery {
                    watch: id,
                    item: Ok(WatchResponse::new(p.revision, events)),
                });
            }
        }
        ids.clear();
        self.concerned = ids;
        let origin = self.origin;
        self.record(|| Entry::Commit {
            revision: p.revision,
            origin,
            events: p.events.clone(),
        });
        self.log.insert(p.revision, p.events);
    }

    /// The events of `events` that `w` watches, as it should receive them.
    ///
    /// etcd looks a previous value up at `mod_revision - 1` when it sends the event; when
    /// that revision is compacted the lookup fails and the event goes out without it. A
    /// watch catching up on old history can therefore get events without `prev_kv`.
    fn matching(w: &Watcher, events: &[Event], compact_revision: Revision) -> Vec<Event> {
        events
            .iter()
            .filter(|e| w.range.contains(&e.kv.key))
            // Field by field: a whole clone copied the previous value a second time, or only
            // to drop it.
            .map(|e| Event {
                kind: e.kind,
                kv: e.kv.clone(),
                prev_kv: if w.prev_kv && e.kv.mod_revision > compact_revision {
                    e.prev_kv.clone()
                } else {
                    None
                },
            })
            .collect()
    }

    fn check_lease(&self, lease: Option<LeaseId>) -> Result<()> {
        match lease {
            Some(l) if !l.is_none() && !self.leases.contains_key(&l) => {
                Err(Error::LeaseNotFound { lease: l })
            }
            _ => Ok(()),
        }
    }

    /// Writes one key.
    pub fn put(&mut self, now: Instant, req: &PutRequest) -> Result<PutResponse> {
        self.expire(now);
        self.check_lease(req.lease)?;
        let mut p = self.begin();
        let resp = self.apply_put(&mut p, req);
        self.commit(p);
        Ok(resp)
    }

    /// Deletes a key or a prefix.
    pub fn delete(&mut self, now: Instant, req: &DeleteRequest) -> Result<DeleteResponse> {
        self.expire(now);
        let mut p = self.begin();
        let resp = self.apply_delete(&mut p, req);
        self.commit(p);
        Ok(resp)
    }

    fn compare(&self, c: &Compare) -> bool {
        if !c.prefix {
            return c.matches(self.current(&c.key));
        }
        // etcd's applyCompare over a range: every key must pass; no key at all is judged as
        // one missing key.
        let range = KeyRange::Prefix(c.key.clone());
        let mut live = self
            .versions_in(&range)
            .filter_map(|(_, v)| Self::value_at(v, None))
            .peekable();
        if live.peek().is_none() {
            return c.matches(None);
        }
        if coord_api::hooks::planted::enabled(
            coord_api::hooks::planted::Bug::SimPrefixCompareChecksLastKey,
        ) {
            return live.last().is_some_and(|kv| c.matches(Some(kv)));
        }
        live.all(|kv| c.matches(Some(kv)))
    }

    /// Runs a transaction.
    pub fn txn(&mut self, now: Instant, req: &TxnRequest) -> Result<TxnResponse> {
        self.expire(now);
        let succeeded = req.compares.iter().all(|c| self.compare(c));
        let branch = if succeeded {
            &req.success
        } else {
            &req.failure
        };
        // Check everything that can fail before applying anything, as etcd does, so a
        // failing transaction leaves no trace.
        for op in branch {
            match op {
                TxnOp::Put(put) => self.check_lease(put.lease)?,
                TxnOp::Get(get) => {
                    if let Some(rev) = get.revision {
                        self.check_read_revision(rev)?;
                    }
                }
                TxnOp::Delete(_) => {}
            }
        }
        let mut p = self.begin();
        let mut responses = Vec::with_capacity(branch.len());
        for op in branch {
            responses.push(match op {
                TxnOp::Get(get) => {
                    let header = self.seen_revision(&p);
                    TxnOpResponse::Get(self.range(get, header))
                }
                TxnOp::Put(put) => TxnOpResponse::Put(self.apply_put(&mut p, put)),
                TxnOp::Delete(del) => TxnOpResponse::Delete(self.apply_delete(&mut p, del)),
            });
        }
        let revision = self.seen_revision(&p);
        self.commit(p);
        Ok(TxnResponse::new(revision, succeeded, responses))
    }

    // ---- leases ------------------------------------------------------------------------

    fn next_lease_id(&mut self) -> LeaseId {
        loop {
            // splitmix64: ids look like etcd's (large, positive, unordered) yet follow from the seed.
            self.lease_rng = self.lease_rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.lease_rng;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            let id = LeaseId((z >> 2) as i64);
            if !id.is_none() && !self.leases.contains_key(&id) {
                return id;
            }
        }
    }

    /// Grants a lease of `ttl` (already validated and rounded by the caller).
    pub fn grant(&mut self, now: Instant, ttl: Duration) -> LeaseGrant {
        self.expire(now);
        let ttl = ttl.max(self.min_ttl);
        let id = self.next_lease_id();
        let deadline = now + ttl;
        self.leases.insert(
            id,
            Lease {
                ttl,
                deadline,
                keys: BTreeSet::new(),
            },
        );
        self.deadlines.set(deadline, id);
        let origin = self.origin;
        self.record(|| Entry::Grant {
            lease: id,
            ttl,
            origin,
        });
        LeaseGrant::new(id, ttl)
    }

    fn remove_lease(&mut self, id: LeaseId) -> Option<Revision> {
        let lease = self.leases.remove(&id)?;
        self.deadlines.forget(id);
        let origin = self.origin;
        self.record(|| Entry::LeaseEnd { lease: id, origin });
        let mut p = self.begin();
        for key in &lease.keys {
            self.delete_key(&mut p, key);
        }
        self.commit(p);
        Some(self.revision)
    }

    /// Revokes a lease; returns the revision after its keys were deleted.
    pub fn revoke(&mut self, now: Instant, id: LeaseId) -> Result<Revision> {
        self.expire(now);
        self.remove_lease(id)
            .ok_or(Error::LeaseNotFound { lease: id })
    }

    /// Renews a lease to its full TTL.
    pub fn renew(&mut self, now: Instant, id: LeaseId) -> Result<Duration> {
        self.expire(now);
        let lease = self
            .leases
            .get_mut(&id)
            .ok_or(Error::LeaseNotFound { lease: id })?;
        lease.deadline = now + lease.ttl;
        self.deadlines.set(lease.deadline, id);
        let ttl = lease.ttl;
        let origin = self.origin;
        self.record(|| Entry::Renew { lease: id, origin });
        Ok(ttl)
    }

    /// A lease's deadline, for tests that check when a renewal applied.
    #[cfg(test)]
    pub(crate) fn lease_deadline(&self, id: LeaseId) -> Option<Instant> {
        self.leases.get(&id).map(|lease| lease.deadline)
    }

    /// Reports a lease's remaining time, in whole seconds rounded down, as etcd does.
    pub fn time_to_live(&mut self, now: Instant, id: LeaseId) -> Result<LeaseTimeToLive> {
        self.expire(now);
        let lease = self
            .leases
            .get(&id)
            .ok_or(Error::LeaseNotFound { lease: id })?;
        let remaining = lease.deadline.saturating_duration_since(now);
        Ok(LeaseTimeToLive::new(
            id,
            Duration::from_secs(remaining.as_secs()),
            lease.ttl,
            lease.keys.iter().cloned().collect(),
        ))
    }

    /// An etcd leader change as the leases see it: the new leader's lessor refreshes every
    /// lease to `now + extend + TTL` (etcd's `Promote`), so leases outlive their TTL. Leases
    /// past their deadline are refreshed too, not expired: after a restart, etcd's recovered
    /// leases all get a fresh TTL, whatever the downtime. (For a leader change without
    /// downtime, call [`expire`](Self::expire) first, as the old leader would have.)
    pub fn promote(&mut self, now: Instant, extend: Duration) {
        let mut ids: Vec<LeaseId> = self.leases.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            let lease = self.leases.get_mut(&id).expect("listed");
            lease.deadline = now + extend + lease.ttl;
            self.deadlines.set(lease.deadline, id);
        }
        self.record(|| Entry::Promote { extend });
    }

    /// Expires every lease whose deadline is at or before `now`, oldest first, each in its
    /// own revision.
    pub fn expire(&mut self, now: Instant) {
        let origin = std::mem::replace(&mut self.origin, Origin::Expiry);
        // When first, then which: a tie is put in lease order only when it expires.
        while self.next_deadline().is_some_and(|deadline| deadline <= now) {
            let (_, id) = self.first_deadline().expect("a deadline in force");
            self.remove_lease(id);
        }
        self.origin = origin;
    }

    // ---- watches and compaction --------------------------------------------------------

    /// Registers a watch. A start revision in the past makes it unsynced: its history is sent
    /// by the next [`sync_watchers`](State::sync_watchers). A compacted start revision queues
    /// `Compacted` and registers nothing.
    pub fn watch(&mut self, now: Instant, req: &WatchRequest) -> WatchId {
        self.expire(now);
        let id = self.next_watch;
        self.next_watch += 1;
        let start = match req.start_revision {
            Some(r) if r > 0 => r,
            _ => self.revision + 1,
        };
        if start < self.compact_revision {
            self.outbox.push(Delivery {
                watch: id,
                item: Err(Error::Compacted {
                    requested: start,
                    compact_revision: self.compact_revision,
                }),
            });
            return id;
        }
        // A watch with history to replay starts unsynced, as in etcd: its history comes with
        // the next sync, and a compaction before then ends it.
        let w = Watcher {
            range: req.range.clone(),
            prev_kv: req.prev_kv,
            next_revision: start,
            synced: start > self.revision,
        };
        self.add_watcher(id, w);
        id
    }

    fn add_watcher(&mut self, id: WatchId, w: Watcher) {
        match &w.range {
            KeyRange::Key(k) => {
                self.key_watchers.entry(k.clone()).or_default().insert(id);
            }
            KeyRange::Prefix(p) => {
                self.prefix_watchers.insert(id, p.clone());
            }
        }
        if !w.synced {
            self.unsynced.insert(id);
        }
        self.watchers.insert(id, w);
    }

    fn remove_watcher(&mut self, id: WatchId) {
        let Some(w) = self.watchers.remove(&id) else {
            return;
        };
        if let KeyRange::Key(k) = &w.range {
            if let Some(set) = self.key_watchers.get_mut(k) {
                set.remove(&id);
                if set.is_empty() {
                    self.key_watchers.remove(k);
                }
            }
        }
        self.prefix_watchers.remove(&id);
        self.unsynced.remove(&id);
    }

    /// True while some watch still has history to catch up on.
    pub fn has_unsynced_watchers(&self) -> bool {
        !self.unsynced.is_empty()
    }

    /// Sends every unsynced watch its history, in one batch, or `Compacted` if a compaction
    /// overtook it; etcd does this from a loop every 100 ms (`syncWatchersLoop`).
    pub fn sync_watchers(&mut self, now: Instant) {
        self.expire(now);
        let ids: Vec<WatchId> = self.unsynced.iter().copied().collect();
        for id in ids {
            let w = &self.watchers[&id];
            if w.next_revision < self.compact_revision {
                self.outbox.push(Delivery {
                    watch: id,
                    item: Err(Error::Compacted {
                        requested: w.next_revision,
                        compact_revision: self.compact_revision,
                    }),
                });
                self.remove_watcher(id);
                continue;
            }
            let events: Vec<Event> = match &w.range {
                // The revisions that changed one key are in its history: a watch on it (a
                // recipe's follow, thousands at once in a large simulation) catches up in the
                // time of the key's changes, not of every write since it started.
                KeyRange::Key(k) => self
                    .changed_since(k, w.next_revision)
                    .filter_map(|rev| self.log.get(&rev))
                    .flat_map(|events| Self::matching(w, events, self.compact_revision))
                    .collect(),
                KeyRange::Prefix(_) => self
                    .log
                    .range(w.next_revision..)
                    .flat_map(|(_, events)| Self::matching(w, events, self.compact_revision))
                    .collect(),
            };
            if !events.is_empty() {
                self.outbox.push(Delivery {
                    watch: id,
                    item: Ok(WatchResponse::new(self.revision, events)),
                });
            }
            let w = self.watchers.get_mut(&id).expect("listed");
            w.next_revision = self.revision + 1;
            w.synced = true;
            self.unsynced.remove(&id);
        }
    }

    /// The revisions from `from` on at which `key` changed, in order. The key's history holds
    /// every change after the compaction point; a delete at the point itself is gone from it
    /// but may still be in the log (when compaction keeps it there), so the point is looked
    /// at too.
    fn changed_since(&self, key: &Bytes, from: Revision) -> impl Iterator<Item = Revision> + '_ {
        let at_point = (from <= self.compact_revision).then_some(self.compact_revision);
        let later = self
            .keys
            .get(key)
            .into_iter()
            .flatten()
            .map(Version::revision)
            .filter(move |r| *r >= from && Some(*r) != at_point);
        at_point.into_iter().chain(later)
    }

    /// Forgets a watch.
    pub fn cancel_watch(&mut self, id: WatchId) {
        self.remove_watcher(id);
    }

    /// Discards history before `rev`.
    pub fn compact(&mut self, now: Instant, rev: Revision) -> Result<()> {
        self.expire(now);
        coord_api::validate::compaction(rev, self.revision, self.compact_revision)?;
        self.compact_revision = rev;
        self.record(|| Entry::Compact { revision: rev });
        self.keys.retain(|versions| {
            // Keep the version current at `rev` (unless it is a deletion) and all after it.
            let keep_from = versions.iter().rposition(|v| v.revision() <= rev);
            if let Some(i) = keep_from {
                let first_kept = if matches!(versions[i], Version::Tombstone(_)) {
                    i + 1
                } else {
                    i
                };
                versions.drain(..first_kept);
            }
            !versions.is_empty()
        });
        self.log = self.log.split_off(&rev);
        if self.compaction_drops_deletes_at_point {
            // etcd 3.4 (etcd#19179, fixed in later releases): compaction removes a tombstone
            // at the compaction revision itself, so a watch from that revision replays its
            // puts but not its deletes.
            if let Some(events) = self.log.get_mut(&rev) {
                events.retain(|e| e.kind != EventKind::Delete);
            }
        }
        Ok(())
    }
}

/// The first key after every key that starts with `prefix` (etcd's range end for a prefix),
/// `None` when no key is (the prefix is empty or all 0xff): the range then runs to the end.
fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let last = prefix.iter().rposition(|b| *b < 0xff)?;
    let mut end = prefix[..=last].to_vec();
    end[last] += 1;
    Some(end)
}
