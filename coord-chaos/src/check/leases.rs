//! L3: the leases of a crashed incarnation end in time.

use std::time::Duration;

use super::{Run, Violation};
use crate::fault::FaultKind;

/// L3: a crashed incarnation's leases end by their last renewal + τ, or by a later lease
/// refresh (leader change, store restart) + ET + τ.
pub(super) fn l3_dead_host_expiry(run: &Run<'_>, out: &mut Vec<Violation>) {
    let slack = Duration::from_millis(1);
    for (who, crashed) in &run.beliefs.crashed {
        for (lease, (client, _)) in &run.truth.grants {
            if run.truth.incarnation_of(*client) != Some(*who) {
                continue;
            }
            let ended = run.truth.lease_ends.get(lease).copied();
            if ended.is_some_and(|e| e <= *crashed) {
                continue;
            }
            // Renewals still in flight when it crashed arrive afterwards and count.
            let bound = expiry_bound(run, *lease, last_arrival(run, *crashed)) + slack;
            let late = match ended {
                Some(e) => e > bound,
                None => run.end > bound,
            };
            if late {
                out.push(run.violation(
                    "L3",
                    bound,
                    &[*who],
                    format!(
                        "lease {lease} of a crashed incarnation ended at {} (bound {:.3}s)",
                        ended.map_or("never".to_owned(), |e| format!("{:.3}s", e.as_secs_f64())),
                        bound.as_secs_f64()
                    ),
                ));
            }
        }
    }
}

/// Until when a request sent before `crashed` may still reach the store: one message's latency
/// on, or later when a member held it. A stalled member reads what it was sent once it thaws,
/// and a renewal it held is applied then (turmoil seed 90949: a renewal sent 1.8 s before the
/// crash to a raft leader stalled for 5 s renewed the lease at the thaw, 3.3 s after the
/// crash); a slow member serves each request its delay late.
fn last_arrival(run: &Run<'_>, crashed: Duration) -> Duration {
    let mut at = crashed + run.rtt();
    for f in &run.beliefs.faults {
        if f.from > crashed || f.until < crashed {
            continue;
        }
        let held_until = match f.fault.kind {
            FaultKind::MemberStall | FaultKind::LeaderStall => f.until,
            FaultKind::MemberSlow => crashed + f.fault.added_latency(),
            _ => continue,
        };
        at = at.max(held_until + run.rtt());
    }
    at
}

/// `bound`, moved by every renewal of `lease` that a stalled or slow member held and applied
/// after `from` and by then: one applied at a stall's thaw, or while a member answered late.
/// Its incarnation sent it while it still kept the lease (a graceful stop keeps its lease
/// until the stop ends, and a stop's own writes are held in the same member), and the member
/// applies it however late it thaws (turmoil seed 9100699's S7: an old incarnation's renewal,
/// sent 0.1 s after the new one registered to a raft leader stalled for 2.5 s, renewed its
/// lease at the thaw while a partition kept its stop from removing its key).
pub(super) fn moved_by_held_renewals(
    run: &Run<'_>,
    lease: coord_api::LeaseId,
    from: Duration,
    bound: Duration,
) -> Duration {
    let held = |at: Duration| {
        run.beliefs.faults.iter().any(|f| match f.fault.kind {
            FaultKind::MemberStall | FaultKind::LeaderStall => {
                f.until <= at && at <= f.until + run.rtt()
            }
            FaultKind::MemberSlow => {
                f.from <= at && at <= f.until + f.fault.added_latency() + run.rtt()
            }
            _ => false,
        })
    };
    let mut bound = bound;
    // In order: a renewal that moves the bound may let a later one count.
    for at in run.truth.renewals.get(&lease).into_iter().flatten() {
        if *at > from && *at <= bound && held(*at) {
            bound = bound.max(moved_by_refreshes(
                run,
                *at,
                *at + run.scenario.ttl + run.rtt(),
            ));
        }
    }
    bound
}

/// When the store ought to have ended `lease`, counting renewals up to `since` only: its last
/// renewal + τ, moved by every refresh before then (a leader change: + ET + τ) and by every
/// store downtime covering it (nothing expires while the store is down; the restart
/// refreshes).
fn expiry_bound(run: &Run<'_>, lease: coord_api::LeaseId, since: Duration) -> Duration {
    let ttl = run.scenario.ttl;
    let renewed = run
        .truth
        .renewals
        .get(&lease)
        .and_then(|r| r.iter().rev().find(|t| **t <= since).copied())
        .or_else(|| run.truth.grants.get(&lease).map(|g| g.1))
        .unwrap_or_default();
    moved_by_refreshes(run, renewed, renewed + ttl)
}

/// `bound`, a time by which a lease should be gone counting from `from`, moved by every
/// refresh of the leases from `from` until then (a leader change: + ET + τ) and by every
/// store downtime covering it (nothing expires while the store is down; the restart
/// refreshes).
pub(super) fn moved_by_refreshes(run: &Run<'_>, from: Duration, bound: Duration) -> Duration {
    let ttl = run.scenario.ttl;
    let mut bound = bound;
    loop {
        let before = bound;
        for (at, extend) in &run.truth.promotes {
            if *at >= from && *at <= bound {
                bound = bound.max(*at + *extend + ttl);
            }
        }
        for f in &run.beliefs.faults {
            if f.fault.kind == FaultKind::StoreCrash && f.from <= bound && f.until >= bound {
                bound = bound.max(f.until + run.scenario.election_timeout + ttl);
            }
        }
        if bound == before {
            return bound;
        }
    }
}
