//! [`Election`] on a [`Session`], and the [`Leadership`] it hands out.
//!
//! The safety argument, in two layers (`docs/INVARIANTS.md` S1, S2):
//! * **Fenced.** A leadership's token is its key's create revision, which grows from one
//!   leader to the next. [`Leadership::fenced`] makes a transaction conditional on the key
//!   still standing as created, so once another candidate can lead, the old leader's fenced
//!   writes fail at the store, whatever the old leader believes.
//! * **Belief.** [`Leadership::lost`] fires when the session's local deadline passes (send
//!   time of the last acknowledged renewal + TTL, which the server's expiry cannot precede)
//!   or when the key is seen deleted. So a leader that is cut off stops believing no later
//!   than the store could elect someone else, barring a process pause longer than the TTL,
//!   which only fencing covers. The key's watch is sent again when it goes unanswered for a
//!   third of the TTL, so a deletion is seen within about that of the link answering again,
//!   even when the watch request was lost and the session renewed on.
//!
//! And what a new leader is guaranteed: [`Election::campaign`] hands a leadership out only
//! with at least half its session's TTL left before the deadline, renewing first if less is
//! left (after a slow renewal, say), so a leader never starts with milliseconds to live.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use super::loss::LossReason;
use super::session::{Before, CampaignTurn, SessionEnd, SessionHandle, SessionHealth};
use super::task::Task;
use crate::elections::follow::Follow;
use crate::elections::{self, candidate_key};
use crate::error::{Error, Result};
use crate::leader_key::LeaderKey;
use crate::request::{GetRequest, PutRequest};
use crate::store::{DynKvLeaseStore, KvLeaseStore, LeaderStream};
use crate::sync::watch;
use crate::txn::{Compare, CompareOp, TxnOp, TxnRequest, TxnResponse};
use crate::types::{KeyValue, Revision};

mod fence;
mod leadership;

pub use fence::Fence;
use leadership::lose;
pub use leadership::Leadership;
pub(crate) use leadership::Unresigned;

/// An election, campaigned in under one session's lease.
#[derive(Debug, Clone)]
pub struct Election {
    store: Arc<DynKvLeaseStore>,
    session: SessionHandle,
    name: String,
    held: Option<Arc<AtomicUsize>>,
    /// How many keys lead at once: one for an election or a lock, N for a semaphore.
    seats: usize,
}

impl Election {
    /// The election `name`, under `session`'s lease (a [`&Session`](super::Session) or a
    /// [`SessionHandle`]).
    pub fn new(session: impl Into<SessionHandle>, name: impl Into<String>) -> Self {
        let session = session.into();
        Election {
            store: session.store().clone(),
            session,
            name: name.into(),
            held: None,
            seats: 1,
        }
    }

    /// The store it campaigns in.
    pub(crate) fn store(&self) -> &Arc<DynKvLeaseStore> {
        &self.store
    }

    /// Lets the `seats` oldest keys lead at once (a semaphore's permits).
    pub(crate) fn with_seats(mut self, seats: usize) -> Self {
        self.seats = seats;
        self
    }

    /// Counts leaderships won through this election in `held` while they last (the pool's
    /// counter).
    pub(crate) fn counting(mut self, held: Arc<AtomicUsize>) -> Self {
        self.held = Some(held);
        self
    }

    /// The election's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Campaigns until this candidate leads.
    ///
    /// Dropping the future cancels the campaign and deletes its key. The wait ends early, with
    /// an error, when the session ends.
    ///
    /// All campaigns of one session in one election share one key (`name/<lease>`), as in
    /// etcd's Go client: a campaign again while the key stands rejoins it at its place and
    /// writes its value, and the key is then the newer campaign's (an older [`Leadership`]'s
    /// resign leaves it alone). Unlike Go's, a newer campaign that gives up (dropped, failed,
    /// or resigned once it led) leaves the key to an older leadership of the session that
    /// still stands, rather than deposing it: the key goes with the last of them.
    ///
    /// # Errors
    /// [`Error::CandidacyLost`] when the session ends or the candidate key is deleted while
    /// waiting; whatever the store fails with.
    pub async fn campaign(&self, value: impl Into<Bytes>) -> Result<Leadership> {
        let value = value.into();
        let lease = self.session.lease();
        crate::metrics::record::campaign_begun(&self.name);
        let begun = tokio::time::Instant::now();
        if self.session.is_done() {
            return Err(self.ended(self.session.done().await));
        }
        // Campaigns on one lease in one election write one key: one at a time.
        let CampaignTurn { turn, campaign, .. } = self.session.campaign_turn(&self.name).await;
        let cleanup = self.session.cleanup(&self.name, campaign);
        let (won, mut turn) = tokio::select! {
            biased;
            end = self.session.done() => return Err(self.ended(end)),
            r = elections::campaign_with(&*self.store, &self.name, value, lease, cleanup, self.seats, Some((turn, self.session.fencing(&self.name)))) => match r {
                Ok(won) => won,
                Err(e) => {
                    // A write that may have applied was handed to the cleanup, which gives
                    // the key back itself; this is for the one that surely did not.
                    self.session.give_back(&self.name, campaign);
                    return Err(e);
                }
            },
        };
        self.runway(&won, campaign, &mut turn).await?;
        crate::hooks::explore::point().await;
        tracing::info!(election = %self.name, token = %won.token, "leadership acquired");
        crate::metrics::record::campaign_won_after(&self.name, begun.elapsed());
        Ok(Leadership::new(
            self.store.clone(),
            self.session.clone(),
            won,
            campaign,
            self.held.clone(),
        ))
    }

    /// Campaigns for at most `timeout`.
    ///
    /// # Errors
    /// [`Error::Cancelled`] when the time runs out (the candidate key is deleted); otherwise
    /// as [`campaign`](Self::campaign).
    pub async fn campaign_timeout(
        &self,
        value: impl Into<Bytes>,
        timeout: Duration,
    ) -> Result<Leadership> {
        match tokio::time::timeout(timeout, self.campaign(value)).await {
            Ok(r) => r,
            Err(_) => Err(Error::Cancelled {
                operation: "campaign",
            }),
        }
    }

    /// Takes the leadership if nobody holds it, in one transaction; never waits and never
    /// queues. `Ok(None)` when someone else leads. On the session's key, as
    /// [`campaign`](Self::campaign): a leader rejoins it and writes its value.
    ///
    /// Dropping the future withdraws the key it may have written, once the write settles.
    pub async fn try_campaign(&self, value: impl Into<Bytes>) -> Result<Option<Leadership>> {
        let value = value.into();
        let lease = self.session.lease();
        crate::validate::election_name(&self.name)?;
        crate::metrics::record::campaign_begun(&self.name);
        let prefix = format!("{}/", self.name);
        let key = candidate_key(&self.name, lease);
        let turn = self.session.campaign_turn(&self.name).await;
        let unfinished = Unfinished {
            election: self,
            campaign: turn.campaign,
            key: Some(LeaderKey {
                name: self.name.clone(),
                key: Bytes::from(key.clone()),
                token: Revision::ZERO,
                lease,
            }),
        };
        let outcome = self.try_campaign_on(value, prefix, key, turn).await;
        unfinished.finish();
        outcome
    }

    /// [`try_campaign`](Self::try_campaign) once its turn is taken.
    async fn try_campaign_on(
        &self,
        value: Bytes,
        prefix: String,
        key: String,
        turn: CampaignTurn,
    ) -> Result<Option<Leadership>> {
        let lease = self.session.lease();
        let CampaignTurn {
            turn,
            campaign,
            before,
        } = turn;
        if self.seats > 1 {
            return self
                .try_seat(value, prefix, key, turn, campaign, before)
                .await;
        }
        // If no candidate exists, put ours; else read the oldest candidate (as etcd's Go
        // TryLock does: a queue of thousands costs one key, not the queue). One transaction,
        // so it cannot lose a race with another candidate (go-coord's TryCampaign could, and
        // then blocked).
        // The write owns the turn until it settles, as a campaign's does.
        let (written, mut turn) = elections::settled(
            self.store.clone(),
            TxnRequest::new()
                .when([
                    if crate::hooks::planted::enabled(
                        crate::hooks::planted::Bug::TryLockIgnoresTheQueue,
                    ) {
                        Compare::create_revision(key.clone(), CompareOp::Equal, 0)
                    } else {
                        Compare::create_revision(prefix.clone(), CompareOp::Equal, 0).with_prefix()
                    },
                ])
                .and_then([PutRequest::new(key.clone(), value.clone()).with_lease(lease)])
                .or_else([elections::oldest_candidate(&self.name)]),
            Some((turn, self.session.fencing(&self.name))),
        )
        .await;
        let resp = match written {
            Ok(r) => r,
            Err(e) => {
                // A write that may have applied leaves a key nobody waits for: withdraw it.
                if e.class() == crate::error::ErrorClass::Indeterminate {
                    self.withdraw(
                        LeaderKey {
                            name: self.name.clone(),
                            key: Bytes::from(key),
                            token: Revision::ZERO,
                            lease,
                        },
                        campaign,
                    );
                } else {
                    self.untouched(&key, campaign, before);
                }
                return Err(e);
            }
        };
        let won = if resp.succeeded {
            LeaderKey {
                name: self.name.clone(),
                key: Bytes::from(key),
                token: resp.revision,
                lease,
            }
        } else {
            // Already leading with this lease (a re-campaign) counts as winning.
            let first = resp
                .responses
                .first()
                .and_then(|r| r.as_get())
                .and_then(|g| g.kvs.first().cloned());
            match first {
                Some(kv) if kv.key == key.as_bytes() => {
                    let won = LeaderKey {
                        name: self.name.clone(),
                        key: kv.key,
                        token: kv.create_revision,
                        lease,
                    };
                    // As a campaign's rejoin does: the leader's value becomes this one's.
                    if kv.value != value {
                        elections::proclaim(&*self.store, &won, value).await?;
                    }
                    won
                }
                _ => {
                    // Another leads: nothing written.
                    self.untouched(&key, campaign, before);
                    return Ok(None);
                }
            }
        };
        self.won_try(won, campaign, "leadership", &mut turn).await
    }

    /// Takes this session's key out of the election, waiting or leading, once any campaign
    /// of this session's that was writing it has settled: after this returns, nothing of the
    /// session's stands in the election or is written into it, until it campaigns again.
    ///
    /// Dropping a campaign deletes its key in the background, and a write it had in flight
    /// may land later; a service that stops with a campaign (a `lock`, an `acquire`)
    /// outstanding calls this to know when its key is gone.
    ///
    /// # Errors
    /// Whatever the delete fails with; the key then goes with the session's lease.
    pub async fn leave(&self) -> Result<()> {
        let mut turn = Some(self.session.campaign_turn(&self.name).await.turn);
        let key = candidate_key(&self.name, self.session.lease());
        let delete = TxnRequest::new().and_then([crate::request::DeleteRequest::key(key)]);
        self.delete_in_turn(delete, &mut turn).await
    }

    /// The current leader's key and value.
    ///
    /// # Errors
    /// [`Error::NoLeader`] when nobody campaigns.
    pub async fn leader(&self) -> Result<KeyValue> {
        self.store.leader(&self.name).await
    }

    /// Streams the leader: the current one, then each change and each proclaimed value.
    pub async fn observe(&self) -> Result<LeaderStream> {
        self.store.observe(&self.name).await
    }

    /// Never hands out a leadership on a dead session, nor on one with moments left: waits for
    /// a renewal when less than half the TTL is left, then confirms the key still leads (it
    /// may have gone while waiting). The confirming read may itself take long (its reply held
    /// past the session's deadline), so the session is judged again after it: the runway
    /// holds when this returns, not only when the check began.
    ///
    /// Called in the session's turn, which the campaign holds until it returns: a key it
    /// gives up goes only as [`SessionHandle`]'s rule for campaign `campaign` allows (an
    /// earlier leadership of the session that the campaign rejoined keeps it).
    async fn runway(
        &self,
        won: &LeaderKey,
        campaign: u64,
        turn: &mut Option<elections::Turn>,
    ) -> Result<()> {
        loop {
            match self.session.fresh(self.session.ttl() / 2).await {
                Ok(false) => return Ok(()),
                Ok(true) => match self.still_leads(won).await {
                    Ok(true) => continue,
                    Ok(false) => {
                        self.give_up(won, campaign, turn).await;
                        return Err(Error::CandidacyLost {
                            election: self.name.clone(),
                            key: String::from_utf8_lossy(&won.key).into_owned(),
                            lease: won.lease,
                            reason: "the candidate key was deleted while the session renewed"
                                .to_owned(),
                        });
                    }
                    Err(e) => {
                        self.give_up(won, campaign, turn).await;
                        return Err(e);
                    }
                },
                Err(end) => {
                    self.give_up(won, campaign, turn).await;
                    return Err(self.ended(end));
                }
            }
        }
    }

    /// Deletes the key a campaign won and is giving up, unless the session's rule leaves it
    /// to another of its campaigns. In the session's turn.
    async fn give_up(&self, won: &LeaderKey, campaign: u64, turn: &mut Option<elections::Turn>) {
        if self.session.may_delete(&self.name, campaign) {
            let _ = self.delete_in_turn(elections::resignation(won), turn).await;
        }
    }

    /// Runs `txn`, a delete of this session's key, in the session's `turn`, fenced (see
    /// `elections::limbo`): given up on, it cannot land after what the turn's next holder
    /// writes. Without the turn (its write's task was cancelled), sent as it is.
    async fn delete_in_turn(
        &self,
        txn: TxnRequest,
        turn: &mut Option<elections::Turn>,
    ) -> Result<()> {
        let Some(held) = turn.take() else {
            return self.store.txn(txn).await.map(|_| ());
        };
        let fencing = self.session.fencing(&self.name);
        let (answer, held) = elections::limbo::write(self.store.clone(), txn, held, fencing).await;
        *turn = held;
        answer.map(|_| ())
    }

    /// Whether `won` still holds a seat (the leadership, with one seat), read from the store.
    async fn still_leads(&self, won: &LeaderKey) -> Result<bool> {
        if self.seats > 1 {
            return match elections::seat(&*self.store, won, self.seats).await? {
                elections::Seat::Held => Ok(true),
                elections::Seat::Disagrees(refused) => Err(refused),
                elections::Seat::Lost | elections::Seat::Waiting { .. } => Ok(false),
            };
        }
        match self.store.leader(&self.name).await {
            Ok(kv) => Ok(kv.key == won.key && kv.create_revision == won.token),
            Err(Error::NoLeader { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// `try_campaign` with several seats: no compare can count keys, so one transaction puts
    /// the key (unless it stands) and reads the oldest keys as they were before it; when all
    /// seats were taken, the key is withdrawn before returning.
    async fn try_seat(
        &self,
        value: Bytes,
        prefix: String,
        key: String,
        turn: elections::Turn,
        campaign: u64,
        before: Before,
    ) -> Result<Option<Leadership>> {
        let lease = self.session.lease();
        let oldest = || {
            GetRequest::prefix(prefix.clone())
                .with_sort(
                    crate::request::SortTarget::Create,
                    crate::request::SortOrder::Ascend,
                )
                .with_limit(self.seats as u64)
        };
        let (written, mut turn) = elections::settled(
            self.store.clone(),
            TxnRequest::new()
                .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                .and_then([
                    TxnOp::Get(oldest()),
                    TxnOp::Put(PutRequest::new(key.clone(), value.clone()).with_lease(lease)),
                ])
                .or_else([oldest()]),
            Some((turn, self.session.fencing(&self.name))),
        )
        .await;
        let mut won = LeaderKey {
            name: self.name.clone(),
            key: Bytes::from(key),
            token: Revision::ZERO,
            lease,
        };
        let resp = match written {
            Ok(r) => r,
            Err(e) => {
                if e.class() == crate::error::ErrorClass::Indeterminate {
                    self.withdraw(won, campaign);
                } else {
                    self.untouched(&won.key, campaign, before);
                }
                return Err(e);
            }
        };
        let oldest: Vec<KeyValue> = resp
            .responses
            .first()
            .and_then(|r| r.as_get())
            .map(|g| g.kvs.clone())
            .unwrap_or_default();
        // Written now, every key read is ahead of ours; standing, those created before it.
        let own = oldest.iter().find(|kv| kv.key == won.key);
        let ahead: Vec<KeyValue> = match (resp.succeeded, own) {
            (true, _) => oldest.clone(),
            (false, Some(own)) => oldest
                .iter()
                .filter(|kv| kv.create_revision < own.create_revision)
                .cloned()
                .collect(),
            (false, None) => Vec::new(),
        };
        if ahead.len() < self.seats {
            if let Some(refused) = elections::disagreement(&self.name, &value, &ahead) {
                if resp.succeeded {
                    won.token = resp.revision;
                    self.withdraw(won, campaign);
                } else {
                    self.untouched(&won.key, campaign, before);
                }
                return Err(refused);
            }
        }
        if resp.succeeded {
            won.token = resp.revision;
            if oldest.len() >= self.seats {
                // Every seat was taken before our key was written: take it back.
                if let Err(e) = self
                    .delete_in_turn(elections::resignation(&won), &mut turn)
                    .await
                {
                    tracing::debug!(election = %self.name, error = &e as &dyn std::error::Error, "could not withdraw a try; withdrawing in the background");
                    self.withdraw(won, campaign);
                }
                return Ok(None);
            }
        } else {
            // Our key stands already (this lease queued before): it leads if it is seated.
            match oldest.iter().find(|kv| kv.key == won.key) {
                Some(kv) => {
                    won.token = kv.create_revision;
                    // As a campaign's rejoin does: the seat's value becomes this one's.
                    if kv.value != value {
                        elections::proclaim(&*self.store, &won, value).await?;
                    }
                }
                None => {
                    // Queued, not seated: a waiter of this session given up just before.
                    self.untouched(&won.key, campaign, before);
                    return Ok(None);
                }
            }
        }
        self.won_try(won, campaign, "seat", &mut turn).await
    }

    /// A try that won (a leadership or a seat): the runway, then the handle.
    async fn won_try(
        &self,
        won: LeaderKey,
        campaign: u64,
        what: &'static str,
        turn: &mut Option<elections::Turn>,
    ) -> Result<Option<Leadership>> {
        self.runway(&won, campaign, turn).await?;
        tracing::info!(election = %self.name, token = %won.token, what, "acquired by a try");
        Ok(Some(Leadership::new(
            self.store.clone(),
            self.session.clone(),
            won,
            campaign,
            self.held.clone(),
        )))
    }

    /// A try that ends without a leadership, having written nothing: see
    /// [`SessionHandle::give_back_untouched`]. A withdrawal its turn called off is handed
    /// over again, on the try's behalf.
    fn untouched(&self, key: impl AsRef<[u8]>, campaign: u64, before: Before) {
        if self
            .session
            .give_back_untouched(&self.name, campaign, before)
        {
            self.withdraw(
                LeaderKey {
                    name: self.name.clone(),
                    key: Bytes::copy_from_slice(key.as_ref()),
                    token: Revision::ZERO,
                    lease: self.session.lease(),
                },
                campaign,
            );
        }
    }

    /// Hands a key this session may have written to the session, which deletes it in the
    /// background unless a newer campaign takes it over.
    fn withdraw(&self, key: LeaderKey, campaign: u64) {
        if let elections::Cleanup::HandOff(withdraw) = self.session.cleanup(&self.name, campaign) {
            withdraw(self.store.clone(), key);
        }
    }

    fn ended(&self, end: SessionEnd) -> Error {
        Error::CandidacyLost {
            election: self.name.clone(),
            key: candidate_key(&self.name, self.session.lease()),
            lease: self.session.lease(),
            reason: format!("the session ended: {end}"),
        }
    }
}

/// A `try_campaign` under way: dropped before it finishes, it withdraws the key it may
/// have written (after the write settles: the withdrawal waits for the session's turn, which
/// the write holds until then).
struct Unfinished<'a> {
    election: &'a Election,
    campaign: u64,
    key: Option<LeaderKey>,
}

impl Unfinished<'_> {
    /// It finished: what became of the key is the outcome's business.
    fn finish(mut self) {
        self.key = None;
    }
}

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            self.election.withdraw(key, self.campaign);
        }
    }
}
