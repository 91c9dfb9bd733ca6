//! [`Leadership`]: a won election, its token, and its end: seen when the key goes or the
//! session ends, recorded once, and the key resigned in the session's turn.

use super::*;

/// A won election: the key, its fencing token, and a signal for when it is over.
///
/// # Fencing
/// [`txn`](Leadership::txn) (or a [`Fence`] from [`fence`](Leadership::fence), which a task
/// can own) runs a transaction only while this key leads, in one round trip:
/// a write the store refuses because another leader may exist comes back as
/// [`Error::FencedOut`] (not as a transaction whose compares failed), and ends the
/// leadership.
///
/// # Drop
/// Dropping it stops watching but keeps the key (the session still holds it): call
/// [`resign`](Leadership::resign) to hand over at once.
#[must_use = "dropping a leadership keeps its key until the session ends; resign to hand over"]
#[derive(Debug)]
pub struct Leadership {
    pub(super) store: Arc<DynKvLeaseStore>,
    pub(super) session: SessionHandle,
    pub(super) key: LeaderKey,
    /// The campaign's number among its session's in this election: a newer campaign may
    /// have rejoined the key since, and then the key is not this leadership's to delete.
    pub(super) campaign: u64,
    pub(super) lost: Arc<watch::Sender<Option<LossReason>>>,
    /// Watches for the loss; cancelled on drop.
    pub(super) _watcher: Task,
    pub(super) held: Option<Arc<AtomicUsize>>,
}

impl Leadership {
    pub(super) fn new(
        store: Arc<DynKvLeaseStore>,
        session: SessionHandle,
        key: LeaderKey,
        campaign: u64,
        held: Option<Arc<AtomicUsize>>,
    ) -> Self {
        let lost = Arc::new(watch::Sender::new(None));
        session.stand(&key.name, campaign, &lost);
        let span = tracing::info_span!("leadership", election = %key.name, token = %key.token);
        let watching = watch_loss(store.clone(), session.clone(), key.clone(), lost.clone());
        // Nothing to let go of when stopped: dropped where it waits.
        let watcher = Task::spawn_abortable(span, watching);
        if let Some(h) = &held {
            h.fetch_add(1, Ordering::SeqCst);
        }
        crate::metrics::record::leadership_acquired(&key.name);
        Leadership {
            store,
            session,
            key,
            campaign,
            lost,
            _watcher: watcher,
            held,
        }
    }

    /// The fencing token: the leader key's create revision. Each new leader's is larger.
    pub fn token(&self) -> Revision {
        self.key.token
    }

    /// The leader key (name, key, token, lease).
    pub fn key(&self) -> &LeaderKey {
        &self.key
    }

    /// The instant after which this leadership must not be trusted (the session's deadline).
    pub fn deadline(&self) -> Instant {
        self.session.deadline()
    }

    /// Whether the session's renewals are working: the last acknowledged one, the time left.
    pub fn health(&self) -> SessionHealth {
        self.session.health()
    }

    /// The session's TTL.
    pub fn ttl(&self) -> Duration {
        self.session.ttl()
    }

    /// Why the leadership ended, if it has (its deadline passing counts).
    pub fn loss(&self) -> Option<LossReason> {
        self.lost.get().or_else(|| {
            self.session.is_done().then(|| {
                self.session
                    .health()
                    .ended
                    .map_or(LossReason::DeadlinePassed, LossReason::from)
            })
        })
    }

    /// True until the leadership is known lost or its deadline passed.
    pub fn is_leader(&self) -> bool {
        self.loss().is_none()
    }

    /// Resolves when the leadership is over, with why: the session's deadline passed or it
    /// ended, the key was deleted, a fenced write was refused, or it was resigned.
    pub async fn lost(&self) -> LossReason {
        let mut rx = self.lost.subscribe();
        // Biased, like every select in the library: polling order then never depends on
        // tokio's unseeded RNG, so simulation runs replay exactly.
        tokio::select! {
            biased;
            why = rx.wait_for(Option::is_some) => why.ok().flatten().unwrap_or(LossReason::SessionClosed),
            end = self.session.done() => {
                let why = LossReason::from(end);
                lose(&self.lost, &self.key.name, why);
                self.lost.get().unwrap_or(why)
            }
        }
    }

    /// `txn` made conditional on this leadership: its compares gain "my key still stands as
    /// created", so the whole transaction fails (runs `failure`) once another leader can exist.
    /// [`txn`](Self::txn) runs it and tells a refusal apart from the caller's own compares.
    pub fn fenced(&self, txn: TxnRequest) -> TxnRequest {
        self.fence().fenced(txn)
    }

    /// The compare behind [`fenced`](Self::fenced), for building transactions by hand.
    pub fn guard(&self) -> Compare {
        self.key.is_current()
    }

    /// A handle that runs transactions fenced by this leadership, which a task can own (a
    /// write that goes on after the leader stopped waiting for it is still judged by the
    /// store).
    pub fn fence(&self) -> Fence {
        Fence {
            store: self.store.clone(),
            key: self.key.clone(),
            lost: self.lost.clone(),
        }
    }

    /// Runs `txn` only while this key leads; see [`Fence::txn`].
    ///
    /// # Errors
    /// As [`Fence::txn`].
    pub async fn txn(&self, txn: TxnRequest) -> Result<TxnResponse> {
        self.fence().txn(txn).await
    }

    /// Replaces the leader's value, only while this key leads.
    ///
    /// # Errors
    /// [`Error::NotLeader`] when the key no longer stands (the leadership is then lost).
    pub async fn proclaim(&self, value: impl Into<Bytes>) -> Result<()> {
        let r = self.store.proclaim(&self.key, value.into()).await;
        if matches!(r, Err(Error::NotLeader { .. })) {
            lose(&self.lost, &self.key.name, LossReason::KeyDeleted);
        }
        r
    }

    /// Hands over: deletes the key if it is still this one, and this leadership's alone:
    /// after a newer campaign of the same session rejoined the key, the key is left to it;
    /// while an older leadership of the session on the key stands (this one rejoined it),
    /// the key is left to that one. Idempotent.
    ///
    /// # Errors
    /// Whatever the delete fails with; the leadership has ended either way (its key then
    /// goes with the session's lease).
    pub async fn resign(self) -> Result<()> {
        self.hand_over().await
    }

    /// [`resign`](Self::resign), keeping the handle: a caller whose resignation failed may
    /// try again.
    pub(crate) async fn hand_over(&self) -> Result<()> {
        lose(&self.lost, &self.key.name, LossReason::Resigned);
        resign_key(&self.store, &self.session, &self.key, self.campaign).await
    }

    /// Ends the leadership, keeping what it takes to resign its key later (a resignation
    /// that failed, or was never sent): no longer counted as a leadership held.
    pub(crate) fn unresigned(self) -> Unresigned {
        lose(&self.lost, &self.key.name, LossReason::Resigned);
        Unresigned {
            store: self.store.clone(),
            session: self.session.clone(),
            key: self.key.clone(),
            campaign: self.campaign,
        }
    }
}

/// The key of a leadership that ended while it may still stand: from
/// [`Leadership::unresigned`].
pub(crate) struct Unresigned {
    store: Arc<DynKvLeaseStore>,
    session: SessionHandle,
    key: LeaderKey,
    campaign: u64,
}

impl Unresigned {
    /// Deletes the key by [`Leadership::resign`]'s rules.
    pub(crate) async fn resign(self) -> Result<()> {
        resign_key(&self.store, &self.session, &self.key, self.campaign).await
    }
}

/// Deletes a leadership's key in the session's turn for its election: never under a
/// campaign's write of the same key, never after a newer campaign took the key over, never
/// under an older leadership of the session that still stands on it.
pub(super) async fn resign_key(
    store: &Arc<DynKvLeaseStore>,
    session: &SessionHandle,
    key: &LeaderKey,
    campaign: u64,
) -> Result<()> {
    let planted =
        crate::hooks::planted::enabled(crate::hooks::planted::Bug::ResignIgnoresNewerCampaign);
    let Some(turn) = (if planted {
        Some(None)
    } else {
        session.resign_turn(&key.name, campaign).await.map(Some)
    }) else {
        tracing::info!(election = %key.name, token = %key.token, "leadership resigned; the key stays with another campaign of the session");
        return Ok(());
    };
    match turn {
        // Fenced, in the turn: a resignation given up on must not land after a newer
        // campaign of the session took the key over (see `elections::limbo`).
        Some(turn) => {
            let fencing = session.fencing(&key.name);
            let resignation = elections::resignation(key);
            elections::limbo::write(store.clone(), resignation, turn, fencing)
                .await
                .0?;
        }
        None => store.resign(key).await?,
    }
    tracing::info!(election = %key.name, token = %key.token, "leadership resigned");
    Ok(())
}

impl Leadership {
    /// Ends the leadership and deletes its key in the background, in the session's turn for
    /// this election: a campaign on the same lease that starts meanwhile calls the delete off
    /// and takes the key over, or waits until it is done. Never a delete that lands under a
    /// campaign that already rejoined the key.
    pub(crate) fn withdraw_in_background(self) {
        lose(&self.lost, &self.key.name, LossReason::Resigned);
        if let elections::Cleanup::HandOff(withdraw) =
            self.session.cleanup(&self.key.name, self.campaign)
        {
            withdraw(self.store.clone(), self.key.clone());
        }
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        // Dropped while standing: this process no longer holds it (the key itself stays
        // until the session ends).
        end(&self.lost, &self.key.name, LossReason::Resigned, "dropped");
        if let Some(h) = &self.held {
            h.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Records why the leadership ended, if it had not ended already; true if this ended it.
pub(super) fn lose(
    lost: &watch::Sender<Option<LossReason>>,
    election: &str,
    why: LossReason,
) -> bool {
    end(lost, election, why, why.label())
}

/// Ends the leadership once, whoever sees it first, and counts it under `label`.
pub(super) fn end(
    lost: &watch::Sender<Option<LossReason>>,
    election: &str,
    why: LossReason,
    label: &'static str,
) -> bool {
    let first = lost.send_if_modified(|l| {
        if l.is_none() {
            *l = Some(why);
            true
        } else {
            false
        }
    });
    if first {
        crate::metrics::record::leadership_ended(election, label);
    }
    first
}

/// Ends the leadership when the key goes or the session ends; logs the loss.
pub(super) async fn watch_loss(
    store: Arc<DynKvLeaseStore>,
    session: SessionHandle,
    key: LeaderKey,
    lost: Arc<watch::Sender<Option<LossReason>>>,
) {
    let mut ended = lost.subscribe();
    // A watch lost on a link that recovered must not leave the belief standing past a
    // deletion for the backend's request timeout: the session, renewing meanwhile, would not
    // end it.
    let mut follow = Follow::new(
        store,
        key.key.clone(),
        key.token + 1,
        Some((key.token, key.token)),
    )
    .answered_within(session.ttl() / 3);
    let why = tokio::select! {
        biased;
        _ = ended.wait_for(Option::is_some) => return,
        end = session.done() => LossReason::from(end),
        _ = follow.until_gone(|kv| kv.create_revision == key.token) => LossReason::KeyDeleted,
    };
    if lose(&lost, &key.name, why) {
        tracing::warn!(election = %key.name, token = %key.token, reason = %why, "leadership lost");
    }
}
