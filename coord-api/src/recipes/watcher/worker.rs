//! The watcher's task: it lists, watches from the listing's revision, applies each batch to
//! the view, resumes a broken watch and re-lists after a compaction.

use crate::retry::Pace;
use std::convert::Infallible;
use std::future::pending;
use std::ops::ControlFlow;

use super::*;

pub(super) struct Worker {
    pub(super) store: Arc<DynKvLeaseStore>,
    pub(super) config: ClusterWatcherConfig,
    pub(super) view: ClusterView,
    pub(super) view_tx: watch::Sender<Arc<ClusterView>>,
    /// This watcher's number and how many views it published, for [`Published`].
    pub(super) watcher: u64,
    pub(super) seq: u64,
    /// The view last published, and the writes applied since (`None` once the map was
    /// replaced whole): each published view's [`Step`].
    pub(super) published: Option<Published>,
    pub(super) written: Option<Vec<Written>>,
    pub(super) tx: mpsc::Sender<ClusterEvent>,
    /// The events the view holds on their way to the channel.
    pub(super) outbox: Outbox,
    /// Between attempts to reach the store (re-open, re-list).
    pub(super) gauges: crate::metrics::record::WatcherGauges,
}

/// The events a watcher's view holds on their way to its channel, shared with the handle so
/// that a stop hands back what the task had not moved yet.
#[derive(Debug, Clone, Default)]
pub(super) struct Outbox(Arc<std::sync::Mutex<std::collections::VecDeque<ClusterEvent>>>);

impl Outbox {
    pub(super) fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::VecDeque<ClusterEvent>> {
        // Nothing panics while holding it; a poisoned queue is still a queue.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn push(&self, events: impl IntoIterator<Item = ClusterEvent>) {
        self.lock().extend(events);
    }

    pub(super) fn pop(&self) -> Option<ClusterEvent> {
        self.lock().pop_front()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    pub(super) fn take(&self) -> std::collections::VecDeque<ClusterEvent> {
        std::mem::take(&mut *self.lock())
    }

    /// Moves what fits into the channel without waiting.
    pub(super) fn move_ready(&self, tx: &mpsc::Sender<ClusterEvent>) {
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
pub(super) const MAX_COALESCED: usize = 256;

/// A listing: revision and hosts.
pub(super) type Listing = (Revision, OrdMap<Arc<str>, Bytes>);

/// Why a watch stopped being followed.
pub(super) enum Broken {
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
    pub(super) fn host(&self, key: &[u8]) -> String {
        String::from_utf8_lossy(&key[self.config.prefix.len().min(key.len())..]).into_owned()
    }

    pub(super) async fn list(&self) -> Result<Listing> {
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
    pub(super) async fn emit(&self, events: impl IntoIterator<Item = ClusterEvent>) {
        self.outbox.push(events);
        self.flush().await;
    }

    /// Moves the outbox into the channel, waiting for room.
    pub(super) async fn flush(&self) {
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

    pub(super) fn publish(&mut self) {
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
    pub(super) async fn apply_listing(&mut self, (revision, hosts): Listing) {
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
    pub(super) async fn run(self, mut backoff: Backoff) {
        self.flush().await;
        // Every watch starts at the last revision seen, the listing's or an event's, never
        // the one after it (see the module docs).
        let from = self.view.revision.max(Revision(1));
        let mut state = (self, from);
        let Ok(never) = retry::until_with(
            &mut backoff,
            pending::<Infallible>(),
            &mut state,
            |(w, from), _| Box::pin(w.follow_once(from)),
        )
        .await;
        match never {}
    }

    /// One stream, followed until it breaks, and what it takes to go on: resume (at once if
    /// it delivered, else after the backoff), or re-list (and start over).
    async fn follow_once(&mut self, from: &mut Revision) -> ControlFlow<Infallible, Pace> {
        let outcome = self.follow(*from).await;
        if self.planted_skip_relist(&outcome).await {
            *from = self.view.revision.next();
            return ControlFlow::Continue(Pace::AtOnce);
        }
        let resume = match &outcome {
            Broken::Closed { delivered, .. } => Some((*delivered, "closed")),
            Broken::Stuck { delivered, .. } => Some((*delivered, "stuck")),
            Broken::Compacted(_) => None,
        };
        if let Some((delivered, reason)) = resume {
            if reason == "stuck" {
                tracing::warn!(why = %outcome, revision = %self.view.revision, "watch stuck; resuming on a new stream");
            } else {
                tracing::debug!(why = %outcome, revision = %self.view.revision, "watch broken; resuming");
            }
            crate::metrics::record::watcher_resumed(&self.config.prefix, reason);
            *from = self.view.revision.max(Revision(1));
            // It worked until now: resume at once. Otherwise the store is unreachable, or
            // breaks every stream at once: back off.
            return ControlFlow::Continue(if delivered {
                start_over()
            } else {
                Pace::Backoff
            });
        }
        crate::metrics::record::watcher_relisted(&self.config.prefix, "compacted");
        tracing::warn!(reason = %outcome, revision = %self.view.revision, "watch broken; re-listing");
        // Re-list until it works and is not behind what we have seen.
        let (this, seen) = (&*self, self.view.revision);
        let mut backoff = Backoff::store(retry::seed(&[this.config.prefix.as_bytes()]));
        let relisted = retry::until(&mut backoff, pending::<Infallible>(), |_| async move {
            match this.list().await {
                Ok(l) if l.0 >= seen => ControlFlow::Break(l),
                Ok(l) => {
                    tracing::warn!(
                        listed = %l.0,
                        %seen,
                        "listing older than the view (stale member?); rejected"
                    );
                    ControlFlow::Continue(Pace::Backoff)
                }
                Err(e) => {
                    tracing::debug!(error = &e as &dyn std::error::Error, "re-list failed");
                    ControlFlow::Continue(Pace::Backoff)
                }
            }
        });
        let Ok(listing) = relisted.await;
        self.apply_listing(listing).await;
        *from = self.view.revision.max(Revision(1));
        tracing::info!(
            revision = %self.view.revision,
            hosts = self.view.hosts.len(),
            "watcher resynced"
        );
        ControlFlow::Continue(start_over())
    }

    /// The planted watcher bugs: resume without re-listing. True when one applied.
    pub(super) async fn planted_skip_relist(&mut self, outcome: &Broken) -> bool {
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
    pub(super) async fn follow(&mut self, from: Revision) -> Broken {
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
    pub(super) fn apply(
        &mut self,
        batch: crate::request::WatchResponse,
        out: &mut Vec<ClusterEvent>,
    ) {
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

/// After a success (a stream that delivered, a re-list): start the backoff over.
fn start_over() -> Pace {
    if crate::hooks::planted::enabled(crate::hooks::planted::Bug::WatcherBackoffNeverResets) {
        Pace::AtOnce
    } else {
        Pace::StartOver
    }
}
