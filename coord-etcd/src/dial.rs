//! How a connection to a member is opened: TCP to its endpoint, with TLS when the
//! configuration asks for it, or a dialer of the caller's (a simulated network's, say).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;

use coord_api::{Error, Result};
use http::Uri;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject as _;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use crate::config::{EtcdConfig, TlsConfig};

/// A connection to a member, as a dialer opens it: any byte stream in both directions.
pub trait MemberIo: AsyncRead + AsyncWrite + Send + Unpin + 'static {}

impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> MemberIo for T {}

/// What opening a connection returns.
pub type Dialing = Pin<Box<dyn Future<Output = io::Result<Box<dyn MemberIo>>> + Send>>;

/// Opens a new connection to one member, each time it is called; see
/// [`EtcdStore::from_member_dialers`](crate::EtcdStore::from_member_dialers) and
/// [`member_dialer`].
pub type MemberDialer = Box<dyn Fn() -> Dialing + Send + Sync>;

pub(crate) type Dialer = Arc<dyn Fn() -> Dialing + Send + Sync>;

/// A [`MemberDialer`] from a function that opens a stream.
///
/// ```
/// use coord_etcd::member_dialer;
/// let dial = member_dialer(|| tokio::net::TcpStream::connect("127.0.0.1:2379"));
/// # let _ = dial;
/// ```
pub fn member_dialer<F, Fut, S>(dial: F) -> MemberDialer
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = io::Result<S>> + Send + 'static,
    S: MemberIo,
{
    Box::new(move || {
        let opening = dial();
        Box::pin(async move { Ok(Box::new(opening.await?) as Box<dyn MemberIo>) })
    })
}

/// A dialer to `endpoint` (validated: `host:port` or `http(s)://host:port`) over TCP, and
/// TLS when `config` has it; with the origin HTTP/2 names the member by.
pub(crate) fn tcp(endpoint: &str, config: &EtcdConfig) -> Result<(Dialer, Uri)> {
    let bad = |e: &dyn std::fmt::Display| {
        Error::invalid(format!("etcd config: endpoint {endpoint:?}: {e}"))
    };
    let url = if endpoint.contains("://") {
        endpoint.to_owned()
    } else if config.tls.is_some() {
        format!("https://{endpoint}")
    } else {
        format!("http://{endpoint}")
    };
    let origin: Uri = url.parse().map_err(|e| bad(&e))?;
    let (Some(host), Some(port)) = (origin.host(), origin.port_u16()) else {
        return Err(bad(&"no host and port"));
    };
    // An IPv6 address comes bracketed in a URI and bare everywhere else.
    let host: Arc<str> = host.trim_start_matches('[').trim_end_matches(']').into();
    let tls = match &config.tls {
        Some(t) => Some(tls(t, &host).map_err(|e| bad(&e))?),
        None => None,
    };
    let dial: Dialer = Arc::new(move || {
        let host = host.clone();
        let tls = tls.clone();
        Box::pin(async move {
            let tcp = tokio::net::TcpStream::connect((&*host, port))
                .await
                // In the words the error mapping reads as "never sent", as hyper's were.
                .map_err(|e| io::Error::new(e.kind(), format!("tcp connect error: {e}")))?;
            // Requests are small and each waited on: never hold one back to fill a segment.
            tcp.set_nodelay(true)?;
            match tls {
                None => Ok(Box::new(tcp) as Box<dyn MemberIo>),
                Some((connector, name)) => {
                    let stream = connector.connect(name, tcp).await?;
                    Ok(Box::new(stream) as Box<dyn MemberIo>)
                }
            }
        }) as Dialing
    });
    Ok((dial, origin))
}

/// The TLS client for `t`: the CA's certificates as the only roots, the identity if any,
/// HTTP/2 by ALPN, and the name to expect in the server's certificate.
fn tls(
    t: &TlsConfig,
    host: &str,
) -> std::result::Result<(tokio_rustls::TlsConnector, ServerName<'static>), String> {
    // The process's provider if it installed one, else ring (the one this crate builds).
    let provider = rustls::crypto::CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()));
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?;
    let mut roots = rustls::RootCertStore::empty();
    if let Some(ca) = &t.ca_pem {
        for cert in CertificateDer::pem_slice_iter(ca) {
            let cert = cert.map_err(|e| format!("TLS CA: not a PEM certificate: {e}"))?;
            roots
                .add(cert)
                .map_err(|e| format!("TLS CA: unusable certificate: {e}"))?;
        }
    }
    let builder = builder.with_root_certificates(roots);
    let mut client = match &t.identity {
        Some((cert, key)) => {
            let certs = CertificateDer::pem_slice_iter(cert)
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| format!("TLS identity: not a PEM certificate: {e}"))?;
            let key = PrivateKeyDer::from_pem_slice(key)
                .map_err(|e| format!("TLS identity: not a PEM private key: {e}"))?;
            builder
                .with_client_auth_cert(certs, key)
                .map_err(|e| format!("TLS identity: {e}"))?
        }
        None => builder.with_no_client_auth(),
    };
    client.alpn_protocols = vec![b"h2".to_vec()];
    let name = t.domain.as_deref().unwrap_or(host).to_owned();
    let name = ServerName::try_from(name).map_err(|e| format!("TLS domain: {e}"))?;
    Ok((Arc::new(client).into(), name))
}
