//! Following one key from a revision: each change to it, in order, through broken streams.
//!
//! Every wait on a key in the recipes (a leader's own key, a candidate's predecessor, a
//! registration's key, an observed leader) goes through [`Follow`]: it watches from the
//! revision after the last one it has seen; when the stream breaks (a lost connection,
//! compaction, a member going away) it re-reads the key and reports what changed in the gap,
//! then watches again, backing off while the store does not answer. It never gives up: the
//! caller bounds the wait (by a session's end, a cancellation).
//!
//! A holder that believes something while the key stands (a leader, a registration) follows
//! it [`answered_within`](Follow::answered_within) a renewal period: a watch request lost on
//! a link that then recovered would otherwise wait out the backend's request timeout, and
//! the holder's session, renewing on the same link, would not end the belief meanwhile.

use std::collections::VecDeque;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;

use crate::error::Error;
use crate::request::{GetRequest, WatchRequest};
use crate::retry::{self, Backoff, Pace};
use crate::store::{DynKvLeaseStore, WatchStream};
use crate::types::{EventKind, KeyValue, Revision};

/// A change to the followed key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Change {
    /// The key was written (created, or overwritten).
    Put(KeyValue),
    /// The key was deleted, at this revision (or found gone by a re-read at it).
    Deleted(Revision),
}

/// Follows one key; see the module docs.
pub(crate) struct Follow {
    /// Between attempts to reach the store (watch, re-read); kept apart from what the
    /// attempts change, which [`retry::until_with`] lends them.
    backoff: Backoff,
    at: Following,
}

/// What a [`Follow`] knows of its key.
struct Following {
    store: Arc<DynKvLeaseStore>,
    key: Bytes,
    /// The first revision not yet seen.
    from: Revision,
    /// The key as last reported: its create and mod revisions, `None` while absent.
    last: Option<(Revision, Revision)>,
    stream: Option<WatchStream>,
    pending: VecDeque<Change>,
    /// How long a watch request or a read may go unanswered before it is sent again.
    answered_within: Option<Duration>,
}

impl Follow {
    /// Follows `key` from revision `from` on, knowing it as `known` (its create and mod
    /// revisions, `None` if absent) just before `from`.
    pub(crate) fn new(
        store: Arc<DynKvLeaseStore>,
        key: impl Into<Bytes>,
        from: Revision,
        known: Option<(Revision, Revision)>,
    ) -> Self {
        let key = key.into();
        Follow {
            backoff: retry::Backoff::store(retry::seed(&[&key])),
            at: Following {
                store,
                key,
                from,
                last: known,
                stream: None,
                pending: VecDeque::new(),
                answered_within: None,
            },
        }
    }

    /// Sends a watch request or a read again when it goes unanswered for `bound` (see the
    /// module docs), rather than wait out the backend's request timeout.
    pub(crate) fn answered_within(mut self, bound: Duration) -> Self {
        self.at.answered_within = Some(bound);
        self
    }

    /// The next change to the key.
    pub(crate) async fn next(&mut self) -> Change {
        let next = retry::until_with(
            &mut self.backoff,
            std::future::pending::<std::convert::Infallible>(),
            &mut self.at,
            |at, _| Box::pin(at.step()),
        );
        let Ok(change) = next.await;
        change
    }

    /// Waits until the key is no longer the incarnation `mine` accepts (deleted, or written by
    /// someone else); returns the revision at which that was seen.
    pub(crate) async fn until_gone(&mut self, mine: impl Fn(&KeyValue) -> bool) -> Revision {
        loop {
            match self.next().await {
                Change::Deleted(revision) => return revision,
                Change::Put(kv) if !mine(&kv) => return kv.mod_revision,
                Change::Put(_) => {}
            }
        }
    }
}

impl Following {
    /// One step: a change to report, or what it takes to find the next (a watch opened, a
    /// batch read, a gap re-read), and how soon to go on.
    async fn step(&mut self) -> ControlFlow<Change, Pace> {
        if let Some(c) = self.pending.pop_front() {
            crate::hooks::explore::point().await;
            return ControlFlow::Break(c);
        }
        let Some(stream) = self.stream.as_mut() else {
            let req = WatchRequest::key(self.key.to_vec()).with_start_revision(self.from);
            return match bounded(self.answered_within, "watch", self.store.watch(req)).await {
                Ok(s) => {
                    self.stream = Some(s);
                    // A watch from the past is caught up only on the store's next sync
                    // (etcd: 100 ms), so what happened before it opened is read now; the
                    // stream's replay of it is skipped below. The read also covers etcd
                    // 3.4's loss of the deletes at the compaction revision from a watch
                    // that starts there (etcd#19179): such a delete came before the watch
                    // opened, so the read sees the key gone.
                    ControlFlow::Continue(self.reread().await)
                }
                // Gone from history: only a re-read can say where the key stands.
                Err(Error::Compacted { .. }) => ControlFlow::Continue(self.reread().await),
                Err(e) => {
                    tracing::debug!(key = %String::from_utf8_lossy(&self.key), error = &e as &dyn std::error::Error, "could not watch a key; retrying");
                    ControlFlow::Continue(Pace::Backoff)
                }
            };
        };
        match stream.next().await {
            Some(Ok(batch)) => {
                let seen = self.from;
                let events = batch.events.into_iter();
                for e in events.filter(|e| e.kv.key == self.key && e.kv.mod_revision >= seen) {
                    match e.kind {
                        EventKind::Put => {
                            self.last = Some((e.kv.create_revision, e.kv.mod_revision));
                            self.pending.push_back(Change::Put(e.kv));
                        }
                        EventKind::Delete => {
                            self.last = None;
                            self.pending.push_back(Change::Deleted(e.kv.mod_revision));
                        }
                    }
                }
                self.from = self.from.max(batch.revision.next());
                ControlFlow::Continue(Pace::StartOver)
            }
            // Compacted, closed, ended: what happened in the gap is read, not watched.
            Some(Err(_)) | None => {
                self.stream = None;
                ControlFlow::Continue(self.reread().await)
            }
        }
    }

    /// Reads the key and queues how it differs from what was last reported; watches resume
    /// after the read's revision. A read that fails asks for the backoff.
    async fn reread(&mut self) -> Pace {
        let read = bounded(
            self.answered_within,
            "get",
            self.store.get(GetRequest::key(self.key.to_vec())),
        )
        .await;
        let r = match read {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(key = %String::from_utf8_lossy(&self.key), error = &e as &dyn std::error::Error, "could not read a key; retrying");
                return Pace::Backoff;
            }
        };
        let now = r.kvs.into_iter().next();
        let state = now.as_ref().map(|kv| (kv.create_revision, kv.mod_revision));
        match (self.last, now) {
            (None, None) => {}
            (Some(_), None) => self.pending.push_back(Change::Deleted(r.revision)),
            (before, Some(kv)) => {
                if before.is_some_and(|(created, _)| created != kv.create_revision) {
                    // Deleted and created again in the gap.
                    self.pending.push_back(Change::Deleted(kv.create_revision));
                }
                if before != state {
                    self.pending.push_back(Change::Put(kv));
                }
            }
        }
        self.last = state;
        self.from = self.from.max(r.revision.next());
        Pace::AtOnce
    }
}

/// `call`, given up on after `bound` (see [`Follow::answered_within`]).
async fn bounded<T>(
    bound: Option<Duration>,
    operation: &'static str,
    call: impl std::future::Future<Output = crate::error::Result<T>>,
) -> crate::error::Result<T> {
    let Some(bound) = bound else {
        return call.await;
    };
    match tokio::time::timeout(bound, call).await {
        Ok(r) => r,
        Err(_) => Err(Error::Unavailable {
            backend: "coord",
            operation,
            source: format!("no answer within {bound:?}").into(),
        }),
    }
}
