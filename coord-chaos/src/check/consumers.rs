//! C1: what a recipe reports agrees with its state, as a consumer reading both at each
//! report finds them (the view holds the event it explains; a leadership handed out leads;
//! a registration's lease is the one its status names).

use super::{Run, Violation};
use crate::history::Happening;

/// C1: no consumer found a recipe's state inconsistent with what it was just told.
pub(super) fn c1_consistent_state(run: &Run<'_>, out: &mut Vec<Violation>) {
    for r in &run.history.records {
        if let Happening::Inconsistent { who, detail } = &r.what {
            out.push(run.violation("C1", r.at, &[*who], detail.clone()));
        }
    }
}
