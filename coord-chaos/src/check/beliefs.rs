//! Each node's beliefs as intervals: when it believed it led, and when it believed it was
//! registered; its stops; plus the faults as intervals.

use std::collections::BTreeMap;
use std::time::Duration;

use coord_api::{LeaseId, Revision};

use crate::fault::{Fault, FaultKind};
use crate::history::{Happening, History, Incarnation, Part};

/// A leadership belief (or a permit's: `election` is then the semaphore).
#[derive(Debug, Clone)]
pub(crate) struct Leading {
    pub who: Incarnation,
    pub election: String,
    pub token: Revision,
    pub from: Duration,
    pub until: Duration,
    /// Ended by a crash rather than by the node.
    pub crashed: bool,
    /// Given up by the node (resigned), not lost.
    pub resigned: bool,
}

/// A registration belief.
#[derive(Debug, Clone)]
pub(crate) struct Registered {
    pub who: Incarnation,
    pub key: String,
    pub lease: LeaseId,
    pub from: Duration,
    pub until: Duration,
}

/// A fault and its span.
#[derive(Debug, Clone)]
pub(crate) struct FaultSpan {
    pub fault: Fault,
    pub from: Duration,
    pub until: Duration,
}

/// A stop of a part of an incarnation: when it began, when it returned (and whether
/// cleanly), when the part started again.
#[derive(Debug, Clone)]
pub(crate) struct PartStop {
    pub who: Incarnation,
    pub part: Part,
    pub began: Duration,
    pub returned: Option<(Duration, bool)>,
    pub restarted: Option<Duration>,
}

/// Beliefs begun and not yet ended, per incarnation and name.
#[derive(Default)]
struct Open(BTreeMap<(Incarnation, String), (Revision, Duration)>);

impl Open {
    fn start(&mut self, who: Incarnation, name: &str, token: Revision, at: Duration) {
        self.0.insert((who, name.to_owned()), (token, at));
    }

    fn end(
        &mut self,
        who: Incarnation,
        name: &str,
        at: Duration,
        given_up: bool,
    ) -> Option<Leading> {
        let (token, from) = self.0.remove(&(who, name.to_owned()))?;
        Some(Leading {
            who,
            election: name.to_owned(),
            token,
            from,
            until: at,
            crashed: false,
            resigned: given_up,
        })
    }

    /// Ends every belief of `who` at its crash.
    fn crash(&mut self, who: Incarnation, at: Duration) -> Vec<Leading> {
        let ended: Vec<_> = self.0.keys().filter(|(w, _)| *w == who).cloned().collect();
        ended
            .into_iter()
            .filter_map(|(w, name)| self.end(w, &name, at, false))
            .map(|l| Leading { crashed: true, ..l })
            .collect()
    }

    /// Every belief still held at the end of the run lasts to it.
    fn finish(self, end: Duration) -> impl Iterator<Item = Leading> {
        self.0
            .into_iter()
            .map(move |((who, election), (token, from))| Leading {
                who,
                election,
                token,
                from,
                until: end,
                crashed: false,
                resigned: false,
            })
    }
}

#[derive(Debug, Default)]
pub(crate) struct Beliefs {
    pub leading: Vec<Leading>,
    /// Permits believed held, as leaderships of their semaphore.
    pub permits: Vec<Leading>,
    pub registered: Vec<Registered>,
    pub faults: Vec<FaultSpan>,
    pub part_stops: Vec<PartStop>,
    /// When each incarnation started, crashed, stopped (clean or not).
    pub started: BTreeMap<Incarnation, Duration>,
    pub crashed: BTreeMap<Incarnation, Duration>,
    pub stopped: BTreeMap<Incarnation, (Duration, bool)>,
    pub stopping: BTreeMap<Incarnation, Duration>,
    pub heal: Duration,
}

impl Beliefs {
    /// Whether `who` still runs at `at`: not crashed, and no stop asked or made, by then.
    pub(crate) fn running_at(&self, who: Incarnation, at: Duration) -> bool {
        self.crashed.get(&who).is_none_or(|c| *c > at)
            && self.stopping.get(&who).is_none_or(|s| *s > at)
            && self.stopped.get(&who).is_none_or(|(s, _)| *s > at)
    }

    pub(crate) fn build(history: &History, end: Duration) -> Beliefs {
        let mut b = Beliefs {
            heal: end,
            ..Beliefs::default()
        };
        let mut leading = Open::default();
        let mut permits = Open::default();
        let mut registered: BTreeMap<Incarnation, (String, LeaseId, Duration)> = BTreeMap::new();
        let mut faults: Vec<(Fault, Duration)> = Vec::new();
        for r in &history.records {
            match &r.what {
                Happening::Started { who, .. } => {
                    b.started.insert(*who, r.at);
                }
                Happening::LeaderStart {
                    who,
                    election,
                    token,
                } => leading.start(*who, election, *token, r.at),
                Happening::LeaderEnd {
                    who,
                    election,
                    resigned,
                    ..
                } => b
                    .leading
                    .extend(leading.end(*who, election, r.at, *resigned)),
                Happening::PermitStart {
                    who,
                    semaphore,
                    token,
                } => permits.start(*who, semaphore, *token, r.at),
                Happening::PermitEnd {
                    who,
                    semaphore,
                    released,
                    ..
                } => b
                    .permits
                    .extend(permits.end(*who, semaphore, r.at, *released)),
                Happening::Registered { who, key, lease } => {
                    // What a registration being stopped reports is relied on no more.
                    if b.stopping.contains_key(who)
                        || b.open_stop(*who, &Part::Registration).is_some()
                    {
                        continue;
                    }
                    if let Some(held) = registered.insert(*who, (key.clone(), *lease, r.at)) {
                        b.end_registration(*who, held, r.at);
                    }
                }
                Happening::Unregistered { who, .. } => {
                    if let Some(held) = registered.remove(who) {
                        b.end_registration(*who, held, r.at);
                    }
                }
                Happening::Crashed(who) => {
                    b.crashed.insert(*who, r.at);
                    b.leading.extend(leading.crash(*who, r.at));
                    b.permits.extend(permits.crash(*who, r.at));
                    if let Some(held) = registered.remove(who) {
                        b.end_registration(*who, held, r.at);
                    }
                }
                Happening::Stopping(who) => {
                    b.stopping.insert(*who, r.at);
                    if let Some(held) = registered.remove(who) {
                        b.end_registration(*who, held, r.at);
                    }
                }
                Happening::Stopped { who, clean } => {
                    b.stopped.insert(*who, (r.at, *clean));
                    // A stopped incarnation believes nothing.
                    if let Some(held) = registered.remove(who) {
                        b.end_registration(*who, held, r.at);
                    }
                }
                Happening::PartStopping { who, part } => {
                    b.part_stops.push(PartStop {
                        who: *who,
                        part: part.clone(),
                        began: r.at,
                        returned: None,
                        restarted: None,
                    });
                    // A registration being stopped is relied on no more.
                    if *part == Part::Registration {
                        if let Some(held) = registered.remove(who) {
                            b.end_registration(*who, held, r.at);
                        }
                    }
                }
                Happening::PartStopped { who, part, clean } => {
                    if let Some(s) = b.open_stop(*who, part) {
                        s.returned = Some((r.at, *clean));
                    }
                }
                Happening::FaultStart(f) => faults.push((f.clone(), r.at)),
                Happening::FaultEnd(f) => {
                    if let Some(i) = faults.iter().position(|(g, _)| g == f) {
                        let (fault, from) = faults.remove(i);
                        b.faults.push(FaultSpan {
                            fault,
                            from,
                            until: r.at,
                        });
                    }
                }
                Happening::Heal => b.heal = r.at,
                _ => {}
            }
            if let Happening::PartStarted { who, part } = &r.what {
                if let Some(s) = b
                    .part_stops
                    .iter_mut()
                    .rev()
                    .find(|s| s.who == *who && s.part == *part && s.restarted.is_none())
                {
                    s.restarted = Some(r.at);
                }
            }
        }
        b.leading.extend(leading.finish(end));
        b.permits.extend(permits.finish(end));
        for (who, held) in registered {
            b.end_registration(who, held, end);
        }
        for (fault, from) in faults {
            // Instant faults (and lasting ones cut off by the end) span to their start.
            let until = if fault.kind.lasts() { end } else { from };
            b.faults.push(FaultSpan { fault, from, until });
        }
        for l in [&mut b.leading, &mut b.permits] {
            l.sort_by(|x, y| (&x.election, x.from).cmp(&(&y.election, y.from)));
        }
        b
    }

    fn open_stop(&mut self, who: Incarnation, part: &Part) -> Option<&mut PartStop> {
        self.part_stops
            .iter_mut()
            .rev()
            .find(|s| s.who == who && s.part == *part && s.returned.is_none())
    }

    /// Closes a registration belief held since `from` under `lease`.
    fn end_registration(
        &mut self,
        who: Incarnation,
        (key, lease, from): (String, LeaseId, Duration),
        until: Duration,
    ) {
        self.registered.push(Registered {
            who,
            key,
            lease,
            from,
            until,
        });
    }

    /// Whether a fault of one of `kinds` touching `node` (or the whole store, for
    /// store-wide kinds) overlaps `[from, until]`.
    pub(crate) fn fault_near(
        &self,
        node: Option<usize>,
        kinds: &[FaultKind],
        from: Duration,
        until: Duration,
    ) -> bool {
        self.faults.iter().any(|f| {
            kinds.contains(&f.fault.kind)
                && (!f.fault.kind.targets_node() || node.is_none_or(|n| n == f.fault.node))
                && f.from <= until
                && f.until >= from
        })
    }

    /// Whether anything other than `except` happened in `[from, until]` (faults of any kind,
    /// on any node, store-wide included).
    pub(crate) fn anything_near(
        &self,
        except: Option<&FaultSpan>,
        from: Duration,
        until: Duration,
    ) -> bool {
        self.faults.iter().any(|g| {
            !except.is_some_and(|e| std::ptr::eq(e, g)) && g.from <= until && g.until >= from
        })
    }
}
