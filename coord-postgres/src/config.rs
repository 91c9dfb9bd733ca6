//! How to reach PostgreSQL and how the store behaves there: one home for every setting.

use std::time::Duration;

use coord_api::Limits;

use crate::TlsConfig;

/// The connection and the store's settings.
///
/// ```
/// use coord_postgres::PostgresConfig;
/// let config = PostgresConfig::new("host=127.0.0.1 port=5432 user=coord dbname=coord")
///     .with_pool_size(8);
/// assert_eq!(config.pool_size(), 8);
/// ```
#[derive(Debug, Clone)]
pub struct PostgresConfig {
    pub(crate) connection: String,
    pub(crate) pool_size: usize,
    pub(crate) request_timeout: Duration,
    pub(crate) sweep_interval: Duration,
    pub(crate) poll_interval: Duration,
    pub(crate) history_retention: Duration,
    pub(crate) tls: Option<TlsConfig>,
    pub(crate) limits: Limits,
}

impl PostgresConfig {
    /// A store on the database `connection` names: a libpq-style string
    /// (`host=... port=... user=... password=... dbname=...`) or a `postgresql://` URL.
    pub fn new(connection: impl Into<String>) -> Self {
        // Leases as short as a second: the server's clock expires them, with no election
        // timeout to stay above as etcd's raft has.
        let mut limits = Limits::ETCD_DEFAULTS;
        limits.min_lease_ttl = Duration::from_secs(1);
        PostgresConfig {
            connection: connection.into(),
            pool_size: 16,
            request_timeout: Duration::from_secs(5),
            sweep_interval: Duration::from_millis(200),
            poll_interval: Duration::from_secs(1),
            history_retention: Duration::from_secs(60),
            tls: None,
            limits,
        }
    }

    /// Connects with TLS (see [`TlsConfig`]); plain by default. Passwords go in the
    /// connection string (`password=...`; SCRAM and md5 are both spoken).
    pub fn with_tls(mut self, tls: TlsConfig) -> Self {
        self.tls = Some(tls);
        self
    }

    /// At most this many connections for requests (watches share them); 16 by default. Lease
    /// renewals have two more of their own, so that no burst of requests delays them.
    pub fn with_pool_size(mut self, size: usize) -> Self {
        self.pool_size = size.max(1);
        self
    }

    /// How long a request may take before it fails: `Unavailable` if nothing was written,
    /// `Indeterminate` if its commit was on its way. 5 s by default.
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// How often this client looks for expired leases; 200 ms by default. Any connected
    /// client expires any lease, so a lease dies within this (plus a query) of its deadline.
    pub fn with_sweep_interval(mut self, interval: Duration) -> Self {
        self.sweep_interval = interval;
        self
    }

    /// How often a watch looks for new revisions without being told (a notification lost
    /// with its connection costs at most this); 1 s by default.
    pub fn with_poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// How long the history a compaction made unreadable stays for watches that were up to
    /// date when it came (etcd never cuts such a watch off; a watch here reads when it is
    /// polled, so it may not have read those rows yet); 1 min by default. Only a watch that
    /// fell this far behind is cut off, as etcd cuts off a slow watcher. The rows go at a
    /// later compaction, in batches of their own.
    pub fn with_history_retention(mut self, retention: Duration) -> Self {
        self.history_retention = retention;
        self
    }

    /// How often a watch that asked for progress notifications gets one while idle; 10 min
    /// by default, as etcd's.
    pub fn with_progress_notify_interval(mut self, every: Duration) -> Self {
        self.limits.progress_notify_interval = every;
        self
    }

    /// The connection string.
    pub fn connection(&self) -> &str {
        &self.connection
    }

    /// The pool's size.
    pub fn pool_size(&self) -> usize {
        self.pool_size
    }

    /// The request timeout.
    pub fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    /// How often the store reads the revision itself, beside notifications: the most a lost
    /// notification costs a watch.
    pub fn poll_interval(&self) -> Duration {
        self.poll_interval
    }

    /// What the store accepts and how its time behaves.
    pub fn limits(&self) -> Limits {
        self.limits.clone()
    }
}
