//! gRPC over turmoil's simulated TCP: the server's incoming connections and the client's
//! connector, as tonic and hyper want them.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::transport::{Channel, Endpoint};

use super::Clients;

/// A turmoil TCP stream that tonic's server and hyper's client accept; a server's may be
/// killed (the process behind it died: the connection drops at once, as the kernel closes a
/// killed process's sockets).
pub struct SimTcp {
    io: Option<turmoil::net::TcpStream>,
    killed: Option<Pin<Box<WaitForCancellationFutureOwned>>>,
    info: tonic::transport::server::TcpConnectInfo,
}

impl std::fmt::Debug for SimTcp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimTcp")
            .field("remote", &self.info.remote_addr)
            .field("open", &self.io.is_some())
            .finish()
    }
}

impl SimTcp {
    fn new(io: turmoil::net::TcpStream, kill: Option<&CancellationToken>) -> Self {
        let info = tonic::transport::server::TcpConnectInfo {
            local_addr: io.local_addr().ok(),
            remote_addr: io.peer_addr().ok(),
        };
        SimTcp {
            io: Some(io),
            killed: kill.map(|k| Box::pin(k.clone().cancelled_owned())),
            info,
        }
    }

    /// The stream, unless it was killed (then it is dropped now, and the peer told).
    fn live(&mut self, cx: &mut Context<'_>) -> io::Result<Pin<&mut turmoil::net::TcpStream>> {
        if self
            .killed
            .as_mut()
            .is_some_and(|k| k.as_mut().poll(cx).is_ready())
        {
            self.io = None;
            self.killed = None;
        }
        match self.io.as_mut() {
            Some(io) => Ok(Pin::new(io)),
            None => Err(io::Error::new(
                io::ErrorKind::ConnectionReset,
                "the server's process was killed",
            )),
        }
    }
}

impl AsyncRead for SimTcp {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.live(cx) {
            Ok(io) => io.poll_read(cx, buf),
            Err(e) => Poll::Ready(Err(e)),
        }
    }
}

impl AsyncWrite for SimTcp {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.live(cx) {
            Ok(io) => io.poll_write(cx, buf),
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.live(cx) {
            Ok(io) => io.poll_flush(cx),
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.live(cx) {
            Ok(io) => io.poll_shutdown(cx),
            Err(e) => Poll::Ready(Err(e)),
        }
    }
}

impl tonic::transport::server::Connected for SimTcp {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.info.clone()
    }
}

impl hyper_util::client::legacy::connect::Connection for SimTcp {
    fn connected(&self) -> hyper_util::client::legacy::connect::Connected {
        hyper_util::client::legacy::connect::Connected::new()
    }
}

/// Accepts connections on `port` of the current turmoil host, forever.
pub fn incoming(port: u16) -> impl Stream<Item = io::Result<SimTcp>> {
    incoming_until(port, None)
}

/// As [`incoming`], each connection dropped when `kill` is cancelled (the stream's owner
/// drops the listener then).
pub(crate) fn incoming_until(
    port: u16,
    kill: Option<CancellationToken>,
) -> impl Stream<Item = io::Result<SimTcp>> {
    async_stream::stream! {
        let listener = turmoil::net::TcpListener::bind(("0.0.0.0", port)).await?;
        loop {
            yield listener.accept().await.map(|(s, _)| SimTcp::new(s, kill.as_ref()));
        }
    }
}

/// A tonic channel to `host:port` over turmoil's network, for clients other than
/// `coord_etcd::EtcdStore` (raw etcd-client, say), connecting lazily (and again after a
/// broken connection), with HTTP/2 keep-alive so a dead peer is noticed, as `EtcdConfig`'s
/// defaults do, and no memory of reset streams, which HTTP/2 keeps in real time (see the
/// crate's determinism notes). `EtcdStore` runs over [`dial`]'s connections instead, with its
/// own channel, as in production.
pub fn channel(host: &str, port: u16) -> Channel {
    connect(host, port, None)
}

/// [`channel`], each of whose connections the server serves through `client` (registered in
/// `clients` as it connects): for several clients on one turmoil host, which the peer's IP
/// alone cannot tell apart.
pub fn channel_as(host: &str, port: u16, client: crate::SimStore, clients: Clients) -> Channel {
    connect(host, port, Some((client, clients)))
}

fn connect(host: &str, port: u16, serve_as: Option<(crate::SimStore, Clients)>) -> Channel {
    let endpoint = Endpoint::from_shared(format!("http://{host}:{port}"))
        .expect("a host name and port make a valid URI")
        .connect_timeout(Duration::from_secs(1))
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(5))
        .keep_alive_while_idle(true)
        // HTTP/2 remembers a stream it reset for one second of *real* time (h2 reads the
        // system clock there), ignoring a late frame for it within that second and answering
        // one after it with a reset of its own: an extra message, so a simulation's history
        // would depend on how fast the machine ran it (a late reply comes seconds of virtual
        // time after its request was given up, which is milliseconds of real time on an idle
        // machine and can be more than a second on a busy one). Forgetting at once makes every
        // late frame draw that reset, whatever the machine; and with no cap on such resets a
        // long run's connection is not closed for having drawn many (a trusted peer).
        .http2_max_concurrent_reset_streams(0)
        .http2_max_local_error_reset_streams(None);
    endpoint.connect_with_connector_lazy(tower::service_fn(move |uri: http::Uri| {
        let serve_as = serve_as.clone();
        async move {
            let host = uri.host().unwrap_or("localhost").to_owned();
            let port = uri.port_u16().unwrap_or(2379);
            dial_to(host, port, serve_as).await.map(TokioIo::new)
        }
    }))
}

/// Opens a connection to `host:port` over turmoil's network: for a client that makes its own
/// channel, as `coord_etcd::EtcdStore::from_member_dialers` does (with `member_dialer`).
pub async fn dial(host: String, port: u16) -> io::Result<SimTcp> {
    dial_to(host, port, None).await
}

/// [`dial`], the connection served through `client` (registered in `clients` as it
/// connects), as [`channel_as`].
pub async fn dial_as(
    host: String,
    port: u16,
    client: crate::SimStore,
    clients: Clients,
) -> io::Result<SimTcp> {
    dial_to(host, port, Some((client, clients))).await
}

async fn dial_to(
    host: String,
    port: u16,
    serve_as: Option<(crate::SimStore, Clients)>,
) -> io::Result<SimTcp> {
    // In hyper's words for a refused connection, which clients (EtcdStore among them) read as
    // "never sent".
    let stream = turmoil::net::TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|e| match e.kind() {
            io::ErrorKind::ConnectionRefused => io::Error::new(
                e.kind(),
                format!("tcp connect error: Connection refused ({e})"),
            ),
            _ => e,
        })?;
    if let Some((client, clients)) = serve_as {
        clients.connected(stream.local_addr()?, client);
    }
    Ok(SimTcp::new(stream, None))
}
