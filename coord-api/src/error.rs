//! The one error type of every [`KvLeaseStore`](crate::KvLeaseStore) call and recipe.
//!
//! Variants are named by *condition*, never by the library that produced them, and each belongs
//! to exactly one [`ErrorClass`], which is what callers branch on:
//!
//! * [`ErrorClass::Rejected`]: the store refused the request; nothing was applied.
//! * [`ErrorClass::Retryable`]: the request was not applied (never sent, or a read); retrying is safe.
//! * [`ErrorClass::Indeterminate`]: a write that may or may not have applied. Re-read before acting;
//!   never retry blindly (a retried conditional delete can remove someone else's key).
//! * [`ErrorClass::InvalidArgument`]: bad input, caught before anything was sent.
//! * [`ErrorClass::NotFound`]: the lease or leader asked about does not exist.
//! * [`ErrorClass::Compacted`]: the revision asked for is no longer in the store's history.
//! * [`ErrorClass::Cancelled`]: the caller gave up (a dropped or timed-out operation).
//!
//! `Display` is one lowercase line without the source's text; the chain is available through
//! [`std::error::Error::source`], so a subscriber can walk it without printing it twice.

use crate::types::{LeaseId, Revision};

/// A boxed error used as the source of backend failures.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The result type of every coord call.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything a [`KvLeaseStore`](crate::KvLeaseStore) call or a recipe can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The request was malformed (empty key, zero TTL, oversized value, bad election name...).
    /// Nothing was sent to the store.
    #[error("invalid argument: {reason}")]
    InvalidArgument {
        /// What was wrong, in words a user can act on.
        reason: String,
    },

    /// The lease does not exist: it was never granted, was revoked, or expired.
    #[error("lease {lease} not found (never granted, revoked or expired)")]
    LeaseNotFound {
        /// The lease asked about.
        lease: LeaseId,
    },

    /// The revision asked for is older than the store's compaction point.
    #[error("revision {requested} has been compacted (history starts at {compact_revision})")]
    Compacted {
        /// The revision that was asked for.
        requested: Revision,
        /// The compaction point: the oldest revision still readable or watchable.
        compact_revision: Revision,
    },

    /// The revision asked for has not been written yet.
    #[error("revision {requested} is in the future (current revision is {current})")]
    FutureRevision {
        /// The revision that was asked for.
        requested: Revision,
        /// The store's revision when the request was served.
        current: Revision,
    },

    /// The election has no candidate, so no leader.
    #[error("election {election:?} has no leader")]
    NoLeader {
        /// The election's name.
        election: String,
    },

    /// A leader-only operation (proclaim) was made with a key that no longer leads: it was
    /// deleted, re-created, or never led.
    #[error("not the leader of election {election:?}")]
    NotLeader {
        /// The election's name.
        election: String,
    },

    /// A campaign ended without leading: its own key disappeared (its lease expired or was
    /// revoked, or the key was deleted) or its session ended before it became leader. The
    /// campaign returns this instead of a leadership.
    #[error("candidacy in election {election:?} lost ({reason}): key {key:?} of lease {lease}")]
    CandidacyLost {
        /// The election's name.
        election: String,
        /// The candidate key.
        key: String,
        /// The candidate's lease.
        lease: LeaseId,
        /// Why: the key was deleted, or the session ended (and how).
        reason: String,
    },

    /// A write fenced by a leadership ([`Leadership::txn`](crate::recipes::Leadership::txn))
    /// was refused by the store because the leadership is over: the leader key no longer
    /// stands as created. Nothing was applied, and the leadership has ended.
    #[error("fenced out of election {election:?}: token {token} no longer leads")]
    FencedOut {
        /// The election's name.
        election: String,
        /// The token the write carried.
        token: Revision,
    },

    /// The caller gave up: the operation was cancelled or its deadline passed.
    #[error("{operation} was cancelled")]
    Cancelled {
        /// The operation that was cancelled.
        operation: &'static str,
    },

    /// A long-lived stream (keep-alive or watch) ended because its connection was lost.
    /// Nothing is known to be lost: re-open it (a watch from the last revision seen + 1).
    #[error("{stream} stream closed")]
    StreamClosed {
        /// Which stream closed ("keep-alive", "watch").
        stream: &'static str,
        /// Why, when the backend knows.
        #[source]
        source: Option<BoxError>,
    },

    /// The store could not be reached and the request was not applied (it was never sent, or
    /// it was a read). Safe to retry.
    #[error("{backend} unavailable for {operation}")]
    Unavailable {
        /// The backend's name.
        backend: &'static str,
        /// The operation that failed.
        operation: &'static str,
        /// The transport's error.
        #[source]
        source: BoxError,
    },

    /// A write that may or may not have been applied (its reply was lost, or it timed out
    /// after being sent). Re-read before acting; never retry blindly.
    #[error("outcome of {operation} on {backend} is unknown")]
    Indeterminate {
        /// The backend's name.
        backend: &'static str,
        /// The operation whose outcome is unknown.
        operation: &'static str,
        /// The transport's error.
        #[source]
        source: BoxError,
    },

    /// The store refused the credentials (wrong user or password, a client certificate it does
    /// not trust) or the user lacks permission. Nothing was applied.
    #[error("permission denied by {backend}: {reason}")]
    PermissionDenied {
        /// The backend's name.
        backend: &'static str,
        /// What the store said.
        reason: String,
    },

    /// The store refused the request for a reason not covered above (an unsupported
    /// feature, an internal error). Nothing was applied.
    #[error("{backend} rejected {operation}")]
    Rejected {
        /// The backend's name.
        backend: &'static str,
        /// The operation that was refused.
        operation: &'static str,
        /// The store's error.
        #[source]
        source: BoxError,
    },
}

/// How a caller should react to an [`Error`]; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorClass {
    /// Definitely not applied; retrying the same request will fail the same way.
    Rejected,
    /// Not applied; safe to retry.
    Retryable,
    /// A write that may have applied; re-read before acting.
    Indeterminate,
    /// Bad input; nothing was sent.
    InvalidArgument,
    /// The lease or leader does not exist.
    NotFound,
    /// The revision is older than the compaction point.
    Compacted,
    /// The caller gave up.
    Cancelled,
}

impl Error {
    /// The class of this error, which says what a caller may do next.
    pub fn class(&self) -> ErrorClass {
        match self {
            Error::InvalidArgument { .. } => ErrorClass::InvalidArgument,
            Error::LeaseNotFound { .. } | Error::NoLeader { .. } => ErrorClass::NotFound,
            Error::Compacted { .. } => ErrorClass::Compacted,
            Error::FutureRevision { .. }
            | Error::NotLeader { .. }
            | Error::CandidacyLost { .. }
            | Error::FencedOut { .. }
            | Error::PermissionDenied { .. }
            | Error::Rejected { .. } => ErrorClass::Rejected,
            Error::Cancelled { .. } => ErrorClass::Cancelled,
            Error::StreamClosed { .. } | Error::Unavailable { .. } => ErrorClass::Retryable,
            Error::Indeterminate { .. } => ErrorClass::Indeterminate,
        }
    }

    /// True when the request was not applied and may be sent again as it is.
    pub fn is_retryable(&self) -> bool {
        self.class() == ErrorClass::Retryable
    }

    /// Shorthand for an [`Error::InvalidArgument`].
    pub fn invalid(reason: impl Into<String>) -> Self {
        Error::InvalidArgument {
            reason: reason.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_is_one_line_without_the_source() {
        let err = Error::Unavailable {
            backend: "etcd",
            operation: "get",
            source: "tcp connect error: connection refused".into(),
        };
        assert_eq!(err.to_string(), "etcd unavailable for get");
        let source = std::error::Error::source(&err).expect("source is kept");
        assert!(source.to_string().contains("connection refused"));
    }

    #[test]
    fn every_condition_has_the_documented_class() {
        let cases = [
            (Error::invalid("empty key"), ErrorClass::InvalidArgument),
            (
                Error::LeaseNotFound { lease: LeaseId(1) },
                ErrorClass::NotFound,
            ),
            (
                Error::NoLeader {
                    election: "e".into(),
                },
                ErrorClass::NotFound,
            ),
            (
                Error::Compacted {
                    requested: Revision(1),
                    compact_revision: Revision(5),
                },
                ErrorClass::Compacted,
            ),
            (
                Error::FutureRevision {
                    requested: Revision(9),
                    current: Revision(5),
                },
                ErrorClass::Rejected,
            ),
            (
                Error::NotLeader {
                    election: "e".into(),
                },
                ErrorClass::Rejected,
            ),
            (
                Error::Cancelled {
                    operation: "campaign",
                },
                ErrorClass::Cancelled,
            ),
            (
                Error::StreamClosed {
                    stream: "watch",
                    source: None,
                },
                ErrorClass::Retryable,
            ),
            (
                Error::Indeterminate {
                    backend: "etcd",
                    operation: "put",
                    source: "timeout".into(),
                },
                ErrorClass::Indeterminate,
            ),
        ];
        for (err, class) in cases {
            assert_eq!(err.class(), class, "{err}");
        }
    }
}
