//! Lease deadlines, earliest first, kept lazily.
//!
//! A thousand simulated sessions renew a thousand times a TTL, and each renewal moves its
//! lease's deadline. An ordered set paid a removal and an insertion in a tree of every lease
//! for each; here a renewal only pushes the new deadline, and an entry the lease has since
//! moved past (or a lease gone) is dropped when it comes to the front. The order is the
//! set's: by deadline, then by lease id.
//!
//! A deadline is the instant a renewal landed plus its lease's TTL, and the clock only moves
//! forward, so the deadlines of leases of one TTL come in order. They are kept in runs that
//! only grow at the back: a deadline goes at the back of the first run it does not precede,
//! and the earliest is at the front of one of them (a binary heap of every entry paid a sift
//! of a dozen levels for each stale entry dropped). What fits no run (more TTLs than runs, or
//! renewals after a leader change pushed every deadline late) goes into a heap.
//!
//! Deadlines equal to the nanosecond are common (sessions started together renew together:
//! at 1,000 hosts, all of them in one instant each second), and land in a run in renewal
//! order, not lease order. Which lease of a tie comes first matters only to the expiry of
//! the tie (leases expire in id order, as they did from the set); the store asks most often
//! when the next deadline is, and for that any entry of the earliest instant in force
//! answers. A run sorts the tie at its front only when asked for the first lease.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use coord_api::LeaseId;
use tokio::time::Instant;

/// How many runs a deadline may go into before it goes into the heap: one per TTL in use,
/// and one more for the deadlines a leader change pushed late.
const RUNS: usize = 4;

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct Deadlines {
    runs: Vec<Run>,
    /// What fits no run.
    heap: BinaryHeap<Reverse<(Instant, LeaseId)>>,
    /// An entry in force at the earliest instant, while known.
    front: Option<Front>,
}

/// An entry in force at the earliest instant; `ordered` when its lease is the least of that
/// instant's.
#[derive(Debug, Clone, Copy)]
struct Front {
    at: Instant,
    id: LeaseId,
    ordered: bool,
}

/// Deadlines in order of instant; entries of one instant in any order, but for the first
/// `sorted`, which hold every entry of the front's instant, in lease order.
#[derive(Debug, Default)]
struct Run {
    due: VecDeque<(Instant, LeaseId)>,
    sorted: usize,
}

impl Run {
    /// The run's earliest entry; with `ordered`, the least lease of its instant (the tie
    /// sorted first if it is not yet).
    fn first(&mut self, ordered: bool) -> Option<(Instant, LeaseId)> {
        let &(at, _) = self.due.front()?;
        if ordered && self.sorted == 0 {
            let tie = self.due.iter().take_while(|e| e.0 == at).count();
            if tie > 1 {
                // One instant: the lease decides.
                let (head, _) = self.due.as_mut_slices();
                match head.get_mut(..tie) {
                    Some(tie) => tie.sort_unstable_by_key(|e| e.1),
                    // The tie wraps around the ring's end: rare, once per lap at most.
                    None => self.due.make_contiguous()[..tie].sort_unstable_by_key(|e| e.1),
                }
            }
            self.sorted = tie;
        }
        self.due.front().copied()
    }

    fn pop(&mut self) {
        self.due.pop_front();
        self.sorted = self.sorted.saturating_sub(1);
    }
}

/// Where the earliest entry is.
#[derive(Clone, Copy)]
enum Source {
    Run(usize),
    Heap,
}

impl Deadlines {
    /// Records that lease `id` now ends at `at`; whatever it was set to before goes stale.
    pub(crate) fn set(&mut self, at: Instant, id: LeaseId) {
        self.push(at, id);
        match self.front {
            // The front lease moved: which one is first now is for `find` to find.
            Some(front) if front.id == id => self.front = None,
            // Earlier than every entry in force, it is the least of its instant; at the
            // front's instant, it is the least if the front was.
            Some(front) if (at, id) < (front.at, front.id) => {
                self.front = Some(Front {
                    at,
                    id,
                    ordered: front.ordered || at < front.at,
                })
            }
            _ => {}
        }
    }

    fn push(&mut self, at: Instant, id: LeaseId) {
        let fits = self
            .runs
            .iter()
            .position(|run| run.due.back().is_none_or(|last| last.0 <= at));
        let run = match fits {
            Some(i) => &mut self.runs[i],
            None if self.runs.len() < RUNS => {
                self.runs.push(Run::default());
                self.runs.last_mut().expect("just pushed")
            }
            None => return self.heap.push(Reverse((at, id))),
        };
        if run.due.front().is_some_and(|first| first.0 == at) {
            // Joins the front's tie: sorted again when next asked for.
            run.sorted = 0;
        }
        run.due.push_back((at, id));
    }

    /// Records that lease `id` is gone; its entries go stale.
    pub(crate) fn forget(&mut self, id: LeaseId) {
        if self.front.is_some_and(|front| front.id == id) {
            self.front = None;
        }
    }

    /// The earliest deadline still in force, and its lease (of leases with that deadline,
    /// the least): an entry is in force while `current(id)` (the lease's deadline now,
    /// `None` once it is gone) still gives its instant. Stale entries in front are dropped on
    /// the way.
    #[inline]
    pub(crate) fn first(
        &mut self,
        current: impl Fn(LeaseId) -> Option<Instant>,
    ) -> Option<(Instant, LeaseId)> {
        match self.front {
            Some(front) if front.ordered => Some((front.at, front.id)),
            _ => self.find(current, true).map(|f| (f.at, f.id)),
        }
    }

    /// The earliest deadline still in force, as [`first`](Self::first) finds it, without
    /// sorting a tie to find its least lease.
    #[inline]
    pub(crate) fn next(&mut self, current: impl Fn(LeaseId) -> Option<Instant>) -> Option<Instant> {
        match self.front {
            Some(front) => Some(front.at),
            None => self.find(current, false).map(|f| f.at),
        }
    }

    /// An entry in force at the earliest instant, the least lease of it if `ordered`, when
    /// the front is not known: out of line, so the known front (most calls) costs no more
    /// than a look.
    #[inline(never)]
    fn find(
        &mut self,
        current: impl Fn(LeaseId) -> Option<Instant>,
        ordered: bool,
    ) -> Option<Front> {
        loop {
            let mut earliest = self.heap.peek().map(|e| (e.0, Source::Heap));
            for (i, run) in self.runs.iter_mut().enumerate() {
                if let Some(first) = run.first(ordered) {
                    if earliest.is_none_or(|(e, _)| first < e) {
                        earliest = Some((first, Source::Run(i)));
                    }
                }
            }
            let ((at, id), source) = earliest?;
            if current(id) == Some(at) {
                self.front = Some(Front { at, id, ordered });
                return self.front;
            }
            match source {
                Source::Run(i) => self.runs[i].pop(),
                Source::Heap => {
                    self.heap.pop();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_earliest_deadline_in_force_comes_first_and_stale_ones_never() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut leases: BTreeMap<LeaseId, Instant> = BTreeMap::new();
        let mut d = Deadlines::default();
        let set = |leases: &mut BTreeMap<LeaseId, Instant>, d: &mut Deadlines, id, s| {
            leases.insert(LeaseId(id), at(s));
            d.set(at(s), LeaseId(id));
        };
        set(&mut leases, &mut d, 1, 5);
        set(&mut leases, &mut d, 2, 3);
        set(&mut leases, &mut d, 3, 3);
        // Renewed: lease 2's deadline at 3 goes stale.
        set(&mut leases, &mut d, 2, 9);
        let first = |d: &mut Deadlines, leases: &BTreeMap<LeaseId, Instant>| {
            d.first(|id| leases.get(&id).copied())
        };
        assert_eq!(first(&mut d, &leases), Some((at(3), LeaseId(3))));
        leases.remove(&LeaseId(3));
        d.forget(LeaseId(3));
        assert_eq!(first(&mut d, &leases), Some((at(5), LeaseId(1))));
        // Moved earlier (a renewal after a leader change's refresh): the earlier one counts.
        set(&mut leases, &mut d, 2, 4);
        assert_eq!(first(&mut d, &leases), Some((at(4), LeaseId(2))));
        leases.remove(&LeaseId(2));
        d.forget(LeaseId(2));
        assert_eq!(first(&mut d, &leases), Some((at(5), LeaseId(1))));
        leases.remove(&LeaseId(1));
        d.forget(LeaseId(1));
        assert_eq!(first(&mut d, &leases), None);
        assert!(
            d.heap.is_empty() && d.runs.iter().all(|run| run.due.is_empty()),
            "every stale entry dropped on the way"
        );
    }

    #[test]
    fn a_tie_across_the_rings_end_still_goes_by_lease_id() {
        let t0 = Instant::now();
        let mut wrapped = 0;
        for stale in 1..24u64 {
            let mut d = Deadlines::default();
            for s in 0..stale {
                d.set(t0 + Duration::from_secs(s), LeaseId(100 + s as i64));
            }
            // Gone: dropped from the front, which moves along the ring.
            assert_eq!(d.first(|_| None), None);
            let tie = t0 + Duration::from_secs(60);
            for id in (1..=8).rev() {
                d.set(tie, LeaseId(id));
            }
            let mut current: BTreeMap<LeaseId, Instant> =
                (1..=8).map(|id| (LeaseId(id), tie)).collect();
            if !d.runs[0].due.as_slices().1.is_empty() {
                wrapped += 1;
            }
            for id in 1..=8 {
                assert_eq!(
                    d.first(|id| current.get(&id).copied()),
                    Some((tie, LeaseId(id)))
                );
                current.remove(&LeaseId(id));
                d.forget(LeaseId(id));
            }
            assert_eq!(d.first(|id| current.get(&id).copied()), None);
        }
        assert!(wrapped > 0, "no case had its tie across the ring's end");
    }

    #[test]
    fn ties_go_by_lease_id_as_the_set_did() {
        let at = Instant::now();
        let mut d = Deadlines::default();
        d.set(at, LeaseId(7));
        d.set(at, LeaseId(2));
        assert_eq!(d.first(|_| Some(at)), Some((at, LeaseId(2))));
    }

    /// Applies `ops` (grant or renew `id` to end at `at`, or remove it) to `d` and to the
    /// ordered set it replaced, comparing their first deadline after each.
    fn against_the_set(ops: impl IntoIterator<Item = (bool, LeaseId, Instant)>) {
        let mut leases: BTreeMap<LeaseId, Instant> = BTreeMap::new();
        let mut set = std::collections::BTreeSet::new();
        let mut d = Deadlines::default();
        for (step, (remove, id, at)) in ops.into_iter().enumerate() {
            if !remove {
                if let Some(old) = leases.insert(id, at) {
                    set.remove(&(old, id));
                }
                set.insert((at, id));
                d.set(at, id);
            } else if let Some(old) = leases.remove(&id) {
                set.remove(&(old, id));
                d.forget(id);
            }
            // The store asks when far more often than which: both, in a mix of runs.
            if step % 3 != 2 {
                let when = d.next(|id| leases.get(&id).copied());
                assert_eq!(when, set.first().map(|&(at, _)| at), "next, step {step}");
            }
            if step % 4 != 1 {
                let ours = d.first(|id| leases.get(&id).copied());
                assert_eq!(ours, set.first().copied(), "first, step {step}");
            }
        }
    }

    #[test]
    fn a_tie_is_put_in_lease_order_only_when_its_first_lease_is_asked_for() {
        let at = Instant::now() + Duration::from_secs(3);
        let mut current: BTreeMap<LeaseId, Instant> = BTreeMap::new();
        let mut d = Deadlines::default();
        for id in [5, 3, 9, 1, 7] {
            current.insert(LeaseId(id), at);
            d.set(at, LeaseId(id));
        }
        assert_eq!(d.next(|id| current.get(&id).copied()), Some(at));
        // The front the question found is the renewal order's, not yet the least lease.
        assert!(d.front.is_some_and(|f| !f.ordered));
        assert_eq!(
            d.first(|id| current.get(&id).copied()),
            Some((at, LeaseId(1)))
        );
        // The least renews: the tie's next least comes first, and the instant stays.
        let later = at + Duration::from_secs(1);
        current.insert(LeaseId(1), later);
        d.set(later, LeaseId(1));
        assert_eq!(d.next(|id| current.get(&id).copied()), Some(at));
        assert_eq!(
            d.first(|id| current.get(&id).copied()),
            Some((at, LeaseId(3)))
        );
        // One of the tie moves, not the front: still the front.
        current.insert(LeaseId(9), later);
        d.set(later, LeaseId(9));
        assert_eq!(
            d.first(|id| current.get(&id).copied()),
            Some((at, LeaseId(3)))
        );
        // A lease joins a tie whose front is the renewal order's, below that front and
        // above the tie's least: it is not the least for that.
        let tie = at + Duration::from_secs(2);
        for id in [8, 2, 6] {
            current.insert(LeaseId(id), tie);
            d.set(tie, LeaseId(id));
        }
        for id in [3, 5, 7] {
            current.insert(LeaseId(id), later + Duration::from_secs(5));
            d.set(later + Duration::from_secs(5), LeaseId(id));
        }
        current.remove(&LeaseId(1));
        d.forget(LeaseId(1));
        current.remove(&LeaseId(9));
        d.forget(LeaseId(9));
        assert_eq!(d.next(|id| current.get(&id).copied()), Some(tie));
        current.insert(LeaseId(4), tie);
        d.set(tie, LeaseId(4));
        assert_eq!(
            d.first(|id| current.get(&id).copied()),
            Some((tie, LeaseId(2)))
        );
    }

    proptest::proptest! {
        /// Any run of grants, renewals (later or earlier) and removals gives the ordered
        /// set's first deadline after each step.
        #[test]
        fn the_front_is_the_ordered_sets(ops in proptest::collection::vec((0u8..3, 0u64..6, 0u64..20), 1..80)) {
            let t0 = Instant::now();
            against_the_set(ops.into_iter().map(|(op, id, s)| {
                (op == 2, LeaseId(id as i64), t0 + Duration::from_secs(s))
            }));
        }

        /// As a store sees them: a clock that only moves forward (often not at all, so
        /// deadlines tie), leases of several TTLs, and now and then a refresh that pushes a
        /// lease's deadline late (a leader change). More TTLs than runs spill into the heap.
        #[test]
        fn the_front_is_the_ordered_sets_as_a_store_pushes(
            ops in proptest::collection::vec((0u8..8, 0u64..12, 0u64..3, 0usize..6), 1..200),
        ) {
            let t0 = Instant::now();
            let ttls = [3, 5, 10, 20, 30, 60];
            let mut now = 0;
            against_the_set(ops.into_iter().map(|(op, id, step, ttl)| {
                now += step;
                let ttl = match op {
                    // A refresh: the election timeout on top of the TTL.
                    7 => ttls[ttl] + 2,
                    _ => ttls[ttl],
                };
                (op == 6, LeaseId(id as i64), t0 + Duration::from_secs(now + ttl))
            }));
        }
    }
}
