//! Watches: the history table is the truth, notifications only a wake-up.
//!
//! Every writing transaction sends `NOTIFY coord_revision` with its revision, delivered at
//! commit. One listener per store turns those into the newest revision known (a
//! `tokio::sync::watch`), and also reads the revision itself every poll interval, so a lost
//! notification (a dropped listener connection, a full queue) costs latency, never an event.
//! Each stream reads whole revisions from `coord_history`, from its next revision up to the
//! newest known: revisions are taken under one lock and committed in order, so every revision
//! up to a committed one is there, with no gaps to wait out.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use coord_api::{
    Error, Event, EventKind, KeyValue, LeaseId, Result, Revision, WatchRequest, WatchResponse,
    WatchStream,
};
use deadpool_postgres::Pool;
use futures::StreamExt;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_postgres::types::Type;
use tokio_util::sync::CancellationToken;

use crate::error::Stage;
use crate::range::{bounds, condition, kv_at};
use crate::tls::Connector;

/// The newest revision any source has shown this store, never moving back.
pub(crate) fn advance(known: &watch::Sender<i64>, revision: i64) {
    known.send_if_modified(|r| {
        let newer = revision > *r;
        if newer {
            *r = revision;
        }
        newer
    });
}

/// The planted bug [`PostgresWatchFedByNotifications`](coord_api::hooks::planted::Bug): no poll.
fn fed_by_notifications() -> bool {
    coord_api::hooks::planted::enabled(
        coord_api::hooks::planted::Bug::PostgresWatchFedByNotifications,
    )
}

/// Listens for notifications and polls, until `stop`.
///
/// The poll goes through the listener's own connection while there is one: an answer shows
/// that connection alive, and a missing one (a frozen connection holds notifications back
/// without a word) has it replaced. Every step is bounded by the request timeout.
pub(crate) async fn listen(
    pg: tokio_postgres::Config,
    connector: Connector,
    pool: Pool,
    known: watch::Sender<i64>,
    poll: Duration,
    timeout: Duration,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(poll);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        // (Re)connect the listener; while it is down, the poll alone keeps watches moving.
        let mut listener =
            match tokio::time::timeout(timeout, Listener::connect(&pg, &connector)).await {
                Ok(Ok(l)) => Some(l),
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "coord-postgres: listener not connected; polling");
                    None
                }
                Err(_) => {
                    tracing::debug!("coord-postgres: listener not connected in time; polling");
                    None
                }
            };
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {
                    if !fed_by_notifications() {
                        let polled = match &listener {
                            Some(l) => tokio::time::timeout(timeout, revision_on(&l.client))
                                .await
                                .unwrap_or_else(|_| Err(crate::error::timed_out("get", Stage::Before))),
                            None => current_revision(&pool, Instant::now() + timeout).await,
                        };
                        match polled {
                            Ok(r) => advance(&known, r.get()),
                            Err(e) if listener.is_some() => {
                                tracing::debug!(error = %e, "coord-postgres: listener connection unanswered; replacing it");
                                break;
                            }
                            Err(_) => {}
                        }
                    }
                    if listener.is_none() {
                        break;
                    }
                }
                n = async { listener.as_mut().expect("listening").notifications.recv().await },
                    if listener.is_some() =>
                {
                    match n {
                        Some(revision) => advance(&known, revision),
                        None => {
                            tracing::debug!("coord-postgres: listener connection lost");
                            break;
                        }
                    }
                }
            }
        }
    }
}

/// A connection listening on `coord_revision`: the revisions notified, and the client (its
/// own liveness check; dropping it closes the connection).
struct Listener {
    client: tokio_postgres::Client,
    notifications: mpsc::UnboundedReceiver<i64>,
}

impl Listener {
    async fn connect(
        pg: &tokio_postgres::Config,
        connector: &Connector,
    ) -> std::result::Result<Self, tokio_postgres::Error> {
        let (client, mut messages) = connector.connect(pg).await?;
        let (tx, rx) = mpsc::unbounded_channel();
        // The connection delivers notifications only while it is polled for messages.
        tokio::spawn(async move {
            while let Some(Ok(message)) = messages.next().await {
                if let tokio_postgres::AsyncMessage::Notification(n) = message {
                    if let Ok(revision) = n.payload().parse::<i64>() {
                        if tx.send(revision).is_err() {
                            return;
                        }
                    }
                }
            }
        });
        client.batch_execute("LISTEN coord_revision").await?;
        Ok(Listener {
            client,
            notifications: rx,
        })
    }
}

/// The store's revision, as committed, read on `c`.
async fn revision_on(c: &tokio_postgres::Client) -> Result<Revision> {
    let rows = c
        .query_typed("SELECT revision FROM coord_meta WHERE id = 1", &[])
        .await
        .map_err(crate::kv::before("get"))?;
    let row = rows.first().ok_or_else(crate::kv::no_meta)?;
    Ok(Revision(row.get(0)))
}

/// The store's revision, as committed, on a pooled connection by `deadline`.
pub(crate) async fn current_revision(pool: &Pool, deadline: Instant) -> Result<Revision> {
    crate::conn::single(pool, deadline, "get", Stage::Before, |c| {
        Box::pin(revision_on(c))
    })
    .await
}

/// What a watch stream needs from its store.
pub(crate) struct Source {
    pub(crate) pool: Pool,
    pub(crate) known: watch::Receiver<i64>,
    pub(crate) progress_interval: Duration,
    /// The request timeout: the most any one read may take.
    pub(crate) timeout: Duration,
}

/// Opens a watch from `start` (the revision after the current one when `None`).
pub(crate) async fn open(source: Source, req: WatchRequest) -> Result<WatchStream> {
    let now = current_revision(&source.pool, Instant::now() + source.timeout).await?;
    let start = req.start_revision.filter(|r| *r > 0).unwrap_or(now.next());
    // A watch from the future is up to date from the start, as etcd's is; one from the past
    // catches up first.
    let synced = start > now;
    let (progress_tx, progress_rx) = mpsc::unbounded_channel::<()>();
    let batches = stream(source, req, start, synced, progress_rx);
    Ok(WatchStream::new(batches, move || {
        progress_tx.send(()).map_err(|_| Error::StreamClosed {
            stream: "watch",
            source: None,
        })
    }))
}

fn closed(e: impl Into<coord_api::BoxError>) -> Error {
    Error::StreamClosed {
        stream: "watch",
        source: Some(e.into()),
    }
}

fn stream(
    source: Source,
    req: WatchRequest,
    start: Revision,
    synced: bool,
    mut progress: mpsc::UnboundedReceiver<()>,
) -> impl futures::Stream<Item = Result<WatchResponse>> + Send + 'static {
    let Source {
        pool,
        mut known,
        progress_interval,
        timeout,
    } = source;
    let req = Arc::new(req);
    async_stream::stream! {
        let mut next = start;
        // Whether a read has brought the watch up to date once: from then on it is owed every
        // event, as etcd's synced watchers are, even past a compaction (see `read_once`).
        let mut synced = synced;
        let mut answer_progress = false;
        // When an idle watch that asked for them gets its next progress notification: a
        // deadline, not a sleep started on each wake, which writes elsewhere in the store
        // would keep putting off.
        let mut notify_at = tokio::time::Instant::now() + progress_interval;
        loop {
            let upto = Revision(*known.borrow_and_update());
            if upto >= next || answer_progress {
                let upto = if answer_progress {
                    match current_revision(&pool, Instant::now() + timeout).await {
                        Ok(r) => r,
                        Err(e) => { yield Err(closed(e)); return; }
                    }
                } else {
                    upto
                };
                if upto >= next {
                    match read(&pool, timeout, &req, next, upto, synced).await {
                        Ok(Ok(events)) => {
                            next = upto.next();
                            synced = true;
                            if !events.is_empty() {
                                notify_at = tokio::time::Instant::now() + progress_interval;
                                yield Ok(WatchResponse::new(upto, events));
                            }
                        }
                        Ok(Err(compacted)) => { yield Err(compacted); return; }
                        Err(e) => { yield Err(e); return; }
                    }
                }
                if answer_progress {
                    answer_progress = false;
                    yield Ok(WatchResponse::progress_answer(upto));
                }
                continue;
            }
            tokio::select! {
                changed = known.changed() => {
                    if changed.is_err() {
                        yield Err(closed("the store was dropped"));
                        return;
                    }
                }
                asked = progress.recv() => {
                    if asked.is_none() {
                        return;
                    }
                    answer_progress = true;
                }
                _ = tokio::time::sleep_until(notify_at), if req.progress_notify => {
                    // Idle for the interval: everything up to `next - 1` has been delivered.
                    notify_at = tokio::time::Instant::now() + progress_interval;
                    yield Ok(WatchResponse::new(next.prev(), Vec::new()));
                }
            }
        }
    }
}

/// How many connections a watch's read tries before the stream ends: a pooled connection the
/// server killed fails once and is replaced; a server that is down fails them all.
const READ_TRIES: usize = 3;

/// [`read_once`], on a fresh connection after a failed one.
async fn read(
    pool: &Pool,
    timeout: Duration,
    req: &WatchRequest,
    from: Revision,
    upto: Revision,
    synced: bool,
) -> Result<Result<Vec<Event>>> {
    let mut tries = 0;
    loop {
        tries += 1;
        match read_once(pool, Instant::now() + timeout, req, from, upto, synced).await {
            Err(e) if tries < READ_TRIES => {
                tracing::debug!(error = %e, "coord-postgres: a watch's read failed; trying again");
            }
            answer => return answer,
        }
    }
}

/// The events of revisions `from..=upto` under the watch's range, in order.
///
/// The inner error is `Compacted` when `from` is below the compaction point, for a watch
/// that has not read yet (a watch from the past is all or nothing, as etcd's); a synced watch
/// reads on while the rows are there, which compaction keeps for a minute (`compact.rs`): only
/// one that fell that far behind is compacted, as a slow etcd watcher is.
/// A watch catching up loses a previous value the compaction made unreadable, as etcd's
/// catch-up reads do; a synced watch keeps it, as etcd sent it to such a watch when the
/// write was made.
async fn read_once(
    pool: &Pool,
    deadline: Instant,
    req: &WatchRequest,
    from: Revision,
    upto: Revision,
    synced: bool,
) -> Result<Result<Vec<Event>>> {
    let (lo, hi) = bounds(&req.range);
    let sql = format!(
        "SELECT m.compact_revision, h.revision, h.deleted, h.key, h.value, h.create_revision, \
         h.revision, h.version, h.lease, p.key, p.value, p.create_revision, p.revision, \
         p.version, p.lease, p.deleted, m.purged_revision \
         FROM coord_meta m LEFT JOIN LATERAL (SELECT * FROM coord_history \
         WHERE revision >= $3 AND revision <= $4 AND {}) h ON true \
         LEFT JOIN LATERAL (SELECT * FROM coord_history p WHERE $5 AND p.key = h.key \
         AND p.revision < h.revision ORDER BY p.revision DESC, p.seq DESC LIMIT 1) p \
         ON $6 OR p.revision >= m.compact_revision \
         OR NOT (p.deleted OR EXISTS \
         (SELECT 1 FROM coord_history n WHERE n.key = p.key AND n.revision > p.revision \
         AND n.revision <= m.compact_revision)) \
         WHERE m.id = 1 ORDER BY h.revision, h.seq",
        condition("key", 1, 2)
    );
    let (prev_kv, from_rev, upto_rev) = (req.prev_kv, from.get(), upto.get());
    // A loan like any request's: bounded, and a connection that failed is closed, so the
    // next try gets one that works.
    let rows = crate::conn::single(pool, deadline, "watch", Stage::Before, move |c| {
        Box::pin(async move {
            let params: [(&(dyn tokio_postgres::types::ToSql + Sync), Type); 6] = [
                (&lo, Type::BYTEA),
                (&hi, Type::BYTEA),
                (&from_rev, Type::INT8),
                (&upto_rev, Type::INT8),
                (&prev_kv, Type::BOOL),
                (&synced, Type::BOOL),
            ];
            c.query_typed(&sql, &params)
                .await
                .map_err(crate::kv::before("watch"))
        })
    })
    .await
    .map_err(closed)?;
    let compact = Revision(rows.first().map_or(0, |r| r.get(0)));
    let purged = Revision(rows.first().map_or(0, |r| r.get(16)));
    if from < if synced { purged } else { compact } {
        return Ok(Err(Error::Compacted {
            requested: from,
            compact_revision: compact,
        }));
    }
    let mut events = Vec::with_capacity(rows.len());
    for row in &rows {
        let Some(revision) = row.get::<_, Option<i64>>(1) else {
            continue;
        };
        let deleted: bool = row.get(2);
        let kv = if deleted {
            KeyValue {
                key: Bytes::from(row.get::<_, Vec<u8>>(3)),
                value: Bytes::new(),
                create_revision: Revision::ZERO,
                mod_revision: Revision(revision),
                version: 0,
                lease: LeaseId::NONE,
            }
        } else {
            kv_at(row, 3).expect("a history row has a key")
        };
        let prev_kv = match row.get::<_, Option<bool>>(15) {
            Some(false) => kv_at(row, 9),
            _ => None,
        };
        events.push(Event {
            kind: if deleted {
                EventKind::Delete
            } else {
                EventKind::Put
            },
            kv,
            prev_kv,
        });
    }
    Ok(Ok(events))
}
