//! [`EtcdConfig`]: how to reach etcd and how long to wait for it.

use std::time::Duration;

use coord_api::{Error, Limits, Result};

/// TLS settings: the CA that signs etcd's server certificate and, for client-certificate
/// authentication, this client's certificate and key. All PEM.
#[derive(Clone, Default)]
pub struct TlsConfig {
    pub(crate) ca_pem: Option<Vec<u8>>,
    pub(crate) identity: Option<(Vec<u8>, Vec<u8>)>,
    pub(crate) domain: Option<String>,
}

impl std::fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print key material.
        f.debug_struct("TlsConfig")
            .field("ca", &self.ca_pem.as_ref().map(|_| "<pem>"))
            .field("identity", &self.identity.as_ref().map(|_| "<pem>"))
            .field("domain", &self.domain)
            .finish()
    }
}

impl TlsConfig {
    /// TLS with no trusted CA and no client certificate: add the CA that signs the members'
    /// certificates ([`with_ca_pem`](Self::with_ca_pem)), for no other is trusted.
    pub fn new() -> Self {
        Self::default()
    }

    /// Trust servers whose certificate this CA signed.
    pub fn with_ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.ca_pem = Some(pem.into());
        self
    }

    /// Present this certificate and key (client-certificate authentication).
    pub fn with_identity_pem(mut self, cert: impl Into<Vec<u8>>, key: impl Into<Vec<u8>>) -> Self {
        self.identity = Some((cert.into(), key.into()));
        self
    }

    /// Expect this name in the server's certificate instead of the endpoint's host.
    pub fn with_domain(mut self, domain: impl Into<String>) -> Self {
        self.domain = Some(domain.into());
        self
    }
}

/// How an [`EtcdStore`](crate::EtcdStore) reaches etcd.
///
/// ```
/// use std::time::Duration;
/// use coord_etcd::EtcdConfig;
/// let config = EtcdConfig::new(["10.0.0.1:2379", "10.0.0.2:2379", "10.0.0.3:2379"])
///     .with_request_timeout(Duration::from_secs(3))
///     .with_user("svc", "secret");
/// # let _ = config;
/// ```
#[derive(Clone)]
pub struct EtcdConfig {
    pub(crate) endpoints: Vec<String>,
    pub(crate) connect_timeout: Duration,
    pub(crate) request_timeout: Duration,
    pub(crate) keep_alive: Option<(Duration, Duration)>,
    pub(crate) tls: Option<TlsConfig>,
    pub(crate) user: Option<(String, String)>,
    pub(crate) require_leader: bool,
    pub(crate) limits: Limits,
}

impl std::fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdConfig")
            .field("endpoints", &self.endpoints)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("keep_alive", &self.keep_alive)
            .field("tls", &self.tls)
            .field("user", &self.user.as_ref().map(|(u, _)| u))
            .field("require_leader", &self.require_leader)
            .field("limits", &self.limits)
            .finish()
    }
}

impl EtcdConfig {
    /// Endpoints as `host:port` or `http(s)://host:port`; every member of the cluster, so a
    /// dead member does not stop the client. Defaults: connect timeout 2 s, request timeout
    /// 5 s, HTTP/2 keep-alive every 10 s with a 5 s timeout (a dead connection is noticed
    /// within 15 s), require-leader on, etcd's default limits.
    pub fn new<S: AsRef<str>>(endpoints: impl IntoIterator<Item = S>) -> Self {
        EtcdConfig {
            endpoints: endpoints
                .into_iter()
                .map(|e| e.as_ref().to_owned())
                .collect(),
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(5),
            // Not more often: etcd closes connections that ping more often than its
            // --grpc-keepalive-min-time (5 s by default) with GOAWAY "too_many_pings",
            // killing every stream on them (measured: with 2 s pings, after 8 s).
            keep_alive: Some((Duration::from_secs(10), Duration::from_secs(5))),
            tls: None,
            user: None,
            // On: without it, a member cut off from its peers keeps a watch open and silent,
            // and holds writes until they time out (measured in tests/faults_etcd.rs, the
            // peer partition case: the watcher missed a host registered on the majority).
            require_leader: true,
            limits: Limits::ETCD_DEFAULTS,
        }
    }

    /// How long to wait for a TCP (and TLS) connection to one endpoint.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long one call may take, retries included. A write that times out is reported as
    /// [`Error::Indeterminate`].
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// HTTP/2 pings: send one every `interval`, give up on the connection after `timeout`
    /// without an answer. `None` turns them off (a dead connection then goes unnoticed
    /// until the OS gives up on it).
    ///
    /// Keep `interval` at or above the server's `--grpc-keepalive-min-time` (etcd's default is
    /// 5 s): etcd closes a connection that pings more often, and every stream on it with it.
    pub fn with_keep_alive(mut self, ping: Option<(Duration, Duration)>) -> Self {
        self.keep_alive = ping;
        self
    }

    /// Connect over TLS.
    pub fn with_tls(mut self, tls: TlsConfig) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Authenticate as this user.
    pub fn with_user(mut self, name: impl Into<String>, password: impl Into<String>) -> Self {
        self.user = Some((name.into(), password.into()));
        self
    }

    /// Ask etcd to refuse requests (and end watches) while the member has no leader, so a
    /// client on a partitioned member fails over instead of reading stale data or hanging.
    /// On by default; turning it off trades that for nothing coord relies on.
    pub fn with_require_leader(mut self, on: bool) -> Self {
        self.require_leader = on;
        self
    }

    /// The cluster's limits, when it does not run with etcd's defaults (for example a
    /// shorter election timeout lowers the minimum TTL; a progress-notify interval set with
    /// `--experimental-watch-progress-notify-interval`).
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// The endpoints.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// How long one call may take, retries included (default 5 s). Keep it well below the
    /// TTL of the leases the store keeps: a session abandons a renewal unanswered by the next
    /// one's time on its own, but other calls wait this long for an answer that may never
    /// come.
    pub fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    /// How long to wait for a connection to one endpoint (default 2 s).
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// Checks the configuration without connecting.
    pub(crate) fn validate(&self) -> Result<()> {
        if self.endpoints.is_empty() {
            return Err(Error::invalid("etcd config: no endpoints"));
        }
        for e in &self.endpoints {
            let rest = e
                .strip_prefix("http://")
                .or_else(|| e.strip_prefix("https://"))
                .unwrap_or(e);
            let valid = rest
                .rsplit_once(':')
                .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
            if !valid {
                return Err(Error::invalid(format!(
                    "etcd config: endpoint {e:?} is not host:port or http(s)://host:port"
                )));
            }
            if e.starts_with("https://") && self.tls.is_none() {
                return Err(Error::invalid(format!(
                    "etcd config: endpoint {e:?} is https but no TLS is configured"
                )));
            }
            if e.starts_with("http://") && self.tls.is_some() {
                return Err(Error::invalid(format!(
                    "etcd config: endpoint {e:?} is plain http but TLS is configured"
                )));
            }
        }
        if self.request_timeout.is_zero() || self.connect_timeout.is_zero() {
            return Err(Error::invalid("etcd config: timeouts must be positive"));
        }
        if let Some((name, _)) = &self.user {
            if name.is_empty() {
                return Err(Error::invalid("etcd config: empty user name"));
            }
        }
        Ok(())
    }

    /// What etcd-client applies per request: a leader required, the user to authenticate as.
    /// The connection's own settings are on its channel (`crate::channel`).
    pub(crate) fn connect_options(&self) -> etcd_client::ConnectOptions {
        let mut o = etcd_client::ConnectOptions::new().with_require_leader(self.require_leader);
        if let Some((u, p)) = &self.user {
            o = o.with_user(u, p);
        }
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_configurations_say_what_is_wrong() {
        let no = |c: EtcdConfig, needle: &str| {
            let e = c.validate().unwrap_err();
            assert!(
                e.to_string().contains(needle),
                "{e} should mention {needle}"
            );
        };
        no(EtcdConfig::new(Vec::<String>::new()), "no endpoints");
        no(EtcdConfig::new(["localhost"]), "not host:port");
        no(EtcdConfig::new(["127.0.0.1:http"]), "not host:port");
        no(EtcdConfig::new(["https://a:2379"]), "no TLS");
        no(
            EtcdConfig::new(["http://a:2379"]).with_tls(TlsConfig::new()),
            "plain http",
        );
        no(EtcdConfig::new(["a:1"]).with_user("", "pw"), "empty user");
        assert!(EtcdConfig::new(["127.0.0.1:2379", "http://[::1]:2379"])
            .validate()
            .is_ok());
    }

    #[test]
    fn debug_output_hides_secrets() {
        let c = EtcdConfig::new(["a:1"]).with_user("svc", "hunter2");
        assert!(!format!("{c:?}").contains("hunter2"));
    }
}
