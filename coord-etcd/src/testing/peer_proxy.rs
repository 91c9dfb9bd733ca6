//! Proxies on the members' peer ports, to cut one member off from the others while its clients
//! still reach it.
//!
//! A member's peers all dial the one peer URL it advertises, so a plain proxy in front of it
//! could only cut everyone from it at once, and raft traffic flows over connections dialed from
//! both sides. What tells the dialer apart: every raft request etcd sends a peer carries
//! `X-Server-From: <the sender's member id, hex>`, and a connection carries one member's
//! requests only. Each proxy reads the headers of a connection's first request, and forwards
//! the connection unless its sender or its receiver is the isolated member.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use coord_api::testkit::proxy;

/// Which member is cut off, shared by every peer proxy of one cluster.
#[derive(Debug, Clone)]
pub(crate) struct Isolation {
    /// Bumped on every change, so that open connections judge themselves again.
    changes: watch::Sender<u64>,
    isolated: Arc<RwLock<Option<usize>>>,
    /// Member ids (as etcd writes them) to member indexes, learned once the cluster runs.
    ids: Arc<RwLock<HashMap<u64, usize>>>,
}

impl Isolation {
    pub(crate) fn new() -> Self {
        let (changes, _) = watch::channel(0);
        Isolation {
            changes,
            isolated: Arc::default(),
            ids: Arc::default(),
        }
    }

    /// Records that member `index` has id `id`.
    pub(crate) fn learn(&self, id: u64, index: usize) {
        let mut ids = self.ids.write().unwrap_or_else(|p| p.into_inner());
        ids.retain(|_, i| *i != index);
        ids.insert(id, index);
    }

    /// Cuts member `index` off from the others (`None`: no one). Open connections to or from
    /// it close; the others carry on untouched (closing them would drop the raft messages in
    /// flight on them, and a proposal dropped so is lost until the request times out).
    pub(crate) fn set(&self, index: Option<usize>) {
        *self.isolated.write().unwrap_or_else(|p| p.into_inner()) = index;
        self.changes.send_modify(|n| *n += 1);
    }

    fn allows(&self, from: Option<u64>, to: usize) -> bool {
        let Some(cut) = *self.isolated.read().unwrap_or_else(|p| p.into_inner()) else {
            return true;
        };
        let from = from.and_then(|id| {
            self.ids
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .get(&id)
                .copied()
        });
        to != cut && from != Some(cut)
    }
}

/// A proxy in front of member `index`'s peer listener.
#[derive(Debug)]
pub(crate) struct PeerProxy {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl PeerProxy {
    /// Listens on a free loopback port and forwards to `target`, member `index`'s peer port.
    pub(crate) async fn start(
        index: usize,
        target: SocketAddr,
        isolation: Isolation,
    ) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let isolation = isolation.clone();
                tokio::spawn(async move {
                    let _ = forward(inbound, index, target, isolation).await;
                });
            }
        });
        Ok(PeerProxy { addr, task })
    }

    /// The port peers dial.
    pub(crate) fn port(&self) -> u16 {
        self.addr.port()
    }
}

impl Drop for PeerProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn forward(
    mut inbound: TcpStream,
    to: usize,
    target: SocketAddr,
    isolation: Isolation,
) -> std::io::Result<()> {
    // Subscribed before judging: a change after this is seen below.
    let mut changes = isolation.changes.subscribe();
    let head = read_head(&mut inbound).await?;
    let from = sender(&head);
    if !isolation.allows(from, to) {
        return Ok(());
    }
    let mut outbound = TcpStream::connect(target).await?;
    outbound.write_all(&head).await?;
    // The connection ends when it is judged cut.
    let judged_cut = async {
        while changes.changed().await.is_ok() {
            if !isolation.allows(from, to) {
                return;
            }
        }
        std::future::pending::<()>().await;
    };
    tokio::select! {
        _ = proxy::forward(inbound, outbound) => {}
        _ = judged_cut => {}
    }
    Ok(())
}

/// The bytes up to the end of the first request's headers (or all there is, if the dialer
/// closes or sends more than 16 KiB of headers first).
async fn read_head(stream: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    Ok(head)
}

/// The `X-Server-From` member id in a request's headers.
fn sender(head: &[u8]) -> Option<u64> {
    let text = String::from_utf8_lossy(head);
    text.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case("x-server-from")
            .then(|| u64::from_str_radix(value.trim(), 16).ok())?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sender_is_read_from_the_headers() {
        let head = b"GET /raft/stream/message/8e9e05c52164694d HTTP/1.1\r\n\
            Host: 127.0.0.1:2380\r\nX-Server-From: 91bc3c398fb3c146\r\n\r\n";
        assert_eq!(sender(head), Some(0x91bc_3c39_8fb3_c146));
        assert_eq!(sender(b"GET /version HTTP/1.1\r\n\r\n"), None);
    }
}
