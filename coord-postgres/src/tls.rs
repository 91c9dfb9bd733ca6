//! How connections are made: plain, or TLS (rustls) with the CAs and client identity the
//! user gives.

use std::sync::Arc;

use coord_api::Error;
use futures::StreamExt;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_postgres::{AsyncMessage, Client, Connection};
use tokio_postgres_rustls::MakeRustlsConnect;

/// TLS to the server: the CA that signed its certificate, and for client-certificate
/// authentication this client's certificate and key. All PEM. The server's name is checked
/// against the connection string's `host` (a DNS name or an IP address in the certificate).
///
/// Whether TLS is required follows the connection string's `sslmode`: `require` refuses a
/// server without TLS; the default, `prefer`, falls back to a plain connection.
///
/// ```
/// use coord_postgres::{PostgresConfig, TlsConfig};
/// # let ca_pem = "";
/// let config = PostgresConfig::new("host=db.internal user=coord sslmode=require")
///     .with_tls(TlsConfig::new(ca_pem));
/// # let _ = config;
/// ```
#[derive(Clone)]
pub struct TlsConfig {
    ca_pem: Vec<u8>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("TlsConfig")
            .field("client_identity", &self.identity.is_some())
            .finish_non_exhaustive()
    }
}

impl TlsConfig {
    /// Trust servers whose certificate a CA in `ca_pem` (one or more certificates) signed.
    pub fn new(ca_pem: impl Into<Vec<u8>>) -> Self {
        TlsConfig {
            ca_pem: ca_pem.into(),
            identity: None,
        }
    }

    /// Present this certificate and key (client-certificate authentication).
    pub fn with_identity_pem(mut self, cert: impl Into<Vec<u8>>, key: impl Into<Vec<u8>>) -> Self {
        self.identity = Some((cert.into(), key.into()));
        self
    }

    /// The rustls connector, or what is wrong with the PEM.
    fn connector(&self) -> Result<MakeRustlsConnect, Error> {
        let bad = |what: &str, e: &dyn std::fmt::Display| {
            Error::invalid(format!("PostgreSQL TLS: {what}: {e}"))
        };
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(&self.ca_pem) {
            let cert = cert.map_err(|e| bad("the CA's PEM", &e))?;
            roots
                .add(cert)
                .map_err(|e| bad("the CA's certificate", &e))?;
        }
        if roots.is_empty() {
            return Err(Error::invalid(
                "PostgreSQL TLS: no CA certificate in the PEM given",
            ));
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| bad("protocol versions", &e))?
            .with_root_certificates(roots);
        let config = match &self.identity {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => {
                let certs = CertificateDer::pem_slice_iter(cert)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| bad("the client certificate's PEM", &e))?;
                let key = PrivateKeyDer::from_pem_slice(key)
                    .map_err(|e| bad("the client key's PEM", &e))?;
                builder
                    .with_client_auth_cert(certs, key)
                    .map_err(|e| bad("the client identity", &e))?
            }
        };
        Ok(MakeRustlsConnect::new(config))
    }
}

/// A connection's messages (notifications among them); polling them drives the connection.
pub(crate) type Messages =
    futures::stream::BoxStream<'static, std::result::Result<AsyncMessage, tokio_postgres::Error>>;

/// How this store makes its connections.
#[derive(Clone)]
pub(crate) enum Connector {
    Plain,
    Tls(MakeRustlsConnect),
}

impl Connector {
    pub(crate) fn new(tls: Option<&TlsConfig>) -> Result<Self, Error> {
        Ok(match tls {
            None => Connector::Plain,
            Some(tls) => Connector::Tls(tls.connector()?),
        })
    }

    /// A connection: its client and its messages, which the caller must poll.
    pub(crate) async fn connect(
        &self,
        pg: &tokio_postgres::Config,
    ) -> std::result::Result<(Client, Messages), tokio_postgres::Error> {
        match self {
            Connector::Plain => {
                let (client, conn) = pg.connect(tokio_postgres::NoTls).await?;
                Ok((client, messages(conn)))
            }
            Connector::Tls(tls) => {
                let (client, conn) = pg.connect(tls.clone()).await?;
                Ok((client, messages(conn)))
            }
        }
    }

    /// The pool's manager, making connections this way.
    pub(crate) fn manager(
        &self,
        pg: tokio_postgres::Config,
        config: deadpool_postgres::ManagerConfig,
    ) -> deadpool_postgres::Manager {
        match self {
            Connector::Plain => {
                deadpool_postgres::Manager::from_config(pg, tokio_postgres::NoTls, config)
            }
            Connector::Tls(tls) => deadpool_postgres::Manager::from_config(pg, tls.clone(), config),
        }
    }
}

fn messages<S, T>(mut conn: Connection<S, T>) -> Messages
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    futures::stream::poll_fn(move |cx| conn.poll_message(cx)).boxed()
}
