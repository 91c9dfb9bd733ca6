//! Watches on etcd's Watch stream.

use coord_api::{Error, Result, Revision, WatchRequest, WatchResponse, WatchStream};
use futures::StreamExt;

use crate::convert;
use crate::error::Kind;
use crate::pool::Pool;

/// Opens a watch and waits for etcd to confirm it, so every write after this returns is seen.
pub(crate) async fn open(pool: &Pool, req: WatchRequest) -> Result<WatchStream> {
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
    let (mut stream, first, dead) = pool
        .call_on("watch", Kind::Read, |mut c, dead| {
            let (key, opts) = (key.clone(), opts.clone());
            async move {
                let mut stream = c.watch(key, Some(opts)).await?;
                // The first answer confirms the watch (or already cancels it).
                let first = stream.message().await?;
                Ok((stream, first, dead))
            }
        })
        .await?;
    let requested = req.start_revision.unwrap_or(Revision::ZERO);
    let mut pending = first.filter(|r| !r.created() || r.canceled());
    let out = async_stream::stream! {
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
                    let events = resp.events().iter().filter_map(convert::event).collect();
                    let revision = Revision(resp.header().map_or(0, |h| h.revision()));
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
    Ok(out.boxed())
}
