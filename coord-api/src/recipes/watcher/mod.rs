//! [`ClusterWatcher`]: who is up under a prefix, as a view and a stream of changes.
//!
//! The promise: the events, applied in order to an empty set, give exactly the view; every
//! net change reaches the consumer, none twice. It lists the prefix, emits `HostUp` for each
//! host, then watches from the listing's revision (never from 0, which means "now" to etcd
//! and loses the gap), dropping what the listing already holds.
//!
//! When the stream breaks (a lost connection, a leader change), it resumes the watch from the
//! last revision it has seen, and drops what it has already seen: a resume costs one watch
//! request, not a listing of every host. Starting at the last revision seen rather than the
//! one after it is deliberate: etcd 3.4 loses the deletes at the compaction revision from a
//! watch that starts exactly there (etcd#19179); from one revision earlier, such a
//! compaction is reported as `Compacted` instead.
//!
//! A quiet prefix and a stuck member look alike from the consumer's side: nothing arrives. So
//! after [`ClusterWatcherConfig::probe`] without a message the watcher asks the store for
//! progress on the stream ([`WatchStream::request_progress`](crate::WatchStream::request_progress)),
//! which a live member answers at once however quiet the prefix. A stream that leaves it
//! unanswered until [`ClusterWatcherConfig::silence`] is stuck (its member stopped, its
//! connection went silent): the watcher gives it up and resumes on a new one, which the
//! store opens on another member. An idle prefix costs a progress request per `probe`, never a
//! re-list.
//!
//! When the watch is compacted, it lists again and emits the difference between its last
//! view and the new listing: hosts that flapped inside the gap collapse, but no net change is
//! lost. go-coord's watcher, and etcd's own endpoint
//! resolver, simply end on compaction.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use imbl::ordmap::{DiffItem, OrdMap};
use tokio::sync::mpsc;

use super::task::Task;
use crate::error::{Error, Result};
use crate::ext::KvLeaseStoreExt;
use crate::request::{GetRequest, WatchRequest};
use crate::retry::{self, Backoff};
use crate::store::DynKvLeaseStore;
use crate::sync::watch;
use crate::types::EventKind;
use crate::types::Revision;

mod view;
mod worker;

pub use view::{ClusterView, HostChange};
use view::{Published, Step, Written, WATCHERS};
use worker::{Outbox, Worker};

/// What to watch.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClusterWatcherConfig {
    /// The prefix hosts register under; a host's name is its key without it.
    pub prefix: String,
    /// After this long without a message on the watch, the watcher asks the store for
    /// progress (default 1 s).
    pub probe: Duration,
    /// How long the watch may stay without any message (an event, a progress notification,
    /// the answer to the watcher's progress request) before the watcher calls it stuck and
    /// resumes on a new one (default 3 s). Longer than `probe`; a live member answers a
    /// progress request in milliseconds, so the rest is slack for a loaded member and network.
    pub silence: Duration,
    /// How many events may wait for the consumer before the watcher waits for it.
    pub buffer: usize,
}

impl ClusterWatcherConfig {
    /// Watch `prefix`, with the defaults above.
    pub fn new(prefix: impl Into<String>) -> Self {
        ClusterWatcherConfig {
            prefix: prefix.into(),
            probe: Duration::from_secs(1),
            silence: Duration::from_secs(3),
            buffer: 1024,
        }
    }

    /// Ask for progress after `probe` without a message, and give the stream up after
    /// `silence` without one.
    pub fn with_stall_detection(mut self, probe: Duration, silence: Duration) -> Self {
        self.probe = probe;
        self.silence = silence;
        self
    }
}

/// A change in membership.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClusterEvent {
    /// A host appeared (or was in the first listing).
    HostUp {
        /// The host's name (key without the prefix).
        host: String,
        /// Its metadata.
        metadata: Bytes,
        /// The revision this was learned at.
        revision: Revision,
    },
    /// A host's metadata changed.
    HostUpdated {
        /// The host's name.
        host: String,
        /// Its new metadata.
        metadata: Bytes,
        /// The revision of the change.
        revision: Revision,
    },
    /// A host went away.
    HostDown {
        /// The host's name.
        host: String,
        /// The last metadata seen for it.
        last_metadata: Bytes,
        /// The revision this was learned at.
        revision: Revision,
    },
    /// The watcher re-listed (after its watch was compacted) and emitted the difference just
    /// before this event.
    Resynced {
        /// The listing's revision.
        revision: Revision,
    },
}

/// Watches the hosts under a prefix. See the module docs.
///
/// # Drop
/// Dropping the watcher stops it; a consumer loop on [`next`](ClusterWatcher::next) or the
/// stream then ends.
///
/// ```no_run
/// # async fn run(store: std::sync::Arc<coord_api::DynKvLeaseStore>) -> coord_api::Result<()> {
/// use coord_api::recipes::{ClusterEvent, ClusterWatcher, ClusterWatcherConfig};
/// let mut watcher = ClusterWatcher::start(store, ClusterWatcherConfig::new("cluster/hosts/")).await?;
/// while let Some(event) = watcher.next().await {
///     if let ClusterEvent::HostDown { host, .. } = event {
///         println!("{host} is down");
///     }
/// }
/// # Ok(()) }
/// ```
#[must_use = "dropping the watcher stops it"]
#[derive(Debug)]
pub struct ClusterWatcher {
    view: watch::Receiver<Arc<ClusterView>>,
    events: mpsc::Receiver<ClusterEvent>,
    /// The events the view holds that are not in the channel yet: a stop hands them back.
    outbox: Outbox,
    task: Task,
}

impl ClusterWatcher {
    /// Lists the prefix and starts watching. The first listing's hosts are the first
    /// `HostUp` events.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty prefix, a zero `probe` or a `silence` not
    /// longer than `probe`; whatever the first listing fails with.
    pub async fn start(store: Arc<DynKvLeaseStore>, config: ClusterWatcherConfig) -> Result<Self> {
        if config.prefix.is_empty() {
            return Err(Error::invalid("cluster watcher: empty prefix"));
        }
        if config.probe.is_zero() || config.silence <= config.probe {
            return Err(Error::invalid(format!(
                "cluster watcher: probe {:?} must be above zero and silence {:?} above it",
                config.probe, config.silence
            )));
        }
        let (tx, events) = mpsc::channel(config.buffer.max(1));
        let (view_tx, view) = watch::channel(Arc::new(ClusterView::default()));
        let seed = retry::seed(&[config.prefix.as_bytes()]);
        let mut w = Worker {
            store,
            gauges: crate::metrics::record::WatcherGauges::register(&config.prefix),
            config,
            view: ClusterView::default(),
            view_tx,
            watcher: WATCHERS.fetch_add(1, Ordering::Relaxed),
            seq: 0,
            published: None,
            written: None,
            tx,
            outbox: Outbox::default(),
        };
        // The first listing becomes the view now, and its HostUp events are queued; those
        // that do not fit the buffer wait in the outbox for the task, which moves them once
        // the caller holds the receiver (waiting for room here would never end: nobody
        // reads yet).
        let (revision, hosts) = w.list().await?;
        w.view = ClusterView {
            revision,
            hosts,
            published: Published::default(),
            step: None,
        };
        w.publish();
        w.outbox.push(
            w.view
                .hosts
                .iter()
                .map(|(host, metadata)| ClusterEvent::HostUp {
                    host: host.to_string(),
                    metadata: metadata.clone(),
                    revision,
                }),
        );
        w.outbox.move_ready(&w.tx);
        let outbox = w.outbox.clone();
        let span = tracing::info_span!("cluster_watcher", prefix = %w.config.prefix);
        let backoff = if crate::hooks::planted::enabled(
            crate::hooks::planted::Bug::WatcherBackoffNeverResets,
        ) {
            retry::Backoff::new(Duration::from_millis(100), Duration::from_secs(30), seed)
        } else {
            retry::Backoff::store(seed)
        };
        let task = Task::spawn_abortable(span, w.run(backoff));
        Ok(ClusterWatcher {
            view,
            events,
            outbox,
            task,
        })
    }

    /// The current view.
    pub fn view(&self) -> Arc<ClusterView> {
        self.view.get()
    }

    /// Follows the view.
    pub fn subscribe_view(&self) -> watch::Receiver<Arc<ClusterView>> {
        self.view.clone()
    }

    /// The next change; `None` once the watcher stopped.
    pub async fn next(&mut self) -> Option<ClusterEvent> {
        self.events.recv().await
    }

    /// The changes as a stream, which ends when the watcher stops (the stream owns it).
    pub fn into_stream(self) -> BoxStream<'static, ClusterEvent> {
        futures::stream::unfold(self, |mut w| async move { w.next().await.map(|e| (e, w)) }).boxed()
    }

    /// Stops the watcher and returns the events it had not yet handed out, in order: with
    /// those handed out before, they give exactly the last view, however the stop fell
    /// (a re-list's difference stopped half-way comes back whole, with its `Resynced`).
    pub async fn stop(mut self) -> Vec<ClusterEvent> {
        self.task.stop().await;
        let mut queued = Vec::new();
        while let Ok(e) = self.events.try_recv() {
            queued.push(e);
        }
        // The task is gone: what it had not moved to the channel came after all of it.
        queued.extend(self.outbox.take());
        queued
    }
}
