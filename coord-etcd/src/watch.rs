//! Watches on etcd's Watch stream, one gRPC stream per watch, and their progress requests.

use std::sync::Arc;
use std::time::Duration;

use coord_api::{Error, Result, Revision, WatchRequest, WatchResponse, WatchStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::convert;
use crate::error::Kind;
use crate::pool::Pool;

/// etcd answers a progress request from the member's own state, without raft: a live member
/// answers in milliseconds. A stream dropped while a request has gone unanswered this long
/// says its member is stuck.
const STUCK_AFTER: Duration = Duration::from_secs(1);

/// The progress request in flight on a stream, if any; when the stream is dropped with one
/// unanswered past [`STUCK_AFTER`] (its consumer gave up on it), the member is left.
struct Asked {
    pool: Arc<Pool>,
    endpoint: usize,
    since: Option<Instant>,
}

impl Drop for Asked {
    fn drop(&mut self) {
        if let Some(since) = self.since {
            if since.elapsed() >= STUCK_AFTER {
                tracing::debug!(
                    endpoint = self.endpoint,
                    unanswered_ms = since.elapsed().as_millis() as u64,
                    "watch dropped with its progress request unanswered; leaving the member"
                );
                self.pool.abandon_if_silent_since(self.endpoint, since);
            }
        }
    }
}

/// Opens a watch and waits for etcd to confirm it, so every write after this returns is seen.
pub(crate) async fn open(pool: &Arc<Pool>, req: WatchRequest) -> Result<WatchStream> {
    let mut opts = etcd_client::WatchOptions::new();
    if let coord_api::KeyRange::Prefix(_) = &req.range {
        opts = opts.with_range(req.range.etcd_range_end());
    }
    if let Some(rev) = req.start_revision {
        opts = opts.with_start_revision(rev.get());
    }
    if req.prev_kv {
        opts = opts.with_prev_key();
    }
    if req.progress_notify {
        opts = opts.with_progress_notify();
    }
    let key = req.range.start().to_vec();
    // `call` bounds this by the request timeout, the confirmation included.
    let (stream, first, connection) = pool
        .call_on("watch", Kind::Read, &key, |c, connection| {
            let (mut c, key, opts) = (c.watch_client(), key.clone(), opts.clone());
            async move {
                let mut stream = c.watch(key, Some(opts)).await?;
                // The first answer confirms the watch (or already cancels it).
                let first = stream.message().await?;
                Ok((stream, first, connection))
            }
        })
        .await?;
    let (mut sender, mut stream) = stream.split();
    let dead = connection.streams;
    let (ask, mut asks) = mpsc::unbounded_channel::<()>();
    let asked = Asked {
        pool: pool.clone(),
        endpoint: connection.endpoint,
        since: None,
    };
    let watching = pool.watching(connection.endpoint);
    let requested = req.start_revision.unwrap_or(Revision::ZERO);
    let mut pending = first.filter(|r| !r.created() || r.canceled());
    let out = async_stream::stream! {
        // Owned by the stream (a closure would capture only the fields it reads), so that it
        // drops with it.
        let mut asked = asked;
        let _watching = watching;
        loop {
            let msg = match pending.take() {
                Some(m) => Ok(Some(m)),
                None => tokio::select! {
                    biased;
                    // The store found the connection dead and replaced it: this stream would
                    // only learn that from HTTP/2 keep-alive, many seconds later.
                    _ = dead.cancelled() => {
                        yield Err(Error::StreamClosed { stream: "watch", source: Some("the connection stopped answering and was replaced".into()) });
                        break;
                    }
                    Some(()) = asks.recv() => {
                        if let Err(e) = sender.request_progress().await {
                            yield Err(Error::StreamClosed { stream: "watch", source: Some(Box::new(e)) });
                            break;
                        }
                        let since = *asked.since.get_or_insert_with(Instant::now);
                        asked.pool.asked(asked.endpoint, since);
                        continue;
                    }
                    m = stream.message() => m,
                },
            };
            match msg {
                Ok(Some(resp)) => {
                    if resp.canceled() {
                        if resp.compact_revision() > 0 {
                            yield Err(Error::Compacted { requested, compact_revision: Revision(resp.compact_revision()) });
                        } else {
                            let reason = resp.cancel_reason().to_owned();
                            yield Err(Error::StreamClosed {
                                stream: "watch",
                                source: Some(format!("etcd cancelled the watch: {reason:?}").into()),
                            });
                        }
                        break;
                    }
                    let revision = Revision(resp.header().map_or(0, |h| h.revision()));
                    // etcd 3.4 answers a progress request with watch id -1 (it belongs to no
                    // one watch of the gRPC stream, and this stream carries only ours).
                    if resp.watch_id() == -1 {
                        // An answer to our request: the connection carries both ways. (An
                        // event proves only the way back: a connection that lost a request's
                        // bytes on the way out may still bring events in.)
                        if let Some(sent) = asked.since.take() {
                            asked.pool.answered(asked.endpoint, sent);
                        }
                        yield Ok(WatchResponse::progress_answer(revision));
                        continue;
                    }
                    let events = resp.events().iter().filter_map(convert::event).collect();
                    yield Ok(WatchResponse::new(revision, events));
                }
                Ok(None) => {
                    yield Err(Error::StreamClosed { stream: "watch", source: Some("the server ended the stream".into()) });
                    break;
                }
                Err(e) => {
                    yield Err(Error::StreamClosed { stream: "watch", source: Some(Box::new(e)) });
                    break;
                }
            }
        }
    };
    Ok(WatchStream::new(out, move || {
        ask.send(()).map_err(|_| Error::StreamClosed {
            stream: "watch",
            source: Some("the watch has ended".into()),
        })
    }))
}
