//! The invariants of coord's cluster watchers: S4/S5 (every view equals the store at its
//! revision, metadata included; events alternate, each agrees with the store at its
//! revision, none lost, none twice) and L4 (convergence).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use coord_api::Revision;

use super::elections::{heal_bound, live_at_end};
use super::truth::Fingerprint;
use super::{time_of, Run, Violation};
use crate::history::{Emitted, Happening, Incarnation};
use crate::keys::HOSTS;

/// S4 and S5, per watcher incarnation: every view equals the truth at its revision (hosts and
/// their metadata), and revisions never go back; per host the events alternate up and down
/// and none repeats; outside a resync, every appearance and disappearance of a host is
/// emitted, exactly.
pub(super) fn s4_s5_watchers(run: &Run<'_>, out: &mut Vec<Violation>) {
    #[derive(Default)]
    struct W {
        revision: Revision,
        up: BTreeSet<String>,
        seen: BTreeSet<(String, Revision, bool)>,
        streamed: BTreeSet<(String, Revision, bool)>,
        covered: Vec<(Revision, Revision)>,
        first: Option<Revision>,
        views: Vec<Revision>,
        /// The revision of the last event it emitted.
        emitted: Revision,
        /// Its view, rebuilt from the changes it recorded, and the view's fingerprint.
        view: BTreeMap<String, String>,
        fingerprint: Fingerprint,
    }
    let mut ws: BTreeMap<Incarnation, W> = BTreeMap::new();
    for r in &run.history.records {
        match &r.what {
            Happening::View {
                who,
                revision,
                changes,
            } => {
                let w = ws.entry(*who).or_default();
                if *revision < w.revision {
                    out.push(run.violation(
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
                apply_changes(&mut w.view, &mut w.fingerprint, changes);
                if *revision > 0 && w.fingerprint != run.truth.fingerprint_at(*revision) {
                    let truth = run.truth.hosts_at(*revision);
                    out.push(run.violation(
                        "S4",
                        r.at,
                        &[*who],
                        format!(
                            "view at revision {revision} ({} hosts) differs from the store's ({} hosts): {}",
                            w.view.len(),
                            truth.len(),
                            differences(&w.view, &truth)
                        ),
                    ));
                }
            }
            Happening::Emitted(who, e) => {
                let w = ws.entry(*who).or_default();
                w.emitted = match e {
                    Emitted::Up(_, _, r)
                    | Emitted::Updated(_, _, r)
                    | Emitted::Down(_, r)
                    | Emitted::Resynced(r) => w.emitted.max(*r),
                };
                match e {
                    Emitted::Up(h, _, rev) | Emitted::Down(h, rev) => {
                        let up = matches!(e, Emitted::Up(..));
                        if w.up.contains(h) == up {
                            out.push(run.violation(
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
                        if run.truth.host_up_at(h, *rev) != up {
                            out.push(run.violation(
                                "S5",
                                r.at,
                                &[*who],
                                format!(
                                    "{} {h} at revision {rev}, but the store had it {} then",
                                    if up { "HostUp" } else { "HostDown" },
                                    if up { "down" } else { "up" }
                                ),
                            ));
                        }
                        if up {
                            w.up.insert(h.clone());
                        } else {
                            w.up.remove(h);
                        }
                        if !w.seen.insert((h.clone(), *rev, up)) {
                            out.push(run.violation(
                                "S5",
                                r.at,
                                &[*who],
                                format!("{h} at revision {rev} emitted twice"),
                            ));
                        }
                        w.streamed.insert((h.clone(), *rev, up));
                    }
                    Emitted::Updated(h, _, rev) => {
                        if !w.up.contains(h) || !run.truth.host_up_at(h, *rev) {
                            out.push(run.violation(
                                "S5",
                                r.at,
                                &[*who],
                                format!("HostUpdated {h} at revision {rev} while it was down (to the watcher or the store)"),
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
                            .unwrap_or(Revision::ZERO);
                        w.covered.push((before, *rev));
                    }
                }
            }
            _ => {}
        }
    }
    // Exactness: every truth transition after the first listing and up to the last view is
    // emitted at its own revision, unless a resync window covers it. A stopped watcher hands
    // back every event its view holds, so it is judged up to its last view; a crashed one
    // may have published a view whose events died with it, and is judged up to what it
    // emitted.
    for (who, w) in &ws {
        let Some(first) = w.first else { continue };
        let reached = if run.beliefs.crashed.contains_key(who) {
            w.revision.min(w.emitted)
        } else {
            w.revision
        };
        for (host, ts) in &run.truth.transitions {
            for t in ts {
                if t.revision <= first || t.revision > reached {
                    continue;
                }
                let covered = w
                    .covered
                    .iter()
                    .any(|(a, b)| t.revision > *a && t.revision <= *b);
                if covered || w.streamed.contains(&(host.clone(), t.revision, t.up)) {
                    continue;
                }
                out.push(run.violation(
                    "S5",
                    time_of(run, t.revision),
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

/// L4: once the hosts stop changing, every live watcher's view converges to the truth.
pub(super) fn l4_watcher_convergence(run: &Run<'_>, out: &mut Vec<Violation>) {
    let last_change = run
        .truth
        .transitions
        .values()
        .flatten()
        .map(|t| time_of(run, t.revision))
        .max()
        .unwrap_or_default();
    let settle = run.rtt() + Duration::from_secs(2);
    if last_change + settle >= run.end || run.beliefs.heal + heal_bound(run) >= run.end {
        return;
    }
    let truth: BTreeSet<String> = run
        .truth
        .final_keys
        .keys()
        .filter_map(|k| k.strip_prefix(HOSTS).map(str::to_owned))
        .collect();
    // Each live watcher's last view, rebuilt in one pass over the history.
    let live: BTreeSet<Incarnation> = live_at_end(run).into_iter().collect();
    let mut views: BTreeMap<Incarnation, (BTreeMap<String, String>, Fingerprint, Revision)> =
        BTreeMap::new();
    for r in &run.history.records {
        if let Happening::View {
            who,
            changes,
            revision,
        } = &r.what
        {
            if live.contains(who) {
                let (view, fingerprint, last) = views.entry(*who).or_default();
                apply_changes(view, fingerprint, changes);
                *last = *revision;
            }
        }
    }
    for (who, (view, _, revision)) in views {
        let hosts: BTreeSet<String> = view.into_keys().collect();
        if hosts != truth {
            out.push(run.violation(
                "L4",
                last_change + settle,
                &[who],
                format!(
                    "final view {hosts:?} (revision {revision}) differs from the store's {truth:?}"
                ),
            ));
        }
    }
}

/// How long after a heal a watcher's view may still lag the store: a reopen of its watch
/// sent into the cut waits out the request timeout (or a stream that opened just before the
/// heal goes silent that long before the watcher calls it stuck), then the store preset's
/// longest backoff, then a round trip for the watch and one for its first message.
pub(super) fn watcher_recovery_bound(scenario: &crate::Scenario, rtt: Duration) -> Duration {
    let silence = coord_api::recipes::ClusterWatcherConfig::new("").silence;
    scenario.request_timeout.max(silence)
        + coord_api::retry::Backoff::store(0).max_delay()
        + rtt * 2
}

/// L8: a watcher is current again within [`watcher_recovery_bound`] of a heal. At each
/// instant the last fault in force ended (slow replies and added latency counted until what
/// they delayed arrived) with none beginning for the bound after it, every watcher
/// incarnation alive across that window holds, by its end, every change of the hosts the
/// store committed before the heal.
pub(super) fn l8_watcher_recovery(run: &Run<'_>, out: &mut Vec<Violation>) {
    let bound = watcher_recovery_bound(run.scenario, run.rtt());
    let spans: Vec<(Duration, Duration)> = run
        .beliefs
        .faults
        .iter()
        .map(|f| (f.from, f.until + f.fault.added_latency()))
        .collect();
    let heals: BTreeSet<Duration> = spans
        .iter()
        .map(|&(_, until)| until)
        .filter(|&h| h + bound <= run.end)
        .filter(|&h| {
            spans
                .iter()
                .all(|&(from, until)| until <= h || from > h + bound)
        })
        .collect();
    if heals.is_empty() {
        return;
    }
    // Each watcher's views, in order: (when, revision).
    let mut views: BTreeMap<Incarnation, Vec<(Duration, Revision)>> = BTreeMap::new();
    for r in &run.history.records {
        if let Happening::View { who, revision, .. } = &r.what {
            views.entry(*who).or_default().push((r.at, *revision));
        }
    }
    let host_commits: Vec<(Duration, Revision)> = run
        .commits()
        .iter()
        .filter(|c| {
            c.events
                .iter()
                .any(|e| e.kv.key.starts_with(HOSTS.as_bytes()))
        })
        .map(|c| (c.at, c.revision))
        .collect();
    for h in heals {
        let by = h + bound;
        let Some(&(_, wanted)) = host_commits.iter().rev().find(|(at, _)| *at <= h) else {
            continue;
        };
        for (who, seen) in &views {
            let alive = run.beliefs.started.get(who).is_some_and(|s| *s <= h)
                && run.beliefs.running_at(*who, by);
            if !alive {
                continue;
            }
            let reached = seen
                .iter()
                .take_while(|(at, _)| *at <= by)
                .map(|(_, r)| *r)
                .max()
                .unwrap_or(Revision::ZERO);
            if reached < wanted {
                out.push(run.violation(
                    "L8",
                    by,
                    &[*who],
                    format!(
                        "{:.3}s after the heal at {:.3}s the view is at revision {reached}, \
                         behind the hosts' change at {wanted} committed before it",
                        bound.as_secs_f64(),
                        h.as_secs_f64()
                    ),
                ));
            }
        }
    }
}

/// Applies a recorded view's changes to the view rebuilt so far, and to its fingerprint.
fn apply_changes(
    view: &mut BTreeMap<String, String>,
    fingerprint: &mut Fingerprint,
    changes: &[(String, Option<String>)],
) {
    for (host, metadata) in changes {
        if let Some(old) = view.remove(host) {
            fingerprint.remove(host, &old);
        }
        if let Some(md) = metadata {
            fingerprint.add(host, md);
            view.insert(host.clone(), md.clone());
        }
    }
}

/// The first few hosts on which two views differ, for a report.
fn differences(view: &BTreeMap<String, String>, truth: &BTreeMap<String, String>) -> String {
    let hosts: BTreeSet<&String> = view.keys().chain(truth.keys()).collect();
    let diff: Vec<String> = hosts
        .into_iter()
        .filter(|h| view.get(*h) != truth.get(*h))
        .take(5)
        .map(|h| format!("{h}: view {:?}, store {:?}", view.get(h), truth.get(h)))
        .collect();
    diff.join("; ")
}
