//! When a write stranded by a raft leader change is settled: applied already, or never to be.
//!
//! A write sent to a follower is forwarded to the raft leader; if that leader dies (or is
//! deposed) first, the proposal is lost with it, and etcd answers the write only at its own
//! request timeout (5 s plus two election timeouts), though the cluster elects another leader
//! within about two election timeouts and serves writes again (`docs/ETCD-BEHAVIOUR.md` 3.7).
//! Its outcome is unknown to the client, but it stops being *pending* early: once a leader of
//! a newer term has committed an entry of its own term, every proposal of an older term has
//! been committed or dropped for good (raft's leader completeness). A linearizable read on the
//! member, answered in the newer term, proves exactly that, and that the member has applied
//! everything committed before it: the write, if applied, has been answered.
//!
//! So each connection keeps what its member said of its raft term, by when: for each term,
//! the latest send of a request it answered in that term (every response carries the term in
//! its header). A write sent before a request answered in term T, on the same connection, was
//! proposed in term T or earlier (the member read it first). When the member later reports a
//! leader in a term above T and serves a linearizable read in it, every write sent before that
//! request is settled, and is answered [`Indeterminate`](coord_api::Error::Indeterminate) at
//! once rather than at the request timeout: the caller may write again (a new write, with its
//! own outcome), never told that the first one failed.
//!
//! The liveness task (`crate::liveness`) asks the status of a member that holds a request past
//! [`SETTLE_AFTER`], and does the read. What is left to chance: a server that runs a handler
//! for a later request before an earlier one on the same connection (Go schedules goroutines
//! freely), or a write whose frames a full HTTP/2 window holds back behind a later request's;
//! such a write could be proposed after the read and still land, as a write answered
//! `Indeterminate` at the request timeout can (a slow leader's disk) today.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

/// How long a request waits on a member before the liveness task asks for its raft term: a
/// write answered in milliseconds needs nothing, and one stranded by a leader's death is
/// noticed before the election ends (etcd's elections take one to two election timeouts).
/// Also when a request starts to listen for its settling (a write) or its connection's
/// replacement (a read): not before, as nearly every request is answered sooner, and
/// listening registers it under a lock that every request on the connection shares.
pub(crate) const SETTLE_AFTER: Duration = Duration::from_millis(50);

/// How many terms a connection remembers: an election moves the term on by one or two.
const TERMS_KEPT: usize = 8;

/// What one connection told of its member's raft term, and how far its writes are settled.
#[derive(Debug)]
pub(crate) struct Terms {
    /// For each term, the latest send of a request answered in it.
    answered: Mutex<BTreeMap<u64, Instant>>,
    /// Writes sent before this instant are settled.
    settled: watch::Sender<Option<Instant>>,
    /// Writes waiting on the connection, and since when there has been one all along (the
    /// pool's own wait tracks the connection's liveness: any later answer ends it, while a
    /// stranded write still waits).
    writes: AtomicUsize,
    writing_since: Mutex<Option<Instant>>,
}

impl Default for Terms {
    fn default() -> Self {
        Terms {
            answered: Mutex::default(),
            settled: watch::Sender::new(None),
            writes: AtomicUsize::new(0),
            writing_since: Mutex::default(),
        }
    }
}

/// A write waiting on a connection, counted until dropped.
pub(crate) struct Writing<'a>(&'a Terms);

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        if self.0.writes.fetch_sub(1, Ordering::AcqRel) == 1 {
            *self
                .0
                .writing_since
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = None;
        }
    }
}

impl Terms {
    /// A write sent at `sent` waits on the connection until the returned guard is dropped.
    pub(crate) fn writing(&self, sent: Instant) -> Writing<'_> {
        if self.writes.fetch_add(1, Ordering::AcqRel) == 0 {
            let mut since = self.writing_since.lock().unwrap_or_else(|p| p.into_inner());
            since.get_or_insert(sent);
        }
        Writing(self)
    }

    /// Since when writes have waited on the connection without a pause, if one waits.
    pub(crate) fn writing_since(&self) -> Option<Instant> {
        if self.writes.load(Ordering::Acquire) == 0 {
            return None;
        }
        *self.writing_since.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A request sent at `sent` was answered in `term`.
    pub(crate) fn observe(&self, sent: Instant, term: u64) {
        let mut answered = self.answered.lock().unwrap_or_else(|p| p.into_inner());
        let latest = answered.entry(term).or_insert(sent);
        *latest = (*latest).max(sent);
        while answered.len() > TERMS_KEPT {
            answered.pop_first();
        }
    }

    /// The latest send of a request answered in a term below `term`: what a leader of `term`
    /// settles, once it serves a read.
    pub(crate) fn settled_by(&self, term: u64) -> Option<Instant> {
        let answered = self.answered.lock().unwrap_or_else(|p| p.into_inner());
        answered.range(..term).map(|(_, at)| *at).max()
    }

    /// Writes sent before `before` are settled.
    pub(crate) fn settle(&self, before: Instant) {
        self.settled.send_if_modified(|s| match s {
            Some(at) if *at >= before => false,
            _ => {
                *s = Some(before);
                true
            }
        });
    }

    /// Resolves once a write sent at `sent` is settled.
    pub(crate) async fn settled(&self, sent: Instant) {
        let mut settled = self.settled.subscribe();
        let _ = settled.wait_for(|s| s.is_some_and(|at| at > sent)).await;
    }
}

/// A response's raft term, from its header: what [`Terms`] learns from every answer.
pub(crate) trait Headed {
    fn raft_term(&self) -> Option<u64>;
}

macro_rules! headed {
    ($($t:ty),*) => {$(
        impl Headed for $t {
            fn raft_term(&self) -> Option<u64> {
                self.header().map(|h| h.raft_term())
            }
        }
    )*};
}

headed!(
    etcd_client::GetResponse,
    etcd_client::PutResponse,
    etcd_client::DeleteResponse,
    etcd_client::TxnResponse,
    etcd_client::CompactionResponse,
    etcd_client::LeaseGrantResponse,
    etcd_client::LeaseRevokeResponse,
    etcd_client::LeaseTimeToLiveResponse
);

/// A watch's opening: its first message's header, if it has one.
impl<S, C> Headed for (S, Option<etcd_client::WatchResponse>, C) {
    fn raft_term(&self) -> Option<u64> {
        self.1
            .as_ref()
            .and_then(|r| r.header())
            .map(|h| h.raft_term())
    }
}

#[cfg(test)]
impl Headed for () {
    fn raft_term(&self) -> Option<u64> {
        None
    }
}

#[cfg(test)]
impl Headed for usize {
    fn raft_term(&self) -> Option<u64> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_newer_term_settles_what_was_sent_before_an_answer_in_an_older_one() {
        let terms = Terms::default();
        let t0 = Instant::now();
        terms.observe(t0, 5);
        let write = t0 + Duration::from_millis(10);
        // Nothing answered in term 5 after the write: a leader of term 6 settles nothing of it
        // (the member may have read it in term 6, and it may still land).
        assert_eq!(terms.settled_by(6), Some(t0));
        terms.observe(write + Duration::from_millis(60), 5);
        assert_eq!(terms.settled_by(5), None, "no term below 5");
        let by = terms.settled_by(6).unwrap();
        assert!(by > write);
        let settled = terms.settled(write);
        tokio::pin!(settled);
        assert!(futures::poll!(settled.as_mut()).is_pending());
        terms.settle(t0);
        assert!(
            futures::poll!(settled.as_mut()).is_pending(),
            "settled only before t0"
        );
        terms.settle(by);
        assert!(futures::poll!(settled.as_mut()).is_ready());
    }
}
