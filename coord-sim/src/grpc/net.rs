//! gRPC over turmoil's simulated TCP: the server's incoming connections and the client's
//! connector, as tonic and hyper want them.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::{Channel, Endpoint};

/// A turmoil TCP stream that tonic's server and hyper's client accept.
#[derive(Debug)]
pub struct SimTcp(turmoil::net::TcpStream);

impl AsyncRead for SimTcp {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for SimTcp {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for SimTcp {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        tonic::transport::server::TcpConnectInfo {
            local_addr: self.0.local_addr().ok(),
            remote_addr: self.0.peer_addr().ok(),
        }
    }
}

impl hyper_util::client::legacy::connect::Connection for SimTcp {
    fn connected(&self) -> hyper_util::client::legacy::connect::Connected {
        hyper_util::client::legacy::connect::Connected::new()
    }
}

/// Accepts connections on `port` of the current turmoil host, forever.
pub fn incoming(port: u16) -> impl Stream<Item = io::Result<SimTcp>> {
    async_stream::stream! {
        let listener = turmoil::net::TcpListener::bind(("0.0.0.0", port)).await?;
        loop {
            yield listener.accept().await.map(|(s, _)| SimTcp(s));
        }
    }
}

/// A channel to `host:port` over turmoil's network, connecting lazily (and again after a
/// broken connection), with HTTP/2 keep-alive so a dead peer is noticed, as
/// `EtcdConfig`'s defaults do.
pub fn channel(host: &str, port: u16) -> Channel {
    let endpoint = Endpoint::from_shared(format!("http://{host}:{port}"))
        .expect("a host name and port make a valid URI")
        .connect_timeout(Duration::from_secs(1))
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(5))
        .keep_alive_while_idle(true);
    endpoint.connect_with_connector_lazy(tower::service_fn(|uri: http::Uri| async move {
        let host = uri.host().unwrap_or("localhost").to_owned();
        let port = uri.port_u16().unwrap_or(2379);
        let stream = turmoil::net::TcpStream::connect((host.as_str(), port)).await?;
        Ok::<_, io::Error>(TokioIo::new(SimTcp(stream)))
    }))
}
