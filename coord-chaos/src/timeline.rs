//! A run's timeline as text: faults, incarnations, beliefs and watcher events, one a line,
//! stamped with simulated time (the store's own changes, views and writes are left out: the
//! checkers read them).

use std::fmt::Write;

use crate::history::{Emitted, Happening, History};

/// The timeline of `history`, one line per record that belongs on it.
pub fn timeline(history: &History) -> String {
    let mut out = String::new();
    for r in &history.records {
        if let Some(line) = line(&r.what) {
            let _ = writeln!(out, "{:>9.3}s  {line}", r.at.as_secs_f64());
        }
    }
    out
}

fn line(what: &Happening) -> Option<String> {
    Some(match what {
        Happening::FaultStart(f) => format!("FAULT  {}", f.what()),
        Happening::FaultEnd(f) => match f.target() {
            Some(target) => format!("healed {} {target}", f.kind),
            None => format!("healed {}", f.kind),
        },
        Happening::Heal => "--- every fault is over: quiet phase ---".to_owned(),
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
