//! [`LossReason`]: why a leadership ended, as its holder and the metrics name it.

/// Why a [`Leadership`](super::Leadership) ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LossReason {
    /// The session's local deadline passed without a renewal: the store may elect another
    /// leader from now on.
    DeadlinePassed,
    /// The store reported the session's lease gone.
    LeaseLost,
    /// The leader key was deleted (by hand, or with its lease) or replaced.
    KeyDeleted,
    /// A fenced write was refused: the store no longer counts this key as the leader.
    FencedOut,
    /// The session was stopped, orphaned or dropped by its owner.
    SessionClosed,
    /// [`Leadership::resign`](super::Leadership::resign) gave it up.
    Resigned,
}

impl LossReason {
    /// The `reason` label of [`LEADERSHIP_ENDED`](crate::metrics::LEADERSHIP_ENDED).
    pub fn label(self) -> &'static str {
        match self {
            LossReason::DeadlinePassed => "deadline_passed",
            LossReason::LeaseLost => "lease_lost",
            LossReason::KeyDeleted => "key_deleted",
            LossReason::FencedOut => "fenced_out",
            LossReason::SessionClosed => "session_closed",
            LossReason::Resigned => "resigned",
        }
    }
}

impl std::fmt::Display for LossReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LossReason::DeadlinePassed => "the session's deadline passed without a renewal",
            LossReason::LeaseLost => "the store reported the lease gone",
            LossReason::KeyDeleted => "the leader key was deleted",
            LossReason::FencedOut => "a fenced write was refused",
            LossReason::SessionClosed => "the session was closed",
            LossReason::Resigned => "resigned",
        })
    }
}
