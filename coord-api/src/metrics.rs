//! What the recipes measure, through the [`metrics`](https://docs.rs/metrics) facade.
//!
//! The library records; it never installs a recorder or an exporter. Without one, every
//! call is a no-op. Install one (Prometheus, StatsD, OpenTelemetry, ...) in the service, before
//! it starts sessions and watchers (each registers its per-renewal and per-batch metrics once,
//! when it starts, with the recorder then in place), and these appear:
//!
//! | name | kind | labels | what |
//! |------|------|--------|------|
//! | `coord_sessions_started_total` | counter | | sessions started (each a granted lease) |
//! | `coord_session_renewals_total` | counter | `outcome`: `ok`, `failed` | keep-alive renewals; `failed` is an unanswered or refused one, retried until the deadline |
//! | `coord_session_renewal_seconds` | histogram | | round trip of each acknowledged renewal |
//! | `coord_sessions_ended_total` | counter | `reason`: `lease_lost`, `expired`, `closed`, `orphaned` | sessions over; `lease_lost` and `expired` are the lost leases |
//! | `coord_registration_losses_total` | counter | | registrations whose session ended under them (a heal begins) |
//! | `coord_registration_heals_total` | counter | | registrations back under a new lease after a loss |
//! | `coord_registration_repairs_total` | counter | | registered keys deleted under a live lease and put back |
//! | `coord_watcher_relists_total` | counter | `prefix`; `reason`: `compacted` | full re-reads of a watched prefix |
//! | `coord_watcher_resumes_total` | counter | `prefix`; `reason`: `closed`, `stuck` | broken watches resumed from the last revision, without a re-read (`stuck`: a progress request went unanswered) |
//! | `coord_watcher_lag_revisions` | gauge | `prefix` | how far the watch stream was behind the store when its latest batch was sent: the batch's revision less its newest event's (0 for a progress notification). An upper bound: it counts writes outside the prefix too, so a few on a busy store is normal; thousands mean a watcher catching up |
//! | `coord_watcher_hosts` | gauge | `prefix` | hosts in the view |
//! | `coord_campaigns_total` | counter | `election` | campaigns begun, waiting or `try_` |
//! | `coord_campaign_wait_seconds` | histogram | `election` | from a waiting campaign's start until it leads |
//! | `coord_leadership_acquired_total` | counter | `election` | leaderships won (a lock taken, a permit held) |
//! | `coord_leadership_ended_total` | counter | `election`; `reason`: `deadline_passed`, `lease_lost`, `key_deleted`, `fenced_out`, `session_closed`, `resigned`, `dropped` | leaderships over, and why; all but `resigned` and `dropped` are involuntary |
//! | `coord_leaderships_held` | gauge | `election` | leaderships this process holds and believes standing |
//! | `coord_fenced_out_writes_total` | counter | `election` | fenced transactions the store refused because the leadership no longer stood |
//!
//! Mutexes and semaphores are elections: their metrics carry the lock's or semaphore's name
//! as `election`. The `election` and `prefix` labels take the names the service chose; keep
//! those few, as with any label.
//!
//! The names are constants here so that dashboards and tests can refer to them.

use std::time::Duration;

/// Sessions started. Counter.
pub const SESSIONS_STARTED: &str = "coord_sessions_started_total";
/// Keep-alive renewals, by `outcome`. Counter.
pub const SESSION_RENEWALS: &str = "coord_session_renewals_total";
/// Round trip of acknowledged renewals, in seconds. Histogram.
pub const SESSION_RENEWAL_SECONDS: &str = "coord_session_renewal_seconds";
/// Sessions over, by `reason`. Counter.
pub const SESSIONS_ENDED: &str = "coord_sessions_ended_total";
/// Registrations lost. Counter.
pub const REGISTRATION_LOSSES: &str = "coord_registration_losses_total";
/// Registrations healed. Counter.
pub const REGISTRATION_HEALS: &str = "coord_registration_heals_total";
/// Registered keys put back after a delete. Counter.
pub const REGISTRATION_REPAIRS: &str = "coord_registration_repairs_total";
/// Watcher re-lists, by `prefix` and `reason`. Counter.
pub const WATCHER_RELISTS: &str = "coord_watcher_relists_total";
/// Watches resumed without a re-list, by `prefix`. Counter.
pub const WATCHER_RESUMES: &str = "coord_watcher_resumes_total";
/// How many revisions the watch stream is behind, by `prefix`. Gauge.
pub const WATCHER_LAG_REVISIONS: &str = "coord_watcher_lag_revisions";
/// Hosts in a watcher's view, by `prefix`. Gauge.
pub const WATCHER_HOSTS: &str = "coord_watcher_hosts";
/// Campaigns begun, by `election`. Counter.
pub const CAMPAIGNS: &str = "coord_campaigns_total";
/// Time from a waiting campaign's start until it leads, in seconds, by `election`. Histogram.
pub const CAMPAIGN_WAIT_SECONDS: &str = "coord_campaign_wait_seconds";
/// Leaderships won, by `election`. Counter.
pub const LEADERSHIP_ACQUIRED: &str = "coord_leadership_acquired_total";
/// Leaderships over, by `election` and `reason`. Counter.
pub const LEADERSHIP_ENDED: &str = "coord_leadership_ended_total";
/// Leaderships held, by `election`. Gauge.
pub const LEADERSHIPS_HELD: &str = "coord_leaderships_held";
/// Fenced transactions refused, by `election`. Counter.
pub const FENCED_OUT_WRITES: &str = "coord_fenced_out_writes_total";

/// Every name above, in the table's order.
pub const ALL: &[&str] = &[
    SESSIONS_STARTED,
    SESSION_RENEWALS,
    SESSION_RENEWAL_SECONDS,
    SESSIONS_ENDED,
    REGISTRATION_LOSSES,
    REGISTRATION_HEALS,
    REGISTRATION_REPAIRS,
    WATCHER_RELISTS,
    WATCHER_RESUMES,
    WATCHER_LAG_REVISIONS,
    WATCHER_HOSTS,
    CAMPAIGNS,
    CAMPAIGN_WAIT_SECONDS,
    LEADERSHIP_ACQUIRED,
    LEADERSHIP_ENDED,
    LEADERSHIPS_HELD,
    FENCED_OUT_WRITES,
];

/// The recording side: one function per event, so that each name and label set is written
/// once.
pub(crate) mod record {
    use super::*;

    pub(crate) fn session_started() {
        ::metrics::counter!(SESSIONS_STARTED).increment(1);
    }

    /// A session's renewal metrics, registered once for its renewer: a thousand sessions
    /// renew a thousand times a TTL, and looking a metric up by name and labels on each
    /// (a key built and hashed, even with no recorder) was a tenth of a renewal's cost.
    pub(crate) struct Renewals {
        ok: ::metrics::Counter,
        failed: ::metrics::Counter,
        seconds: ::metrics::Histogram,
    }

    impl Renewals {
        /// Registers with the recorder in place now (the global one, or the thread's local
        /// one around the runtime).
        pub(crate) fn register() -> Self {
            Renewals {
                ok: ::metrics::counter!(SESSION_RENEWALS, "outcome" => "ok"),
                failed: ::metrics::counter!(SESSION_RENEWALS, "outcome" => "failed"),
                seconds: ::metrics::histogram!(SESSION_RENEWAL_SECONDS),
            }
        }

        pub(crate) fn renewed(&self, took: Duration) {
            self.ok.increment(1);
            self.seconds.record(took.as_secs_f64());
        }

        pub(crate) fn failed(&self) {
            self.failed.increment(1);
        }
    }

    pub(crate) fn session_ended(reason: &'static str) {
        ::metrics::counter!(SESSIONS_ENDED, "reason" => reason).increment(1);
    }

    pub(crate) fn registration_lost() {
        ::metrics::counter!(REGISTRATION_LOSSES).increment(1);
    }

    pub(crate) fn registration_healed() {
        ::metrics::counter!(REGISTRATION_HEALS).increment(1);
    }

    pub(crate) fn registration_repaired() {
        ::metrics::counter!(REGISTRATION_REPAIRS).increment(1);
    }

    pub(crate) fn watcher_relisted(prefix: &str, reason: &'static str) {
        ::metrics::counter!(WATCHER_RELISTS, "prefix" => prefix.to_owned(), "reason" => reason)
            .increment(1);
    }

    pub(crate) fn watcher_resumed(prefix: &str, reason: &'static str) {
        ::metrics::counter!(WATCHER_RESUMES, "prefix" => prefix.to_owned(), "reason" => reason)
            .increment(1);
    }

    /// A watcher's per-batch gauges, registered once for its worker (the prefix label is
    /// the worker's for its life): each batch and each published view set them.
    pub(crate) struct WatcherGauges {
        lag: ::metrics::Gauge,
        hosts: ::metrics::Gauge,
    }

    impl WatcherGauges {
        /// Registers with the recorder in place now, labelled with `prefix`.
        pub(crate) fn register(prefix: &str) -> Self {
            WatcherGauges {
                lag: ::metrics::gauge!(WATCHER_LAG_REVISIONS, "prefix" => prefix.to_owned()),
                hosts: ::metrics::gauge!(WATCHER_HOSTS, "prefix" => prefix.to_owned()),
            }
        }

        pub(crate) fn lag(&self, revisions: i64) {
            self.lag.set(revisions.max(0) as f64);
        }

        pub(crate) fn hosts(&self, hosts: usize) {
            self.hosts.set(hosts as f64);
        }
    }

    pub(crate) fn campaign_begun(election: &str) {
        ::metrics::counter!(CAMPAIGNS, "election" => election.to_owned()).increment(1);
    }

    pub(crate) fn campaign_won_after(election: &str, waited: Duration) {
        ::metrics::histogram!(CAMPAIGN_WAIT_SECONDS, "election" => election.to_owned())
            .record(waited.as_secs_f64());
    }

    pub(crate) fn leadership_acquired(election: &str) {
        ::metrics::counter!(LEADERSHIP_ACQUIRED, "election" => election.to_owned()).increment(1);
        ::metrics::gauge!(LEADERSHIPS_HELD, "election" => election.to_owned()).increment(1.0);
    }

    pub(crate) fn leadership_ended(election: &str, reason: &'static str) {
        ::metrics::counter!(LEADERSHIP_ENDED, "election" => election.to_owned(), "reason" => reason)
            .increment(1);
        ::metrics::gauge!(LEADERSHIPS_HELD, "election" => election.to_owned()).decrement(1.0);
    }

    pub(crate) fn fenced_out(election: &str) {
        ::metrics::counter!(FENCED_OUT_WRITES, "election" => election.to_owned()).increment(1);
    }
}

#[cfg(test)]
mod tests {
    /// The table in the module docs names every constant, and nothing else.
    #[test]
    fn the_table_names_every_metric() {
        let src = include_str!("metrics.rs");
        let table: Vec<&str> = src
            .lines()
            .filter_map(|l| l.strip_prefix("//! | `"))
            .filter_map(|l| l.split('`').next())
            .collect();
        assert_eq!(table, super::ALL);
    }
}
