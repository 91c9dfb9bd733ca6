//! A watch's stream: the events the state machine queues for it, carried over the client's
//! link, ended when the link breaks or the store closes its streams; and the answers to its
//! progress requests, which cross the link both ways.

use std::sync::{Arc, Weak};
use std::time::Duration;

use coord_api::{WatchResponse, WatchStream};
use tokio::time::Instant;

use crate::link::{Leg, Link};
use crate::mailbox::{Mail, Mailbox};
use crate::state::WatchId;
use crate::store::Shared;

/// Cancels the watch when its stream is dropped.
struct WatchGuard {
    shared: Weak<Shared>,
    id: WatchId,
}

impl Drop for WatchGuard {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.upgrade() {
            let mut inner = shared.lock();
            inner.sinks.remove(&self.id);
            inner.state.cancel_watch(self.id);
        }
    }
}

/// The link a watch stream was opened over, the connection it was opened on, and the
/// store's base latency each progress answer takes.
pub(crate) struct StreamLink {
    pub(crate) link: Arc<Link>,
    pub(crate) generation: u64,
    pub(crate) latency: Duration,
}

impl StreamLink {
    /// Carries a progress answer back to the client: the store's latency, then the link's
    /// faults (it stalls while they last). False when the connection broke meanwhile.
    async fn carry_back(&self) -> bool {
        let delay = self.latency + self.link.reply_latency();
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        self.link.wait_flowing(self.generation).await.is_ok()
    }
}

fn link_broken() -> coord_api::Error {
    coord_api::Error::StreamClosed {
        stream: "watch",
        source: Some("the simulated connection broke".into()),
    }
}

pub(crate) fn watch_stream(
    shared: Arc<Shared>,
    id: WatchId,
    mut mail: Mailbox,
    progress: Option<Duration>,
    link: StreamLink,
) -> WatchStream {
    let guard = WatchGuard {
        shared: Arc::downgrade(&shared),
        id,
    };
    drop(shared);
    let asks = mail.asks();
    let stream = async_stream::stream! {
        let guard = guard;
        // Like etcd, notify progress only after a whole interval without events.
        let mut sent_since_tick = false;
        let mut link_rx = link.link.subscribe();
        // One timer for the stream's life, moved at each tick: a fresh one per event was
        // registered and torn down once for each of thousands of streams' events.
        let tick = tokio::time::sleep_until(Instant::now() + progress.unwrap_or_default());
        tokio::pin!(tick);
        loop {
            tokio::select! {
                biased;
                // A fault on the link: the stream stalls while it lasts, and dies with the
                // connection if the connection broke.
                changed = link_rx.changed() => {
                    if changed.is_err() || link.link.wait_flowing(link.generation).await.is_err() {
                        yield Err(link_broken());
                        break;
                    }
                }
                m = mail.next() => match m {
                    Mail::Ask => {
                        // The request crosses the link to the store; one lost on a cut link
                        // is never answered, and the stream stalls until the link says why.
                        if link.link.request(link.latency).await == Leg::Lost {
                            continue;
                        }
                        let Some(shared) = guard.shared.upgrade() else { break };
                        // As etcd 3.4 does, the answer carries the store's revision and goes
                        // out at once, ahead of any events still queued for this watch
                        // (etcd's order between the two is a race; asks come first, the
                        // worst case).
                        let revision = shared.lock().state.revision();
                        drop(shared);
                        if !link.carry_back().await {
                            yield Err(link_broken());
                            break;
                        }
                        yield Ok(WatchResponse::progress_answer(revision));
                    }
                    Mail::Response(item) => {
                        // It came the way back on the store's arrival queue (see `Sink`);
                        // a fault that holds or breaks the link still stalls or ends it.
                        if link.link.wait_flowing(link.generation).await.is_err() {
                            yield Err(link_broken());
                            break;
                        }
                        let end = item.is_err();
                        sent_since_tick = true;
                        yield item;
                        if end { break; }
                    }
                    Mail::Closed => break,
                },
                _ = tick.as_mut(), if progress.is_some() => {
                    let every = progress.expect("ticks only with progress");
                    tick.as_mut().reset(Instant::now() + every);
                    if std::mem::take(&mut sent_since_tick) {
                        continue;
                    }
                    if link.link.wait_flowing(link.generation).await.is_err() {
                        yield Err(link_broken());
                        break;
                    }
                    let Some(shared) = guard.shared.upgrade() else { break };
                    // Read the revision under the lock that deliveries are sent under: if
                    // nothing is queued for us now, nor on its way, every event up to it has
                    // been delivered. A watch the store has ended (its sink gone) has its end
                    // on the way, maybe behind events: it notifies nothing more.
                    let revision = {
                        let inner = shared.lock();
                        let on_its_way = inner
                            .sinks
                            .get(&guard.id)
                            .is_none_or(|sink| sink.in_flight(shared.now()));
                        (mail.is_empty() && !on_its_way).then(|| inner.state.revision())
                    };
                    if let Some(revision) = revision {
                        yield Ok(WatchResponse::new(revision, Vec::new()));
                    }
                }
            }
        }
    };
    WatchStream::new(stream, move || {
        asks.ask().map_err(|()| coord_api::Error::StreamClosed {
            stream: "watch",
            source: Some("the watch has ended".into()),
        })
    })
}
