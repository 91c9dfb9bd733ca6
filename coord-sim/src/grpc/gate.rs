//! A member's gate: every request a member of a simulated cluster serves passes it first,
//! and is served, refused or held as [`Members::verdict`] says; its streams' deliveries wait
//! while it is cut off, and its require-leader streams end as etcd's leader monitor ends them.

use std::time::Duration;

use tonic::{Request, Status};

use super::members::{Call, Members, Refusal, Verdict};

/// Simulated time since the start of the run, on the current turmoil host.
fn now() -> Duration {
    turmoil::sim_elapsed().unwrap_or_default()
}

async fn sleep_until(at: Duration) {
    tokio::time::sleep(at.saturating_sub(now())).await;
}

/// Whether a write its client gave up on while member `index` was stalled applies when the
/// member reads it: one draw in three, mixed from the instants it arrived and was read.
fn lands_anyway(index: usize, arrived: Duration, read: Duration) -> bool {
    let mut x = (arrived.as_nanos() as u64)
        ^ (read.as_nanos() as u64).rotate_left(32)
        ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    // splitmix64's finaliser: neighbouring instants draw apart.
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 31;
    x % 3 == 0
}

/// Whether a request carries etcd's require-leader metadata.
pub(crate) fn requires_leader<T>(request: &Request<T>) -> bool {
    request
        .metadata()
        .get("hasleader")
        .is_some_and(|v| v == "true")
}

/// Member `index` of a cluster.
#[derive(Debug, Clone)]
pub(crate) struct Gate {
    pub(crate) members: Members,
    pub(crate) index: usize,
}

impl Gate {
    /// Waits until the member serves a `call`, or refuses it as etcd would. A stalled member
    /// reads the request only once thawed (its kernel kept it), and a slow one answers late.
    pub(crate) async fn admit(&self, call: Call, require_leader: bool) -> Result<(), Status> {
        let mut changes = self.members.subscribe();
        self.while_stalled(&mut changes).await;
        let arrived = now();
        self.late().await;
        loop {
            self.while_stalled(&mut changes).await;
            match self
                .members
                .verdict(self.index, now(), arrived, call, require_leader)
            {
                Verdict::Go => return Ok(()),
                Verdict::Refuse(r) => return Err(r.status()),
                Verdict::FailAt(at, r) => {
                    sleep_until(at).await;
                    return Err(r.status());
                }
                Verdict::WaitUntil(at) => {
                    tokio::select! {
                        _ = sleep_until(at) => {}
                        _ = changes.changed() => {}
                    }
                }
            }
        }
    }

    /// Admits a write, then applies it (`apply`).
    ///
    /// A write that reaches a stalled member is read only once the member thaws, and so is
    /// what its client did meanwhile: if it gave up (the stream reset, the connection
    /// closed), etcd takes the request and the giving up in the order its kernel kept them,
    /// and applied such writes after the thaw in 5 of 16 runs measured
    /// (`docs/ETCD-BEHAVIOUR.md` 3.7). Here a handler is dropped when its client gives up,
    /// so such a write runs apart from its handler, and at the thaw one draw in three
    /// applies it anyway, from the instants it arrived and was read (so from the run's seed).
    pub(crate) async fn write<T: Send + 'static>(
        &self,
        require_leader: bool,
        apply: impl std::future::Future<Output = Result<T, Status>> + Send + 'static,
    ) -> Result<T, Status> {
        if !self.members.is_stalled(self.index) {
            self.admit(Call::Write, require_leader).await?;
            return apply.await;
        }
        let arrived = now();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let gate = self.clone();
        tokio::spawn(async move {
            let outcome = async {
                gate.admit(Call::Write, require_leader).await?;
                if tx.is_closed() && !lands_anyway(gate.index, arrived, now()) {
                    return Err(Status::cancelled(
                        "the client gave up on the write before the member read it",
                    ));
                }
                apply.await
            };
            let outcome = outcome.await;
            let _ = tx.send(outcome);
        });
        rx.await
            .unwrap_or_else(|_| Err(Status::unavailable("the member went down")))
    }

    /// Waits out the member's lateness: a slow member answers everything this late.
    async fn late(&self) {
        let late = self.members.lateness(self.index);
        if !late.is_zero() {
            tokio::time::sleep(late).await;
        }
    }

    async fn while_stalled(&self, changes: &mut tokio::sync::watch::Receiver<u64>) {
        while self.members.is_stalled(self.index) {
            if changes.changed().await.is_err() {
                return;
            }
        }
    }

    /// Waits while the member is cut off or stalled: its own state stops there, so nothing
    /// new reaches its watchers until it rejoins or thaws; then, from a slow member, a
    /// message arrives late.
    pub(crate) async fn while_cut_off(&self) {
        let mut changes = self.members.subscribe();
        while self.members.is_cut_off(self.index) {
            if changes.changed().await.is_err() {
                return;
            }
        }
        self.late().await;
    }

    /// Waits until the member answers a progress request: etcd answers one from the member's
    /// own state, without raft, so a member cut off from its peers answers at once (with the
    /// revision it has, while the others move on), a stalled one once thawed, a slow one late.
    /// Returns whether the member is cut off.
    pub(crate) async fn progress_answered(&self) -> bool {
        let mut changes = self.members.subscribe();
        self.while_stalled(&mut changes).await;
        self.late().await;
        self.members.is_cut_off(self.index)
    }

    /// Resolves with `no leader` when a require-leader stream on the member must end; never
    /// for one without require-leader.
    pub(crate) async fn stream_ends(&self, require_leader: bool) -> Status {
        if !require_leader {
            return std::future::pending().await;
        }
        let mut changes = self.members.subscribe();
        loop {
            match self.members.stream_end(self.index) {
                Some(at) if now() >= at => return Refusal::NoLeader.status(),
                Some(at) => {
                    tokio::select! {
                        _ = sleep_until(at) => {}
                        _ = changes.changed() => {}
                    }
                }
                None => {
                    if changes.changed().await.is_err() {
                        return std::future::pending().await;
                    }
                }
            }
        }
    }

    /// The etcd version this member reports.
    pub(crate) fn version(&self) -> &'static str {
        self.members.version().reported()
    }

    /// The leader's member id as this member reports it (0: none known), and the term.
    pub(crate) fn status(&self) -> (u64, u64) {
        let (leader, term) = self.members.status(self.index, now());
        (leader.map_or(0, |l| l as u64 + 1), term)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The draw lands about one write in three, over instants a millisecond apart (what a
    /// schedule's arrivals are), and depends on the instants.
    #[test]
    fn a_given_up_write_lands_one_draw_in_three() {
        let ms = Duration::from_millis;
        let landed = (0..3000u64)
            .filter(|i| lands_anyway((*i % 3) as usize, ms(*i), ms(*i + 2000)))
            .count();
        assert!(
            (900..=1100).contains(&landed),
            "{landed} of 3000 landed, not about a third"
        );
        let by_arrival: Vec<bool> = (0..64u64)
            .map(|i| lands_anyway(0, ms(i), ms(5000)))
            .collect();
        assert!(by_arrival.contains(&true) && by_arrival.contains(&false));
    }
}
