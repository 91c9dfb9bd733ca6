//! Lease deadlines, earliest first, kept lazily.
//!
//! A thousand simulated sessions renew a thousand times a TTL, and each renewal moves its
//! lease's deadline. An ordered set paid a removal and an insertion in a tree of every lease
//! for each; here a renewal only pushes the new deadline, and an entry the lease has since
//! moved past (or a lease gone) is dropped when it comes to the front. The order is the
//! set's: by deadline, then by lease id.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use coord_api::LeaseId;
use tokio::time::Instant;

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct Deadlines {
    heap: BinaryHeap<Reverse<(Instant, LeaseId)>>,
    /// The earliest entry in force, while known.
    front: Option<(Instant, LeaseId)>,
}

impl Deadlines {
    /// Records that lease `id` now ends at `at`; whatever it was set to before goes stale.
    pub(crate) fn set(&mut self, at: Instant, id: LeaseId) {
        self.heap.push(Reverse((at, id)));
        match self.front {
            // The front lease moved: which one is first now is for `first` to find.
            Some((_, front)) if front == id => self.front = None,
            Some(front) if (at, id) < front => self.front = Some((at, id)),
            _ => {}
        }
    }

    /// Records that lease `id` is gone; its entries go stale.
    pub(crate) fn forget(&mut self, id: LeaseId) {
        if self.front.is_some_and(|(_, front)| front == id) {
            self.front = None;
        }
    }

    /// The earliest deadline still in force, and its lease: an entry is in force while
    /// `current(id)` (the lease's deadline now, `None` once it is gone) still gives its
    /// instant. Stale entries in front are dropped on the way.
    pub(crate) fn first(
        &mut self,
        current: impl Fn(LeaseId) -> Option<Instant>,
    ) -> Option<(Instant, LeaseId)> {
        if self.front.is_some() {
            return self.front;
        }
        while let Some(&Reverse((at, id))) = self.heap.peek() {
            if current(id) == Some(at) {
                self.front = Some((at, id));
                return self.front;
            }
            self.heap.pop();
        }
        None
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
        assert!(d.heap.is_empty(), "every stale entry dropped on the way");
    }

    #[test]
    fn ties_go_by_lease_id_as_the_set_did() {
        let at = Instant::now();
        let mut d = Deadlines::default();
        d.set(at, LeaseId(7));
        d.set(at, LeaseId(2));
        assert_eq!(d.first(|_| Some(at)), Some((at, LeaseId(2))));
    }

    proptest::proptest! {
        /// Against the ordered set it replaced: any run of grants, renewals (later or
        /// earlier) and removals gives the same first deadline after each step.
        #[test]
        fn the_front_is_the_ordered_sets(ops in proptest::collection::vec((0u8..3, 0u64..6, 0u64..20), 1..80)) {
            let t0 = Instant::now();
            let mut leases: BTreeMap<LeaseId, Instant> = BTreeMap::new();
            let mut set = std::collections::BTreeSet::new();
            let mut d = Deadlines::default();
            for (op, id, s) in ops {
                let id = LeaseId(id as i64);
                let at = t0 + Duration::from_secs(s);
                if op < 2 {
                    if let Some(old) = leases.insert(id, at) {
                        set.remove(&(old, id));
                    }
                    set.insert((at, id));
                    d.set(at, id);
                } else if let Some(old) = leases.remove(&id) {
                    set.remove(&(old, id));
                    d.forget(id);
                }
                let ours = d.first(|id| leases.get(&id).copied());
                proptest::prop_assert_eq!(ours, set.first().copied());
            }
        }
    }
}
