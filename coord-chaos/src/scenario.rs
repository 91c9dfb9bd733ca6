//! What a chaos run simulates: the cluster, the workload's knobs, the timing and the faults.
//! The checkers read their bounds from here (the renewal period, the backoff, the request
//! timeout), never from constants of their own.

use std::collections::BTreeSet;
use std::time::Duration;

use coord_api::recipes::{CandidateConfig, RegistrationConfig, SessionConfig};
use coord_api::Bytes;

use crate::fault::FaultKind;

/// A scenario: what a run simulates, once per seed.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Scenario {
    /// Nodes; each runs the service (coord's own: registers itself, campaigns in every
    /// election, watches).
    pub hosts: usize,
    /// Elections every node of coord's own service campaigns in.
    pub elections: usize,
    /// How many of coord's own nodes also run a cluster watcher.
    pub watchers: usize,
    /// Lease TTL of registrations and sessions (τ).
    pub ttl: Duration,
    /// How often sessions renew; `None` is `SessionConfig`'s default, a third of the TTL (KA).
    pub renew_interval: Option<Duration>,
    /// How long a client waits for a reply before the call fails: the simulator's and
    /// `EtcdStore`'s request timeout (default 5 s, `EtcdConfig`'s).
    pub request_timeout: Duration,
    /// First delay before a registration re-grants after losing its lease.
    pub initial_backoff: Duration,
    /// Largest registration re-grant backoff (B).
    pub max_backoff: Duration,
    /// The etcd election timeout a leader change adds to every lease (ET).
    pub election_timeout: Duration,
    /// Simulated length of a run, quiet phase included.
    pub duration: Duration,
    /// The fault kinds injected (member faults only where the store has members).
    pub fault_kinds: BTreeSet<FaultKind>,
    /// How many etcd members the store is served as. Over turmoil each is a host of its own
    /// and every node's `EtcdStore` knows them all (3 there, see `Runner::turmoil`); an
    /// in-process run has one store (1).
    pub members: usize,
    /// Faults per simulated minute, per enabled kind.
    pub faults_per_minute: f64,
    /// Base one-way latency of every message.
    pub latency: Duration,
    /// Over turmoil: how far simulated time moves per step (turmoil's tick). Every host is
    /// polled once per step, so a coarser tick is proportionally faster; timers and messages
    /// land on tick boundaries (a 1 ms latency becomes one tick). 10 ms by default: five
    /// times faster than 1 ms at 10 hosts, far below every bound the checkers use.
    pub turmoil_tick: Duration,
    /// Explore schedules: the recipes yield to other tasks at their await points a number of
    /// times drawn from the seed, so that a task that signals before it publishes is caught
    /// on one thread too.
    pub explore: bool,
    /// Over turmoil: which etcd the members answer as, where a client can tell (a member cut
    /// off rejoins with an election on 3.4, without on 3.5; a raft leader replaced while
    /// stalled revokes the leases it saw overdue on resuming on 3.4, etcd#15247). `None`
    /// (the default) draws one from each seed, either equally.
    pub etcd_version: Option<EtcdRelease>,
}

/// An etcd release a turmoil run's members answer as ([`Scenario::etcd_version`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EtcdRelease {
    /// etcd 3.4 (as measured on 3.4.23).
    V3_4,
    /// etcd 3.5 (as measured on 3.5.1).
    V3_5,
}

impl EtcdRelease {
    /// The release of a run: `chosen`, or one drawn from `seed` (apart from the fault
    /// schedule's draws, which it leaves as they were).
    pub fn of_run(chosen: Option<EtcdRelease>, seed: u64) -> EtcdRelease {
        chosen.unwrap_or_else(|| {
            if crate::rng::Rng::new(seed ^ 0x0e7c_d035_0304_0305).chance(0.5) {
                EtcdRelease::V3_4
            } else {
                EtcdRelease::V3_5
            }
        })
    }
}

impl std::fmt::Display for EtcdRelease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            EtcdRelease::V3_4 => "3.4",
            EtcdRelease::V3_5 => "3.5",
        })
    }
}

impl Default for Scenario {
    /// Five nodes, two elections, two watchers, a 3 s TTL and every other timing at the
    /// library's defaults; two minutes per seed, every fault kind twice a minute.
    fn default() -> Self {
        Scenario {
            hosts: 5,
            elections: 2,
            watchers: 2,
            ttl: Duration::from_secs(3),
            renew_interval: None,
            request_timeout: Duration::from_secs(5),
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(2),
            election_timeout: Duration::from_secs(1),
            duration: Duration::from_secs(120),
            fault_kinds: FaultKind::ALL.into_iter().collect(),
            members: 1,
            faults_per_minute: 2.0,
            latency: Duration::from_millis(1),
            turmoil_tick: Duration::from_millis(10),
            explore: true,
            etcd_version: None,
        }
    }
}

impl Scenario {
    /// Every timing at the library's defaults, nothing tuned: `SessionConfig`'s 10 s TTL and
    /// TTL/3 renewals, `RegistrationConfig`'s 100 ms to 30 s backoff, `EtcdConfig`'s 5 s
    /// request timeout. Runs are longer (five minutes), so that the quiet phase covers a heal
    /// at the largest backoff.
    pub fn defaults() -> Self {
        Scenario {
            ttl: Duration::from_secs(10),
            max_backoff: Duration::from_secs(30),
            duration: Duration::from_secs(300),
            ..Scenario::default()
        }
    }

    /// The renewal period (KA).
    pub fn renew_period(&self) -> Duration {
        self.renew_interval.unwrap_or(self.ttl / 3)
    }

    /// The quiet phase at the end, in which no fault is active and liveness is checked:
    /// 3τ + B + ET, plus the heal of the slowest recipe.
    pub fn quiet(&self) -> Duration {
        self.ttl * 3 + self.max_backoff + self.election_timeout + Duration::from_secs(5)
    }

    /// The heal instant: every fault is over by then.
    pub fn heal_at(&self) -> Duration {
        self.duration.saturating_sub(self.quiet())
    }

    /// The session settings that match this scenario: its TTL and renewal period. Build a
    /// service's sessions from it (and its registrations and candidates from the two calls
    /// below): the checkers' bounds are drawn from the scenario, so a service running other
    /// timings is held to bounds that are not its own.
    ///
    /// ```
    /// let scenario = coord_chaos::Scenario::defaults();
    /// assert_eq!(scenario.session_config().ttl, scenario.ttl);
    /// ```
    pub fn session_config(&self) -> SessionConfig {
        let config = SessionConfig::default().with_ttl(self.ttl);
        match self.renew_interval {
            Some(every) => config.with_renew_interval(every),
            None => config,
        }
    }

    /// A registration of `key` with this scenario's re-grant backoff
    /// ([`initial_backoff`](Self::initial_backoff) to [`max_backoff`](Self::max_backoff), the B
    /// of the registration and quiet-phase bounds). Its TTL is its session's.
    pub fn registration_config(
        &self,
        key: impl Into<String>,
        metadata: impl Into<Bytes>,
    ) -> RegistrationConfig {
        RegistrationConfig::new(key, metadata).with_backoff(self.initial_backoff, self.max_backoff)
    }

    /// A candidate for `election` with this scenario's campaign backoff (the B of the
    /// failover bound).
    pub fn candidate_config(
        &self,
        election: impl Into<String>,
        value: impl Into<Bytes>,
    ) -> CandidateConfig {
        CandidateConfig::new(election, value).with_backoff(self.initial_backoff, self.max_backoff)
    }

    /// The largest round trip a healthy call takes.
    pub fn rtt(&self) -> Duration {
        self.latency * 2
    }
}
