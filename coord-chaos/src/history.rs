//! The history of a run: one list, in the order things happened, on the simulated clock.
//! The store's journal (the truth), each node's beliefs and outputs, and the faults.

use std::fmt;
use std::time::Duration;

use coord_api::{LeaseId, Revision};
use coord_sim::journal::Entry;

use crate::fault::Fault;

/// A node, and which incarnation of it (a crash or restart makes a new one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Incarnation {
    /// The node's index.
    pub node: usize,
    /// Its incarnation, from 0.
    pub inc: u32,
}

impl fmt::Display for Incarnation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "n{}.{}", self.node, self.inc)
    }
}

/// What a cluster watcher emitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Emitted {
    /// `HostUp`: host, metadata, revision.
    Up(String, String, Revision),
    /// `HostUpdated`: host, metadata, revision.
    Updated(String, String, Revision),
    /// `HostDown`: host, revision.
    Down(String, Revision),
    /// `Resynced`: the listing's revision.
    Resynced(Revision),
}

/// A part of an incarnation that can be stopped on its own, or a hold it lets go of: every
/// verb that ends a hold, recorded around it, is held to L7 (a clean return means the key is
/// gone).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Part {
    /// Its host registration.
    Registration,
    /// Its election pool (every leadership and candidacy on it).
    Pool,
    /// Its leadership of this election (a resignation).
    Leadership(String),
    /// Its hold of a lock or a permit (`of`: the mutex's or the semaphore's name) with this
    /// token: an unlock or a release.
    Hold {
        /// The mutex's or the semaphore's name.
        of: String,
        /// The hold's token (its key's create revision).
        token: Revision,
    },
    /// Its place in an election, a mutex's or a semaphore's queue under one session's lease
    /// (`of`: the name): a `leave()`.
    Queue {
        /// The election's, mutex's or semaphore's name.
        of: String,
        /// The session's lease.
        lease: LeaseId,
    },
}

impl fmt::Display for Part {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Part::Registration => f.write_str("registration"),
            Part::Pool => f.write_str("pool"),
            Part::Leadership(e) => write!(f, "leadership of {e}"),
            Part::Hold { of, token } => write!(f, "hold of {of} (token {token})"),
            Part::Queue { of, lease } => write!(f, "place in {of}'s queue (lease {lease})"),
        }
    }
}

/// What became of a fenced write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The store applied it.
    Accepted,
    /// The store refused it: the leadership was over ([`coord_api::Error::FencedOut`]).
    FencedOut,
    /// Unknown: its reply was lost, or the writer stopped waiting for it (it may still land).
    Unknown,
}

/// One thing that happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Happening {
    /// The store changed (the truth).
    Store(Entry),
    /// Calls of an incarnation held on their way while later ones passed them (a latency
    /// fault that overtakes) landed now, after those.
    Overtaken {
        /// Whose calls.
        who: Incarnation,
        /// How many were held.
        calls: usize,
    },
    /// An incarnation started, as the store client with this id.
    Started {
        /// Who.
        who: Incarnation,
        /// Its store client id (the journal's `Origin::Client`).
        client: u64,
    },
    /// An incarnation crashed: every belief it held ends here.
    Crashed(Incarnation),
    /// A graceful stop of the whole incarnation began.
    Stopping(Incarnation),
    /// A graceful stop of the whole incarnation returned.
    Stopped {
        /// Who.
        who: Incarnation,
        /// Whether every part stopped without an error.
        clean: bool,
    },
    /// A part of an incarnation is being stopped on purpose.
    PartStopping {
        /// Who.
        who: Incarnation,
        /// Which part.
        part: Part,
    },
    /// A part's stop returned.
    PartStopped {
        /// Who.
        who: Incarnation,
        /// Which part.
        part: Part,
        /// Whether the stop returned `Ok`.
        clean: bool,
    },
    /// A part stopped on purpose starts again (before it writes anything).
    PartStarted {
        /// Who.
        who: Incarnation,
        /// Which part.
        part: Part,
    },
    /// The node believes its key is registered, under `lease`.
    Registered {
        /// Who.
        who: Incarnation,
        /// The registered key.
        key: String,
        /// The lease it believes the key lives under.
        lease: LeaseId,
    },
    /// The node believes its key is not registered (lost, healing, stopped).
    Unregistered {
        /// Who.
        who: Incarnation,
        /// The key.
        key: String,
    },
    /// The node changed its registration's metadata to `value` (recorded once the update
    /// returned: every write of the key sent after this carries it, or a newer value).
    Metadata {
        /// Who.
        who: Incarnation,
        /// The registered key.
        key: String,
        /// The new metadata.
        value: String,
    },
    /// coord's node sent a write of its host key (a put, or a transaction that may put it),
    /// recorded as the call is made: the journal says when a write landed, this when it left.
    HostKeyWriteSent {
        /// Who.
        who: Incarnation,
        /// The host key.
        key: String,
    },
    /// The node believes it leads `election` with `token`.
    LeaderStart {
        /// Who.
        who: Incarnation,
        /// The election's name.
        election: String,
        /// The fencing token.
        token: Revision,
    },
    /// The node no longer believes it leads.
    LeaderEnd {
        /// Who.
        who: Incarnation,
        /// The election's name.
        election: String,
        /// The fencing token it held.
        token: Revision,
        /// It gave the leadership up (resigned), rather than lost it.
        resigned: bool,
    },
    /// The work of the node's term with `token` in `election` began (it runs while the node
    /// leads, and winds down after).
    WorkStarted {
        /// Who.
        who: Incarnation,
        /// The election's name.
        election: String,
        /// The term's fencing token.
        token: Revision,
    },
    /// The work of that term stopped (returned, or was dropped).
    WorkEnded {
        /// Who.
        who: Incarnation,
        /// The election's name.
        election: String,
        /// The term's fencing token.
        token: Revision,
    },
    /// The node believes it holds a permit of `semaphore` with `token` (its key's create
    /// revision).
    PermitStart {
        /// Who.
        who: Incarnation,
        /// The semaphore's name.
        semaphore: String,
        /// The permit's fencing token.
        token: Revision,
    },
    /// The node no longer believes it holds the permit.
    PermitEnd {
        /// Who.
        who: Incarnation,
        /// The semaphore's name.
        semaphore: String,
        /// The permit's fencing token.
        token: Revision,
        /// It released the permit, rather than lost it.
        released: bool,
    },
    /// A fenced write: sent by a node that believed it led with `token`, and its outcome as
    /// the node learned it. The store's journal says whether it applied.
    FencedWrite {
        /// Who.
        who: Incarnation,
        /// The election whose leadership fenced it.
        election: String,
        /// The token it carried.
        token: Revision,
        /// What the node learned.
        outcome: Outcome,
    },
    /// A watcher's view changed: its revision, and the hosts that differ from its previous
    /// view (every host, for the first), each with its metadata or `None` when it is gone.
    /// Changes, not the whole view, so that a record costs what changed, whatever the
    /// cluster's size.
    View {
        /// Whose watcher.
        who: Incarnation,
        /// The view's revision.
        revision: Revision,
        /// The hosts that differ from the previous view.
        changes: Vec<(String, Option<String>)>,
    },
    /// A watcher emitted an event.
    Emitted(Incarnation, Emitted),
    /// A consumer found a recipe's state inconsistent with what it was just told (a view that
    /// does not hold the event it explains, a leadership that is not leading when handed
    /// out, a lease id that disagrees with the status).
    Inconsistent {
        /// Who.
        who: Incarnation,
        /// What it read, and what it was told.
        detail: String,
    },
    /// Something a user's service recorded for its own invariants.
    Note {
        /// Who.
        who: Incarnation,
        /// What kind of note (the service's own vocabulary).
        kind: String,
        /// Its content.
        detail: String,
    },
    /// A fault began.
    FaultStart(Fault),
    /// A lasting fault ended.
    FaultEnd(Fault),
    /// Every fault is over (the quiet phase begins).
    Heal,
}

/// A happening and when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Simulated time since the run started.
    pub at: Duration,
    /// What.
    pub what: Happening,
}

/// A run's history.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct History {
    /// Every record, in order.
    pub records: Vec<Record>,
    /// The world's time resolution: zero in-process, turmoil's tick over turmoil (timers and
    /// messages land on its boundaries, so no round trip is shorter than two of them).
    pub resolution: Duration,
}

impl History {
    /// A hash of the whole history (FNV-1a over its debug form): equal for byte-identical
    /// histories, so two runs of one seed can be compared cheaply (S9).
    pub fn digest(&self) -> u64 {
        let mut h = Fnv(0xcbf2_9ce4_8422_2325);
        for r in &self.records {
            use std::fmt::Write;
            let _ = writeln!(h, "{r:?}");
        }
        h.0
    }

    /// When the run ended: its last record, or `at_least` if that is later.
    pub fn end(&self, at_least: Duration) -> Duration {
        self.records
            .last()
            .map(|r| r.at)
            .unwrap_or_default()
            .max(at_least)
    }

    /// The faults of the run, in order.
    pub fn faults(&self) -> impl Iterator<Item = (Duration, &Fault)> {
        self.records.iter().filter_map(|r| match &r.what {
            Happening::FaultStart(f) => Some((r.at, f)),
            _ => None,
        })
    }

    /// The notes of kind `kind`, with when and who.
    pub fn notes<'a>(
        &'a self,
        kind: &'a str,
    ) -> impl Iterator<Item = (Duration, Incarnation, &'a str)> + 'a {
        self.records.iter().filter_map(move |r| match &r.what {
            Happening::Note {
                who,
                kind: k,
                detail,
            } if k == kind => Some((r.at, *who, detail.as_str())),
            _ => None,
        })
    }
}

struct Fnv(u64);

impl std::fmt::Write for Fnv {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        for b in s.bytes() {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
        Ok(())
    }
}
