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

mod leases;
mod reads;
mod watches;

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
}

/// The first key after every key that starts with `prefix` (etcd's range end for a prefix),
/// `None` when no key is (the prefix is empty or all 0xff): the range then runs to the end.
fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let last = prefix.iter().rposition(|b| *b < 0xff)?;
    let mut end = prefix[..=last].to_vec();
    end[last] += 1;
    Some(end)
}
