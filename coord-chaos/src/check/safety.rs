//! The safety invariants, over the whole run.

use std::collections::{BTreeMap, BTreeSet};

use super::{Ctx, Violation};
use crate::fault::FaultKind;
use crate::history::{Emitted, Happening, Incarnation};
use coord_sim::journal::Origin;

pub(super) fn check(ctx: &Ctx<'_>, out: &mut Vec<Violation>) {
    s1_fenced_exclusivity(ctx, out);
    s2_belief_exclusivity(ctx, out);
    s3_no_phantom_leadership(ctx, out);
    s4_s5_watchers(ctx, out);
    s6_no_foreign_deletes(ctx, out);
    s7_single_registration(ctx, out);
}

fn v(
    invariant: &'static str,
    at: std::time::Duration,
    nodes: &[Incarnation],
    detail: String,
) -> Violation {
    Violation {
        invariant,
        at,
        nodes: nodes.iter().map(|n| n.to_string()).collect(),
        detail,
    }
}

/// S1: successive leaders' tokens strictly increase; the fenced resource (the work key)
/// accepts a write only from the election's current leader, with non-decreasing tokens.
///
/// Beliefs begin when a campaign's confirming read comes back, up to one round trip after the
/// store answered it; so a belief can begin with a lower token than one that began just
/// before it, when its key was deleted while its reply travelled (an operator's revoke under
/// added latency). That stale belief is S3's to bound (it ends within the notice bound after
/// the key went), and the fence part below shows no write of it was accepted; it is excused
/// here only when its key was already gone, at most one round trip before it began.
fn s1_fenced_exclusivity(ctx: &Ctx<'_>, out: &mut Vec<Violation>) {
    let mut last: BTreeMap<usize, (i64, Incarnation)> = BTreeMap::new();
    for r in &ctx.history.records {
        if let Happening::LeaderStart {
            who,
            election,
            token,
        } = &r.what
        {
            if let Some((prev, prev_who)) = last.get(election) {
                // The same incarnation leading again on the key it still holds (a resign that
                // failed, then a re-campaign rejoined its key) is one leadership, not two.
                let rejoined = token == prev && who == prev_who;
                let prefix = crate::node::election_name(*election);
                let stale = ctx.truth.deletions.iter().any(|d| {
                    d.create_revision == *token
                        && d.key.starts_with(&prefix)
                        && d.at <= r.at
                        && r.at <= d.at + ctx.rtt()
                });
                if token <= prev && !rejoined && !stale {
                    out.push(v(
                        "S1",
                        r.at,
                        &[*prev_who, *who],
                        format!("election e{election}: leader token {token} after {prev}"),
                    ));
                }
            }
            // The highest token so far is what the next leader must exceed.
            if last.get(election).is_none_or(|(prev, _)| token >= prev) {
                last.insert(*election, (*token, *who));
            }
        }
    }
    for (e, writes) in &ctx.truth.work {
        let mut max = 0;
        for w in writes {
            if w.leader != Some(w.token) {
                out.push(v(
                    "S1",
                    w.at,
                    &[],
                    format!(
                        "election e{e}: the fence accepted token {} at revision {} while the leader's token was {:?}",
                        w.token, w.revision, w.leader
                    ),
                ));
            }
            if w.token < max {
                out.push(v(
                    "S1",
                    w.at,
                    &[],
                    format!(
                        "election e{e}: accepted token {} after token {max}",
                        w.token
                    ),
                ));
            }
            max = max.max(w.token);
        }
    }
}

/// S2: at most one node believes it leads an election at any instant, unless a believer
/// was paused or an operator revoked or deleted keys shortly before.
fn s2_belief_exclusivity(ctx: &Ctx<'_>, out: &mut Vec<Violation>) {
    let ttl = ctx.scenario.ttl;
    let leading = &ctx.beliefs.leading;
    for (i, a) in leading.iter().enumerate() {
        for b in &leading[i + 1..] {
            if b.election != a.election || b.from >= a.until {
                continue;
            }
            if a.who == b.who {
                continue;
            }
            let start = b.from.max(a.from);
            let end = b.until.min(a.until);
            if end <= start {
                continue;
            }
            let paused = [a.who.node, b.who.node].iter().any(|n| {
                ctx.beliefs.fault_near(
                    Some(*n),
                    &[FaultKind::Pause],
                    start.saturating_sub(ttl),
                    end,
                )
            });
            let operator = ctx.beliefs.fault_near(
                None,
                &[FaultKind::Revoke, FaultKind::Delete],
                start.saturating_sub(ttl),
                start,
            );
            if !paused && !operator {
                out.push(v(
                    "S2",
                    start,
                    &[a.who, b.who],
                    format!(
                        "election e{}: both believe they lead for {:.3}s (tokens {} and {})",
                        a.election,
                        (end - start).as_secs_f64(),
                        a.token,
                        b.token
                    ),
                ));
            }
        }
    }
}

/// S3: a leadership begins only while its key exists and is the oldest of the election
/// (within one round trip), and ends within the notice bound after the key is deleted.
fn s3_no_phantom_leadership(ctx: &Ctx<'_>, out: &mut Vec<Violation>) {
    let window = ctx.rtt();
    for l in &ctx.beliefs.leading {
        let spans = ctx
            .truth
            .leaders
            .get(&l.election)
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        let lo = l.from.saturating_sub(window);
        let led = spans.iter().enumerate().any(|(i, s)| {
            let until = spans.get(i + 1).map(|n| n.from);
            s.token == Some(l.token) && s.from <= l.from && until.is_none_or(|u| u > lo)
        });
        if !led {
            out.push(v(
                "S3",
                l.from,
                &[l.who],
                format!(
                    "election e{}: believes it leads with token {}, but that key was not the oldest of the election within {:?} before",
                    l.election, l.token, window
                ),
            ));
            continue;
        }
        // The key's deletion ends the belief: at once when the node is healthy, by its
        // session deadline otherwise.
        let deleted = ctx.truth.deletions.iter().find(|d| {
            d.create_revision == l.token
                && d.key.starts_with(&crate::node::election_name(l.election))
        });
        if let Some(d) = deleted {
            let faulty = ctx.beliefs.fault_near(
                Some(l.who.node),
                &[
                    FaultKind::Partition,
                    FaultKind::OneWay,
                    FaultKind::Hold,
                    FaultKind::Pause,
                    FaultKind::Latency,
                    FaultKind::CloseStreams,
                    FaultKind::LeaderChange,
                    FaultKind::StoreCrash,
                ],
                d.at.saturating_sub(ctx.scenario.ttl),
                d.at + window,
            );
            let bound = if faulty {
                ctx.scenario.ttl + window
            } else {
                window
            };
            if l.until > d.at + bound {
                out.push(v(
                    "S3",
                    d.at + bound,
                    &[l.who],
                    format!(
                        "election e{}: still believes it leads (token {}) {:.3}s after its key was deleted (bound {:.3}s)",
                        l.election,
                        l.token,
                        (l.until - d.at).as_secs_f64(),
                        bound.as_secs_f64()
                    ),
                ));
            }
        }
    }
}

/// S4 and S5, per watcher incarnation: every view equals the truth at its revision, and
/// revisions never go back; per host the events alternate up and down and none repeats;
/// outside a resync, every appearance and disappearance of a host is emitted, exactly.
fn s4_s5_watchers(ctx: &Ctx<'_>, out: &mut Vec<Violation>) {
    #[derive(Default)]
    struct W {
        revision: i64,
        up: BTreeSet<String>,
        seen: BTreeSet<(String, i64, bool)>,
        streamed: BTreeSet<(String, i64, bool)>,
        covered: Vec<(i64, i64)>,
        first: Option<i64>,
        views: Vec<i64>,
    }
    let mut ws: BTreeMap<Incarnation, W> = BTreeMap::new();
    for r in &ctx.history.records {
        match &r.what {
            Happening::View {
                who,
                revision,
                hosts,
            } => {
                let w = ws.entry(*who).or_default();
                if *revision < w.revision {
                    out.push(v(
                        "S4",
                        r.at,
                        &[*who],
                        format!("view went back from revision {} to {revision}", w.revision),
                    ));
                }
                w.revision = *revision;
                w.views.push(*revision);
                if w.first.is_none() && *revision > 0 {
                    w.first = Some(*revision);
                }
                let truth = ctx.truth.hosts_at(*revision);
                let view: BTreeSet<String> = hosts.iter().cloned().collect();
                if *revision > 0 && view != *truth {
                    out.push(v(
                        "S4",
                        r.at,
                        &[*who],
                        format!("view at revision {revision} is {view:?}, the store had {truth:?}"),
                    ));
                }
            }
            Happening::Emitted(who, e) => {
                let w = ws.entry(*who).or_default();
                match e {
                    Emitted::Up(h, rev) | Emitted::Down(h, rev) => {
                        let up = matches!(e, Emitted::Up(..));
                        if w.up.contains(h) == up {
                            out.push(v(
                                "S5",
                                r.at,
                                &[*who],
                                format!(
                                    "{} {h} at revision {rev}, but it was already {}",
                                    if up { "HostUp" } else { "HostDown" },
                                    if up { "up" } else { "down" }
                                ),
                            ));
                        }
                        if up {
                            w.up.insert(h.clone());
                        } else {
                            w.up.remove(h);
                        }
                        if !w.seen.insert((h.clone(), *rev, up)) {
                            out.push(v(
                                "S5",
                                r.at,
                                &[*who],
                                format!("{h} at revision {rev} emitted twice"),
                            ));
                        }
                        w.streamed.insert((h.clone(), *rev, up));
                    }
                    Emitted::Updated(h, rev) => {
                        if !w.up.contains(h) {
                            out.push(v(
                                "S5",
                                r.at,
                                &[*who],
                                format!("HostUpdated {h} at revision {rev} while it was down"),
                            ));
                        }
                    }
                    Emitted::Resynced(rev) => {
                        // The diff before it was emitted at `rev`, and stands for every
                        // change since the view before the listing.
                        let before = w
                            .views
                            .iter()
                            .rev()
                            .find(|r| **r < *rev)
                            .copied()
                            .unwrap_or(0);
                        w.covered.push((before, *rev));
                    }
                }
            }
            _ => {}
        }
    }
    // Exactness: every truth transition after the first listing and up to the last view is
    // emitted at its own revision, unless a resync window covers it.
    for (who, w) in &ws {
        let Some(first) = w.first else { continue };
        for (host, ts) in &ctx.truth.transitions {
            for t in ts {
                if t.revision <= first || t.revision > w.revision {
                    continue;
                }
                let covered = w
                    .covered
                    .iter()
                    .any(|(a, b)| t.revision > *a && t.revision <= *b);
                if covered {
                    continue;
                }
                if !w.streamed.contains(&(host.clone(), t.revision, t.up)) {
                    let at = ctx
                        .truth
                        .revision_at
                        .get(&t.revision)
                        .copied()
                        .unwrap_or_default();
                    out.push(v(
                        "S5",
                        at,
                        &[*who],
                        format!(
                            "{} {host} at revision {} never emitted (watcher reached revision {})",
                            if t.up { "HostUp" } else { "HostDown" },
                            t.revision,
                            w.revision
                        ),
                    ));
                }
            }
        }
    }
}

/// S6: a node deletes (or revokes away) only keys under its own incarnation's leases.
fn s6_no_foreign_deletes(ctx: &Ctx<'_>, out: &mut Vec<Violation>) {
    for d in &ctx.truth.deletions {
        let Origin::Client(c) = d.origin else {
            continue;
        };
        let Some(deleter) = ctx.truth.incarnation_of(c) else {
            continue; // the operator's faults
        };
        let owner = ctx.truth.granted_by(d.lease);
        if owner != Some(deleter) {
            let mut nodes = vec![deleter];
            nodes.extend(owner);
            out.push(v(
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
/// stays under the host's name for longer than τ + RTT.
fn s7_single_registration(ctx: &Ctx<'_>, out: &mut Vec<Violation>) {
    let bound = ctx.scenario.ttl + ctx.rtt();
    for span in &ctx.truth.key_spans {
        let Some(host) = span.key.strip_prefix(crate::node::HOSTS) else {
            continue;
        };
        let Some(owner) = ctx.truth.granted_by(span.lease) else {
            continue;
        };
        let until = span.until.unwrap_or(ctx.end);
        let newer = ctx.beliefs.registered.iter().find(|r| {
            r.who.node == owner.node
                && r.who.inc > owner.inc
                && format!("n{}", r.who.node) == host
                && r.from + bound < until
                && r.from >= span.from
        });
        if let Some(r) = newer {
            out.push(v(
                "S7",
                r.from + bound,
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
