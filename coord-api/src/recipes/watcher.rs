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
use crate::request::{GetRequest, WatchRequest};
use crate::retry::{self, Backoff};
use crate::store::{DynKvLeaseStore, KvLeaseStoreExt};
use crate::sync::watch;
use crate::types::EventKind;
use crate::types::Revision;

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

/// The membership as the watcher knows it: the hosts and their metadata, current at a
/// revision.
///
/// A view is a snapshot: it never changes once published. Views share their structure, so
/// taking one is cheap whatever the cluster's size, and [`changes_since`](Self::changes_since)
/// finds what changed between two views of one watcher without walking what did not.
#[derive(Clone, Default)]
pub struct ClusterView {
    revision: Revision,
    /// Shared names: a change copies the map's node it lands in, and each of that node's
    /// names is then a count bumped, not a string allocated.
    hosts: OrdMap<Arc<str>, Bytes>,
    /// Which watcher published it, and when.
    published: Published,
    /// How the watcher came to this view from the one it published before, when it knows.
    step: Option<Arc<Step>>,
}

/// A watcher's publication: the watcher (numbered from 1 in the process) and the view's place
/// in what it published. The default is no watcher's: views built otherwise.
///
/// A view names the one before it by this, not by holding its hosts map: a map kept that way
/// lived until the next view was dropped too, and its nodes were freed two views later, long
/// after the change that copied them (their entries cold again by then).
#[derive(Clone, Copy, Default, PartialEq, Eq)]
struct Published {
    watcher: u64,
    seq: u64,
}

/// Numbers the watchers of this process, for [`Published`].
static WATCHERS: AtomicU64 = AtomicU64::new(1);

/// The view a watcher published before, and what differs since: what
/// [`ClusterView::changes_since`] needs to answer for that view without walking both maps or
/// looking a host up in either.
struct Step {
    from: Published,
    /// The hosts whose metadata differs from `from`'s, in host order, each once, with their
    /// metadata now (`None`: gone).
    changed: Vec<(String, Option<Bytes>)>,
}

/// A write the watcher applied since it last published: the host, and its metadata before
/// and after (`None`: not up).
struct Written {
    host: String,
    before: Option<Bytes>,
    after: Option<Bytes>,
}

impl PartialEq for ClusterView {
    fn eq(&self, other: &Self) -> bool {
        // How a view was reached is not part of it.
        self.revision == other.revision && self.hosts == other.hosts
    }
}

impl Eq for ClusterView {}

impl std::fmt::Debug for ClusterView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterView")
            .field("revision", &self.revision)
            .field("hosts", &self.hosts)
            .finish()
    }
}

/// A host that differs between two views: see [`ClusterView::changes_since`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostChange<'a> {
    /// The host.
    pub host: &'a str,
    /// Its metadata in the later view; `None` when it is gone from it.
    pub metadata: Option<&'a Bytes>,
}

impl ClusterView {
    /// The revision the view is current at.
    pub fn revision(&self) -> Revision {
        self.revision
    }

    /// The metadata of `host`, if it is up.
    pub fn get(&self, host: &str) -> Option<&Bytes> {
        self.hosts.get(host)
    }

    /// Whether `host` is up.
    pub fn contains(&self, host: &str) -> bool {
        self.hosts.contains_key(host)
    }

    /// How many hosts are up.
    pub fn len(&self) -> usize {
        self.hosts.len()
    }

    /// Whether no host is up.
    pub fn is_empty(&self) -> bool {
        self.hosts.is_empty()
    }

    /// The hosts and their metadata, in host order.
    pub fn hosts(&self) -> impl Iterator<Item = (&str, &Bytes)> + '_ {
        self.hosts.iter().map(|(h, m)| (&**h, m))
    }

    /// The hosts and their metadata, as a map of their own.
    pub fn to_map(&self) -> BTreeMap<String, Bytes> {
        self.hosts
            .iter()
            .map(|(h, m)| (h.to_string(), m.clone()))
            .collect()
    }

    /// Whether this view, read by a consumer on receiving `event`, already explains it: the
    /// view is not older than the event, and at the event's own revision it holds the event's
    /// change (a newer view may have moved on: the host back, or gone again). The watcher
    /// promises this of every event it emits.
    pub fn explains(&self, event: &ClusterEvent) -> bool {
        let (revision, holds) = match event {
            ClusterEvent::HostUp {
                host,
                metadata,
                revision,
            }
            | ClusterEvent::HostUpdated {
                host,
                metadata,
                revision,
            } => (*revision, self.get(host) == Some(metadata)),
            ClusterEvent::HostDown { host, revision, .. } => (*revision, !self.contains(host)),
            ClusterEvent::Resynced { revision } => (*revision, true),
        };
        self.revision > revision || (self.revision == revision && holds)
    }

    /// The hosts that differ from `earlier`: up in this view and not in `earlier`, gone from
    /// it, or with other metadata. In host order. Cheap between views of one watcher (they
    /// share what did not change), cheapest between a view and the one the watcher published
    /// just before it (the cost of the hosts written in between); any two views work.
    pub fn changes_since<'a>(
        &'a self,
        earlier: &'a ClusterView,
    ) -> impl Iterator<Item = HostChange<'a>> + 'a {
        match self.step.as_deref() {
            // `earlier` is the view the watcher published just before this one: the hosts it
            // wrote since are all that can differ (a walk of both maps still visits every
            // node on the edge of what they share, for each change).
            // (A step names a watcher's publication, never the default of views built
            // otherwise.)
            Some(step) if step.from == earlier.published => {
                let stepped = step.changed.iter().map(|(host, metadata)| HostChange {
                    host,
                    metadata: metadata.as_ref(),
                });
                debug_assert!(
                    stepped.clone().eq(Self::walk(&earlier.hosts, &self.hosts)),
                    "the watcher's step agrees with the walk"
                );
                Changes::Stepped(stepped)
            }
            _ => Changes::Walked(Self::walk(&earlier.hosts, &self.hosts)),
        }
    }

    fn walk<'a>(
        earlier: &'a OrdMap<Arc<str>, Bytes>,
        later: &'a OrdMap<Arc<str>, Bytes>,
    ) -> impl Iterator<Item = HostChange<'a>> + 'a {
        earlier.diff(later).map(|d| match d {
            DiffItem::Add(h, m) | DiffItem::Update { new: (h, m), .. } => HostChange {
                host: h,
                metadata: Some(m),
            },
            DiffItem::Remove(h, _) => HostChange {
                host: h,
                metadata: None,
            },
        })
    }
}

/// [`ClusterView::changes_since`]'s answer, from the watcher's step or from a walk.
enum Changes<S, W> {
    Stepped(S),
    Walked(W),
}

impl<'a, S, W> Iterator for Changes<S, W>
where
    S: Iterator<Item = HostChange<'a>>,
    W: Iterator<Item = HostChange<'a>>,
{
    type Item = HostChange<'a>;

    fn next(&mut self) -> Option<HostChange<'a>> {
        match self {
            Changes::Stepped(s) => s.next(),
            Changes::Walked(w) => w.next(),
        }
    }
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
            backoff: retry::store_backoff(seed),
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
        let task = Task::spawn_abortable(span, w.run());
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

struct Worker {
    store: Arc<DynKvLeaseStore>,
    config: ClusterWatcherConfig,
    view: ClusterView,
    view_tx: watch::Sender<Arc<ClusterView>>,
    /// This watcher's number and how many views it published, for [`Published`].
    watcher: u64,
    seq: u64,
    /// The view last published, and the writes applied since (`None` once the map was
    /// replaced whole): each published view's [`Step`].
    published: Option<Published>,
    written: Option<Vec<Written>>,
    tx: mpsc::Sender<ClusterEvent>,
    /// The events the view holds on their way to the channel.
    outbox: Outbox,
    /// Between attempts to reach the store (re-open, re-list).
    backoff: Backoff,
    gauges: crate::metrics::record::WatcherGauges,
}

/// The events a watcher's view holds on their way to its channel, shared with the handle so
/// that a stop hands back what the task had not moved yet.
#[derive(Debug, Clone, Default)]
struct Outbox(Arc<std::sync::Mutex<std::collections::VecDeque<ClusterEvent>>>);

impl Outbox {
    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::VecDeque<ClusterEvent>> {
        // Nothing panics while holding it; a poisoned queue is still a queue.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn push(&self, events: impl IntoIterator<Item = ClusterEvent>) {
        self.lock().extend(events);
    }

    fn pop(&self) -> Option<ClusterEvent> {
        self.lock().pop_front()
    }

    fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    fn take(&self) -> std::collections::VecDeque<ClusterEvent> {
        std::mem::take(&mut *self.lock())
    }

    /// Moves what fits into the channel without waiting.
    fn move_ready(&self, tx: &mpsc::Sender<ClusterEvent>) {
        let mut q = self.lock();
        while !q.is_empty() {
            let Ok(permit) = tx.try_reserve() else { break };
            if let Some(e) = q.pop_front() {
                permit.send(e);
            }
        }
    }
}

/// The most watch batches taken together for one snapshot of the view.
const MAX_COALESCED: usize = 256;

/// A listing: revision and hosts.
type Listing = (Revision, OrdMap<Arc<str>, Bytes>);

/// Why a watch stopped being followed.
enum Broken {
    /// The store compacted past the watch; the compaction point.
    Compacted(Revision),
    /// A progress request went unanswered: no message at all for this long.
    Stuck { silent: Duration, delivered: bool },
    /// The stream closed or failed, or could not be opened; `delivered` when it worked (gave
    /// something) before it broke.
    Closed { delivered: bool, why: String },
}

impl std::fmt::Display for Broken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Broken::Compacted(point) => write!(f, "compacted at {point}"),
            Broken::Stuck { silent, .. } => {
                write!(f, "no answer to a progress request; silent for {silent:?}")
            }
            Broken::Closed { why, .. } => f.write_str(why),
        }
    }
}

impl Worker {
    fn host(&self, key: &[u8]) -> String {
        String::from_utf8_lossy(&key[self.config.prefix.len().min(key.len())..]).into_owned()
    }

    async fn list(&self) -> Result<Listing> {
        let r = self
            .store
            .get(GetRequest::prefix(self.config.prefix.clone()))
            .await?;
        let hosts = r
            .kvs
            .iter()
            .map(|kv| (Arc::from(self.host(&kv.key)), kv.value.clone()))
            .collect();
        Ok((r.revision, hosts))
    }

    /// Hands `events` to the consumer, in order. They enter the outbox first, all at once,
    /// and leave it one at a time as the channel has room: a stop that falls in between
    /// (the task is dropped where it waits) finds the rest there, not lost.
    async fn emit(&self, events: impl IntoIterator<Item = ClusterEvent>) {
        self.outbox.push(events);
        self.flush().await;
    }

    /// Moves the outbox into the channel, waiting for room.
    async fn flush(&self) {
        while !self.outbox.is_empty() {
            crate::hooks::explore::point().await;
            // With room in the buffer (nearly always) the slot is there at once.
            let permit = match self.tx.try_reserve() {
                Ok(p) => p,
                Err(mpsc::error::TrySendError::Full(())) => match self.tx.reserve().await {
                    Ok(p) => p,
                    // A consumer that went away is not an error; the task ends when stopped.
                    Err(_) => return,
                },
                Err(mpsc::error::TrySendError::Closed(())) => return,
            };
            // No wait between taking the event and sending it: a stop never falls between.
            if let Some(e) = self.outbox.pop() {
                permit.send(e);
            }
        }
    }

    fn publish(&mut self) {
        self.gauges.hosts(self.view.hosts.len());
        let mut view = self.view.clone();
        self.seq += 1;
        view.published = Published {
            watcher: self.watcher,
            seq: self.seq,
        };
        if let (Some(from), Some(written)) = (self.published.take(), self.written.as_mut()) {
            // A stable sort keeps each host's writes in order: its first saw what `from`
            // holds, its last left what the view holds.
            written.sort_by(|a, b| a.host.cmp(&b.host));
            let mut changed = Vec::with_capacity(written.len());
            // Drained, not consumed: the next writes go into the same buffer.
            let mut writes = written.drain(..).peekable();
            while let Some(first) = writes.next() {
                let mut after = first.after;
                while let Some(next) = writes.next_if(|w| w.host == first.host) {
                    after = next.after;
                }
                if first.before != after {
                    changed.push((first.host, after));
                }
            }
            view.step = Some(Arc::new(Step { from, changed }));
        }
        self.published = Some(view.published);
        self.written.get_or_insert_with(Vec::new);
        self.view_tx.send_replace(Arc::new(view));
    }

    /// Adopts a listing, then emits the difference between the old view and it.
    async fn apply_listing(&mut self, (revision, hosts): Listing) {
        let old = std::mem::replace(
            &mut self.view,
            ClusterView {
                revision,
                hosts,
                published: Published::default(),
                step: None,
            },
        );
        self.written = None;
        let new = &self.view.hosts;
        let mut out = Vec::new();
        for (host, md) in &old.hosts {
            if !new.contains_key(host) {
                out.push(ClusterEvent::HostDown {
                    host: host.to_string(),
                    last_metadata: md.clone(),
                    revision,
                });
            }
        }
        for (host, md) in new {
            match old.hosts.get(host) {
                None => out.push(ClusterEvent::HostUp {
                    host: host.to_string(),
                    metadata: md.clone(),
                    revision,
                }),
                Some(prev) if prev != md => out.push(ClusterEvent::HostUpdated {
                    host: host.to_string(),
                    metadata: md.clone(),
                    revision,
                }),
                Some(_) => {}
            }
        }
        out.push(ClusterEvent::Resynced { revision });
        // The view first, then the events it explains: a consumer that reads an event and
        // then the view finds the event in it (the emits below may wait for the consumer).
        self.publish();
        self.emit(out).await;
    }

    /// Follows the prefix until stopped. Stopped by being dropped where it waits
    /// ([`Task::spawn_abortable`]): it holds nothing a stop must let go of, and a stop while
    /// it waits for the consumer to make room ends it at once.
    async fn run(mut self) {
        self.flush().await;
        // Every watch starts at the last revision seen, the listing's or an event's, never
        // the one after it (see the module docs).
        let mut from = self.view.revision.max(Revision(1));
        loop {
            let outcome = self.follow(from).await;
            if self.planted_skip_relist(&outcome).await {
                from = self.view.revision.next();
                continue;
            }
            let resume = match &outcome {
                Broken::Closed { delivered, .. } => Some((*delivered, "closed")),
                Broken::Stuck { delivered, .. } => Some((*delivered, "stuck")),
                Broken::Compacted(_) => None,
            };
            match resume {
                Some((delivered, reason)) => {
                    if reason == "stuck" {
                        tracing::warn!(why = %outcome, revision = %self.view.revision, "watch stuck; resuming on a new stream");
                    } else {
                        tracing::debug!(why = %outcome, revision = %self.view.revision, "watch broken; resuming");
                    }
                    crate::metrics::record::watcher_resumed(&self.config.prefix, reason);
                    from = self.view.revision.max(Revision(1));
                    if delivered {
                        // It worked until now: resume at once.
                        self.backoff.reset();
                        continue;
                    }
                    // The store is unreachable, or breaks every stream at once: back off.
                    self.backoff.wait().await;
                    continue;
                }
                None => crate::metrics::record::watcher_relisted(&self.config.prefix, "compacted"),
            }
            tracing::warn!(reason = %outcome, revision = %self.view.revision, "watch broken; re-listing");
            // Re-list until it works and is not behind what we have seen.
            loop {
                let listed = self.list().await;
                match listed {
                    Ok(l) if l.0 >= self.view.revision => {
                        self.apply_listing(l).await;
                        from = self.view.revision.max(Revision(1));
                        self.backoff.reset();
                        tracing::info!(
                            revision = %self.view.revision,
                            hosts = self.view.hosts.len(),
                            "watcher resynced"
                        );
                        break;
                    }
                    Ok(l) => tracing::warn!(
                        listed = %l.0,
                        seen = %self.view.revision,
                        "listing older than the view (stale member?); rejected"
                    ),
                    Err(e) => {
                        tracing::debug!(error = &e as &dyn std::error::Error, "re-list failed")
                    }
                }
                self.backoff.wait().await;
            }
        }
    }

    /// The planted watcher bugs: resume without re-listing. True when one applied.
    async fn planted_skip_relist(&mut self, outcome: &Broken) -> bool {
        use crate::hooks::planted::{enabled, Bug};
        match outcome {
            Broken::Compacted(point) if enabled(Bug::WatcherIgnoresCompaction) => {
                self.view.revision = point.prev();
                true
            }
            Broken::Closed {
                delivered: true, ..
            }
            | Broken::Stuck {
                delivered: true, ..
            } if enabled(Bug::WatcherResumesFromNow) => match self.store.current_revision().await {
                Ok(now) => {
                    self.view.revision = now;
                    true
                }
                Err(_) => false,
            },
            _ => false,
        }
    }

    /// Applies the watch from `from` until it breaks; says why. Events the view already has
    /// (a resume starts at the last revision seen) are dropped.
    async fn follow(&mut self, from: Revision) -> Broken {
        let req = WatchRequest::prefix(self.config.prefix.clone())
            .with_start_revision(from)
            .with_progress_notify();
        let mut stream = match self.store.watch(req).await {
            Ok(s) => s,
            Err(Error::Compacted {
                compact_revision, ..
            }) => return Broken::Compacted(compact_revision),
            Err(e) => {
                return Broken::Closed {
                    delivered: false,
                    why: format!("could not open the watch: {e}"),
                }
            }
        };
        let mut delivered = false;
        // Whether a progress request is out since the last message.
        let mut asked = false;
        // One timer for the silences, moved on at each message (a fresh timeout per message
        // put a timer into the runtime's wheel and took it out again, for every change of
        // every host, at every watcher), and buffers kept from message to message.
        let silence = tokio::time::sleep(self.config.probe);
        tokio::pin!(silence);
        let mut items = Vec::new();
        let mut out = Vec::new();
        loop {
            let wait = if asked {
                self.config.silence.saturating_sub(self.config.probe)
            } else {
                self.config.probe
            };
            silence.as_mut().reset(crate::hooks::clock::now() + wait);
            let first = tokio::select! {
                biased;
                item = stream.next() => item,
                () = silence.as_mut() => {
                    if asked {
                        return Broken::Stuck {
                            silent: self.config.silence,
                            delivered,
                        };
                    }
                    if let Err(e) = stream.request_progress() {
                        return Broken::Closed {
                            delivered,
                            why: format!("could not ask for progress: {e}"),
                        };
                    }
                    asked = true;
                    continue;
                }
            };
            // Any message says the stream is alive, the answer or not.
            asked = false;
            // Whatever else has already arrived goes with it, so that a burst costs one
            // snapshot of the view (a copy of every host) rather than one per event.
            items.push(first);
            while items.len() < MAX_COALESCED {
                match stream.next().now_or_never() {
                    Some(item) => items.push(item),
                    None => break,
                }
            }
            let mut broken = None;
            let closed = |why: String, delivered| Broken::Closed { delivered, why };
            for item in items.drain(..) {
                if broken.is_some() {
                    // Taken from the stream already; nothing after a break is applied.
                    continue;
                }
                match item {
                    Some(Ok(batch)) => {
                        delivered = true;
                        self.apply(batch, &mut out);
                    }
                    None => broken = Some(closed("the stream ended".into(), delivered)),
                    Some(Err(Error::Compacted {
                        compact_revision, ..
                    })) => broken = Some(Broken::Compacted(compact_revision)),
                    Some(Err(e)) => broken = Some(closed(e.to_string(), delivered)),
                }
            }
            // The view first, then the events it explains: a consumer that reads an event
            // and then the view finds the event in it.
            if crate::hooks::planted::enabled(crate::hooks::planted::Bug::WatcherEmitsBeforePublish)
            {
                self.emit(out.drain(..)).await;
            }
            self.publish();
            self.emit(out.drain(..)).await;
            if let Some(b) = broken {
                return b;
            }
        }
    }

    /// Applies one watch batch to the view, collecting the events to emit.
    fn apply(&mut self, batch: crate::WatchResponse, out: &mut Vec<ClusterEvent>) {
        let planted = crate::hooks::planted::enabled(
            crate::hooks::planted::Bug::WatcherTrustsProgressAnswers,
        );
        if batch.is_progress_answer() && !planted {
            // Proof of life only: etcd 3.4 sends it ahead of events still queued for the
            // watch, so its revision is no delivery bound.
            return;
        }
        let newest = batch
            .events
            .last()
            .map_or(batch.revision, |e| e.kv.mod_revision);
        self.gauges.lag(batch.revision.0 - newest.0);
        for event in batch.events {
            let rev = event.kv.mod_revision;
            if rev <= self.view.revision {
                // What a resume replays by design (the last revision seen), or a watch going
                // back in time (etcd#15271): either way, never applied twice.
                tracing::trace!(
                    revision = %rev,
                    view = %self.view.revision,
                    "event not newer than the view; dropped"
                );
                continue;
            }
            let host = self.host(&event.kv.key);
            self.view.revision = rev;
            match event.kind {
                EventKind::Put => {
                    // A host already up keeps its shared name: only its metadata changes.
                    let prev = match self.view.hosts.get_mut(host.as_str()) {
                        Some(md) => Some(std::mem::replace(md, event.kv.value.clone())),
                        None => self
                            .view
                            .hosts
                            .insert(Arc::from(host.as_str()), event.kv.value.clone()),
                    };
                    if let Some(written) = &mut self.written {
                        written.push(Written {
                            host: host.clone(),
                            before: prev.clone(),
                            after: Some(event.kv.value.clone()),
                        });
                    }
                    match prev {
                        None => out.push(ClusterEvent::HostUp {
                            host,
                            metadata: event.kv.value,
                            revision: rev,
                        }),
                        Some(p) if p != event.kv.value => out.push(ClusterEvent::HostUpdated {
                            host,
                            metadata: event.kv.value,
                            revision: rev,
                        }),
                        Some(_) => {}
                    }
                }
                EventKind::Delete => {
                    let gone = self.view.hosts.remove(host.as_str());
                    if let Some(written) = &mut self.written {
                        written.push(Written {
                            host: host.clone(),
                            before: gone.clone(),
                            after: None,
                        });
                    }
                    if let Some(last_metadata) = gone {
                        out.push(ClusterEvent::HostDown {
                            host,
                            last_metadata,
                            revision: rev,
                        });
                    }
                }
            }
        }
        // A progress notification (or a batch's header) says everything up to its revision
        // has been delivered.
        self.view.revision = self.view.revision.max(batch.revision);
    }
}
