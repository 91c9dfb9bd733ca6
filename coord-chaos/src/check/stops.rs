//! L7: what a stop promises. A stop that returned cleanly ended what it stopped (the keys
//! under its leases, a resigned leader's key, an unlocked lock's or a released permit's key,
//! a queue's keys left), and nothing stopped writes again until it is started again: for a
//! whole incarnation's graceful stop, and for a stop of one of its parts (its registration,
//! its pool, a leadership, a hold, a place in a queue) at any moment, healing or not.

use std::time::Duration;

use coord_api::{EventKind, LeaseId};

use super::truth::KeySpan;
use super::{PartStop, Run, Violation};
use crate::history::{Happening, Incarnation, Part};
use crate::keys::host_key;

pub(super) fn l7_stops(run: &Run<'_>, out: &mut Vec<Violation>) {
    l7_incarnation_stops(run, out);
    for stop in &run.beliefs.part_stops {
        part_stop(run, stop, out);
    }
    no_host_key_sent_once_stopping(run, out);
}

/// Once a registration's stop was asked (the whole incarnation's, or the registration's
/// own), the node sends no write of its host key until the registration starts again: a
/// heal still waiting for its lease gives way, and only a write already sent may land (the
/// stop removes it). A write sent in the instant the stop was asked counts as sent with it:
/// the registration runs its writes as tasks of their own, and one decided before the stop
/// may first run just after it, in the same instant.
fn no_host_key_sent_once_stopping(run: &Run<'_>, out: &mut Vec<Violation>) {
    let mut asked: std::collections::BTreeMap<Incarnation, Duration> = Default::default();
    for r in &run.history.records {
        match &r.what {
            Happening::Stopping(who)
            | Happening::PartStopping {
                who,
                part: Part::Registration,
            } => {
                asked.entry(*who).or_insert(r.at);
            }
            Happening::PartStarted {
                who,
                part: Part::Registration,
            } => {
                asked.remove(who);
            }
            Happening::HostKeyWriteSent { who, key } => {
                if let Some(at) = asked.get(who).filter(|at| r.at > **at) {
                    out.push(run.violation(
                        "L7",
                        r.at,
                        &[*who],
                        format!(
                            "sent a write of {key} {:.3}s after the stop of its registration was asked (at {:.3}s)",
                            (r.at - *at).as_secs_f64(),
                            at.as_secs_f64()
                        ),
                    ));
                }
            }
            _ => {}
        }
    }
}

/// The keys that stood at `at`, with the lease each stood under.
fn keys_at<'r>(run: &'r Run<'_>, at: Duration) -> impl Iterator<Item = (&'r str, LeaseId)> {
    spans_at(run, at).map(|s| (s.key.as_str(), s.lease))
}

fn spans_at<'r>(run: &'r Run<'_>, at: Duration) -> impl Iterator<Item = &'r KeySpan> {
    run.truth
        .key_spans
        .iter()
        .filter(move |s| s.from <= at && s.until.is_none_or(|u| u > at))
}

/// Whether `span` is what an earlier stop of the same part left behind and reported (it
/// returned an error: the key goes with its lease), untouched by the incarnation since. A
/// later instance of the part never held such a key, so its clean stop does not answer for
/// it; one that wrote the key again does.
fn left_by_failed_stop(run: &Run<'_>, stop: &PartStop, span: &KeySpan) -> bool {
    run.beliefs.part_stops.iter().any(|earlier| {
        let Some((at, false)) = earlier.returned else {
            return false;
        };
        earlier.who == stop.who
            && earlier.part == stop.part
            && at <= stop.began
            && span.from <= at
            && !wrote(run, stop.who, &span.key, at)
    })
}

/// Whether `who` put `key` after `since`.
fn wrote(run: &Run<'_>, who: Incarnation, key: &str, since: Duration) -> bool {
    run.history.records.iter().any(|r| {
        let Happening::Store(coord_sim::journal::Entry::Commit { origin, events, .. }) = &r.what
        else {
            return false;
        };
        r.at > since
            && run.author(*origin) == Some(who)
            && events
                .iter()
                .any(|e| e.kind == EventKind::Put && e.kv.key_str() == key)
    })
}

fn is_election_key(run: &Run<'_>, key: &str) -> bool {
    run.truth.leaders.keys().any(|e| {
        key.strip_prefix(e.as_str())
            .is_some_and(|k| k.starts_with('/'))
    })
}

/// A whole incarnation's clean stop removed its registration's key and its leaders' keys.
fn l7_incarnation_stops(run: &Run<'_>, out: &mut Vec<Violation>) {
    for (who, (at, clean)) in &run.beliefs.stopped {
        let Some(began) = run.beliefs.stopping.get(who).copied() else {
            continue;
        };
        if !clean {
            continue;
        }
        let held = |from: Duration, until: Duration| from <= began && until >= began;
        let mut leases: Vec<(LeaseId, String)> = run
            .beliefs
            .registered
            .iter()
            .filter(|r| r.who == *who && held(r.from, r.until))
            .map(|r| (r.lease, "its registration".to_owned()))
            .collect();
        for l in run
            .beliefs
            .leading
            .iter()
            .filter(|l| l.who == *who && held(l.from, l.until))
        {
            let prefix = format!("{}/", l.election);
            if let Some(span) = run
                .truth
                .key_spans
                .iter()
                .find(|s| s.create_revision == l.token && s.key.starts_with(&prefix))
            {
                leases.push((span.lease, format!("its leadership of {}", l.election)));
            }
        }
        for (key, lease) in keys_at(run, *at) {
            if let Some((_, what)) = leases.iter().find(|(l, _)| *l == lease) {
                out.push(run.violation(
                    "L7",
                    *at,
                    &[*who],
                    format!(
                        "{key} (lease {lease}, {what}) outlived the stop at {:.3}s",
                        at.as_secs_f64()
                    ),
                ));
            }
        }
    }
}

/// A part's stop: a clean one ended what it held, and nothing of the part was written until
/// it started again.
fn part_stop(run: &Run<'_>, stop: &PartStop, out: &mut Vec<Violation>) {
    let Some((returned, clean)) = stop.returned else {
        return;
    };
    let who = stop.who;
    let mine = |lease: LeaseId| run.truth.granted_by(lease) == Some(who);
    if clean {
        let left: Vec<String> = match &stop.part {
            Part::Registration | Part::Pool => spans_at(run, returned)
                .filter(|s| match stop.part {
                    Part::Registration => s.key == host_key(who.node),
                    _ => is_election_key(run, &s.key),
                })
                .filter(|s| mine(s.lease) && !left_by_failed_stop(run, stop, s))
                .map(|s| format!("{} under lease {}", s.key, s.lease))
                .collect(),
            Part::Hold { of, token } => {
                let prefix = format!("{of}/");
                spans_at(run, returned)
                    .filter(|s| s.create_revision == *token && s.key.starts_with(&prefix))
                    .map(|s| format!("{} (token {})", s.key, s.create_revision))
                    .collect()
            }
            Part::Queue { of, lease } => {
                let prefix = format!("{of}/");
                spans_at(run, returned)
                    .filter(|s| s.lease == *lease && s.key.starts_with(&prefix))
                    .map(|s| format!("{} under lease {}", s.key, s.lease))
                    .collect()
            }
            Part::Leadership(election) => {
                let token = run
                    .beliefs
                    .leading
                    .iter()
                    .find(|l| {
                        l.who == who
                            && &l.election == election
                            && l.from <= stop.began
                            && l.until >= stop.began
                    })
                    .map(|l| l.token);
                let prefix = format!("{election}/");
                run.truth
                    .key_spans
                    .iter()
                    .filter(|s| {
                        Some(s.create_revision) == token
                            && s.key.starts_with(&prefix)
                            && s.from <= returned
                            && s.until.is_none_or(|u| u > returned)
                    })
                    .map(|s| format!("{} (token {})", s.key, s.create_revision))
                    .collect()
            }
        };
        if !left.is_empty() {
            out.push(run.violation(
                "L7",
                returned,
                &[who],
                format!(
                    "the stop of its {} returned Ok at {:.3}s, and left {}",
                    stop.part,
                    returned.as_secs_f64(),
                    left.join(", ")
                ),
            ));
        }
    }
    // Nothing written by the stopped part until it started again (or the incarnation ended).
    let until = stop
        .restarted
        .or_else(|| run.beliefs.crashed.get(&who).copied())
        .unwrap_or(run.end);
    let writes_part = |key: &str| match &stop.part {
        Part::Registration => key == host_key(who.node),
        Part::Pool => is_election_key(run, key),
        // A resigned leader campaigns again at once: its next key is a new candidacy; a
        // lock or permit let go of is taken again, under a new key.
        _ => false,
    };
    for r in &run.history.records {
        if r.at <= returned || r.at >= until {
            continue;
        }
        let Happening::Store(coord_sim::journal::Entry::Commit {
            revision,
            origin,
            events,
        }) = &r.what
        else {
            continue;
        };
        if run.author(*origin) != Some(who) {
            continue;
        }
        for e in events.iter().filter(|e| e.kind == EventKind::Put) {
            let key = e.kv.key_str();
            if writes_part(&key) {
                out.push(run.violation(
                    "L7",
                    r.at,
                    &[who],
                    format!(
                        "wrote {key} at revision {revision}, {:.3}s after the stop of its {} returned",
                        (r.at - returned).as_secs_f64(),
                        stop.part
                    ),
                ));
            }
        }
    }
}
