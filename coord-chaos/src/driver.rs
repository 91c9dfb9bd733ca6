//! One fault driver for every world: when each fault starts and ends, how overlapping faults
//! of one kind on one node nest (the link is repaired when the last one ends; a link with
//! several latency faults in force adds the largest of them), and what each does, in the
//! terms of [`World`], which the in-process store and the turmoil network both implement.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::fault::{Fault, FaultKind};
use crate::history::Happening;
use crate::service::PartStopRequest;

/// What the driver asks of a world. Link faults come already nested: `on` is the state the
/// node's link must be in.
pub(crate) trait World {
    /// Records on the history, at the world's clock.
    fn record(&mut self, what: Happening);
    /// Partitions the node from the store both ways, or repairs it.
    fn partition(&mut self, node: usize, on: bool);
    /// Partitions the node one way (replies lost), or repairs it.
    fn partition_oneway(&mut self, node: usize, on: bool);
    /// Holds the node's messages, or releases them.
    fn hold(&mut self, node: usize, on: bool);
    /// Whether the world sees each node's writes as they are sent, for
    /// [`hold_first_writer`](Self::hold_first_writer).
    fn sees_writes(&self) -> bool {
        false
    }
    /// Starts (or ends) a hold that waits for the first node to send a write and holds that
    /// node's messages from then on, that write first; the world records the fault, on the
    /// node it hit, as it acts (never, if no node wrote before it ended).
    fn hold_first_writer(&mut self, fault: &Fault, on: bool) {
        let _ = (fault, on);
    }
    /// Stalls the node's actions (a GC pause), or lets them go.
    fn pause(&mut self, node: usize, on: bool);
    /// Adds latency to the node's requests.
    fn latency(&mut self, node: usize, extra: Duration);
    /// Adds latency to the node's replies.
    fn reply_latency(&mut self, node: usize, extra: Duration);
    /// From `from` on, holds the node's requests then on their way (later ones pass them)
    /// until `until`, both from now: a request stuck at a stalled member or in a server's
    /// queue while its client goes on. A world that cannot hold one request apart from the
    /// next (turmoil's links are in order) does nothing.
    fn overtake(&mut self, _node: usize, _from: Duration, _until: Duration) {}
    /// Loses the replies of the node's next writes.
    fn lose_replies(&mut self, node: usize, count: u32);
    /// Closes every stream of the store.
    fn close_streams(&mut self);
    /// An etcd leader change.
    fn leader_change(&mut self);
    /// Crashes the store, or restarts it.
    fn store_down(&mut self, down: bool);
    /// Starts or ends a compaction storm.
    fn compaction(&mut self, storm: &Fault, on: bool);
    /// An operator revokes or deletes one of the service's keys (its
    /// [`operator_prefixes`](crate::Service::operator_prefixes)), recording the fault as it
    /// acts: not at all when there is no such key.
    fn operator(&mut self, fault: &Fault);
    /// Crashes the node's live incarnation.
    fn crash(&mut self, node: usize);
    /// Starts a crashed node again, as a new incarnation.
    fn recover(&mut self, node: usize);
    /// Restarts the node gracefully: a new incarnation, then the old one stops. Whether it
    /// acts (a crashed node has nothing to restart).
    fn rolling_restart(&mut self, node: usize) -> bool;
    /// Asks the node to stop one of its parts for a while; whether the request reached a
    /// service that takes them (it acts).
    fn stop_part(&mut self, node: usize, request: PartStopRequest) -> bool;
    /// How many etcd members serve the store (1: one store, no member faults).
    fn members(&self) -> usize;
    /// Kills member `member`, or starts it again.
    fn member_down(&mut self, member: usize, down: bool);
    /// Cuts `Some(member)` off from the others, or lets it rejoin (`None`).
    fn member_isolated(&mut self, member: Option<usize>);
    /// Stalls member `member` (it answers nothing), or thaws it.
    fn member_stalled(&mut self, member: usize, stalled: bool);
    /// Makes member `member` answer `late` late (zero: on time).
    fn member_slowed(&mut self, member: usize, late: Duration);
    /// The raft leader, if one is elected.
    fn leader(&mut self) -> Option<usize>;
    /// Hands raft leadership to member `to`; returns whether it moved.
    fn transfer_leader(&mut self, to: usize) -> bool;
}

/// A fault starting or ending, at a time.
#[derive(Debug, Clone)]
pub(crate) struct Action {
    pub(crate) at: Duration,
    pub(crate) start: bool,
    pub(crate) fault: Fault,
}

/// Every start and end of `faults` the world supports, in time order (at one instant,
/// starts before ends).
pub(crate) fn actions(faults: &[Fault], supported: impl Fn(FaultKind) -> bool) -> Vec<Action> {
    let mut out = Vec::new();
    for f in faults.iter().filter(|f| supported(f.kind)) {
        out.push(Action {
            at: f.at,
            start: true,
            fault: f.clone(),
        });
        if f.kind.lasts() {
            out.push(Action {
                at: f.at + f.length,
                start: false,
                fault: f.clone(),
            });
        }
    }
    out.sort_by_key(|a| (a.at, !a.start));
    out
}

/// What nests: faults of one kind on one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Nest {
    Partition,
    OneWay,
    /// Holds and pauses share one: a pause holds the link too.
    Hold,
    Pause,
    Latency,
    SlowReplies,
    Crash,
    Store,
}

/// The driver: see the module docs.
#[derive(Debug, Default)]
pub(crate) struct Driver {
    counts: BTreeMap<(Nest, usize), u32>,
    /// The added latencies of the latency and slow-replies faults in force, per node.
    added: BTreeMap<(Nest, usize), Vec<Duration>>,
    /// The member fault in force and the member it hit: one at a time, so that a majority
    /// always serves (a fault drawn while another is in force does nothing).
    member_fault: Option<(Fault, usize)>,
    /// The lasting faults that acted and have not ended: only they are undone and recorded
    /// as ended.
    acting: BTreeSet<Fault>,
}

impl Driver {
    /// Counts a nested fault in or out; true when it is the first in or the last out.
    fn nest(&mut self, nest: Nest, node: usize, into: bool) -> bool {
        let c = self.counts.entry((nest, node)).or_insert(0);
        if into {
            *c += 1;
            *c == 1
        } else {
            *c = c.saturating_sub(1);
            *c == 0
        }
    }

    /// Counts a latency fault (`Nest::Latency` or `Nest::SlowReplies`) in or out; returns
    /// the latency the node's link must add now: the largest of its faults of that kind in
    /// force, as the checkers' reply windows assume. (The latest to start used to stay in
    /// force until the last ended: a short slow-replies fault of +1.47 s inside a long one of
    /// +0.51 s kept delaying replies by 1.47 s after it ended, past what the checkers allow
    /// for: `--defaults` seed 2004722's false P3.)
    fn added(&mut self, nest: Nest, node: usize, f: &Fault, into: bool) -> Duration {
        let in_force = self.added.entry((nest, node)).or_default();
        let added = f.added_latency();
        if into {
            in_force.push(added);
        } else if let Some(i) = in_force.iter().position(|d| *d == added) {
            in_force.swap_remove(i);
        }
        in_force.iter().copied().max().unwrap_or_default()
    }

    /// The heal instant: every fault is over, including replies still due to be lost (a
    /// lost-replies fault lingers until the node's writes take it).
    pub(crate) fn heal(&mut self, world: &mut impl World, hosts: usize) {
        for n in 0..hosts {
            world.lose_replies(n, 0);
        }
        world.record(Happening::Heal);
    }

    /// Applies one start or end, recording it when the fault acts: a fault that did nothing
    /// (a member fault drawn while another is in force, a transfer with no leader to move) is
    /// neither recorded, so no checker takes it for an excuse, nor counted.
    pub(crate) fn apply(&mut self, world: &mut impl World, action: &Action) {
        // A world that cannot see writes holds at once: recorded as the plain hold it is.
        let plain;
        let f = if action.fault.waits_for_a_write() && !world.sees_writes() {
            plain = action.fault.without_aim();
            &plain
        } else {
            &action.fault
        };
        if action.start {
            if !self.can_act(world, f) {
                return;
            }
            if f.kind == FaultKind::LeaderTransfer {
                // The cluster may refuse (an election under way): recorded only if it moved.
                let to = f.node % world.members();
                if world.transfer_leader(to) {
                    world.record(Happening::FaultStart(Fault {
                        node: to,
                        ..f.clone()
                    }));
                }
                return;
            }
            if f.waits_for_a_write() {
                // Recorded by the world as a write starts it, on the node that wrote.
                world.hold_first_writer(f, true);
                return;
            }
            if f.kind == FaultKind::Stop {
                // The part's stop and restart are the service's own, told by one request:
                // recorded only if a service takes it. Nothing for the driver to undo.
                let request = PartStopRequest {
                    pick: f.pick,
                    length: f.length,
                };
                if world.stop_part(f.node, request) {
                    world.record(Happening::FaultStart(f.clone()));
                    self.acting.insert(f.clone());
                }
                return;
            }
            if f.kind == FaultKind::Restart {
                // Recorded only if the node runs; what it does comes later (the new
                // incarnation starts on the node's own task or host).
                if world.rolling_restart(f.node) {
                    world.record(Happening::FaultStart(f.clone()));
                }
                return;
            }
            if matches!(f.kind, FaultKind::Revoke | FaultKind::Delete) {
                // Recorded by the world as it acts: there may be no key to act on.
                world.operator(f);
                return;
            }
            // Recorded before it acts, so that what it causes comes after it in the history;
            // a member fault names the member it hits, which may not be the one drawn.
            let member = member_hit(world, f);
            world.record(Happening::FaultStart(on_member(f, member)));
            self.begin(world, f);
            if f.kind.lasts() {
                self.acting.insert(f.clone());
            }
        } else if f.waits_for_a_write() {
            // The world knows whether it armed it, and what it hit.
            world.hold_first_writer(f, false);
        } else if self.acting.remove(f) {
            // Named as its start was: a member fault by the member it hit.
            let member = self
                .member_fault
                .as_ref()
                .filter(|(g, _)| g == f)
                .map(|(_, m)| *m);
            let recorded = on_member(f, member);
            self.end(world, f);
            world.record(Happening::FaultEnd(recorded));
        }
    }

    /// Whether `f` would act now: member faults need members and a leader, and act one at a
    /// time (so that a majority always serves); the rest always act.
    fn can_act(&self, w: &mut impl World, f: &Fault) -> bool {
        if !f.kind.needs_members() {
            return true;
        }
        if self.member_fault.is_some() || w.members() < 2 {
            return false;
        }
        f.kind == FaultKind::LeaderTransfer || w.leader().is_some()
    }

    fn begin(&mut self, w: &mut impl World, f: &Fault) {
        let n = f.node;
        match f.kind {
            FaultKind::Partition => {
                if self.nest(Nest::Partition, n, true) {
                    w.partition(n, true);
                }
            }
            FaultKind::OneWay => {
                if self.nest(Nest::OneWay, n, true) {
                    w.partition_oneway(n, true);
                }
            }
            FaultKind::Hold | FaultKind::Pause => {
                if self.nest(Nest::Hold, n, true) {
                    w.hold(n, true);
                }
                if f.kind == FaultKind::Pause && self.nest(Nest::Pause, n, true) {
                    w.pause(n, true);
                }
            }
            FaultKind::Latency => {
                let added = self.added(Nest::Latency, n, f, true);
                w.latency(n, added);
                if f.overtakes() {
                    w.overtake(n, f.length / 2, f.length);
                }
            }
            FaultKind::SlowReplies => {
                let added = self.added(Nest::SlowReplies, n, f, true);
                w.reply_latency(n, added);
            }
            FaultKind::LostReplies => w.lose_replies(n, f.length.as_millis() as u32),
            FaultKind::CloseStreams => w.close_streams(),
            FaultKind::LeaderChange => w.leader_change(),
            FaultKind::StoreCrash => {
                if self.nest(Nest::Store, 0, true) {
                    w.store_down(true);
                }
            }
            FaultKind::Compact => w.compaction(f, true),
            // Applied, and recorded as they act, by `apply`.
            FaultKind::Revoke | FaultKind::Delete => {}
            // Never scheduled: recorded as a leader stall brings it about.
            FaultKind::ResumeRevoke => {}
            FaultKind::Crash => {
                if self.nest(Nest::Crash, n, true) {
                    w.crash(n);
                }
            }
            // Sent, and recorded if it acts, by `apply`.
            FaultKind::Restart => {}
            // Sent, and recorded as it acts, by `apply`.
            FaultKind::Stop => {}
            FaultKind::MemberCrash
            | FaultKind::MemberIsolation
            | FaultKind::LeaderCrash
            | FaultKind::MemberStall
            | FaultKind::MemberSlow
            | FaultKind::LeaderStall => {
                let Some(member) = member_hit(w, f) else {
                    return;
                };
                match f.kind {
                    FaultKind::MemberIsolation => w.member_isolated(Some(member)),
                    FaultKind::MemberStall | FaultKind::LeaderStall => {
                        w.member_stalled(member, true)
                    }
                    FaultKind::MemberSlow => w.member_slowed(member, f.added_latency()),
                    _ => w.member_down(member, true),
                }
                self.member_fault = Some((f.clone(), member));
            }
            // Applied (and recorded only if it moved) by `apply`.
            FaultKind::LeaderTransfer => {}
        }
    }

    fn end(&mut self, w: &mut impl World, f: &Fault) {
        let n = f.node;
        match f.kind {
            FaultKind::Partition => {
                if self.nest(Nest::Partition, n, false) {
                    w.partition(n, false);
                }
            }
            FaultKind::OneWay => {
                if self.nest(Nest::OneWay, n, false) {
                    w.partition_oneway(n, false);
                }
            }
            FaultKind::Hold | FaultKind::Pause => {
                if self.nest(Nest::Hold, n, false) {
                    w.hold(n, false);
                }
                if f.kind == FaultKind::Pause && self.nest(Nest::Pause, n, false) {
                    w.pause(n, false);
                }
            }
            FaultKind::Latency => {
                let added = self.added(Nest::Latency, n, f, false);
                w.latency(n, added);
            }
            FaultKind::SlowReplies => {
                let added = self.added(Nest::SlowReplies, n, f, false);
                w.reply_latency(n, added);
            }
            FaultKind::StoreCrash => {
                if self.nest(Nest::Store, 0, false) {
                    w.store_down(false);
                }
            }
            FaultKind::Compact => w.compaction(f, false),
            FaultKind::Crash => {
                if self.nest(Nest::Crash, n, false) {
                    w.recover(n);
                }
            }
            FaultKind::MemberCrash
            | FaultKind::MemberIsolation
            | FaultKind::LeaderCrash
            | FaultKind::MemberStall
            | FaultKind::MemberSlow
            | FaultKind::LeaderStall => {
                // Only the fault in force has anything to undo.
                let Some((_, member)) = self.member_fault.take_if(|(g, _)| g == f) else {
                    return;
                };
                match f.kind {
                    FaultKind::MemberIsolation => w.member_isolated(None),
                    FaultKind::MemberStall | FaultKind::LeaderStall => {
                        w.member_stalled(member, false)
                    }
                    FaultKind::MemberSlow => w.member_slowed(member, Duration::ZERO),
                    _ => w.member_down(member, false),
                }
            }
            // Instant faults have no end; a part stopped starts again by itself.
            FaultKind::LeaderTransfer
            | FaultKind::LostReplies
            | FaultKind::CloseStreams
            | FaultKind::LeaderChange
            | FaultKind::Revoke
            | FaultKind::Delete
            | FaultKind::Restart
            | FaultKind::Stop
            | FaultKind::ResumeRevoke => {}
        }
    }
}

/// The member a member fault hits, if it is one and there is a leader: member crashes,
/// isolations, stalls and slowness hit a follower (the next member when the drawn one leads);
/// a leader's loss is the leader crash's and the leader stall's.
fn member_hit(w: &mut impl World, f: &Fault) -> Option<usize> {
    // A transfer names the member it moves to; it hits none.
    if !f.kind.needs_members() || f.kind == FaultKind::LeaderTransfer {
        return None;
    }
    let leader = w.leader()?;
    Some(match f.kind {
        FaultKind::LeaderCrash | FaultKind::LeaderStall => leader,
        _ if f.node % w.members() == leader => (leader + 1) % w.members(),
        _ => f.node % w.members(),
    })
}

/// `f` as the history records it: on `member`, the member it hit, if it hit one.
fn on_member(f: &Fault, member: Option<usize>) -> Fault {
    Fault {
        node: member.unwrap_or(f.node),
        ..f.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A world that keeps the reply latency of each node's link, what it recorded and which
    /// members it stalled, has no node running (nothing to restart), member 0 as its leader
    /// of `members` (one unless set), and ignores the rest.
    #[derive(Default)]
    struct Replies {
        latency: BTreeMap<usize, Duration>,
        recorded: Vec<Happening>,
        members: usize,
        stalled: Vec<(usize, bool)>,
    }

    impl World for Replies {
        fn record(&mut self, what: Happening) {
            self.recorded.push(what);
        }
        fn partition(&mut self, _: usize, _: bool) {}
        fn partition_oneway(&mut self, _: usize, _: bool) {}
        fn hold(&mut self, _: usize, _: bool) {}
        fn pause(&mut self, _: usize, _: bool) {}
        fn latency(&mut self, _: usize, _: Duration) {}
        fn reply_latency(&mut self, node: usize, extra: Duration) {
            self.latency.insert(node, extra);
        }
        fn lose_replies(&mut self, _: usize, _: u32) {}
        fn close_streams(&mut self) {}
        fn leader_change(&mut self) {}
        fn store_down(&mut self, _: bool) {}
        fn compaction(&mut self, _: &Fault, _: bool) {}
        fn operator(&mut self, _: &Fault) {}
        fn crash(&mut self, _: usize) {}
        fn recover(&mut self, _: usize) {}
        fn rolling_restart(&mut self, _: usize) -> bool {
            false
        }
        fn stop_part(&mut self, _: usize, _: PartStopRequest) -> bool {
            true
        }
        fn members(&self) -> usize {
            self.members.max(1)
        }
        fn member_down(&mut self, _: usize, _: bool) {}
        fn member_isolated(&mut self, _: Option<usize>) {}
        fn member_stalled(&mut self, member: usize, stalled: bool) {
            self.stalled.push((member, stalled));
        }
        fn member_slowed(&mut self, _: usize, _: Duration) {}
        fn leader(&mut self) -> Option<usize> {
            Some(0)
        }
        fn transfer_leader(&mut self, _: usize) -> bool {
            false
        }
    }

    fn slow_replies(at: u64, secs: u64, pick: u64) -> Fault {
        Fault {
            at: Duration::from_secs(at),
            kind: FaultKind::SlowReplies,
            node: 3,
            length: Duration::from_secs(secs),
            pick,
        }
    }

    /// `--defaults` seed 2004722's faults: +511 ms for 20 s, and +1,470 ms for 4 s within it.
    /// Each end leaves the largest delay still in force, never the last one set.
    #[test]
    fn overlapping_slow_replies_add_the_largest_delay_in_force() {
        let long = slow_replies(100, 20, 14179843357140752261);
        let short = slow_replies(101, 4, 16664440128777572020);
        assert_eq!(long.added_latency(), Duration::from_millis(511));
        assert_eq!(short.added_latency(), Duration::from_millis(1470));
        let (mut driver, mut world) = (Driver::default(), Replies::default());
        let mut seen = Vec::new();
        for action in actions(&[long, short], |_| true) {
            driver.apply(&mut world, &action);
            seen.push((action.at.as_secs(), world.latency[&3].as_millis()));
        }
        assert_eq!(seen, [(100, 511), (101, 1470), (105, 511), (120, 0)]);
    }

    /// A rolling restart of a node that does not run (crashed) does nothing, and is not
    /// counted.
    #[test]
    fn a_restart_that_finds_nothing_running_is_not_recorded() {
        let restart = Fault {
            at: Duration::from_secs(10),
            kind: FaultKind::Restart,
            node: 1,
            length: Duration::ZERO,
            pick: 0,
        };
        let (mut driver, mut world) = (Driver::default(), Replies::default());
        for action in actions(&[restart], |_| true) {
            driver.apply(&mut world, &action);
        }
        assert_eq!(world.recorded, []);
    }

    /// A member stall drawn on the leader stalls the next member, and the history names the
    /// member it stalled, at its start and at its end: a timeline that named the one drawn
    /// showed a fault on a member it never touched.
    #[test]
    fn a_member_fault_is_recorded_on_the_member_it_hit() {
        let stall = Fault {
            at: Duration::from_secs(10),
            kind: FaultKind::MemberStall,
            node: 3,
            length: Duration::from_secs(2),
            pick: 0,
        };
        let mut world = Replies {
            members: 3,
            ..Replies::default()
        };
        let mut driver = Driver::default();
        for action in actions(&[stall], |_| true) {
            driver.apply(&mut world, &action);
        }
        // Drawn 3, member 0 of 3, the leader: member 1 is stalled instead.
        assert_eq!(world.stalled, [(1, true), (1, false)]);
        let named: Vec<usize> = world
            .recorded
            .iter()
            .filter_map(|h| match h {
                Happening::FaultStart(f) | Happening::FaultEnd(f) => Some(f.node),
                _ => None,
            })
            .collect();
        assert_eq!(named, [1, 1]);
    }
}
