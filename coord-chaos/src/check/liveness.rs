//! The liveness and timeliness invariants: after the heal instant, or after each fault.

use std::time::Duration;

use super::{Ctx, Violation};
use crate::fault::FaultKind;
use crate::history::{Happening, Incarnation};
use crate::node::host_key;

pub(super) fn check(ctx: &Ctx<'_>, out: &mut Vec<Violation>) {
    l1_self_healing(ctx, out);
    l2_blip_ride_through(ctx, out);
    l3_dead_host_expiry(ctx, out);
    l4_watcher_convergence(ctx, out);
    l5_leader_exists(ctx, out);
    l6_failover(ctx, out);
    l7_graceful_stop(ctx, out);
}

fn v(invariant: &'static str, at: Duration, nodes: &[Incarnation], detail: String) -> Violation {
    Violation {
        invariant,
        at,
        nodes: nodes.iter().map(|n| n.to_string()).collect(),
        detail,
    }
}

/// The bound for healing after `t_h`: τ + B + ET (a leader change's lease extension) + RTT.
fn heal_bound(ctx: &Ctx<'_>) -> Duration {
    let s = ctx.scenario;
    s.ttl + s.max_backoff + s.election_timeout + ctx.rtt()
}

/// Each node's last incarnation, if it is alive at the end.
fn live_at_end(ctx: &Ctx<'_>) -> Vec<Incarnation> {
    let mut last: std::collections::BTreeMap<usize, Incarnation> = Default::default();
    for who in ctx.beliefs.started.keys() {
        let e = last.entry(who.node).or_insert(*who);
        if who.inc > e.inc {
            *e = *who;
        }
    }
    last.into_values()
        .filter(|w| !ctx.beliefs.crashed.contains_key(w) && !ctx.beliefs.stopped.contains_key(w))
        .collect()
}

/// L1: by t_h + τ + B + ET + RTT every live node is registered, believes it, and stays so.
fn l1_self_healing(ctx: &Ctx<'_>, out: &mut Vec<Violation>) {
    let from = ctx.beliefs.heal + heal_bound(ctx);
    if from >= ctx.end {
        return;
    }
    for who in live_at_end(ctx) {
        let key = host_key(who.node);
        // The key must exist under this incarnation's lease from `from` to the end.
        let span = ctx.truth.key_spans.iter().find(|s| {
            s.key == key
                && ctx.truth.granted_by(s.lease) == Some(who)
                && s.from <= from
                && s.until.is_none()
        });
        let covered = span.is_some();
        let believed = ctx.beliefs.registered.iter().any(|r| {
            r.who == who
                && r.from <= from
                && r.until >= ctx.end
                && span.is_none_or(|s| s.lease == r.lease)
        });
        if !covered || !believed {
            out.push(v(
                "L1",
                from,
                &[who],
                format!(
                    "not registered for good by {:.3}s (heal + {:.3}s): key held to the end: {covered}, believed: {believed}",
                    from.as_secs_f64(),
                    heal_bound(ctx).as_secs_f64()
                ),
            ));
        }
    }
}

/// L2: a disruption between one node and the store shorter than τ − 2·KA − 2·RTT (KA = τ/3,
/// the renewal period; the bound for a client that renews on its cadence rather than at once
/// on reconnect), with nothing else going on, deletes none of the node's keys and ends none of
/// its beliefs.
fn l2_blip_ride_through(ctx: &Ctx<'_>, out: &mut Vec<Violation>) {
    let ttl = ctx.scenario.ttl;
    let bound = (ttl / 3).saturating_sub(ctx.scenario.rtt());
    let blips = [FaultKind::Partition, FaultKind::OneWay, FaultKind::Hold];
    for f in &ctx.beliefs.faults {
        if !blips.contains(&f.fault.kind) || f.until - f.from >= bound {
            continue;
        }
        let (from, until) = (f.from, f.until + ttl);
        let alone = !ctx
            .beliefs
            .faults
            .iter()
            .any(|g| !std::ptr::eq(g, f) && g.from <= until && g.until + ttl >= f.from);
        if !alone || until >= ctx.end {
            continue;
        }
        let n = f.fault.node;
        let who: Vec<Incarnation> = ctx
            .beliefs
            .started
            .iter()
            .filter(|(w, at)| w.node == n && **at <= from)
            .map(|(w, _)| *w)
            .collect();
        let Some(who) = who.last().copied() else {
            continue;
        };
        if ctx.beliefs.crashed.contains_key(&who) || ctx.beliefs.stopped.contains_key(&who) {
            continue;
        }
        // Deleted by the store (expiry) or an operator; the node's own resignations and
        // clean-ups are its business.
        let own = |o: coord_sim::journal::Origin| match o {
            coord_sim::journal::Origin::Client(c) => ctx.truth.incarnation_of(c) == Some(who),
            _ => false,
        };
        let lost_key = ctx.truth.deletions.iter().find(|d| {
            d.at >= from
                && d.at <= until
                && ctx.truth.granted_by(d.lease) == Some(who)
                && !own(d.origin)
        });
        let lost_lead = ctx.beliefs.leading.iter().find(|l| {
            l.who == who && !l.resigned && l.from < from && l.until >= from && l.until <= until
        });
        let lost_reg = ctx
            .beliefs
            .registered
            .iter()
            .find(|r| r.who == who && r.from < from && r.until >= from && r.until <= until);
        let what = match (lost_key, lost_lead, lost_reg) {
            (Some(d), _, _) => format!(
                "its key {} was deleted at {:.3}s",
                d.key,
                d.at.as_secs_f64()
            ),
            (_, Some(l), _) => format!(
                "it lost its leadership of e{} at {:.3}s",
                l.election,
                l.until.as_secs_f64()
            ),
            (_, _, Some(r)) => format!(
                "it stopped believing it is registered at {:.3}s",
                r.until.as_secs_f64()
            ),
            _ => continue,
        };
        out.push(v(
            "L2",
            f.from,
            &[who],
            format!(
                "a {} of {:.3}s (ride-through bound {:.3}s): {what}",
                f.fault.kind,
                (f.until - f.from).as_secs_f64(),
                bound.as_secs_f64()
            ),
        ));
    }
}

/// L3: a crashed incarnation's leases end by their last renewal + τ, or by a later lease
/// refresh (leader change, store restart) + ET + τ.
fn l3_dead_host_expiry(ctx: &Ctx<'_>, out: &mut Vec<Violation>) {
    let slack = Duration::from_millis(1);
    for (who, crashed) in &ctx.beliefs.crashed {
        for (lease, (client, _)) in &ctx.truth.grants {
            if ctx.truth.incarnation_of(*client) != Some(*who) {
                continue;
            }
            let ended = ctx.truth.lease_ends.get(lease).copied();
            if ended.is_some_and(|e| e <= *crashed) {
                continue;
            }
            // Renewals still in flight when it crashed arrive afterwards (within one
            // message's latency) and count.
            let bound = expiry_bound(ctx, *lease, *crashed + ctx.rtt()) + slack;
            let late = match ended {
                Some(e) => e > bound,
                None => ctx.end > bound,
            };
            if late {
                out.push(v(
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

/// When the store ought to have ended `lease`, counting renewals up to `since` only: its last
/// renewal + τ, moved by every refresh before then (a leader change: + ET + τ) and by every
/// store downtime covering it (nothing expires while the store is down; the restart
/// refreshes).
fn expiry_bound(ctx: &Ctx<'_>, lease: coord_api::LeaseId, since: Duration) -> Duration {
    let ttl = ctx.scenario.ttl;
    let renewed = ctx
        .truth
        .renewals
        .get(&lease)
        .and_then(|r| r.iter().rev().find(|t| **t <= since).copied())
        .or_else(|| ctx.truth.grants.get(&lease).map(|g| g.1))
        .unwrap_or_default();
    let mut bound = renewed + ttl;
    loop {
        let before = bound;
        for (at, extend) in &ctx.truth.promotes {
            if *at >= renewed && *at <= bound {
                bound = bound.max(*at + *extend + ttl);
            }
        }
        for f in &ctx.beliefs.faults {
            if f.fault.kind == FaultKind::StoreCrash && f.from <= bound && f.until >= bound {
                bound = bound.max(f.until + ctx.scenario.election_timeout + ttl);
            }
        }
        if bound == before {
            return bound;
        }
    }
}

/// L4: once the hosts stop changing, every live watcher's view converges to the truth.
fn l4_watcher_convergence(ctx: &Ctx<'_>, out: &mut Vec<Violation>) {
    let last_change = ctx
        .truth
        .transitions
        .values()
        .flatten()
        .map(|t| ctx.truth.revision_at[&t.revision])
        .max()
        .unwrap_or_default();
    let settle = ctx.rtt() + Duration::from_secs(2);
    if last_change + settle >= ctx.end || ctx.beliefs.heal + heal_bound(ctx) >= ctx.end {
        return;
    }
    let truth: std::collections::BTreeSet<String> = ctx
        .truth
        .final_keys
        .keys()
        .filter_map(|k| k.strip_prefix(crate::node::HOSTS).map(str::to_owned))
        .collect();
    for who in live_at_end(ctx) {
        if who.node >= ctx.scenario.watchers {
            continue;
        }
        let last = ctx
            .history
            .records
            .iter()
            .rev()
            .find_map(|r| match &r.what {
                Happening::View {
                    who: w,
                    hosts,
                    revision,
                } if *w == who => Some((hosts, *revision)),
                _ => None,
            });
        let Some((hosts, revision)) = last else {
            continue;
        };
        let view: std::collections::BTreeSet<String> = hosts.iter().cloned().collect();
        if view != truth {
            out.push(v(
                "L4",
                last_change + settle,
                &[who],
                format!(
                    "final view {view:?} (revision {revision}) differs from the store's {truth:?}"
                ),
            ));
        }
    }
}

/// L5: after t_h + τ + B + ET + RTT, no election goes without a leader for longer than
/// τ + B + 2RTT.
fn l5_leader_exists(ctx: &Ctx<'_>, out: &mut Vec<Violation>) {
    let from = ctx.beliefs.heal + heal_bound(ctx);
    let gap_bound = ctx.scenario.ttl + ctx.scenario.max_backoff + ctx.rtt() * 2;
    if from >= ctx.end || live_at_end(ctx).is_empty() {
        return;
    }
    for e in 0..ctx.scenario.elections {
        let mut spans: Vec<(Duration, Duration)> = ctx
            .beliefs
            .leading
            .iter()
            .filter(|l| l.election == e && l.until > from)
            .map(|l| (l.from.max(from), l.until))
            .collect();
        spans.sort();
        let mut covered_to = from;
        let mut worst = (Duration::ZERO, from);
        for (a, b) in spans.iter().copied().chain([(ctx.end, ctx.end)]) {
            if a > covered_to && a - covered_to > worst.0 {
                worst = (a - covered_to, covered_to);
            }
            covered_to = covered_to.max(b);
        }
        if worst.0 > gap_bound {
            out.push(v(
                "L5",
                worst.1,
                &[],
                format!(
                    "election e{e} had no leader for {:.3}s after the heal (bound {:.3}s)",
                    worst.0.as_secs_f64(),
                    gap_bound.as_secs_f64()
                ),
            ));
        }
    }
}

/// L6: when a leader crashes and nothing else is wrong, the candidate next in the queue leads
/// within one round trip (plus a retry pause) of the old key's expiry, if it is alive: a
/// successor that crashed too is not promised anything (its key blocks the queue until it
/// expires, and L5 bounds that).
fn l6_failover(ctx: &Ctx<'_>, out: &mut Vec<Violation>) {
    let quiet_kinds: Vec<FaultKind> = FaultKind::ALL
        .into_iter()
        .filter(|k| *k != FaultKind::Crash)
        .collect();
    for l in ctx.beliefs.leading.iter().filter(|l| l.crashed) {
        let prefix = crate::node::election_name(l.election);
        let Some(d) = ctx
            .truth
            .deletions
            .iter()
            .find(|d| d.create_revision == l.token && d.key.starts_with(&prefix))
        else {
            continue;
        };
        let bound = d.at + ctx.rtt() + Duration::from_millis(500);
        if bound >= ctx.end
            || ctx.beliefs.fault_near(
                None,
                &quiet_kinds,
                l.until.saturating_sub(ctx.scenario.ttl),
                bound,
            )
        {
            continue;
        }
        // The next in the queue: the election's oldest key once the old one is gone, and who
        // campaigned with it.
        let Some(successor) = ctx.truth.leader_after(l.election, d.revision) else {
            continue;
        };
        let Some(owner) = ctx
            .truth
            .key_spans
            .iter()
            .find(|s| s.create_revision == successor && s.key.starts_with(&prefix))
            .and_then(|s| ctx.truth.granted_by(s.lease))
        else {
            continue;
        };
        let alive = ctx.beliefs.crashed.get(&owner).is_none_or(|c| *c > bound)
            && ctx.beliefs.stopping.get(&owner).is_none_or(|s| *s > bound);
        if !alive {
            continue;
        }
        let next = ctx
            .beliefs
            .leading
            .iter()
            .filter(|n| n.election == l.election && n.from >= l.from && n.token != l.token)
            .map(|n| n.from)
            .min();
        if next.is_none_or(|n| n > bound) {
            out.push(v(
                "L6",
                bound,
                &[l.who, owner],
                format!(
                    "election e{}: the leader crashed, its key expired at {:.3}s, and {owner} (next in the queue, token {successor}) did not lead by {:.3}s",
                    l.election,
                    d.at.as_secs_f64(),
                    bound.as_secs_f64()
                ),
            ));
        }
    }
}

/// L7: a stop that returned cleanly removed what the incarnation held when it began: its
/// registration's key and its leaders' keys. (Keys under leases it had already given up are
/// L3's business: they expire by its bound.)
fn l7_graceful_stop(ctx: &Ctx<'_>, out: &mut Vec<Violation>) {
    for (who, (at, clean)) in &ctx.beliefs.stopped {
        let Some(began) = ctx.beliefs.stopping.get(who).copied() else {
            continue;
        };
        if !clean {
            continue;
        }
        let held = |from: Duration, until: Duration| from <= began && until >= began;
        let mut leases: Vec<(coord_api::LeaseId, String)> = ctx
            .beliefs
            .registered
            .iter()
            .filter(|r| r.who == *who && held(r.from, r.until))
            .map(|r| (r.lease, "its registration".to_owned()))
            .collect();
        for l in ctx
            .beliefs
            .leading
            .iter()
            .filter(|l| l.who == *who && held(l.from, l.until))
        {
            let prefix = crate::node::election_name(l.election);
            if let Some(span) = ctx
                .truth
                .key_spans
                .iter()
                .find(|s| s.create_revision == l.token && s.key.starts_with(&prefix))
            {
                leases.push((span.lease, format!("its leadership of e{}", l.election)));
            }
        }
        for s in &ctx.truth.key_spans {
            let Some((_, what)) = leases.iter().find(|(l, _)| *l == s.lease) else {
                continue;
            };
            if s.from <= *at && s.until.is_none_or(|u| u > *at) {
                out.push(v(
                    "L7",
                    *at,
                    &[*who],
                    format!(
                        "{} (lease {}, {what}) outlived the stop at {:.3}s",
                        s.key,
                        s.lease,
                        at.as_secs_f64()
                    ),
                ));
            }
        }
    }
}
