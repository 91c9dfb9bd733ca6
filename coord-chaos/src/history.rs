//! The history of a run: one list, in the order things happened, on the simulated clock.
//! The store's journal (the truth), each node's beliefs and outputs, and the faults.

use std::fmt;
use std::time::Duration;

use coord_api::LeaseId;

use crate::fault::Fault;
use coord_sim::journal::Entry;

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
    /// `HostUp`.
    Up(String, i64),
    /// `HostUpdated`.
    Updated(String, i64),
    /// `HostDown`.
    Down(String, i64),
    /// `Resynced`.
    Resynced(i64),
}

/// One thing that happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Happening {
    /// The store changed (the truth).
    Store(Entry),
    /// An incarnation started, as the store client with this id.
    Started {
        /// Who.
        who: Incarnation,
        /// Its store client id (the journal's `Origin::Client`).
        client: u64,
    },
    /// An incarnation crashed: every belief it held ends here.
    Crashed(Incarnation),
    /// A graceful stop began.
    Stopping(Incarnation),
    /// A graceful stop returned.
    Stopped {
        /// Who.
        who: Incarnation,
        /// Whether every part stopped without an error.
        clean: bool,
    },
    /// The node believes it is registered, under `lease`.
    Registered(Incarnation, LeaseId),
    /// The node believes it is not registered (lost, healing, stopped).
    Unregistered(Incarnation),
    /// The node believes it leads `election` with `token`.
    LeaderStart {
        /// Who.
        who: Incarnation,
        /// Which election.
        election: usize,
        /// The fencing token.
        token: i64,
    },
    /// The node no longer believes it leads.
    LeaderEnd {
        /// Who.
        who: Incarnation,
        /// Which election.
        election: usize,
        /// The fencing token it held.
        token: i64,
        /// It gave the leadership up (resigned), rather than lost it.
        resigned: bool,
    },
    /// A leader attempted its fenced action; `accepted` says whether the store's fence let it.
    Act {
        /// Who.
        who: Incarnation,
        /// Which election.
        election: usize,
        /// The token it acted with.
        token: i64,
        /// Whether the fenced transaction succeeded (`None`: outcome unknown).
        accepted: Option<bool>,
    },
    /// A watcher's view changed: its revision and hosts.
    View {
        /// Whose watcher.
        who: Incarnation,
        /// The view's revision.
        revision: i64,
        /// The hosts in it.
        hosts: Vec<String>,
    },
    /// A watcher emitted an event.
    Emitted(Incarnation, Emitted),
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
