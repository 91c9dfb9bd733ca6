//! The faults a test injects: per client (its link: partitions both ways or one way, held
//! messages, latency, lost replies) and store-wide (every stream closed, a leader change, a
//! crash and restart, a compaction storm). Each is a verb, and each that lasts has its undo.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::arrivals::{land, Arrival};
use crate::clock::background;
use crate::journal::Origin;
use crate::store::SimStore;
use coord_api::LeaseId;

impl SimStore {
    /// Fault: the next `count` writes of this client (put, delete, txn, grant, revoke,
    /// compact) are applied, but their replies are lost: each returns `Indeterminate`, as a
    /// request that timed out after reaching etcd does.
    pub fn lose_replies(&self, count: u32) {
        self.link.set_lost_replies(count);
    }

    /// Fault: an etcd leader change. Every keep-alive channel and watch stream ends (as
    /// [`close_streams`](Self::close_streams)), and every lease is refreshed to its full TTL
    /// plus `election_timeout` from now, as etcd's new leader does (so a crashed client's
    /// lease outlives its TTL: etcd#9395).
    pub fn leader_change(&self, election_timeout: Duration) {
        self.close_streams();
        self.shared.apply(Origin::Store, |s, now| {
            s.expire(now);
            s.promote(now, election_timeout);
        });
        self.shared.deadlines_changed.notify_one();
    }

    /// A new raft leader's lease refresh, alone: every lease lives its full TTL plus `extend`
    /// from now (etcd's lessor promotion), and no stream closes. A member-level leader change
    /// (`SimCluster`, with the `turmoil` feature) uses it; [`leader_change`](Self::leader_change)
    /// is the store-wide fault, which also closes every stream.
    pub fn promote(&self, extend: Duration) {
        self.shared.apply(Origin::Store, |s, now| {
            s.expire(now);
            s.promote(now, extend);
        });
        self.shared.deadlines_changed.notify_one();
    }

    /// What a raft leader's lessor knows when it stops: every lease's deadline now. A leader
    /// paused and replaced keeps this view while its peers renew the leases; see
    /// [`revoke_as_stale_leader`](Self::revoke_as_stale_leader).
    pub fn lessor_snapshot(&self) -> LessorSnapshot {
        let deadlines = self.shared.apply(Origin::Store, |s, now| {
            s.expire(now);
            s.lease_deadlines()
        });
        LessorSnapshot { deadlines }
    }

    /// Fault: etcd#15247. A raft leader paused past some leases' TTL, replaced meanwhile,
    /// revokes on resuming every lease it saw overdue, whatever the new leader renewed: each
    /// lease of `snapshot` whose deadline there has passed and that still exists ends (keys
    /// deleted, origin [`Origin::StaleLeader`]). Returns the leases it ended.
    pub fn revoke_as_stale_leader(&self, snapshot: &LessorSnapshot) -> Vec<LeaseId> {
        let revoked = self.shared.apply(Origin::StaleLeader, |s, now| {
            s.expire(now);
            snapshot
                .deadlines
                .iter()
                .filter(|(_, deadline)| *deadline <= now)
                .filter_map(|(id, _)| s.revoke(now, *id).ok().map(|_| *id))
                .collect::<Vec<_>>()
        });
        self.shared.deadlines_changed.notify_one();
        revoked
    }

    /// Makes the store count time as turmoil's simulated time since the start, on the clock
    /// of the host calling it, so that several turmoil hosts can serve it (each host's
    /// runtime counts `Instant`s from a base of its own). Call it on the host whose runtime
    /// runs the store's clock (the one that created it), before another host serves it.
    #[cfg(feature = "grpc")]
    pub fn count_in_simulated_time(&self) {
        let elapsed = turmoil::sim_elapsed().unwrap_or_default();
        *self.shared.origin.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(Instant::now() - elapsed);
        self.shared
            .counts_in_simulated_time
            .store(true, Ordering::Release);
    }

    /// Fault: the store crashes. Every stream ends; until [`restart`](Self::restart) every
    /// call fails with `Unavailable` (connection refused) and no lease expires, as a stopped
    /// etcd's leases do not. Its data is kept, as etcd's is on disk.
    pub fn crash(&self) {
        self.shared.down.store(true, Ordering::SeqCst);
        self.close_streams();
    }

    /// Repairs [`crash`](Self::crash): the store answers again, with every lease refreshed
    /// to its TTL plus `election_timeout` from now, as a restarted etcd member that becomes
    /// leader does.
    pub fn restart(&self, election_timeout: Duration) {
        // Refresh before answering: a lease whose deadline passed while the store was down
        // lives on, as etcd's recovered leases do.
        self.shared
            .apply(Origin::Store, |s, now| s.promote(now, election_timeout));
        self.shared.down.store(false, Ordering::SeqCst);
        self.close_streams();
        self.shared.deadlines_changed.notify_one();
    }

    /// Starts the store again after the runtime that ran its clock is gone, as when the
    /// turmoil host serving it crashed and came back: its data is kept (as etcd's is on
    /// disk), its clock task starts on the current runtime, every stream of the old runtime
    /// is closed, and every lease is refreshed to its TTL plus `election_timeout`, as a
    /// restarted etcd member does.
    ///
    /// # Panics
    /// Outside a Tokio runtime.
    pub fn resume_on_current_runtime(&self, election_timeout: Duration) {
        tokio::spawn(background(
            Arc::downgrade(&self.shared),
            self.shared.deadlines_changed.clone(),
        ));
        tokio::spawn(land(
            Arc::downgrade(&self.shared),
            self.shared.arrivals.clone(),
        ));
        self.restart(election_timeout);
    }

    /// Whether the store is crashed.
    pub fn is_down(&self) -> bool {
        self.shared.down.load(Ordering::SeqCst)
    }

    /// Fault: compacts at the current revision every `every`, until the returned handle is
    /// dropped (etcd's `--auto-compaction-mode=revision` at its most aggressive).
    pub fn compact_every(&self, every: Duration) -> CompactionTask {
        let store = self.connect();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval_at(Instant::now() + every, every);
            loop {
                tick.tick().await;
                let rev = store.revision();
                if rev > store.compact_revision() && !store.is_down() {
                    let _ = store
                        .shared
                        .apply(Origin::Store, |s, now| s.compact(now, rev));
                }
            }
        });
        CompactionTask(task)
    }

    /// Fault: partitions this client from the store, both ways, until [`repair`]: requests
    /// and replies vanish, so every call through this handle (and its clones) fails after
    /// [`SimConfig::request_timeout`](crate::SimConfig::request_timeout) having changed nothing (unless the request got across
    /// before), and its watch streams deliver nothing, then end with `StreamClosed` once the
    /// link is repaired (the connection died). The store, its leases' clocks and other clients
    /// go on.
    ///
    /// [`repair`]: Self::repair
    pub fn partition(&self) {
        self.link.update(|s| s.cut = true);
    }

    /// Repairs [`partition`](Self::partition).
    pub fn repair(&self) {
        self.link.update(|s| s.cut = false);
    }

    /// Fault: a one-way partition, store to client, until [`repair_oneway`]: requests still
    /// reach the store and apply, but replies vanish, so each call fails after
    /// [`SimConfig::request_timeout`](crate::SimConfig::request_timeout) (writes with `Indeterminate`), renewals renew the lease
    /// without the client learning it, and watch streams stall, then end once repaired.
    ///
    /// [`repair_oneway`]: Self::repair_oneway
    pub fn partition_oneway(&self) {
        self.link.update(|s| s.deaf = true);
    }

    /// Repairs [`partition_oneway`](Self::partition_oneway).
    pub fn repair_oneway(&self) {
        self.link.update(|s| s.deaf = false);
    }

    /// Fault: holds every message of this client, both ways (calls, their replies, renewals,
    /// watch deliveries), until [`release`](Self::release); then they all go through, nothing
    /// lost (turmoil's hold).
    pub fn hold(&self) {
        self.link.on_next_write(None);
        self.link.update(|s| s.held = true);
    }

    /// Fault: [`hold`](Self::hold) from the moment this client next sends a write (a put, a
    /// delete, a transaction), that write held first: a process that stalls, or a link
    /// that stalls, right as a write leaves, so that the write lands only when
    /// [`release`](Self::release)d, after whatever the store did meanwhile (a lease expired,
    /// another leader elected). Calls, renewals and deliveries before that write pass.
    /// Nothing changes if the link is held already.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> coord_api::Result<()> {
    /// use std::time::Duration;
    /// use coord_api::{KvLeaseStore, KvLeaseStoreExt, PutRequest};
    /// use coord_sim::SimStore;
    ///
    /// let store = SimStore::new();
    /// let client = store.connect();
    /// client.hold_from_next_write();
    /// client.get_key("k").await?; // a read passes
    /// let late = tokio::spawn({
    ///     let client = client.clone();
    ///     async move { client.put(PutRequest::new("k", "late")).await }
    /// });
    /// tokio::time::sleep(Duration::from_secs(1)).await;
    /// store.put(PutRequest::new("k", "meanwhile")).await?;
    /// client.release();
    /// late.await.unwrap()?;
    /// assert_eq!(store.get_key("k").await?.unwrap().value_str(), "late");
    /// # Ok(())
    /// # }
    /// ```
    pub fn hold_from_next_write(&self) {
        if self.link.state().held {
            return;
        }
        let held = self.clone();
        self.on_next_write(move || held.link.update(|s| s.held = true));
    }

    /// Runs `then` as this client (or a clone) next sends a write, before the write leaves:
    /// a fault set there (a [`hold`](Self::hold), a [`partition`](Self::partition)) catches
    /// the write itself. Once only; a later call replaces it, and [`hold`](Self::hold) and
    /// [`release`](Self::release) call it off, as does
    /// [`call_off_next_write`](Self::call_off_next_write). `then` runs inside the write's
    /// call: it may set faults, and must not wait.
    pub fn on_next_write(&self, then: impl FnOnce() + Send + 'static) {
        self.link.on_next_write(Some(Box::new(then)));
    }

    /// Calls off what [`on_next_write`](Self::on_next_write) set, if it has not run.
    pub fn call_off_next_write(&self) {
        self.link.on_next_write(None);
    }

    /// Releases [`hold`](Self::hold) (or calls off
    /// [`hold_from_next_write`](Self::hold_from_next_write)).
    pub fn release(&self) {
        self.link.on_next_write(None);
        self.link.update(|s| s.held = false);
    }

    /// Fault: every call this client (and its clones) has sent that has not reached the store
    /// yet stays on its way, until [`release_sent`](Self::release_sent); calls sent after
    /// this pass them. A request stuck in a stalled member or a server's queue while its
    /// client goes on does this: a write sent before a delete lands after it. Replies,
    /// renewals and watch deliveries are not held (see [`hold`](Self::hold) for that).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> coord_api::Result<()> {
    /// use std::time::Duration;
    /// use coord_api::{KvLeaseStore, KvLeaseStoreExt, PutRequest};
    /// use coord_sim::SimStore;
    ///
    /// let store = SimStore::new();
    /// let client = store.connect();
    /// client.set_latency(Duration::from_millis(100));
    /// let first = tokio::spawn({
    ///     let client = client.clone();
    ///     async move { client.put(PutRequest::new("k", "first")).await }
    /// });
    /// tokio::time::sleep(Duration::from_millis(50)).await;
    /// client.hold_sent();
    /// client.set_latency(Duration::ZERO);
    /// client.put(PutRequest::new("k", "second")).await?;
    /// // The first put reaches the store meanwhile, and is kept there.
    /// tokio::time::sleep(Duration::from_millis(100)).await;
    /// assert_eq!(store.get_key("k").await?.unwrap().value_str(), "second");
    /// assert_eq!(client.release_sent(), 1, "the first put was held");
    /// first.await.unwrap()?;
    /// // The first write landed last.
    /// assert_eq!(store.get_key("k").await?.unwrap().value_str(), "first");
    /// # Ok(())
    /// # }
    /// ```
    pub fn hold_sent(&self) {
        self.link.hold_sent();
    }

    /// Ends [`hold_sent`](Self::hold_sent): the calls it held land now, in the order they
    /// reached the store. Returns how many it held (none: the hold changed nothing).
    pub fn release_sent(&self) -> usize {
        let now = self.shared.now();
        let held = self.link.release_sent();
        let count = held.len();
        for land in held {
            self.shared.arrivals.push(now, Arrival::Boxed(land));
        }
        count
    }

    /// Fault: every request of this client (and its clones) takes `latency` more to reach the
    /// store, on top of [`SimConfig::latency`](crate::SimConfig::latency); other clients are not slowed.
    pub fn set_latency(&self, latency: Duration) {
        self.link.set_latency(latency);
    }

    /// Fault: every reply to this client, and every watch delivery, takes `latency` more to
    /// come back, on top of [`SimConfig::latency`](crate::SimConfig::latency): requests apply on time, their callers
    /// learn of it late (a slow but successful reply).
    pub fn set_reply_latency(&self, latency: Duration) {
        self.link.set_reply_latency(latency);
    }

    /// Fault: ends every open keep-alive channel and watch stream, as a lost connection or an
    /// etcd leader change does. Each channel fails its next renewal with `StreamClosed` (the
    /// lease itself lives on), each watch yields `StreamClosed` and ends. New channels and
    /// watches work as before.
    pub fn close_streams(&self) {
        self.shared.stream_epoch.fetch_add(1, Ordering::SeqCst);
        let mut inner = self.shared.lock();
        let sinks = std::mem::take(&mut inner.sinks);
        let now = self.shared.now();
        for (id, mut sink) in sinks {
            inner.state.cancel_watch(id);
            // After what is already on its way, as a connection's end comes after the bytes
            // sent before it.
            sink.send(
                &self.shared.arrivals,
                Err(coord_api::Error::StreamClosed {
                    stream: "watch",
                    source: Some("the simulator closed every stream".into()),
                }),
                now,
            );
        }
    }
}

/// Periodic compaction started by [`SimStore::compact_every`]; dropping it stops it.
#[derive(Debug)]
pub struct CompactionTask(tokio::task::JoinHandle<()>);

impl Drop for CompactionTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A lessor's view of every lease's deadline at one instant (see
/// [`SimStore::lessor_snapshot`]).
#[derive(Debug, Clone, Default)]
pub struct LessorSnapshot {
    deadlines: Vec<(LeaseId, Instant)>,
}

#[cfg(test)]
mod tests {
    use coord_api::{KvLeaseStore, KvLeaseStoreExt, PutRequest};
    use std::time::Duration;

    use crate::SimStore;

    /// etcd#15247 as modelled: what the stale leader saw overdue goes, renewed since or not;
    /// what was not yet due in its view, or granted after it stalled, stays.
    #[tokio::test(start_paused = true)]
    async fn a_stale_leader_revokes_what_it_saw_overdue_and_nothing_else() {
        let store = SimStore::new();
        let secs = Duration::from_secs;
        let renewed = store.grant(secs(3)).await.unwrap().id;
        let long = store.grant(secs(30)).await.unwrap().id;
        store
            .put(PutRequest::new("k", "v").with_lease(renewed))
            .await
            .unwrap();
        let snapshot = store.lessor_snapshot();
        // The new leader renews it and grants another, while the old one sleeps.
        tokio::time::advance(secs(2)).await;
        store
            .keep_alive(renewed)
            .await
            .unwrap()
            .renew()
            .await
            .unwrap();
        let later = store.grant(secs(3)).await.unwrap().id;
        tokio::time::advance(secs(2)).await;
        assert_eq!(store.revoke_as_stale_leader(&snapshot), vec![renewed]);
        assert!(
            store.get_key("k").await.unwrap().is_none(),
            "its key went with it"
        );
        for kept in [long, later] {
            assert!(store.time_to_live(kept).await.is_ok(), "{kept} kept");
        }
    }
}
