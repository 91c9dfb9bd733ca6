//! The invariants of a semaphore of N permits, for any service whose nodes record the
//! permits they hold (`Node::permit_start`/`permit_end`): P1 (at most N believers at a time),
//! P2 (the store accepts fenced writes only from seated permits: at most N at any revision),
//! P3 (no phantom permit).

use std::sync::Arc;
use std::time::Duration;

use coord_api::{EventKind, Revision};

use super::elections::{belief_ends_with_its_key, excused_overlap, Held};
use super::{Invariant, Run, TokenReader, Violation};

/// A semaphore's invariants: P1, P2 over the writes under a prefix, P3.
///
/// ```
/// use coord_api::Revision;
/// use coord_chaos::Permits;
/// // Three workers at a time; each writes "<token>:<item>" under "reindex/".
/// let permits = Permits::new("semaphores/reindex", 3, "reindex/", |value| {
///     let token = std::str::from_utf8(value).ok()?.split(':').next()?;
///     token.parse().ok().map(Revision)
/// });
/// # let _ = permits;
/// ```
#[derive(Clone)]
pub struct Permits {
    name: String,
    semaphore: String,
    permits: usize,
    prefix: Vec<u8>,
    token: TokenReader,
}

impl std::fmt::Debug for Permits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Permits")
            .field("semaphore", &self.semaphore)
            .field("permits", &self.permits)
            .field("prefix", &String::from_utf8_lossy(&self.prefix))
            .finish_non_exhaustive()
    }
}

impl Permits {
    /// The semaphore `semaphore` of `permits` permits, whose holders write under `prefix`
    /// through their permit's fence, each value carrying the writer's token (read by
    /// `token`).
    pub fn new(
        semaphore: impl Into<String>,
        permits: usize,
        prefix: impl Into<Vec<u8>>,
        token: impl Fn(&[u8]) -> Option<Revision> + Send + Sync + 'static,
    ) -> Self {
        let semaphore = semaphore.into();
        Permits {
            name: format!("P1-P3 ({semaphore})"),
            semaphore,
            permits,
            prefix: prefix.into(),
            token: Arc::new(token),
        }
    }

    /// P1: at any instant at most N incarnations believe they hold a permit, unless one of
    /// them was paused around it or an operator revoked or deleted keys shortly before (as S2).
    fn p1(&self, run: &Run<'_>, out: &mut Vec<Violation>) {
        let held: Vec<_> = run
            .beliefs
            .permits
            .iter()
            .filter(|p| p.election == self.semaphore)
            .collect();
        // At each belief's start, who else believes then.
        for p in &held {
            let mut with: Vec<_> = held
                .iter()
                .filter(|q| q.from <= p.from && p.from < q.until && q.who != p.who)
                .collect();
            if with.len() < self.permits {
                continue;
            }
            with.sort_by_key(|q| q.from);
            let excused = with.iter().any(|q| {
                excused_overlap(run, p.who.node, q.who.node, p.from, p.from, Duration::ZERO)
            });
            if excused {
                continue;
            }
            let mut who: Vec<_> = with.iter().map(|q| q.who).collect();
            who.push(p.who);
            let tokens: Vec<String> = with
                .iter()
                .map(|q| q.token.to_string())
                .chain([p.token.to_string()])
                .collect();
            out.push(run.violation(
                "P1",
                p.from,
                &who,
                format!(
                    "semaphore {} ({} permits): {} believe they hold one (tokens {})",
                    self.semaphore,
                    self.permits,
                    who.len(),
                    tokens.join(", ")
                ),
            ));
        }
    }

    /// P2: every write the store accepted under the prefix carries the token of a key among
    /// the N oldest of the semaphore at that revision.
    fn p2(&self, run: &Run<'_>, out: &mut Vec<Violation>) {
        for c in run.commits() {
            for e in &c.events {
                if e.kind != EventKind::Put || !e.kv.key.starts_with(&self.prefix) {
                    continue;
                }
                let token = (self.token)(&e.kv.value);
                let seated = run
                    .truth
                    .seated_at(&self.semaphore, c.revision, self.permits);
                if token.is_some_and(|t| seated.contains(&t)) {
                    continue;
                }
                out.push(run.violation(
                    "P2",
                    c.at,
                    &run.author(c.origin).into_iter().collect::<Vec<_>>(),
                    format!(
                        "semaphore {}: the store accepted {} with token {token:?} at revision {} while the permits were held by {seated:?}",
                        self.semaphore,
                        e.kv.key_str(),
                        c.revision
                    ),
                ));
            }
        }
    }

    /// P3: a permit is believed only from when its key is among the N oldest (within one
    /// round trip), and no longer than its key stands (S3's bounds).
    fn p3(&self, run: &Run<'_>, out: &mut Vec<Violation>) {
        let spans = run
            .truth
            .queues
            .get(&self.semaphore)
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        for p in run
            .beliefs
            .permits
            .iter()
            .filter(|p| p.election == self.semaphore)
        {
            let window = run.reply_window(p.who.node, p.from);
            let lo = p.from.saturating_sub(window);
            let seated = spans.iter().enumerate().any(|(i, s)| {
                let until = spans.get(i + 1).map(|n| n.from);
                s.from <= p.from
                    && until.is_none_or(|u| u > lo)
                    && s.keys.iter().take(self.permits).any(|k| *k == p.token)
            });
            if !seated {
                out.push(run.violation(
                    "P3",
                    p.from,
                    &[p.who],
                    format!(
                        "semaphore {}: believes it holds a permit with token {}, but that key was not among the {} oldest within {window:?} before",
                        self.semaphore, p.token, self.permits
                    ),
                ));
                continue;
            }
            belief_ends_with_its_key(run, "P3", p, out);
        }
    }
}

impl Invariant for Permits {
    fn name(&self) -> &str {
        &self.name
    }

    fn check(&self, run: &Run<'_>, out: &mut Vec<Violation>) {
        self.p1(run, out);
        self.p2(run, out);
        self.p3(run, out);
    }
}

/// P4, for a semaphore whose permit a service's nodes always want (each takes one in a
/// loop, as coord's own nodes do): from t_h + τ + B + ET + RTT on, it never goes without a
/// believed permit for longer than τ + B + 2RTT, L5's bound. A waiter that a release does
/// not wake leaves its seat unused (held by a key nobody believes in) until its session ends.
pub(crate) struct PermitHeld {
    semaphore: &'static str,
}

impl PermitHeld {
    /// P4 for the semaphore `semaphore`.
    pub(crate) fn new(semaphore: &'static str) -> Self {
        PermitHeld { semaphore }
    }
}

impl Invariant for PermitHeld {
    fn name(&self) -> &str {
        "P4"
    }

    fn check(&self, run: &Run<'_>, out: &mut Vec<Violation>) {
        let held = Held {
            invariant: "P4",
            what: "semaphore",
            none: "no permit believed",
        };
        held.check(run, &run.beliefs.permits, [self.semaphore], out);
    }
}
