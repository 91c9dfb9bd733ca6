//! W1: the work of two terms never overlaps. A node's term's work (recorded with
//! [`Node::work_started`](crate::Node::work_started)) begins when it leads and winds down
//! after; the next term's work, on this node or another, begins only after it ended, except
//! where no client can know in time (S2's excuses: a pause, an operator's revoke or delete),
//! which the fence covers. After an operator's revoke or delete, the deposed term's work may
//! run on for the candidate's grace after its belief ends (`--defaults` seed 2196611: a
//! phantom term, begun on a slow reply after its key's deletion, whose watch lost the event
//! to a store crash, stepped down before its deadline and dropped its work at it).

use std::collections::BTreeMap;
use std::time::Duration;

use coord_api::recipes::CandidateConfig;
use coord_api::Revision;

use super::elections::excused_overlap;
use super::{Run, Violation};
use crate::history::{Happening, Incarnation};

/// One term's work.
#[derive(Debug, Clone)]
struct Work {
    who: Incarnation,
    election: String,
    token: Revision,
    from: Duration,
    until: Duration,
}

/// Every term's work; one that never recorded its end ended with its incarnation (crash or
/// stop), or lasts to the end of the run.
fn works(run: &Run<'_>) -> Vec<Work> {
    let mut open: BTreeMap<(Incarnation, String, Revision), Duration> = BTreeMap::new();
    let mut done = Vec::new();
    for r in &run.history.records {
        match &r.what {
            Happening::WorkStarted {
                who,
                election,
                token,
            } => {
                open.insert((*who, election.clone(), *token), r.at);
            }
            Happening::WorkEnded {
                who,
                election,
                token,
            } => {
                if let Some(from) = open.remove(&(*who, election.clone(), *token)) {
                    done.push(Work {
                        who: *who,
                        election: election.clone(),
                        token: *token,
                        from,
                        until: r.at,
                    });
                }
            }
            _ => {}
        }
    }
    for ((who, election, token), from) in open {
        let until = run
            .beliefs
            .crashed
            .get(&who)
            .copied()
            .or_else(|| run.beliefs.stopped.get(&who).map(|(at, _)| *at))
            .unwrap_or(run.end);
        done.push(Work {
            who,
            election,
            token,
            from,
            until,
        });
    }
    done.sort_by_key(|w| w.from);
    done
}

pub(super) fn w1_work_never_overlaps(run: &Run<'_>, out: &mut Vec<Violation>) {
    let all = works(run);
    for (i, a) in all.iter().enumerate() {
        for b in &all[i + 1..] {
            if b.election != a.election || b.token == a.token || b.from >= a.until {
                continue;
            }
            let (start, end) = (b.from, a.until.min(b.until));
            if end <= start {
                continue;
            }
            // The same node's terms are the candidate's alone to keep apart: no excuse.
            let same = a.who == b.who;
            // coord's node gives its terms the candidate's default grace.
            let grace = CandidateConfig::default_grace(run.scenario.ttl);
            if same || !excused_overlap(run, a.who.node, b.who.node, start, end, grace) {
                out.push(run.violation(
                    "W1",
                    start,
                    &[a.who, b.who],
                    format!(
                        "election {}: the work of term {} (from {:.3}s) was still running when the work of term {} began; they overlapped {:.3}s",
                        a.election,
                        a.token,
                        a.from.as_secs_f64(),
                        b.token,
                        (end - start).as_secs_f64()
                    ),
                ));
            }
        }
    }
}
