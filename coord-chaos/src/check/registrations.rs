//! The invariants of coord's registrations: S6 (no foreign deletes), S7 (one registration per
//! host), L1 (self-healing, and a lone loss healed within the backoff's first step), L2
//! (ride-through), M1 (writes carry the latest metadata).

use std::time::Duration;

use coord_sim::journal::{Entry, Origin};

use super::elections::{heal_bound, live_at_end};
use super::{FaultSpan, Run, Violation};
use crate::fault::FaultKind;
use crate::history::{Happening, Incarnation, Part};
use crate::keys::{host_key, metadata_generation, HOSTS};

/// S8: a registration is not believed past its lease's end. The store expires a lease no
/// earlier than the registration's local deadline, so a belief in an expired lease must end
/// by the expiry, whatever the network did; after a revoke it ends within the notice bound
/// (a round trip when the node's link is sound, its session's deadline otherwise). A
/// readiness probe reads this belief.
pub(super) fn s8_registration_belief(run: &Run<'_>, out: &mut Vec<Violation>) {
    let window = run.rtt();
    for b in &run.beliefs.registered {
        let Some(end) = run.truth.lease_ends.get(&b.lease).copied() else {
            continue;
        };
        if b.until <= end {
            continue;
        }
        let bound = if run.truth.expired.contains(&b.lease) {
            Duration::ZERO
        } else {
            let disturbed: Vec<FaultKind> = FaultKind::ALL
                .into_iter()
                .filter(|k| k.disturbs_link())
                .collect();
            let faulty = run.beliefs.fault_near(
                Some(b.who.node),
                &disturbed,
                end.saturating_sub(run.scenario.ttl),
                end + window,
            );
            if faulty {
                run.scenario.ttl + window
            } else {
                window
            }
        };
        // A paused process learns nothing until it runs again.
        let paused_until = run
            .beliefs
            .faults
            .iter()
            .filter(|f| {
                f.fault.kind == FaultKind::Pause
                    && f.fault.node == b.who.node
                    && super::overlaps(f, b.from, b.until)
            })
            .map(|f| f.until)
            .max();
        if paused_until.is_some_and(|p| b.until <= p + window) {
            continue;
        }
        if b.until > end + bound {
            out.push(run.violation(
                "S8",
                end + bound,
                &[b.who],
                format!(
                    "believed {} registered under lease {} until {:.3}s, {:.3}s after the lease ended at the store{}",
                    b.key,
                    b.lease,
                    b.until.as_secs_f64(),
                    (b.until - end).as_secs_f64(),
                    if bound.is_zero() { " by expiry" } else { "" }
                ),
            ));
        }
    }
}

/// S6: a node deletes (or revokes away) only keys under its own incarnation's leases.
pub(super) fn s6_no_foreign_deletes(run: &Run<'_>, out: &mut Vec<Violation>) {
    for d in &run.truth.deletions {
        let Some(deleter) = run.truth.author(d.origin) else {
            continue; // the operator's faults
        };
        let owner = run.truth.granted_by(d.lease);
        if owner != Some(deleter) {
            let mut nodes = vec![deleter];
            nodes.extend(owner);
            out.push(run.violation(
                "S6",
                d.at,
                &nodes,
                format!(
                    "{deleter} deleted {} (revision {}) under lease {}, which is {}'s",
                    d.key,
                    d.revision,
                    d.lease,
                    owner.map_or("nobody".to_owned(), |o| o.to_string())
                ),
            ));
        }
    }
}

/// S7: once a newer incarnation of a host is registered, no key of an older incarnation
/// stays under the host's name for longer than τ + RTT, moved by the store's lease refreshes
/// and downtimes meanwhile (in-process seed 124928: an old incarnation's heal put its key
/// back just after the new one registered, and a store crash kept it), and by the older
/// lease's renewals that a stalled or slow member held (τ + RTT from where each landed).
pub(super) fn s7_single_registration(run: &Run<'_>, out: &mut Vec<Violation>) {
    let bound = run.scenario.ttl + run.rtt();
    for span in &run.truth.key_spans {
        if !span.key.starts_with(HOSTS) {
            continue;
        }
        let Some(owner) = run.truth.granted_by(span.lease) else {
            continue;
        };
        let until = span.until.unwrap_or(run.end);
        let deadline = |from: Duration| {
            let refreshed = super::leases::moved_by_refreshes(run, from, from + bound);
            super::leases::moved_by_held_renewals(run, span.lease, from, refreshed)
        };
        let newer = run.beliefs.registered.iter().find(|r| {
            r.who.node == owner.node
                && r.who.inc > owner.inc
                && r.key == span.key
                && deadline(r.from) < until
                && r.from >= span.from
        });
        if let Some(r) = newer {
            out.push(run.violation(
                "S7",
                deadline(r.from),
                &[owner, r.who],
                format!(
                    "{} still holds {} {:.3}s after {} registered",
                    owner,
                    span.key,
                    (until - r.from).as_secs_f64(),
                    r.who
                ),
            ));
        }
    }
}

/// L1: by t_h + τ + B + ET + RTT every live node is registered, believes it, and stays so
/// (plus the request timeout for a node whose lost replies may have lingered to the heal: a
/// write that took one just before the heal waits it out). And a lone loss (the lease revoked, the key deleted, with nothing else near) heals within
/// the backoff's first step, every time: a backoff that does not start over after a heal
/// fails the second one.
pub(super) fn l1_self_healing(run: &Run<'_>, out: &mut Vec<Violation>) {
    let s = run.scenario;
    let heal = run.beliefs.heal;
    if heal + heal_bound(run) < run.end {
        for who in live_at_end(run) {
            // A request whose message or reply the fault lost is given up only at its
            // timeout, which may fall after the heal: a lost reply lingers (it can be any
            // later write's), and a request sent while the node was cut off waits from then.
            let lingered = run.beliefs.faults.iter().any(|f| {
                f.fault.node == who.node
                    && f.from <= heal
                    && match f.fault.kind {
                        FaultKind::LostReplies => {
                            f.from + s.ttl * 2 + s.request_timeout * 3 >= heal
                        }
                        FaultKind::Partition | FaultKind::OneWay => {
                            f.until + s.request_timeout >= heal
                        }
                        _ => false,
                    }
            });
            let bound = heal_bound(run)
                + if lingered {
                    s.request_timeout
                } else {
                    Duration::ZERO
                };
            let from = heal + bound;
            if from >= run.end {
                continue;
            }
            let key = host_key(who.node);
            // The key must exist under this incarnation's lease from `from` to the end.
            let span = run.truth.key_spans.iter().find(|s| {
                s.key == key
                    && run.truth.granted_by(s.lease) == Some(who)
                    && s.from <= from
                    && s.until.is_none()
            });
            let covered = span.is_some();
            let believed = run.beliefs.registered.iter().any(|r| {
                r.who == who
                    && r.from <= from
                    && r.until >= run.end
                    && span.is_none_or(|s| s.lease == r.lease)
            });
            if !covered || !believed {
                out.push(run.violation(
                    "L1",
                    from,
                    &[who],
                    format!(
                        "not registered for good by {:.3}s (heal + {:.3}s): key held to the end: {covered}, believed: {believed}",
                        from.as_secs_f64(),
                        bound.as_secs_f64()
                    ),
                ));
            }
        }
    }
    // Lone losses. The heal's first attempt comes within the backoff's first step, after
    // the loss reaches the registration (the store's answer to a renewal, or its watch);
    // the attempt is a grant and a put. Each of those three exchanges takes a round trip
    // and the step the member answers in (turmoil's tick: turmoil seed 125 took 30 ms a
    // round trip at 10 ms latency); one round trip of slack.
    let s = run.scenario;
    let exchange = run.round_trip() + run.history.resolution;
    let bound = s.initial_backoff + exchange * 3 + run.round_trip();
    for lost in &run.beliefs.registered {
        if lost.until >= run.end
            || run.beliefs.crashed.contains_key(&lost.who)
            || run.beliefs.stopping.contains_key(&lost.who)
        {
            continue;
        }
        let t = lost.until;
        let window = (t.saturating_sub(s.ttl), t + bound + run.round_trip());
        // Lost replies linger until the node's next writes take them, each waiting out the
        // request timeout.
        let lingering = |f: &FaultSpan| {
            f.fault.kind == FaultKind::LostReplies
                && f.fault.node == lost.who.node
                && f.from + s.ttl * 2 + s.request_timeout * 3 >= t
        };
        let alone = run.beliefs.faults.iter().all(|f| {
            let operator = f.fault.kind.takes_leases();
            // Another revoke or delete after the loss may take the heal's new lease or key
            // (in-process seed 73157: the next revoke took the lease granted for the heal).
            let again = operator && f.from > t && f.from <= window.1;
            (operator || !super::overlaps(f, window.0, window.1)) && !again && !lingering(f)
        });
        let stopped = run.beliefs.part_stops.iter().any(|p| {
            p.who == lost.who
                && p.part == Part::Registration
                && p.began <= window.1
                && p.restarted.is_none_or(|r| r >= window.0)
        });
        if !alone || stopped {
            continue;
        }
        let back = run
            .beliefs
            .registered
            .iter()
            .filter(|r| r.who == lost.who && r.from >= t)
            .map(|r| r.from)
            .min();
        if back.is_none_or(|b| b > t + bound) {
            out.push(run.violation(
                "L1",
                t + bound,
                &[lost.who],
                format!(
                    "lost its registration at {:.3}s with the store reachable and nothing else wrong, and was not back by {:.3}s (the backoff's first step, {:?}, plus a grant and a put){}",
                    t.as_secs_f64(),
                    (t + bound).as_secs_f64(),
                    s.initial_backoff,
                    back.map_or(String::new(), |b| format!("; back at {:.3}s", b.as_secs_f64()))
                ),
            ));
        }
    }
}

/// L2: a disruption a registration must ride through, with nothing else going on, deletes
/// none of the node's keys, ends none of its beliefs and changes none of its leases: a
/// network blip (partition, one way, hold) shorter than τ − 2·KA − RTT (the bound for a client
/// that renews on its cadence, KA the renewal period), a closed stream, an etcd leader change;
/// with members, a follower killed or cut off and a leader transfer.
pub(super) fn l2_ride_through(run: &Run<'_>, out: &mut Vec<Violation>) {
    let s = run.scenario;
    let ttl = s.ttl;
    let blip = ttl
        .saturating_sub(s.renew_period() * 2)
        .saturating_sub(run.round_trip());
    for f in &run.beliefs.faults {
        let rides = match f.fault.kind {
            FaultKind::Partition | FaultKind::OneWay | FaultKind::Hold => f.until - f.from < blip,
            FaultKind::CloseStreams | FaultKind::LeaderChange => true,
            // A follower killed, cut off, stalled or slow, leadership handed over: a majority
            // serves throughout, and the client moves to it (a leader's death is not here: it
            // halts writes and renewals for up to two election timeouts, which a session
            // renewing every TTL/3 need not survive, on etcd as here).
            FaultKind::MemberCrash
            | FaultKind::MemberIsolation
            | FaultKind::LeaderTransfer
            | FaultKind::MemberStall
            | FaultKind::MemberSlow => true,
            _ => false,
        };
        if !rides {
            continue;
        }
        // A member cut off forces an election when it rejoins (its term rose while it
        // campaigned alone; etcd 3.4 runs without pre-vote), which halts the cluster for up
        // to an election timeout on top of what the cut cost: a loss counts only while the
        // member is cut off.
        let after = if f.fault.kind == FaultKind::MemberIsolation {
            Duration::ZERO
        } else {
            ttl
        };
        let (from, until) = (f.from, f.until + after);
        if until >= run.end
            || run
                .beliefs
                .anything_near(Some(f), from.saturating_sub(ttl), until)
        {
            continue;
        }
        let nodes: Vec<usize> = if f.fault.kind.targets_node() {
            vec![f.fault.node]
        } else {
            (0..s.hosts).collect()
        };
        for n in nodes {
            check_rode_through(run, f, n, (from, until), out);
        }
    }
}

fn check_rode_through(
    run: &Run<'_>,
    f: &FaultSpan,
    node: usize,
    (from, until): (Duration, Duration),
    out: &mut Vec<Violation>,
) {
    let Some(who) = run
        .beliefs
        .started
        .iter()
        .filter(|(w, at)| w.node == node && **at <= from)
        .map(|(w, _)| *w)
        .next_back()
    else {
        return;
    };
    if run.beliefs.crashed.contains_key(&who) || run.beliefs.stopped.contains_key(&who) {
        return;
    }
    // Only a node in its steady state rides through: one still healing (its old lease given
    // up, perhaps still standing at the store until it expires) has nothing to ride on.
    let steady = run
        .beliefs
        .registered
        .iter()
        .any(|r| r.who == who && r.from < from && r.until >= from);
    if !steady {
        return;
    }
    // Deleted by the store (expiry) or an operator; the node's own resignations and
    // clean-ups are its business.
    let own = |o: Origin| run.truth.author(o) == Some(who);
    let lost_key = run.truth.deletions.iter().find(|d| {
        d.at >= from
            && d.at <= until
            && run.truth.granted_by(d.lease) == Some(who)
            && !own(d.origin)
    });
    let lost_lead = run.beliefs.leading.iter().find(|l| {
        l.who == who && !l.resigned && l.from < from && l.until >= from && l.until <= until
    });
    let lost_reg = run
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
            "it lost its leadership of {} at {:.3}s",
            l.election,
            l.until.as_secs_f64()
        ),
        (_, _, Some(r)) => format!(
            "its registration left lease {} at {:.3}s",
            r.lease,
            r.until.as_secs_f64()
        ),
        _ => return,
    };
    out.push(run.violation(
        "L2",
        f.from,
        &[who],
        format!(
            "a {} of {:.3}s, with nothing else going on: {what}",
            f.fault.kind,
            (f.until - f.from).as_secs_f64(),
        ),
    ));
}

/// M1: every write of a host's key by its node carries the metadata the node last set before
/// the write (or newer): a heal, a put-back after a delete, a re-put never brings back an old
/// value. A write sent before an update returned may land after it (the backend gave up on
/// it, `Indeterminate`, while its last attempt was on the wire), so an older value is allowed
/// only while a write that carried it could still be in flight: it was the latest within the
/// node's reply window before landing, or before a hold of the node's traffic that ended in
/// that window.
pub(super) fn m1_latest_metadata(run: &Run<'_>, out: &mut Vec<Violation>) {
    // Per node, each generation it set and when the update returned, in order.
    let mut set: std::collections::BTreeMap<Incarnation, Vec<(u64, Duration)>> = Default::default();
    for r in &run.history.records {
        match &r.what {
            Happening::Metadata { who, value, .. } => {
                if let Some(g) = metadata_generation(value.as_bytes()) {
                    set.entry(*who).or_default().push((g, r.at));
                }
            }
            Happening::Store(Entry::Commit {
                revision,
                origin,
                events,
            }) => {
                let Some(who) = run.author(*origin) else {
                    continue;
                };
                let Some(&(latest, _)) = set.get(&who).and_then(|s| s.last()) else {
                    continue;
                };
                let key = host_key(who.node);
                for e in events.iter().filter(|e| {
                    e.kind == coord_api::EventKind::Put && e.kv.key.as_ref() == key.as_bytes()
                }) {
                    let Some(wrote) = metadata_generation(&e.kv.value).filter(|w| *w < latest)
                    else {
                        continue;
                    };
                    // When what it carried stopped being the latest: the first update to a
                    // newer generation returned.
                    let superseded = set[&who]
                        .iter()
                        .find(|(g, _)| *g > wrote)
                        .map_or(Duration::ZERO, |(_, at)| *at);
                    if superseded + run.reply_window(who.node, r.at) >= r.at {
                        continue;
                    }
                    out.push(run.violation(
                        "M1",
                        r.at,
                        &[who],
                        format!(
                            "wrote {key} with metadata generation {wrote} at revision {revision}, {:.3}s after an update replaced it (latest: {latest}; a write sent before could land {:.3}s after)",
                            (r.at - superseded).as_secs_f64(),
                            run.reply_window(who.node, r.at).as_secs_f64()
                        ),
                    ));
                }
            }
            _ => {}
        }
    }
}
