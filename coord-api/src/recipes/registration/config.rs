//! What a registration is given ([`RegistrationConfig`]) and what it reports
//! ([`RegistrationStatus`], [`RegistrationHealth`]).

use super::*;

/// What to register and how.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RegistrationConfig {
    /// The host's key (for example `cluster/hosts/<id>`).
    pub key: String,
    /// The value stored at the key.
    pub metadata: Bytes,
    /// The TTL of the registration's own lease, for [`start`](HostRegistration::start) and
    /// [`spawn`](HostRegistration::spawn) (`None`: 10 s): how long the key outlives a crash.
    /// A registration on a host session shares the host's lease, whose TTL is the
    /// [`HostSession`]'s: [`start_on`](HostRegistration::start_on) and
    /// [`spawn_on`](HostRegistration::spawn_on) refuse a config that sets one.
    pub ttl: Option<Duration>,
    /// First delay before re-granting after the lease is lost (default 100 ms); it doubles.
    pub initial_backoff: Duration,
    /// Largest delay between re-grant attempts (default 30 s).
    pub max_backoff: Duration,
    /// Mixed into the seed of the backoff's jitter (which is otherwise drawn from the key, so
    /// hosts differ and a simulation replays).
    pub backoff_seed: u64,
    /// Remove the key, in the background, when the handle is dropped without
    /// [`stop`](HostRegistration::stop) (default off: the key expires with its lease, as after
    /// a crash).
    pub revoke_on_drop: bool,
}

impl RegistrationConfig {
    /// Register `metadata` at `key`, with the defaults above.
    pub fn new(key: impl Into<String>, metadata: impl Into<Bytes>) -> Self {
        RegistrationConfig {
            key: key.into(),
            metadata: metadata.into(),
            ttl: None,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(30),
            backoff_seed: 0,
            revoke_on_drop: false,
        }
    }

    /// Whether dropping the handle removes the key (see
    /// [`revoke_on_drop`](Self::revoke_on_drop)).
    pub fn with_revoke_on_drop(mut self, on: bool) -> Self {
        self.revoke_on_drop = on;
        self
    }

    /// The session of a registration with a lease of its own.
    pub(super) fn session(&self) -> SessionConfig {
        let session = SessionConfig::default().with_revoke_on_drop(self.revoke_on_drop);
        match self.ttl {
            Some(ttl) => session.with_ttl(ttl),
            None => session,
        }
    }

    /// Use this TTL for the registration's own lease (see [`ttl`](Self::ttl)).
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// Mix this seed into the backoff's jitter.
    pub fn with_backoff_seed(mut self, seed: u64) -> Self {
        self.backoff_seed = seed;
        self
    }

    /// Back off from `initial` to at most `max`.
    pub fn with_backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.initial_backoff = initial;
        self.max_backoff = max;
        self
    }
}

/// Where a registration stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegistrationStatus {
    /// Writing the key for the first time.
    Registering,
    /// The key is present under this lease.
    Registered {
        /// The live lease.
        lease: LeaseId,
    },
    /// The lease was lost (re-granting), or the key was deleted under the live lease
    /// (putting it back), or another lease took the key (a newer incarnation of the host:
    /// waiting for it to be freed, then putting it back): the key is not known to be present
    /// under this registration's lease. Counts the attempts so far.
    Healing {
        /// Attempts made since the loss.
        attempt: u32,
    },
    /// Stopped: the key was revoked ([`HostRegistration::stop`]) or left to expire (drop).
    Stopped,
}

/// Whether a registration is working, for a readiness probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RegistrationHealth {
    /// Where it stands.
    pub status: RegistrationStatus,
    /// When its lease's last renewal was acknowledged (`None` before the first, or while
    /// healing).
    pub last_renewal: Option<Instant>,
    /// How long its lease is known to live (zero while healing).
    pub remaining: Duration,
}

impl RegistrationHealth {
    /// Registered, with renewals working (at least half of `ttl` left).
    pub fn is_healthy(&self, ttl: Duration) -> bool {
        matches!(self.status, RegistrationStatus::Registered { .. }) && self.remaining >= ttl / 2
    }
}
