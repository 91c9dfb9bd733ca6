//! What a chaos run simulates: the cluster, the workload's knobs and the faults.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::fault::FaultKind;

/// A scenario: what [`simulate`](crate::simulate) runs, once per seed.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Scenario {
    /// Nodes; each registers itself and campaigns in every election.
    pub hosts: usize,
    /// Elections every node campaigns in.
    pub elections: usize,
    /// How many of the nodes also run a cluster watcher.
    pub watchers: usize,
    /// Lease TTL of registrations and election sessions (τ).
    pub ttl: Duration,
    /// Simulated length of a run, quiet phase included.
    pub duration: Duration,
    /// The fault kinds injected.
    pub fault_kinds: BTreeSet<FaultKind>,
    /// Faults per simulated minute, per enabled kind.
    pub faults_per_minute: f64,
    /// Base one-way latency of every call.
    pub latency: Duration,
    /// Largest registration re-grant backoff (B).
    pub max_backoff: Duration,
    /// The etcd election timeout a leader change adds to every lease (ET).
    pub election_timeout: Duration,
}

impl Default for Scenario {
    fn default() -> Self {
        Scenario {
            hosts: 5,
            elections: 2,
            watchers: 2,
            ttl: Duration::from_secs(3),
            duration: Duration::from_secs(120),
            fault_kinds: FaultKind::ALL.into_iter().collect(),
            faults_per_minute: 2.0,
            latency: Duration::from_millis(1),
            max_backoff: Duration::from_secs(2),
            election_timeout: Duration::from_secs(1),
        }
    }
}

impl Scenario {
    /// The quiet phase at the end, in which no fault is active and liveness is checked:
    /// 3τ + B + ET, plus the heal of the slowest recipe.
    pub fn quiet(&self) -> Duration {
        self.ttl * 3 + self.max_backoff + self.election_timeout + Duration::from_secs(5)
    }

    /// The heal instant: every fault is over by then.
    pub fn heal_at(&self) -> Duration {
        self.duration.saturating_sub(self.quiet())
    }

    /// The largest round trip a healthy call takes.
    pub fn rtt(&self) -> Duration {
        self.latency * 2
    }
}
