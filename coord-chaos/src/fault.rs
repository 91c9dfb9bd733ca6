//! The faults a run injects, and the schedule drawn from a seed.

use std::fmt;
use std::time::Duration;

use crate::rng::Rng;
use crate::scenario::Scenario;

/// A kind of fault, as named on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FaultKind {
    /// A node cut off from the store both ways (F3).
    Partition,
    /// A one-way partition: requests arrive, replies are lost (F4, F7).
    OneWay,
    /// A node's messages held, then released (F5). One in two waits for the first node to
    /// send a write and holds that node from the write on, until its leases have ended at the
    /// store ([`Fault::waits_for_a_write`]).
    Hold,
    /// A node's calls slowed on their way to the store (F6).
    Latency,
    /// A node's replies slowed: requests apply on time, their callers learn of it late (a
    /// grant or renewal answered late).
    SlowReplies,
    /// A node's next writes apply but lose their replies (F7).
    LostReplies,
    /// Every keep-alive and watch stream closed.
    CloseStreams,
    /// An etcd leader change: streams close, leases refreshed to TTL + election timeout.
    LeaderChange,
    /// The store crashes and restarts on the same data (F10).
    StoreCrash,
    /// A compaction storm: the store compacts at its current revision every 100 ms to 1 s
    /// (F8).
    Compact,
    /// An operator revokes the lease of one of the nodes' keys (F9).
    Revoke,
    /// An operator deletes one of the nodes' keys (F9).
    Delete,
    /// A node crashes and restarts later as a new incarnation (F1).
    Crash,
    /// A node pauses (a GC pause: its messages held and its actions stalled) (F2).
    Pause,
    /// A node restarts gracefully: the new incarnation starts, then the old one stops.
    Restart,
    /// A node stops one of its parts (its registration, its election pool, or a leadership
    /// it holds) at a random moment, healing or not, and starts it again later.
    Stop,
    /// A follower (an etcd member that does not lead) is killed and restarted later on its
    /// data (its clients move to the others). Needs members (over turmoil).
    MemberCrash,
    /// A follower is cut off from the others while its clients still reach it. Needs
    /// members.
    MemberIsolation,
    /// The raft leader is killed, with whatever was forwarded to it, and restarted later.
    /// Needs members.
    LeaderCrash,
    /// Raft leadership handed to another member (`etcdctl move-leader`). Needs members.
    LeaderTransfer,
    /// A follower stalls (SIGSTOP, a long GC, a stuck disk): it accepts connections and
    /// answers nothing, its peers carry on without it, and it answers everything once thawed.
    /// Needs members.
    MemberStall,
    /// A follower answers every request and stream message late (by 0.1 to 6 s) while its
    /// peers see nothing wrong. Needs members.
    MemberSlow,
    /// The raft leader stalls (as [`MemberStall`](Self::MemberStall)): its peers elect
    /// another after an election timeout, and it follows once thawed. On etcd 3.4 it first
    /// revokes the leases it saw overdue ([`ResumeRevoke`](Self::ResumeRevoke)). Needs
    /// members.
    LeaderStall,
    /// Not drawn: what a [`LeaderStall`](Self::LeaderStall) does on etcd 3.4 when its
    /// successor led before the thaw (etcd#15247): the old leader revokes every lease it saw
    /// overdue, however the new one renewed it. Recorded once per lease it ended, when it
    /// ended, so that the checkers excuse a loss to it as they do an operator's revoke.
    ResumeRevoke,
}

impl FaultKind {
    /// The kinds that need the store served as several members.
    pub const MEMBERS: [FaultKind; 7] = [
        FaultKind::MemberCrash,
        FaultKind::MemberIsolation,
        FaultKind::LeaderCrash,
        FaultKind::LeaderTransfer,
        FaultKind::MemberStall,
        FaultKind::MemberSlow,
        FaultKind::LeaderStall,
    ];

    /// Every kind a schedule draws (all but [`ResumeRevoke`](Self::ResumeRevoke), which a
    /// leader stall brings about).
    pub const ALL: [FaultKind; 23] = [
        FaultKind::Partition,
        FaultKind::OneWay,
        FaultKind::Hold,
        FaultKind::Latency,
        FaultKind::SlowReplies,
        FaultKind::LostReplies,
        FaultKind::CloseStreams,
        FaultKind::LeaderChange,
        FaultKind::StoreCrash,
        FaultKind::Compact,
        FaultKind::Revoke,
        FaultKind::Delete,
        FaultKind::Crash,
        FaultKind::Pause,
        FaultKind::Restart,
        FaultKind::Stop,
        FaultKind::MemberCrash,
        FaultKind::MemberIsolation,
        FaultKind::LeaderCrash,
        FaultKind::LeaderTransfer,
        FaultKind::MemberStall,
        FaultKind::MemberSlow,
        FaultKind::LeaderStall,
    ];

    /// Every kind a history may hold: the drawn ones and what they bring about.
    pub const RECORDED: [FaultKind; 24] = {
        let mut all = [FaultKind::ResumeRevoke; 24];
        let mut i = 0;
        while i < FaultKind::ALL.len() {
            all[i] = FaultKind::ALL[i];
            i += 1;
        }
        all
    };

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Partition => "partition",
            FaultKind::OneWay => "one-way",
            FaultKind::Hold => "hold",
            FaultKind::Latency => "latency",
            FaultKind::SlowReplies => "slow-replies",
            FaultKind::LostReplies => "lost-replies",
            FaultKind::CloseStreams => "close-streams",
            FaultKind::LeaderChange => "leader-change",
            FaultKind::StoreCrash => "store-crash",
            FaultKind::Compact => "compact",
            FaultKind::Revoke => "revoke",
            FaultKind::Delete => "delete",
            FaultKind::Crash => "crash",
            FaultKind::Pause => "pause",
            FaultKind::Restart => "restart",
            FaultKind::Stop => "stop",
            FaultKind::MemberCrash => "member-crash",
            FaultKind::MemberIsolation => "member-isolation",
            FaultKind::LeaderCrash => "leader-crash",
            FaultKind::LeaderTransfer => "leader-transfer",
            FaultKind::MemberStall => "member-stall",
            FaultKind::MemberSlow => "member-slow",
            FaultKind::LeaderStall => "leader-stall",
            FaultKind::ResumeRevoke => "resume-revoke",
        }
    }

    /// Whether the fault needs the store served as several members (each a turmoil host).
    pub fn needs_members(self) -> bool {
        FaultKind::MEMBERS.contains(&self)
    }

    /// The kind named `name`.
    pub fn from_name(name: &str) -> Option<FaultKind> {
        FaultKind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Whether the fault targets one node.
    pub fn targets_node(self) -> bool {
        matches!(
            self,
            FaultKind::Partition
                | FaultKind::OneWay
                | FaultKind::Hold
                | FaultKind::Latency
                | FaultKind::SlowReplies
                | FaultKind::LostReplies
                | FaultKind::Crash
                | FaultKind::Pause
                | FaultKind::Restart
                | FaultKind::Stop
        )
    }

    /// Whether the fault lasts (has an end), rather than being one action.
    pub fn lasts(self) -> bool {
        matches!(
            self,
            FaultKind::Partition
                | FaultKind::OneWay
                | FaultKind::Hold
                | FaultKind::Latency
                | FaultKind::SlowReplies
                | FaultKind::StoreCrash
                | FaultKind::Crash
                | FaultKind::Pause
                | FaultKind::Compact
                | FaultKind::Stop
                | FaultKind::MemberCrash
                | FaultKind::MemberIsolation
                | FaultKind::LeaderCrash
                | FaultKind::MemberStall
                | FaultKind::MemberSlow
                | FaultKind::LeaderStall
        )
    }

    /// Whether the fault disturbs the node's link to the store (or the store itself), rather
    /// than the node's own process.
    pub fn disturbs_link(self) -> bool {
        matches!(
            self,
            FaultKind::Partition
                | FaultKind::OneWay
                | FaultKind::Hold
                | FaultKind::Latency
                | FaultKind::SlowReplies
                | FaultKind::LostReplies
                | FaultKind::CloseStreams
                | FaultKind::LeaderChange
                | FaultKind::StoreCrash
                | FaultKind::Pause
                | FaultKind::MemberCrash
                | FaultKind::MemberIsolation
                | FaultKind::LeaderCrash
                | FaultKind::LeaderTransfer
                | FaultKind::MemberStall
                | FaultKind::MemberSlow
                | FaultKind::LeaderStall
        )
    }

    /// Whether the fault takes leases or keys from live nodes, as an operator's revoke or
    /// delete does: a loss soon after it is its doing.
    pub fn takes_leases(self) -> bool {
        matches!(
            self,
            FaultKind::Revoke | FaultKind::Delete | FaultKind::ResumeRevoke
        )
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One scheduled fault.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Fault {
    /// When it starts, from the start of the run.
    pub at: Duration,
    /// What it is.
    pub kind: FaultKind,
    /// The node it hits (ignored by store-wide kinds); for a member fault, the member: drawn
    /// in a schedule, and in a history the member it hit (a follower's fault drawn on the
    /// leader hits the next member).
    pub node: usize,
    /// How long it lasts (lasting kinds); for lost replies, how many (in milliseconds).
    pub length: Duration,
    /// A number for the fault's own choices (which key to delete, which lease to revoke).
    pub pick: u64,
}

/// The bit of a hold's `pick` that makes it wait for a write.
const AIM_BIT: u32 = 41;

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.3}s {}", self.at.as_secs_f64(), self.what())
    }
}

impl Fault {
    /// The fault without its time: kind, target and size.
    pub fn what(&self) -> String {
        struct What<'a>(&'a Fault);
        impl fmt::Display for What<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt_what(f)
            }
        }
        What(self).to_string()
    }

    fn fmt_what(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.kind)?;
        if let Some(target) = self.target() {
            write!(f, " {target}")?;
        }
        match self.kind {
            _ if self.waits_for_a_write() => write!(
                f,
                " from a write within {:.3}s, until its leases end",
                self.length.as_secs_f64()
            ),
            k if k.lasts() => write!(f, " for {:.3}s", self.length.as_secs_f64()),
            FaultKind::LostReplies => write!(f, " x{}", self.length.as_millis()),
            _ => Ok(()),
        }?;
        if matches!(
            self.kind,
            FaultKind::Latency | FaultKind::SlowReplies | FaultKind::MemberSlow
        ) {
            write!(f, " +{}ms", self.added_latency().as_millis())?;
        }
        if self.overtakes() {
            f.write_str(" overtaken")?;
        }
        if self.kind == FaultKind::Stop {
            write!(f, " part {}", self.pick % 3)?;
        }
        if self.kind == FaultKind::Compact {
            write!(f, " every {}ms", self.compaction_period().as_millis())?;
        }
        Ok(())
    }
}

impl Fault {
    /// What it hits, when it hits one thing: node `n3`, member `m1` (for a member crash or
    /// cut-off, the member drawn; the driver moves to the next when that one leads).
    pub fn target(&self) -> Option<String> {
        if self.kind.targets_node() {
            Some(format!("n{}", self.node))
        } else if matches!(
            self.kind,
            FaultKind::MemberCrash
                | FaultKind::MemberIsolation
                | FaultKind::LeaderTransfer
                | FaultKind::MemberStall
                | FaultKind::MemberSlow
        ) {
            Some(format!("m{}", self.node))
        } else {
            None
        }
    }

    /// For a latency fault, whether half-way through it holds the node's requests then on
    /// their way until it ends, while later ones pass them (one in two): a write sent
    /// before a `leave()`, a stop or a resignation lands after it.
    pub fn overtakes(&self) -> bool {
        self.kind == FaultKind::Latency && (self.pick >> 40) & 1 == 1
    }

    /// For a hold, whether it waits for the first node to send a write, and holds that node
    /// from that write on (one in two): the write lands when the hold ends, after whatever
    /// the store did meanwhile, so a leader whose write is unfenced is caught writing after
    /// its successor was elected. The node drawn for it is then not the one it hits (it is
    /// recorded with the node it hit). Over turmoil, where the runner cannot see a node's
    /// writes, it is a plain hold of the node drawn.
    pub fn waits_for_a_write(&self) -> bool {
        self.kind == FaultKind::Hold && (self.pick >> AIM_BIT) & 1 == 1
    }

    /// The same fault as a plain hold of the node drawn, for [`waits_for_a_write`].
    ///
    /// [`waits_for_a_write`]: Self::waits_for_a_write
    pub(crate) fn without_aim(&self) -> Fault {
        Fault {
            pick: self.pick & !(1 << AIM_BIT),
            ..self.clone()
        }
    }

    /// For a compaction storm, how often it compacts: 100 ms to 1 s.
    pub fn compaction_period(&self) -> Duration {
        Duration::from_millis(100 + self.pick % 900)
    }

    /// For a latency fault, the latency it adds: 1 to 400 ms to requests; 50 to 1,500 ms to
    /// slow replies (longer than a renewal period at a 3 s TTL); 100 ms to 6 s to everything
    /// a slow member answers (past the 5 s request timeout).
    pub fn added_latency(&self) -> Duration {
        match self.kind {
            FaultKind::SlowReplies => Duration::from_millis(50 + self.pick % 1450),
            FaultKind::MemberSlow => Duration::from_millis(100 + self.pick % 5900),
            _ => Duration::from_millis(1 + self.pick % 400),
        }
    }
}

/// Draws the fault schedule of one run: for each enabled kind, a Poisson-like number of
/// faults at the scenario's rate, at uniform times in the chaos phase, each over by the heal
/// instant.
pub fn schedule(scenario: &Scenario, rng: &mut Rng) -> Vec<Fault> {
    let chaos_start = Duration::from_secs(2);
    let heal = scenario.heal_at();
    if heal <= chaos_start {
        return Vec::new();
    }
    let window = heal - chaos_start;
    let ttl_ms = scenario.ttl.as_millis() as u64;
    let mut faults = Vec::new();
    for kind in scenario.fault_kinds.iter().copied() {
        // One store has no members to fail.
        if kind.needs_members() && scenario.members < 2 {
            continue;
        }
        let expected = scenario.faults_per_minute * window.as_secs_f64() / 60.0;
        // Round the expectation randomly so that low rates still produce faults sometimes.
        let mut count = expected.floor() as u64;
        if rng.chance(expected.fract()) {
            count += 1;
        }
        for _ in 0..count {
            let at = chaos_start + Duration::from_millis(rng.below(window.as_millis() as u64));
            let length = match kind {
                // From a blip well inside the TTL to well past it.
                FaultKind::Partition
                | FaultKind::OneWay
                | FaultKind::Hold
                | FaultKind::Pause
                | FaultKind::Latency
                | FaultKind::SlowReplies
                | FaultKind::Compact => Duration::from_millis(rng.between(100, ttl_ms * 2)),
                FaultKind::Stop => Duration::from_millis(rng.between(100, ttl_ms)),
                FaultKind::LostReplies => Duration::from_millis(rng.between(1, 3)),
                FaultKind::StoreCrash
                | FaultKind::MemberCrash
                | FaultKind::MemberIsolation
                | FaultKind::LeaderCrash => Duration::from_millis(rng.between(100, ttl_ms * 2)),
                // From a blip to three TTLs: a sick member may stay sick for any length of
                // time, and nothing may be lost to it.
                FaultKind::MemberStall | FaultKind::MemberSlow | FaultKind::LeaderStall => {
                    Duration::from_millis(rng.between(100, ttl_ms * 3))
                }
                FaultKind::Crash => Duration::from_millis(rng.between(ttl_ms / 2, ttl_ms * 3)),
                _ => Duration::ZERO,
            };
            // Everything is over by the heal instant.
            let length = if kind.lasts() {
                length.min(heal.saturating_sub(at))
            } else {
                length
            };
            let targets = if kind.needs_members() {
                scenario.members
            } else {
                scenario.hosts
            };
            faults.push(Fault {
                at,
                kind,
                node: rng.below(targets as u64) as usize,
                length,
                pick: rng.next_u64(),
            });
        }
    }
    // A link that degrades before it fails: half the slow-replies faults are followed by a
    // partition of the same node (a session that trusted a slow reply too long is caught
    // then, when it can no longer renew).
    if scenario.fault_kinds.contains(&FaultKind::Partition) {
        let degrading: Vec<Fault> = faults
            .iter()
            .filter(|f| f.kind == FaultKind::SlowReplies)
            .cloned()
            .collect();
        for f in degrading {
            if !rng.chance(0.5) {
                continue;
            }
            let at = f.at + f.length.mul_f64(0.5 + rng.below(50) as f64 / 100.0);
            let length =
                Duration::from_millis(rng.between(ttl_ms, ttl_ms * 2)).min(heal.saturating_sub(at));
            if at < heal && !length.is_zero() {
                faults.push(Fault {
                    at,
                    kind: FaultKind::Partition,
                    node: f.node,
                    length,
                    pick: rng.next_u64(),
                });
            }
        }
    }
    faults.sort();
    faults
}
