//! The truth of a run, rebuilt from the store's journal: which keys existed when, who granted
//! each lease, when each lease ended, who wrote and deleted what, and each election's leader.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use coord_api::{Event, EventKind, LeaseId, Revision};
use coord_sim::journal::{Entry, Origin};

use crate::history::{Happening, History, Incarnation};
use crate::keys::HOSTS;

/// A key as it stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Live {
    pub lease: LeaseId,
    pub create_revision: Revision,
    pub value: String,
}

/// A delete of a key, with its cause.
#[derive(Debug, Clone)]
pub(crate) struct Deletion {
    pub at: Duration,
    pub revision: Revision,
    pub key: String,
    pub lease: LeaseId,
    pub create_revision: Revision,
    pub origin: Origin,
}

/// A host appearing or disappearing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Transition {
    pub revision: Revision,
    pub up: bool,
}

/// An election's leader (its oldest key), from some instant on.
#[derive(Debug, Clone)]
pub(crate) struct LeaderSpan {
    pub from: Duration,
    /// The revision that made it leader.
    pub revision: Revision,
    pub token: Option<Revision>,
}

/// A semaphore's queue (its keys' create revisions, oldest first), from some instant on.
#[derive(Debug, Clone)]
pub(crate) struct QueueSpan {
    pub from: Duration,
    /// The revision that made it so.
    pub revision: Revision,
    pub keys: Vec<Revision>,
}

/// One committed write transaction.
#[derive(Debug, Clone)]
pub struct Commit {
    /// When.
    pub at: Duration,
    /// Its revision.
    pub revision: Revision,
    /// Who made it.
    pub origin: Origin,
    /// What changed.
    pub events: Vec<Event>,
}

/// A set of hosts with their metadata, summarised: how many, and the sum of each pair's hash.
/// Updated per change and compared at once, so a view is checked against the store in
/// constant time however many hosts there are; only a mismatch is worth a full comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Fingerprint {
    len: usize,
    sum: u64,
}

impl Fingerprint {
    fn pair(host: &str, metadata: &str) -> u64 {
        // FNV-1a over host, a separator, metadata; then a finaliser so sums spread.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in host.bytes().chain([0xff]).chain(metadata.bytes()) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^ (h >> 33)
    }

    /// `host` joins with `metadata`.
    pub(crate) fn add(&mut self, host: &str, metadata: &str) {
        self.len += 1;
        self.sum = self.sum.wrapping_add(Self::pair(host, metadata));
    }

    /// `host`, which had `metadata`, leaves.
    pub(crate) fn remove(&mut self, host: &str, metadata: &str) {
        self.len -= 1;
        self.sum = self.sum.wrapping_sub(Self::pair(host, metadata));
    }
}

/// Everything the checkers ask of the truth.
#[derive(Debug, Default)]
pub(crate) struct Truth {
    /// The hosts' fingerprint after each revision that changed them.
    hosts_at: BTreeMap<Revision, Fingerprint>,
    /// Per host, its transitions in revision order.
    pub transitions: BTreeMap<String, Vec<Transition>>,
    pub deletions: Vec<Deletion>,
    /// Per election, its leader over time.
    pub leaders: BTreeMap<String, Vec<LeaderSpan>>,
    /// Per semaphore, its queue over time.
    pub queues: BTreeMap<String, Vec<QueueSpan>>,
    /// Every commit, in order.
    pub commits: Vec<Commit>,
    /// Who granted each lease (the client id), and when.
    pub grants: BTreeMap<LeaseId, (u64, Duration)>,
    /// When each lease ended.
    pub lease_ends: BTreeMap<LeaseId, Duration>,
    /// Leases that ended by expiring at the store (not revoked).
    pub expired: BTreeSet<LeaseId>,
    /// When each lease was last renewed.
    pub renewals: BTreeMap<LeaseId, Vec<Duration>>,
    /// When the store refreshed every lease (leader change, restart), with the extension.
    pub promotes: Vec<(Duration, Duration)>,
    /// The key space at the end of the run.
    pub final_keys: BTreeMap<String, Live>,
    /// Client id to incarnation.
    pub clients: BTreeMap<u64, Incarnation>,
    /// The time each revision was committed.
    pub revision_at: BTreeMap<Revision, Duration>,
    /// Live keys over time, for "which keys did this lease hold at t".
    pub key_spans: Vec<KeySpan>,
}

/// A key's life under one lease.
#[derive(Debug, Clone)]
pub(crate) struct KeySpan {
    pub key: String,
    pub lease: LeaseId,
    pub create_revision: Revision,
    pub from: Duration,
    pub until: Option<Duration>,
}

/// The election a key belongs to: its name is the key up to the last `/`.
fn election_of(key: &str) -> Option<&str> {
    key.rsplit_once('/').map(|(name, _)| name)
}

impl Truth {
    pub(crate) fn build(history: &History) -> Truth {
        let mut t = Truth::default();
        let elections: BTreeSet<String> = history
            .records
            .iter()
            .filter_map(|r| match &r.what {
                Happening::LeaderStart { election, .. } => Some(election.clone()),
                _ => None,
            })
            .collect();
        let semaphores: BTreeSet<String> = history
            .records
            .iter()
            .filter_map(|r| match &r.what {
                Happening::PermitStart { semaphore, .. } => Some(semaphore.clone()),
                _ => None,
            })
            .collect();
        let mut keys: BTreeMap<String, Live> = BTreeMap::new();
        let mut open_spans: BTreeMap<String, usize> = BTreeMap::new();
        let mut hosts = Fingerprint::default();
        t.hosts_at.insert(Revision::ZERO, hosts);
        for r in &history.records {
            match &r.what {
                Happening::Started { who, client } => {
                    t.clients.insert(*client, *who);
                }
                Happening::Store(Entry::Grant { lease, origin, .. }) => {
                    let client = match origin {
                        Origin::Client(c) => *c,
                        _ => u64::MAX,
                    };
                    t.grants.insert(*lease, (client, r.at));
                }
                Happening::Store(Entry::LeaseEnd { lease, origin }) => {
                    t.lease_ends.insert(*lease, r.at);
                    if *origin == Origin::Expiry {
                        t.expired.insert(*lease);
                    }
                }
                Happening::Store(Entry::Renew { lease, .. }) => {
                    t.renewals.entry(*lease).or_default().push(r.at);
                }
                Happening::Store(Entry::Promote { extend }) => t.promotes.push((r.at, *extend)),
                Happening::Store(Entry::Commit {
                    revision,
                    origin,
                    events,
                }) => {
                    t.revision_at.insert(*revision, r.at);
                    t.commits.push(Commit {
                        at: r.at,
                        revision: *revision,
                        origin: *origin,
                        events: events.clone(),
                    });
                    let mut hosts_changed = false;
                    let mut touched: BTreeSet<&str> = BTreeSet::new();
                    for e in events {
                        let key = String::from_utf8_lossy(&e.kv.key).into_owned();
                        if let Some(name) = election_of(&key)
                            .and_then(|n| elections.get(n).or_else(|| semaphores.get(n)))
                        {
                            touched.insert(name.as_str());
                        }
                        let before = keys.get(&key).cloned();
                        match e.kind {
                            EventKind::Put => {
                                let live = Live {
                                    lease: e.kv.lease,
                                    create_revision: e.kv.create_revision,
                                    value: String::from_utf8_lossy(&e.kv.value).into_owned(),
                                };
                                if before.as_ref().map(|b| b.lease) != Some(e.kv.lease) {
                                    if let Some(i) = open_spans.remove(&key) {
                                        t.key_spans[i].until = Some(r.at);
                                    }
                                    open_spans.insert(key.clone(), t.key_spans.len());
                                    t.key_spans.push(KeySpan {
                                        key: key.clone(),
                                        lease: e.kv.lease,
                                        create_revision: e.kv.create_revision,
                                        from: r.at,
                                        until: None,
                                    });
                                }
                                let changed =
                                    before.as_ref().map(|b| &b.value) != Some(&live.value);
                                if let Some(host) = key.strip_prefix(HOSTS) {
                                    if let Some(b) = before.as_ref().filter(|_| changed) {
                                        hosts.remove(host, &b.value);
                                    }
                                    if before.is_none() || changed {
                                        hosts.add(host, &live.value);
                                    }
                                }
                                keys.insert(key.clone(), live);
                                if before.is_none() {
                                    hosts_changed |= t.host_transition(&key, *revision, true);
                                } else if changed {
                                    hosts_changed |= key.starts_with(HOSTS);
                                }
                            }
                            EventKind::Delete => {
                                let Some(prev) = keys.remove(&key) else {
                                    continue;
                                };
                                if let Some(host) = key.strip_prefix(HOSTS) {
                                    hosts.remove(host, &prev.value);
                                }
                                if let Some(i) = open_spans.remove(&key) {
                                    t.key_spans[i].until = Some(r.at);
                                }
                                t.deletions.push(Deletion {
                                    at: r.at,
                                    revision: *revision,
                                    key: key.clone(),
                                    lease: prev.lease,
                                    create_revision: prev.create_revision,
                                    origin: *origin,
                                });
                                hosts_changed |= t.host_transition(&key, *revision, false);
                            }
                        }
                    }
                    if hosts_changed {
                        t.hosts_at.insert(*revision, hosts);
                    }
                    for name in touched {
                        let prefix = format!("{name}/");
                        let mut queue: Vec<Revision> = keys
                            .range(prefix.clone()..)
                            .take_while(|(k, _)| k.starts_with(&prefix))
                            .map(|(_, v)| v.create_revision)
                            .collect();
                        queue.sort();
                        if semaphores.contains(name) {
                            let spans = t.queues.entry(name.to_owned()).or_default();
                            if spans.last().map(|s| &s.keys) != Some(&queue) {
                                spans.push(QueueSpan {
                                    from: r.at,
                                    revision: *revision,
                                    keys: queue,
                                });
                            }
                            continue;
                        }
                        let leader = queue.first().copied();
                        let spans = t.leaders.entry(name.to_owned()).or_default();
                        if spans.last().map(|s| s.token) != Some(leader) {
                            spans.push(LeaderSpan {
                                from: r.at,
                                revision: *revision,
                                token: leader,
                            });
                        }
                    }
                }
                _ => {}
            }
        }
        t.final_keys = keys;
        t
    }

    /// Records a host appearing or disappearing, if `key` is a host's; says whether it was.
    fn host_transition(&mut self, key: &str, revision: Revision, up: bool) -> bool {
        let Some(host) = key.strip_prefix(HOSTS) else {
            return false;
        };
        self.transitions
            .entry(host.to_owned())
            .or_default()
            .push(Transition { revision, up });
        true
    }

    /// Whether `host` was registered at `revision`.
    pub(crate) fn host_up_at(&self, host: &str, revision: Revision) -> bool {
        let Some(ts) = self.transitions.get(host) else {
            return false;
        };
        let upto = ts.partition_point(|t| t.revision <= revision);
        upto > 0 && ts[upto - 1].up
    }

    /// The fingerprint of the hosts registered at `revision`.
    pub(crate) fn fingerprint_at(&self, revision: Revision) -> Fingerprint {
        self.hosts_at
            .range(..=revision)
            .next_back()
            .map(|(_, f)| *f)
            .expect("revision 0 is always there")
    }

    /// The hosts registered at `revision`, with their metadata: replayed from the commits,
    /// for a report (see [`fingerprint_at`](Self::fingerprint_at) for checking).
    pub(crate) fn hosts_at(&self, revision: Revision) -> BTreeMap<String, String> {
        let mut hosts = BTreeMap::new();
        for c in self.commits.iter().take_while(|c| c.revision <= revision) {
            for e in &c.events {
                let key = String::from_utf8_lossy(&e.kv.key);
                let Some(host) = key.strip_prefix(HOSTS) else {
                    continue;
                };
                match e.kind {
                    EventKind::Put => {
                        let md = String::from_utf8_lossy(&e.kv.value).into_owned();
                        hosts.insert(host.to_owned(), md);
                    }
                    EventKind::Delete => {
                        hosts.remove(host);
                    }
                }
            }
        }
        hosts
    }

    /// The election's leader (the oldest key's create revision) as of `revision`.
    pub(crate) fn leader_at(&self, election: &str, revision: Revision) -> Option<Revision> {
        self.leaders
            .get(election)?
            .iter()
            .take_while(|s| s.revision <= revision)
            .last()
            .and_then(|s| s.token)
    }

    /// The create revisions of the `seats` oldest keys of `semaphore` just after `revision`.
    pub(crate) fn seated_at(
        &self,
        semaphore: &str,
        revision: Revision,
        seats: usize,
    ) -> &[Revision] {
        let keys = self
            .queues
            .get(semaphore)
            .and_then(|q| q.iter().take_while(|s| s.revision <= revision).last())
            .map_or(&[][..], |s| &s.keys[..]);
        &keys[..keys.len().min(seats)]
    }

    /// The incarnation a client id belongs to (none for the operator and the store).
    pub(crate) fn incarnation_of(&self, client: u64) -> Option<Incarnation> {
        self.clients.get(&client).copied()
    }

    /// The incarnation that made a change (none for the operator and the store itself).
    pub(crate) fn author(&self, origin: Origin) -> Option<Incarnation> {
        match origin {
            Origin::Client(c) => self.incarnation_of(c),
            _ => None,
        }
    }

    /// The incarnation that granted `lease`.
    pub(crate) fn granted_by(&self, lease: LeaseId) -> Option<Incarnation> {
        self.grants
            .get(&lease)
            .and_then(|(c, _)| self.incarnation_of(*c))
    }
}
