//! What a session is given ([`SessionConfig`]) and what it reports: how it ended
//! ([`SessionEnd`]) and how it stands ([`SessionHealth`]).

use super::*;

/// How a [`Session`] keeps its lease.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SessionConfig {
    /// The lease's TTL (default 10 s).
    pub ttl: Duration,
    /// How often to renew; `None` is a third of the granted TTL, which rides through one lost
    /// renewal reply.
    pub renew_interval: Option<Duration>,
    /// Revoke the lease, in the background, once the local deadline passes (default on): the
    /// store may still hold it (a reply lost, an etcd restart refreshed it), and keys under it,
    /// such as a queued election candidate, would block others until it expires. Turn it off
    /// when the owner replaces the keys itself first (a registration re-puts its key, then
    /// revokes the old lease, so watchers see no flap).
    pub revoke_on_expiry: bool,
    /// Revoke the lease, in the background, when the [`Session`] is dropped without
    /// [`stop`](Session::stop) (default off: a dropped session's lease expires after its TTL,
    /// which is what a crash looks like).
    pub revoke_on_drop: bool,
    /// How far this host's clock may run slow against the store's, in parts per million of
    /// the time measured (default 10,000: 1%). The local deadline is kept that much of the TTL
    /// ahead of the store's expiry: the store counts the TTL on its own clock, and a local
    /// clock that runs slow (or a deadline timer that fires late on a loaded host) would
    /// otherwise let a belief outlast the lease. At the 10 s default TTL, 100 ms.
    pub clock_drift_ppm: u32,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            ttl: Duration::from_secs(10),
            renew_interval: None,
            revoke_on_expiry: true,
            revoke_on_drop: false,
            clock_drift_ppm: 10_000,
        }
    }
}

impl SessionConfig {
    /// Use this TTL.
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Renew this often instead of every TTL/3.
    pub fn with_renew_interval(mut self, every: Duration) -> Self {
        self.renew_interval = Some(every);
        self
    }

    /// Whether to revoke the lease once the local deadline passes (see
    /// [`revoke_on_expiry`](Self::revoke_on_expiry)).
    pub fn with_revoke_on_expiry(mut self, on: bool) -> Self {
        self.revoke_on_expiry = on;
        self
    }

    /// Whether dropping the session revokes its lease (see
    /// [`revoke_on_drop`](Self::revoke_on_drop)).
    pub fn with_revoke_on_drop(mut self, on: bool) -> Self {
        self.revoke_on_drop = on;
        self
    }

    /// Allow for this much clock drift, in parts per million (see
    /// [`clock_drift_ppm`](Self::clock_drift_ppm)); at most 100,000 (10%).
    pub fn with_clock_drift_ppm(mut self, ppm: u32) -> Self {
        self.clock_drift_ppm = ppm.min(MAX_CLOCK_DRIFT_PPM);
        self
    }
}

/// The largest clock drift a session allows for: 10% of the TTL.
pub(super) const MAX_CLOCK_DRIFT_PPM: u32 = 100_000;

/// How much of `ttl` the local deadline keeps ahead of the store's expiry, for `ppm` of
/// clock drift.
pub(super) fn clock_margin(ttl: Duration, ppm: u32) -> Duration {
    ttl.mul_f64(f64::from(ppm.min(MAX_CLOCK_DRIFT_PPM)) / 1_000_000.0)
}

/// Why a session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SessionEnd {
    /// The store said the lease is gone (revoked, or expired on the server).
    LeaseLost,
    /// The local deadline passed without an acknowledged renewal.
    Expired,
    /// [`Session::stop`] revoked it (or it was dropped with
    /// [`revoke_on_drop`](SessionConfig::revoke_on_drop)).
    Closed,
    /// It stopped renewing without revoking ([`Session::orphan`], or dropped): the lease
    /// expires after its TTL.
    Orphaned,
}

impl SessionEnd {
    /// The `reason` label of [`SESSIONS_ENDED`](crate::metrics::SESSIONS_ENDED).
    pub fn label(self) -> &'static str {
        match self {
            SessionEnd::LeaseLost => "lease_lost",
            SessionEnd::Expired => "expired",
            SessionEnd::Closed => "closed",
            SessionEnd::Orphaned => "orphaned",
        }
    }
}

impl std::fmt::Display for SessionEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SessionEnd::LeaseLost => "the store reports the lease gone",
            SessionEnd::Expired => "the local deadline passed without a renewal",
            SessionEnd::Closed => "closed",
            SessionEnd::Orphaned => "orphaned (no longer renewed)",
        })
    }
}

/// Whether a session's renewals are working, for a readiness probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct SessionHealth {
    /// The lease.
    pub lease: LeaseId,
    /// The local deadline: send time of the last acknowledged renewal + TTL.
    pub deadline: Instant,
    /// How long until the deadline (zero once it passed).
    pub remaining: Duration,
    /// When the last renewal was acknowledged (`None` before the first).
    pub last_renewal: Option<Instant>,
    /// Why it ended, once it has.
    pub ended: Option<SessionEnd>,
}

impl SessionHealth {
    /// Live, with at least half the TTL left: renewals are working.
    pub fn is_healthy(&self, ttl: Duration) -> bool {
        self.ended.is_none() && self.remaining >= ttl / 2
    }
}

impl From<SessionEnd> for LossReason {
    fn from(end: SessionEnd) -> Self {
        match end {
            SessionEnd::Expired => LossReason::DeadlinePassed,
            SessionEnd::LeaseLost => LossReason::LeaseLost,
            _ => LossReason::SessionClosed,
        }
    }
}
