//! [`SimConfig`]: where the simulator's behaviour depends on configuration, as etcd's does.

use coord_api::Limits;

use std::time::Duration;

/// How a [`SimStore`](crate::SimStore) behaves where etcd's behaviour depends on its configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SimConfig {
    /// Lease ids are drawn from this seed, so a run is reproducible.
    pub seed: u64,
    /// Limits the store enforces and reports. The defaults are etcd's (idle watches that ask
    /// for progress notifications get one every 10 minutes), except that expiry is exact
    /// (etcd checks every 500 ms).
    pub limits: Limits,
    /// How often watches that start in the past are caught up (etcd: 100 ms). Until then
    /// they deliver nothing, and a compaction can end them.
    pub watch_sync_interval: Duration,
    /// The one-way latency of every message: a request takes it to reach the store, its reply
    /// takes it again to come back, and so does each watch delivery; so operations take time
    /// and interleave as they do over a network. Zero by default.
    pub latency: Duration,
    /// Reproduce etcd 3.4's etcd#19179: a watch from the compaction revision misses the
    /// deletes made at that revision. On by default (the project runs etcd 3.4); turn it off
    /// to model an etcd that has the fix.
    pub compaction_drops_deletes_at_point: bool,
    /// How long a call whose reply is lost (a deaf link) waits before failing, as a client's
    /// request timeout does. 5 s, as `EtcdStore`'s default.
    pub request_timeout: Duration,
}

impl Default for SimConfig {
    fn default() -> Self {
        let mut limits = Limits::ETCD_DEFAULTS;
        limits.expiry_granularity = Duration::ZERO;
        SimConfig {
            seed: 0,
            limits,
            watch_sync_interval: Duration::from_millis(100),
            compaction_drops_deletes_at_point: true,
            latency: Duration::ZERO,
            request_timeout: Duration::from_secs(5),
        }
    }
}

impl SimConfig {
    /// Draw lease ids from `seed`.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Grant at least `ttl` (etcd: 1.5 x the election timeout, 2 s by default).
    pub fn with_min_lease_ttl(mut self, ttl: Duration) -> Self {
        self.limits.min_lease_ttl = ttl;
        self
    }

    /// Refuse requests larger than `bytes` (etcd's `--max-request-bytes`).
    pub fn with_max_request_bytes(mut self, bytes: usize) -> Self {
        self.limits.max_request_bytes = bytes;
        self
    }

    /// Make every message take `latency` one way (a call: twice that).
    pub fn with_latency(mut self, latency: Duration) -> Self {
        self.latency = latency;
        self
    }

    /// Catch up watches that start in the past this often.
    pub fn with_watch_sync_interval(mut self, every: Duration) -> Self {
        self.watch_sync_interval = every;
        self
    }

    /// Fail calls whose reply is lost after `timeout`.
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Send idle watches a progress notification this often.
    pub fn with_progress_notify_interval(mut self, every: Duration) -> Self {
        self.limits.progress_notify_interval = every;
        self
    }
}
