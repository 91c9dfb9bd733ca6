//! The per-lease bookkeeping of election turns: one election's campaigns on one lease take
//! turns on its key ([`CampaignSlot`]).

use super::*;

/// A leadership's loss signal: unset while it stands.
pub(super) type LossSignal = watch::Sender<Option<LossReason>>;

/// One election's campaigns on one lease. They all write the same key (`name/<lease>`), so
/// they take turns, and the withdrawal of a campaign that did not finish is retried only
/// until a newer campaign takes the key over: a withdrawal that landed after that would
/// delete the newer campaign's key (its leadership, even).
///
/// Each campaign is numbered as its turn comes: a withdrawal or a resign on behalf of
/// campaign `n` deletes only while no later campaign has taken a turn (a campaign again on
/// the same session rejoins the key, create revision and all, so no compare in the store can
/// tell the two apart), and while no earlier leadership of the session on the key still
/// stands: the key is that one's too, and is left to it (see [`CampaignSlot::may_delete`]).
/// A campaign given up before its turn came took nothing over.
#[derive(Debug)]
pub(super) struct CampaignSlot {
    /// The key's turn, and the pending withdrawal, which the next campaign calls off.
    pub(super) key: KeyTurn,
    /// The number of the campaign the key is on behalf of: the latest to have taken its
    /// turn, or an earlier leadership the key was left to.
    pub(super) latest: watch::Sender<u64>,
    /// The last number handed out: numbers are never reused, though `latest` can go back.
    pub(super) numbered: AtomicU64,
    /// The leaderships won on the key, by campaign number, each with its loss signal: one
    /// whose signal is unset (and not dropped) still stands.
    pub(super) standing: Mutex<Vec<(u64, Weak<LossSignal>)>>,
}

impl Default for CampaignSlot {
    fn default() -> Self {
        CampaignSlot {
            key: KeyTurn::default(),
            latest: watch::Sender::new(0),
            numbered: AtomicU64::new(0),
            standing: Mutex::default(),
        }
    }
}

/// A campaign's turn in one election on one lease (see [`SessionHandle::campaign_turn`]).
pub(crate) struct CampaignTurn {
    pub(crate) turn: crate::elections::Turn,
    /// The campaign's number in the slot: what its withdrawal or resign is held to.
    pub(crate) campaign: u64,
    /// What the key stood for before this campaign took its turn, for a campaign that ends
    /// having written nothing (see [`SessionHandle::give_back`](super::SessionHandle::give_back)).
    pub(crate) before: Before,
}

/// The key as a campaign found it when it took its turn.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Before {
    /// The campaign the key was on behalf of.
    pub(super) latest: u64,
    /// Whether a withdrawal of it was pending, which taking the turn called off.
    pub(super) withdrawal_called_off: bool,
}

impl CampaignSlot {
    /// Whether `campaign` is still the latest to have taken a turn: its key is not a newer
    /// campaign's.
    pub(super) fn is_latest(&self, campaign: u64) -> bool {
        self.latest.get() == campaign
    }

    /// Whether the key may be deleted on behalf of `campaign` (its resign, or the withdrawal
    /// of a campaign that did not finish): only while it is the latest campaign, and no
    /// earlier leadership of the session on the key still stands. When one stands (a newer
    /// campaign rejoined its key, then gave up or resigned), the key is left to it, and it is
    /// the latest again: its own resign deletes the key. The one place that rule lives: every
    /// delete of the key on a campaign's behalf asks here, last in the session's turn just
    /// before the delete (a withdrawal also asks when it is handed over, to spare a task).
    pub(super) fn may_delete(&self, campaign: u64) -> bool {
        if !self.is_latest(campaign) {
            return false;
        }
        let mut standing = self.standing.lock().unwrap_or_else(|p| p.into_inner());
        standing.retain(|(_, lost)| lost.upgrade().is_some_and(|l| l.get().is_none()));
        let earlier = standing
            .iter()
            .map(|(n, _)| *n)
            .filter(|n| *n < campaign)
            .max();
        match earlier {
            Some(n) => {
                self.latest.send_replace(n);
                false
            }
            None => true,
        }
    }
}
