//! The invariants of elections, for any service whose nodes record their leaderships: S1
//! (tokens grow; the fenced resource accepts only the current leader), S2 (one believer at a
//! time), S3 (no phantom leadership), S9 (no node deletes the key it believes it leads on),
//! L5 (a leader exists after the heal), L6 (failover).

use std::sync::Arc;
use std::time::Duration;

use coord_api::{KeyValue, Revision};

use super::beliefs::Leading;
use super::truth::Deletion;
use super::{Commit, Invariant, Run, TokenReader, Violation};
use crate::fault::FaultKind;
use crate::history::{Happening, Incarnation};

/// The live incarnations at the end of the run (not crashed, not stopped).
pub(super) fn live_at_end(run: &Run<'_>) -> Vec<Incarnation> {
    let mut last: std::collections::BTreeMap<usize, Incarnation> = Default::default();
    for who in run.beliefs.started.keys() {
        let e = last.entry(who.node).or_insert(*who);
        if who.inc > e.inc {
            *e = *who;
        }
    }
    last.into_values()
        .filter(|w| !run.beliefs.crashed.contains_key(w) && !run.beliefs.stopped.contains_key(w))
        .collect()
}

/// The bound for healing after the heal instant: τ + B + ET (a leader change's lease
/// extension) + RTT.
pub(super) fn heal_bound(run: &Run<'_>) -> Duration {
    let s = run.scenario;
    s.ttl + s.max_backoff + s.election_timeout + run.rtt()
}

fn prefix(election: &str) -> String {
    format!("{election}/")
}

/// S1, the beliefs: successive leaders' tokens strictly increase.
///
/// Beliefs begin when a campaign's confirming read comes back, up to one round trip after the
/// store answered it; so a belief can begin with a lower token than one that began just
/// before it, when its key was deleted while its reply travelled (an operator's revoke under
/// added latency). That stale belief is S3's to bound (it ends within the notice bound after
/// the key went), and [`FencedWrites`] shows no write of it was accepted; it is excused here
/// only when its key was already gone, at most one round trip before it began.
pub(super) fn s1_tokens_grow(run: &Run<'_>, out: &mut Vec<Violation>) {
    let mut last: std::collections::BTreeMap<&str, (Revision, Incarnation)> = Default::default();
    for r in &run.history.records {
        let Happening::LeaderStart {
            who,
            election,
            token,
        } = &r.what
        else {
            continue;
        };
        if let Some((prev, prev_who)) = last.get(election.as_str()) {
            // The same incarnation leading again on the key it still holds (a resign that
            // failed, then a re-campaign rejoined its key) is one leadership, not two.
            let rejoined = token == prev && who == prev_who;
            let p = prefix(election);
            let stale = run.truth.deletions.iter().any(|d| {
                d.create_revision == *token
                    && d.key.starts_with(&p)
                    && d.at <= r.at
                    && r.at <= d.at + run.reply_window(who.node, r.at)
            });
            if token <= prev && !rejoined && !stale {
                out.push(run.violation(
                    "S1",
                    r.at,
                    &[*prev_who, *who],
                    format!("election {election}: leader token {token} after {prev}"),
                ));
            }
        }
        // The highest token so far is what the next leader must exceed.
        if last
            .get(election.as_str())
            .is_none_or(|(prev, _)| token >= prev)
        {
            last.insert(election, (*token, *who));
        }
    }
}

/// S1, the fenced resource: every write the store accepted to the keys under a prefix
/// carries the token of the election's leader at that revision, and tokens never go back.
/// What the leader of an election writes through its fence (coord's nodes write their token
/// to `work/<election>`; a scheduler, its results).
///
/// ```
/// use coord_chaos::FencedWrites;
/// use coord_api::Revision;
/// // Results are written as "<token>:<job>" by the leader of "jobs".
/// let fenced = FencedWrites::new("jobs", "results/", |value| {
///     let token = std::str::from_utf8(value).ok()?.split(':').next()?.parse().ok()?;
///     Some(Revision(token))
/// });
/// # let _ = fenced;
/// ```
#[derive(Clone)]
pub struct FencedWrites {
    name: String,
    election: String,
    prefix: Vec<u8>,
    token: TokenReader,
}

impl std::fmt::Debug for FencedWrites {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FencedWrites")
            .field("election", &self.election)
            .field("prefix", &String::from_utf8_lossy(&self.prefix))
            .finish_non_exhaustive()
    }
}

impl FencedWrites {
    /// The writes under `prefix`, fenced by `election`'s leadership, each carrying its
    /// writer's token in its value (read by `token`; `None`: the value carries none, which
    /// is a violation).
    pub fn new(
        election: impl Into<String>,
        prefix: impl Into<Vec<u8>>,
        token: impl Fn(&[u8]) -> Option<Revision> + Send + Sync + 'static,
    ) -> Self {
        let election = election.into();
        FencedWrites {
            name: format!("S1 (fence of {election})"),
            election,
            prefix: prefix.into(),
            token: Arc::new(token),
        }
    }

    fn accepted<'r>(
        &'r self,
        run: &'r Run<'_>,
    ) -> impl Iterator<Item = (&'r Commit, KeyValue)> + 'r {
        run.commits().iter().flat_map(move |c| {
            c.events
                .iter()
                .filter(|e| {
                    e.kind == coord_api::EventKind::Put && e.kv.key.starts_with(&self.prefix)
                })
                .map(move |e| (c, e.kv.clone()))
        })
    }
}

impl Invariant for FencedWrites {
    fn name(&self) -> &str {
        &self.name
    }

    fn check(&self, run: &Run<'_>, out: &mut Vec<Violation>) {
        let mut max = Revision(i64::MIN);
        for (commit, kv) in self.accepted(run) {
            let (at, revision) = (commit.at, commit.revision);
            // Who wrote it: the incarnation whose client sent the write.
            let writer: Vec<Incarnation> = run.author(commit.origin).into_iter().collect();
            let token = (self.token)(&kv.value);
            let leader = run.leader_at(&self.election, revision);
            let key = kv.key_str();
            match token {
                Some(t) if leader == Some(t) => {}
                _ => out.push(run.violation(
                    "S1",
                    at,
                    &writer,
                    format!(
                        "election {}: the store accepted {key} with token {} at revision {revision} while the leader's token was {}",
                        self.election,
                        token.map_or("none".to_owned(), |t| t.to_string()),
                        leader.map_or("none (no candidate)".to_owned(), |t| t.to_string()),
                    ),
                )),
            }
            if let Some(t) = token {
                if t < max {
                    out.push(run.violation(
                        "S1",
                        at,
                        &writer,
                        format!(
                            "election {}: accepted {key} with token {t} after token {max}",
                            self.election
                        ),
                    ));
                }
                max = max.max(t);
            }
        }
    }
}

/// S2: at most one node believes it leads an election at any instant, unless a believer
/// was paused or an operator revoked or deleted keys shortly before.
pub(super) fn s2_belief_exclusivity(run: &Run<'_>, out: &mut Vec<Violation>) {
    let leading = &run.beliefs.leading;
    for (i, a) in leading.iter().enumerate() {
        for b in &leading[i + 1..] {
            if b.election != a.election || b.from >= a.until || a.who == b.who {
                continue;
            }
            let start = b.from.max(a.from);
            let end = b.until.min(a.until);
            if end <= start {
                continue;
            }
            if !excused_overlap(run, a.who.node, b.who.node, start, end, Duration::ZERO) {
                out.push(run.violation(
                    "S2",
                    start,
                    &[a.who, b.who],
                    format!(
                        "election {}: both believe they lead for {:.3}s (tokens {} and {})",
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

/// Whether two nodes' leaderships (or their terms' work) may overlap in `start..end`: one of
/// them was paused around it (only the fence protects against a pause past the deadline), or
/// an operator revoked or deleted keys shortly before (the deposed node learns of it only
/// when its watch tells it). Shortly: S3's bound on a belief after its key's deletion (τ +
/// RW, RW at the deletion, for either node), plus `wind_down` for what runs on after the
/// belief (a term's work: the candidate's grace).
pub(super) fn excused_overlap(
    run: &Run<'_>,
    a: usize,
    b: usize,
    start: Duration,
    end: Duration,
    wind_down: Duration,
) -> bool {
    let ttl = run.scenario.ttl;
    let paused = [a, b].iter().any(|n| {
        run.beliefs.fault_near(
            Some(*n),
            &[FaultKind::Pause],
            start.saturating_sub(ttl),
            end,
        )
    });
    let operator = run.beliefs.faults.iter().any(|f| {
        let window = ttl + run.reply_window(a, f.from).max(run.reply_window(b, f.from));
        f.fault.kind.takes_leases() && f.from <= start && start - f.from <= window + wind_down
    });
    paused || operator
}

/// S3: a leadership begins only while its key exists and is the oldest of the election
/// (within one round trip, a slow reply's included), and ends within the notice bound after the key is deleted.
pub(super) fn s3_no_phantom_leadership(run: &Run<'_>, out: &mut Vec<Violation>) {
    for l in &run.beliefs.leading {
        let window = run.reply_window(l.who.node, l.from);
        let spans = run
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
            out.push(run.violation(
                "S3",
                l.from,
                &[l.who],
                format!(
                    "election {}: believes it leads with token {}, but that key was not the oldest of the election within {:?} before",
                    l.election, l.token, window
                ),
            ));
            continue;
        }
        belief_ends_with_its_key(run, "S3", l, out);
    }
}

/// S9: a node never deletes the key of a leadership it still believes in. Its resign (or
/// any delete of its) lands only after its belief on that key ended: every leadership of a
/// node in one election shares the node's key there, so a resign of an older one that
/// deleted the key after a newer campaign rejoined it deposes the leadership the node
/// handed over to.
pub(super) fn s9_no_self_deposition(run: &Run<'_>, out: &mut Vec<Violation>) {
    for d in &run.truth.deletions {
        let Some(who) = run.truth.author(d.origin) else {
            continue;
        };
        let believed = run.beliefs.leading.iter().find(|l| {
            l.who == who
                && l.token == d.create_revision
                && d.key.starts_with(&prefix(&l.election))
                && l.from <= d.at
                && d.at < l.until
        });
        if let Some(l) = believed {
            out.push(run.violation(
                "S9",
                d.at,
                &[who],
                format!(
                    "election {}: its own delete of key {} (token {}) landed at revision {} while it believed it led on it",
                    l.election, d.key, l.token, d.revision
                ),
            ));
        }
    }
}

/// The deletion of the key a belief was held on, if it was deleted.
fn deletion_of<'r>(run: &'r Run<'_>, l: &Leading) -> Option<&'r Deletion> {
    let p = prefix(&l.election);
    run.truth
        .deletions
        .iter()
        .find(|d| d.create_revision == l.token && d.key.starts_with(&p))
}

/// The second half of S3 (and of a semaphore's P3): a belief ends no later than its lease's
/// expiry at the store, and within the notice bound after its key is deleted otherwise (at
/// once when the node is healthy, by its session deadline when its link was disturbed).
pub(super) fn belief_ends_with_its_key(
    run: &Run<'_>,
    invariant: &str,
    l: &Leading,
    out: &mut Vec<Violation>,
) {
    let Some(d) = deletion_of(run, l) else {
        return;
    };
    // The event that tells of the deletion travels the node's link like any reply: a
    // renewal sent up to one reply window after the deletion, while the event was still on
    // its way (and then lost), is acknowledged and moves the deadline (`--defaults` seed
    // 2113138: replies 1.4 s slow, the watch's event lost to a leader change and a one-way
    // cut, its belief 10.82 s after the deletion, past τ + RTT).
    let window = run.reply_window(l.who.node, d.at);
    // Deleted by its lease's expiry: the belief ended before. The local deadline (send time
    // of the last acknowledged renewal + TTL) cannot be later than the store's expiry
    // (receipt of the last renewal + TTL), whatever the network did.
    if d.origin == coord_sim::journal::Origin::Expiry && l.until > d.at {
        out.push(run.violation(
            invariant,
            d.at,
            &[l.who],
            format!(
                "{}: believed (token {}) {:.3}s past its lease's expiry at the store",
                l.election,
                l.token,
                (l.until - d.at).as_secs_f64()
            ),
        ));
        return;
    }
    let disturbed: Vec<FaultKind> = FaultKind::ALL
        .into_iter()
        .filter(|k| k.disturbs_link())
        .collect();
    let faulty = run.beliefs.fault_near(
        Some(l.who.node),
        &disturbed,
        d.at.saturating_sub(run.scenario.ttl),
        d.at + window,
    );
    let bound = if faulty {
        run.scenario.ttl + window
    } else {
        window
    };
    if l.until > d.at + bound {
        out.push(run.violation(
            invariant,
            d.at + bound,
            &[l.who],
            format!(
                "{}: still believed (token {}) {:.3}s after its key was deleted (bound {:.3}s)",
                l.election,
                l.token,
                (l.until - d.at).as_secs_f64(),
                bound.as_secs_f64()
            ),
        ));
    }
}

/// L5: after t_h + τ + B + ET + RTT, no election goes without a leader for longer than
/// τ + B + 2RTT.
pub(super) fn l5_leader_exists(run: &Run<'_>, out: &mut Vec<Violation>) {
    let elections: std::collections::BTreeSet<&str> = run
        .beliefs
        .leading
        .iter()
        .map(|l| l.election.as_str())
        .collect();
    let held = Held {
        invariant: "L5",
        what: "election",
        none: "no leader",
    };
    held.check(run, &run.beliefs.leading, elections, out);
}

/// An invariant that some belief in each of several elections (or semaphores) always stands
/// after the heal: L5, and P4.
pub(super) struct Held {
    pub(super) invariant: &'static str,
    pub(super) what: &'static str,
    pub(super) none: &'static str,
}

impl Held {
    /// From t_h + τ + B + ET + RTT on, each of `names` goes without a belief of `beliefs` for
    /// no longer than τ + B + 2RTT.
    pub(super) fn check<'a>(
        &self,
        run: &Run<'_>,
        beliefs: &[Leading],
        names: impl IntoIterator<Item = &'a str>,
        out: &mut Vec<Violation>,
    ) {
        let from = run.beliefs.heal + heal_bound(run);
        let gap_bound = run.scenario.ttl + run.scenario.max_backoff + run.rtt() * 2;
        if from >= run.end || live_at_end(run).is_empty() {
            return;
        }
        for e in names {
            let mut spans: Vec<(Duration, Duration)> = beliefs
                .iter()
                .filter(|l| l.election == e && l.until > from)
                .map(|l| (l.from.max(from), l.until))
                .collect();
            spans.sort();
            let mut covered_to = from;
            let mut worst = (Duration::ZERO, from);
            for (a, b) in spans.iter().copied().chain([(run.end, run.end)]) {
                if a > covered_to && a - covered_to > worst.0 {
                    worst = (a - covered_to, covered_to);
                }
                covered_to = covered_to.max(b);
            }
            if worst.0 > gap_bound {
                out.push(run.violation(
                    self.invariant,
                    worst.1,
                    &[],
                    format!(
                        "{} {e} had {} for {:.3}s after the heal (bound {:.3}s)",
                        self.what,
                        self.none,
                        worst.0.as_secs_f64(),
                        gap_bound.as_secs_f64()
                    ),
                ));
            }
        }
    }
}

/// L6: when a leader crashes and nothing else is wrong, the candidate next in the queue leads
/// within one round trip (plus a retry pause) of the old key's expiry, if it is alive: a
/// successor that crashed too is not promised anything (its key blocks the queue until it
/// expires, and L5 bounds that).
pub(super) fn l6_failover(run: &Run<'_>, out: &mut Vec<Violation>) {
    let quiet_kinds: Vec<FaultKind> = FaultKind::RECORDED
        .into_iter()
        .filter(|k| *k != FaultKind::Crash)
        .collect();
    for l in run.beliefs.leading.iter().filter(|l| l.crashed) {
        let p = prefix(&l.election);
        let Some(d) = deletion_of(run, l) else {
            continue;
        };
        let bound = d.at + run.rtt() + Duration::from_millis(500);
        if bound >= run.end
            || run.beliefs.fault_near(
                None,
                &quiet_kinds,
                l.until.saturating_sub(run.scenario.ttl),
                bound,
            )
        {
            continue;
        }
        // The next in the queue: the election's oldest key once the old one is gone, and who
        // campaigned with it.
        let Some(successor) = run.truth.leader_at(&l.election, d.revision) else {
            continue;
        };
        let Some(owner) = run
            .truth
            .key_spans
            .iter()
            .find(|s| s.create_revision == successor && s.key.starts_with(&p))
            .and_then(|s| run.truth.granted_by(s.lease))
        else {
            continue;
        };
        if !run.beliefs.running_at(owner, bound) {
            continue;
        }
        let next = run
            .beliefs
            .leading
            .iter()
            .filter(|n| n.election == l.election && n.from >= l.from && n.token != l.token)
            .map(|n| n.from)
            .min();
        if next.is_none_or(|n| n > bound) {
            out.push(run.violation(
                "L6",
                bound,
                &[l.who, owner],
                format!(
                    "election {}: the leader crashed, its key expired at {:.3}s, and {owner} (next in the queue, token {successor}) did not lead by {:.3}s",
                    l.election,
                    d.at.as_secs_f64(),
                    bound.as_secs_f64()
                ),
            ));
        }
    }
}
