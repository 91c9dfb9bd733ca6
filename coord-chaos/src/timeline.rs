//! A run's timeline as text: faults, incarnations, beliefs and watcher events, one a line,
//! stamped with simulated time; with [`timeline_with_store`], the store's journal too (every
//! commit, lease grant, renewal and lease end, by whom), to tell from a failing seed what the
//! store held when a node believed otherwise.

use std::collections::BTreeMap;
use std::fmt::Write;

use coord_api::EventKind;
use coord_sim::journal::{Entry, Origin};

use crate::history::{Emitted, Happening, History, Incarnation};

/// The timeline of `history`, one line per record that belongs on it.
pub fn timeline(history: &History) -> String {
    render(history, false)
}

/// [`timeline`] with the store's journal: each commit's events (`@revision put key = value
/// (lease) by who`, `@revision delete key by who`), lease grants, renewals and ends, leader
/// changes' lease extensions and compactions, who being the incarnation whose client sent the
/// request (or the operator's client, an expiry, the store itself).
pub fn timeline_with_store(history: &History) -> String {
    render(history, true)
}

fn render(history: &History, store: bool) -> String {
    let clients: BTreeMap<u64, Incarnation> = history
        .records
        .iter()
        .filter_map(|r| match r.what {
            Happening::Started { who, client } => Some((client, who)),
            _ => None,
        })
        .collect();
    let mut out = String::new();
    for r in &history.records {
        let lines = match &r.what {
            Happening::Store(entry) if store => store_lines(entry, &clients),
            what => line(what).into_iter().collect(),
        };
        for line in lines {
            let _ = writeln!(out, "{:>9.3}s  {line}", r.at.as_secs_f64());
        }
    }
    out
}

fn store_lines(entry: &Entry, clients: &BTreeMap<u64, Incarnation>) -> Vec<String> {
    let by = |origin: &Origin| match origin {
        Origin::Client(c) => match clients.get(c) {
            Some(who) => format!("by {who}"),
            None => format!("by client {c}"),
        },
        Origin::Expiry => "by expiry".to_owned(),
        Origin::Store => "by the store".to_owned(),
        Origin::StaleLeader => "by a stale leader on resuming (etcd#15247)".to_owned(),
    };
    match entry {
        Entry::Commit {
            revision,
            origin,
            events,
        } => events
            .iter()
            .map(|e| match e.kind {
                EventKind::Put => format!(
                    "store  @{revision} put {} = {} (lease {}) {}",
                    e.kv.key_str(),
                    String::from_utf8_lossy(&e.kv.value),
                    e.kv.lease,
                    by(origin)
                ),
                EventKind::Delete => {
                    format!(
                        "store  @{revision} delete {} {}",
                        e.kv.key_str(),
                        by(origin)
                    )
                }
            })
            .collect(),
        Entry::Grant { lease, ttl, origin } => vec![format!(
            "store  grant lease {lease} ({} s) {}",
            ttl.as_secs_f64(),
            by(origin)
        )],
        Entry::Renew { lease, origin } => {
            vec![format!("store  renew lease {lease} {}", by(origin))]
        }
        Entry::LeaseEnd { lease, origin } => vec![match origin {
            Origin::Expiry => format!("store  lease {lease} expired"),
            other => format!("store  lease {lease} revoked {}", by(other)),
        }],
        Entry::Promote { extend } => vec![format!(
            "store  new leader: every lease's deadline set to its TTL + {} s",
            extend.as_secs_f64()
        )],
        Entry::Compact { revision } => vec![format!("store  compacted before @{revision}")],
    }
}

fn line(what: &Happening) -> Option<String> {
    Some(match what {
        Happening::FaultStart(f) => format!("FAULT  {}", f.what()),
        Happening::FaultEnd(f) => match f.target() {
            Some(target) => format!("healed {} {target}", f.kind),
            None => format!("healed {}", f.kind),
        },
        Happening::Heal => "--- every fault is over: quiet phase ---".to_owned(),
        Happening::Overtaken { who, calls } => {
            format!("{who}  {calls} call(s) held on their way land now, after later ones")
        }
        Happening::Started { who, .. } => format!("{who}  started"),
        Happening::Crashed(who) => format!("{who}  CRASHED"),
        Happening::Stopping(who) => format!("{who}  stopping"),
        Happening::Stopped { who, clean } => format!(
            "{who}  stopped{}",
            if *clean { "" } else { " (with errors)" }
        ),
        Happening::PartStopping { who, part } => format!("{who}  stopping its {part}"),
        Happening::PartStopped { who, part, clean } => format!(
            "{who}  stopped its {part}{}",
            if *clean { "" } else { " (with errors)" }
        ),
        Happening::PartStarted { who, part } => format!("{who}  starts its {part} again"),
        Happening::Registered { who, lease, .. } => format!("{who}  registered (lease {lease})"),
        Happening::Unregistered { who, .. } => format!("{who}  not registered"),
        Happening::Metadata { who, value, .. } => format!("{who}  metadata {value}"),
        Happening::LeaderStart {
            who,
            election,
            token,
        } => format!("{who}  leads {election} (token {token})"),
        Happening::LeaderEnd {
            who,
            election,
            token,
            resigned,
        } => format!(
            "{who}  {} {election} (token {token})",
            if *resigned {
                "resigns"
            } else {
                "no longer leads"
            }
        ),
        Happening::PermitStart {
            who,
            semaphore,
            token,
        } => format!("{who}  holds a permit of {semaphore} (token {token})"),
        Happening::PermitEnd {
            who,
            semaphore,
            token,
            released,
        } => format!(
            "{who}  {} its permit of {semaphore} (token {token})",
            if *released {
                "releases"
            } else {
                "no longer holds"
            }
        ),
        Happening::FencedWrite {
            who,
            token,
            outcome,
            ..
        } if *outcome != crate::history::Outcome::Accepted => {
            format!("{who}  fenced write with token {token}: {outcome:?}")
        }
        Happening::Emitted(who, Emitted::Up(h, _, rev)) => format!("{who}  sees {h} up @{rev}"),
        Happening::Emitted(who, Emitted::Down(h, rev)) => format!("{who}  sees {h} down @{rev}"),
        Happening::Emitted(who, Emitted::Resynced(rev)) => {
            format!("{who}  watcher resynced @{rev}")
        }
        Happening::Inconsistent { who, detail } => format!("{who}  INCONSISTENT {detail}"),
        Happening::Note { who, kind, detail } => format!("{who}  {kind}: {detail}"),
        _ => return None,
    })
}
