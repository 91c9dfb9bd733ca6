//! A TCP proxy in front of a server (an etcd member, PostgreSQL), to cut a client off from it.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What the proxy does with traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyMode {
    /// Forward everything.
    Pass,
    /// Accept and keep connections but forward nothing, either way: a partition in which
    /// packets vanish, so only timeouts and keep-alive pings notice.
    Blackhole,
    /// Close every connection and refuse new ones at once: a partition that answers with
    /// resets.
    Reset,
    /// Forward everything after this delay.
    Delay(Duration),
    /// Keep every byte, those already on their way included, and forward them all, in
    /// order, when the mode changes: a link that stalls and loses nothing.
    Hold,
}

/// A TCP proxy: point a client at [`endpoint`](TcpProxy::endpoint) instead of the member, then
/// switch modes to partition it. Stops when dropped.
#[derive(Debug)]
pub struct TcpProxy {
    addr: SocketAddr,
    mode: watch::Sender<State>,
    task: JoinHandle<()>,
}

/// The proxy's mode, and the generation every connection is born in: connections born
/// before `cut_before` are closed, and those born before `frozen_before` forward nothing ever
/// again, whatever the mode is by the time they look.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct State {
    mode: ProxyMode,
    generation: u64,
    cut_before: u64,
    frozen_before: u64,
}

impl State {
    /// Forwarding everything, on connections born from now on.
    fn pass() -> Self {
        State {
            mode: ProxyMode::Pass,
            generation: 0,
            cut_before: 0,
            frozen_before: 0,
        }
    }

    /// Starts a new generation: the connections open now are born in an older one.
    fn next_generation(&mut self) -> u64 {
        self.generation += 1;
        self.generation
    }
}

impl TcpProxy {
    /// Starts a proxy on a free loopback port, forwarding to `target`.
    pub async fn start(target: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (mode, modes) = watch::channel(State::pass());
        let task = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                if modes.borrow().mode == ProxyMode::Reset {
                    drop(inbound);
                    continue;
                }
                let modes = modes.clone();
                let born = modes.borrow().generation;
                tokio::spawn(async move {
                    if let Ok(outbound) = TcpStream::connect(target).await {
                        relay(inbound, outbound, modes, born).await;
                    }
                });
            }
        });
        Ok(TcpProxy { addr, mode, task })
    }

    /// The address clients connect to, `127.0.0.1:port`.
    pub fn endpoint(&self) -> String {
        self.addr.to_string()
    }

    /// The port clients connect to, on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Switches the mode; existing connections follow at once.
    pub fn set_mode(&self, mode: ProxyMode) {
        self.mode.send_modify(|s| {
            if mode == ProxyMode::Reset {
                s.cut_before = s.next_generation();
            }
            s.mode = mode;
        });
    }

    /// Closes every open connection (so every stream on them ends) and keeps accepting new
    /// ones: what a client sees when its etcd member restarts or a middlebox drops it.
    pub fn close_connections(&self) {
        self.mode
            .send_modify(|s| s.cut_before = s.next_generation());
    }

    /// Freezes every open connection for good, either way, without closing it, and keeps
    /// forwarding new ones: a partition that outlived TCP's retransmissions, or a middlebox
    /// that forgot its connections and drops their packets. Only a timeout notices.
    pub fn freeze_connections(&self) {
        self.mode
            .send_modify(|s| s.frozen_before = s.next_generation());
    }

    /// Drops all traffic silently.
    pub fn blackhole(&self) {
        self.set_mode(ProxyMode::Blackhole);
    }

    /// Resets every connection and refuses new ones.
    pub fn reset(&self) {
        self.set_mode(ProxyMode::Reset);
    }

    /// Delays all traffic.
    pub fn delay(&self, by: Duration) {
        self.set_mode(ProxyMode::Delay(by));
    }

    /// Holds all traffic, what is on its way included, until the next mode: nothing lost.
    pub fn hold(&self) {
        self.set_mode(ProxyMode::Hold);
    }

    /// Forwards everything again. Connections that saw a blackhole may have lost bytes and
    /// are best abandoned by the client; new ones work.
    pub fn heal(&self) {
        self.set_mode(ProxyMode::Pass);
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.set_mode(ProxyMode::Reset);
        self.task.abort();
    }
}

/// Forwards everything between `a` and `b`, both ways, until either ends (a relay for a
/// proxy with rules of its own, such as etcd peers' isolation).
pub async fn forward(a: TcpStream, b: TcpStream) {
    let (_pass, modes) = watch::channel(State::pass());
    relay(a, b, modes, 0).await;
}

/// Relays between `a` and `b` until either ends, or connections born in generation `born`
/// are cut.
async fn relay(a: TcpStream, b: TcpStream, modes: watch::Receiver<State>, born: u64) {
    let (ar, aw) = a.into_split();
    let (br, bw) = b.into_split();
    let up = pump(ar, bw, modes.clone(), born);
    let down = pump(br, aw, modes, born);
    // Either direction ending (EOF, error or reset) ends the connection.
    tokio::select! {
        _ = up => {}
        _ = down => {}
    }
}

/// How a direction's reader ended.
enum Ended {
    /// The sender closed its side: what is queued is still delivered.
    Eof,
    /// A reset, an error, or its generation cut: the connection dies at once.
    Cut,
}

/// Forwards one direction. A delay is latency, not throughput: each chunk is delivered its
/// delay after it was read, in order, while later chunks are read meanwhile (a slow link,
/// not a queue that grows with every chunk).
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut modes: watch::Receiver<State>,
    born: u64,
) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    let mut held = modes.clone();
    let reader = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = tokio::select! {
                read = from.read(&mut buf) => match read {
                    Ok(0) => return Ended::Eof,
                    Err(_) => return Ended::Cut,
                    Ok(n) => n,
                },
                changed = modes.changed() => {
                    if changed.is_err() || born < modes.borrow().cut_before {
                        return Ended::Cut;
                    }
                    continue;
                }
            };
            let state = *modes.borrow();
            if born < state.cut_before {
                return Ended::Cut;
            }
            if born < state.frozen_before {
                continue;
            }
            let due = match state.mode {
                ProxyMode::Pass | ProxyMode::Hold => tokio::time::Instant::now(),
                ProxyMode::Blackhole => continue,
                ProxyMode::Reset => return Ended::Cut,
                ProxyMode::Delay(d) => tokio::time::Instant::now() + d,
            };
            if tx.send((due, buf[..n].to_vec())).is_err() {
                return Ended::Cut;
            }
        }
    };
    let writer = async move {
        // In order: a chunk read in Pass after one read in Delay waits for it.
        while let Some((due, bytes)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            // A hold keeps what was on its way when it began as well.
            if held.wait_for(|s| s.mode != ProxyMode::Hold).await.is_err() {
                return;
            }
            if to.write_all(&bytes).await.is_err() {
                return;
            }
        }
    };
    tokio::pin!(writer);
    tokio::select! {
        ended = reader => {
            if let Ended::Eof = ended {
                writer.await;
            }
        }
        _ = &mut writer => {}
    }
}
