//! The truth of a run, rebuilt from the store's journal: which keys existed at each
//! revision, who granted each lease, when each lease ended, who deleted what.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use coord_api::{EventKind, LeaseId};

use crate::history::{Happening, History, Incarnation};
use crate::node::{election_name, HOSTS};
use coord_sim::journal::{Entry, Origin};

/// A key as it stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Live {
    pub lease: LeaseId,
    pub create_revision: i64,
}

/// A delete of a key, with its cause.
#[derive(Debug, Clone)]
pub(crate) struct Deletion {
    pub at: Duration,
    pub revision: i64,
    pub key: String,
    pub lease: LeaseId,
    pub create_revision: i64,
    pub origin: Origin,
}

/// A host appearing or disappearing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Transition {
    pub revision: i64,
    pub up: bool,
}

/// An election's leader (its oldest key), from some instant on.
#[derive(Debug, Clone)]
pub(crate) struct LeaderSpan {
    pub from: Duration,
    pub token: Option<i64>,
}

/// A fenced write that the store accepted.
#[derive(Debug, Clone)]
pub(crate) struct Work {
    pub at: Duration,
    pub revision: i64,
    pub token: i64,
    /// The election's oldest key's create revision when it was written.
    pub leader: Option<i64>,
}

/// Everything the checkers ask of the truth.
#[derive(Debug, Default)]
pub(crate) struct Truth {
    /// Hosts present after each revision that changed them.
    hosts_at: BTreeMap<i64, BTreeSet<String>>,
    /// Per host, its transitions in revision order.
    pub transitions: BTreeMap<String, Vec<Transition>>,
    pub deletions: Vec<Deletion>,
    /// Per election, its leader over time.
    pub leaders: BTreeMap<usize, Vec<LeaderSpan>>,
    /// Per election, its accepted fenced writes.
    pub work: BTreeMap<usize, Vec<Work>>,
    /// Who granted each lease (the client id), and when.
    pub grants: BTreeMap<LeaseId, (u64, Duration)>,
    /// When each lease ended.
    pub lease_ends: BTreeMap<LeaseId, Duration>,
    /// When each lease was last renewed.
    pub renewals: BTreeMap<LeaseId, Vec<Duration>>,
    /// When the store refreshed every lease (leader change, restart), with the extension.
    pub promotes: Vec<(Duration, Duration)>,
    /// The key space at the end of the run.
    pub final_keys: BTreeMap<String, Live>,
    /// Client id to incarnation.
    pub clients: BTreeMap<u64, Incarnation>,
    /// The time each revision was committed.
    pub revision_at: BTreeMap<i64, Duration>,
    /// Live keys over time, for "which keys did this lease hold at t".
    pub key_spans: Vec<KeySpan>,
}

/// A key's life under one lease.
#[derive(Debug, Clone)]
pub(crate) struct KeySpan {
    pub key: String,
    pub lease: LeaseId,
    pub create_revision: i64,
    pub from: Duration,
    pub until: Option<Duration>,
}

impl Truth {
    pub(crate) fn build(history: &History, elections: usize) -> Truth {
        let mut t = Truth::default();
        let mut keys: BTreeMap<String, Live> = BTreeMap::new();
        let mut open_spans: BTreeMap<String, usize> = BTreeMap::new();
        t.hosts_at.insert(0, BTreeSet::new());
        let prefixes: Vec<String> = (0..elections)
            .map(|e| format!("{}/", election_name(e)))
            .collect();
        let works: Vec<String> = (0..elections).map(crate::node::work_key).collect();
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
                Happening::Store(Entry::LeaseEnd { lease, .. }) => {
                    t.lease_ends.insert(*lease, r.at);
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
                    let mut hosts_changed = false;
                    for e in events {
                        let key = String::from_utf8_lossy(&e.kv.key).into_owned();
                        let before = keys.get(&key).cloned();
                        match e.kind {
                            EventKind::Put => {
                                let live = Live {
                                    lease: e.kv.lease,
                                    create_revision: e.kv.create_revision,
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
                                keys.insert(key.clone(), live);
                                if let Some(i) = works.iter().position(|w| *w == key) {
                                    let token =
                                        String::from_utf8_lossy(&e.kv.value).parse().unwrap_or(-1);
                                    t.work.entry(i).or_default().push(Work {
                                        at: r.at,
                                        revision: *revision,
                                        token,
                                        leader: None,
                                    });
                                }
                                if before.is_none() {
                                    hosts_changed |= t.host_transition(&key, *revision, true);
                                }
                            }
                            EventKind::Delete => {
                                let Some(prev) = keys.remove(&key) else {
                                    continue;
                                };
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
                        let set = keys
                            .keys()
                            .filter_map(|k| k.strip_prefix(HOSTS).map(str::to_owned))
                            .collect();
                        t.hosts_at.insert(*revision, set);
                    }
                    for (e, prefix) in prefixes.iter().enumerate() {
                        let leader = keys
                            .iter()
                            .filter(|(k, _)| k.starts_with(prefix.as_str()))
                            .map(|(_, v)| v.create_revision)
                            .min();
                        let spans = t.leaders.entry(e).or_default();
                        if spans.last().map(|s| s.token) != Some(leader) {
                            spans.push(LeaderSpan {
                                from: r.at,
                                token: leader,
                            });
                        }
                        if let Some(w) = t.work.get_mut(&e).and_then(|w| w.last_mut()) {
                            if w.revision == *revision {
                                w.leader = leader;
                            }
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
    fn host_transition(&mut self, key: &str, revision: i64, up: bool) -> bool {
        let Some(host) = key.strip_prefix(HOSTS) else {
            return false;
        };
        self.transitions
            .entry(host.to_owned())
            .or_default()
            .push(Transition { revision, up });
        true
    }

    /// The hosts registered at `revision`.
    pub(crate) fn hosts_at(&self, revision: i64) -> &BTreeSet<String> {
        self.hosts_at
            .range(..=revision)
            .next_back()
            .map(|(_, s)| s)
            .expect("revision 0 is always there")
    }

    /// The election's leader (the oldest key's create revision) just after `revision`.
    pub(crate) fn leader_after(&self, election: usize, revision: i64) -> Option<i64> {
        let at = *self.revision_at.get(&revision)?;
        self.leaders
            .get(&election)?
            .iter()
            .take_while(|s| s.from <= at)
            .last()
            .and_then(|s| s.token)
    }

    /// The incarnation a client id belongs to (none for the operator and the store).
    pub(crate) fn incarnation_of(&self, client: u64) -> Option<Incarnation> {
        self.clients.get(&client).copied()
    }

    /// The incarnation that granted `lease`.
    pub(crate) fn granted_by(&self, lease: LeaseId) -> Option<Incarnation> {
        self.grants
            .get(&lease)
            .and_then(|(c, _)| self.incarnation_of(*c))
    }
}
