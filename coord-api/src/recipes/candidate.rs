//! [`Candidate`]: campaign, work while leading, stop the work on loss, campaign again.
//!
//! Every elected service writes this loop, and gets one of its edges wrong: the work of a lost
//! term still running when the next term starts, a candidate that re-campaigns in a tight loop
//! against a flapping store, a leadership dropped without resigning. The candidate owns the
//! loop; the service writes only the work of one term.
//!
//! The promises:
//! * **The work of two terms never overlaps.** When renewals stop working, the term is
//!   declared over a grace before the session's deadline (which the store's expiry cannot
//!   precede), and its work is dropped if it has not returned by the deadline; a term handed
//!   over (the work returned, the candidate stopped) resigns only once its work has stopped;
//!   and the candidate campaigns again only after that. So the next leader, here or
//!   elsewhere, starts after this term's work ended. What no client can see in time (an
//!   operator deleting the key, a process paused past its deadline) is what the term's
//!   [`Fence`] is for: the store refuses a deposed term's writes.
//! * **Anti-flap.** After a term ends, the candidate rests before campaigning again
//!   ([`CandidateConfig::rest`]), so a host whose lease keeps dying does not win and lose in a
//!   tight loop, and a term whose work returned hands over to someone else.
//! * **Clean hand-over.** A term whose work returned, and a candidate stopped or dropped,
//!   resigns: the next leader need not wait for a TTL.

use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use super::election::{Fence, Leadership, Unresigned};
use super::loss::LossReason;
use super::pool::ElectionPool;
use super::task::Task;
use crate::error::{Error, Result};
use crate::leader_key::LeaderKey;
use crate::retry::{self, Backoff};
use crate::sync::{watch, Stop};
use crate::txn::{TxnRequest, TxnResponse};
use crate::types::Revision;
use std::ops::ControlFlow;

/// What a [`Candidate`] campaigns for, and how it paces itself.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CandidateConfig {
    /// The election.
    pub name: String,
    /// The value the candidate's key holds (who it is, where to reach it).
    pub value: Bytes,
    /// How long to wait after a term ends before campaigning again (default 1 s).
    pub rest: Duration,
    /// How long a term's work has to wind down. The term is declared over this long before
    /// the leadership's deadline when renewals stop working (so the work can stop before the
    /// store could elect someone else), and a work told its term is over is dropped
    /// (cancelled at its next `.await`) after this long, or at the deadline if that is
    /// sooner. `None` (the default) is [`default_grace`](Self::default_grace) of the
    /// session's TTL.
    pub grace: Option<Duration>,
    /// First delay before campaigning again after a campaign failed (default 100 ms); it
    /// doubles, with jitter.
    pub initial_backoff: Duration,
    /// Largest delay between failed campaigns (default 5 s).
    pub max_backoff: Duration,
}

impl CandidateConfig {
    /// Campaign in `name` with `value`, with the defaults above.
    pub fn new(name: impl Into<String>, value: impl Into<Bytes>) -> Self {
        CandidateConfig {
            name: name.into(),
            value: value.into(),
            rest: Duration::from_secs(1),
            grace: None,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
        }
    }

    /// Rest this long between terms.
    pub fn with_rest(mut self, rest: Duration) -> Self {
        self.rest = rest;
        self
    }

    /// The grace a term gets when none is configured: a quarter of the session's TTL.
    ///
    /// ```
    /// use std::time::Duration;
    /// use coord_api::recipes::CandidateConfig;
    /// assert_eq!(CandidateConfig::default_grace(Duration::from_secs(10)), Duration::from_millis(2500));
    /// ```
    pub fn default_grace(ttl: Duration) -> Duration {
        ttl / 4
    }

    /// Give a term's work this long to wind down (see [`grace`](Self::grace)).
    pub fn with_grace(mut self, grace: Duration) -> Self {
        self.grace = Some(grace);
        self
    }

    /// Back off from `initial` to at most `max` between failed campaigns.
    pub fn with_backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.initial_backoff = initial;
        self.max_backoff = max;
        self
    }
}

/// One term of a [`Candidate`]: what its work needs to act as leader.
#[derive(Debug, Clone)]
pub struct Term {
    number: u64,
    key: LeaderKey,
    fence: Fence,
    over: Stop,
    end: Arc<OnceLock<TermEnd>>,
}

impl Term {
    /// The candidate's count of terms: 1 for its first.
    pub fn number(&self) -> u64 {
        self.number
    }

    /// The fencing token: each new leader's is larger.
    pub fn token(&self) -> Revision {
        self.key.token
    }

    /// The leader key.
    pub fn key(&self) -> &LeaderKey {
        &self.key
    }

    /// Transactions fenced by this term, for a task of the work to own.
    pub fn fence(&self) -> Fence {
        self.fence.clone()
    }

    /// Runs `txn` only while this term leads; see [`Fence::txn`]. A refusal ends the term.
    ///
    /// # Errors
    /// As [`Fence::txn`].
    pub async fn txn(&self, txn: TxnRequest) -> Result<TxnResponse> {
        self.fence.txn(txn).await
    }

    /// Resolves when the term is over (the leadership lost, or the candidate stopping): the
    /// work must then return.
    pub async fn over(&self) {
        self.over.stopped().await;
    }

    /// Whether the term is over.
    pub fn is_over(&self) -> bool {
        self.over.is_stopped()
    }

    /// Why the leadership was lost, if it was: `None` while it leads, and for a term that
    /// ended otherwise (stepped down, handed over, stopped: [`end`](Self::end) tells them
    /// apart). Set the moment the fence knows, which may be before the term is over.
    pub fn loss(&self) -> Option<LossReason> {
        self.fence.loss().filter(|l| *l != LossReason::Resigned)
    }

    /// How the term ended: `None` until it is over (set before [`over`](Self::over)
    /// resolves, so that a work told its term is over can read why).
    pub fn end(&self) -> Option<TermEnd> {
        self.end.get().copied()
    }
}

/// Where a candidate stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CandidateStatus {
    /// Campaigning (or resting between terms).
    Campaigning,
    /// Campaigns are failing (the store unreachable, the session lost while queued): the
    /// candidate campaigns again after each backoff delay, and says so here until one wins.
    Retrying {
        /// Failed campaigns since the last one that won (from 1).
        attempt: u32,
    },
    /// Leading, in the term with this token.
    Leading {
        /// The term's fencing token.
        token: Revision,
    },
    /// Stopped.
    Stopped,
}

/// A candidate that campaigns for as long as it lives, running `work` in each term it wins.
/// See the module docs.
///
/// ```no_run
/// # async fn run(store: std::sync::Arc<coord_api::DynKvLeaseStore>) -> coord_api::Result<()> {
/// use coord_api::recipes::{Candidate, CandidateConfig, ElectionPool, SessionConfig, Term};
/// use coord_api::{PutRequest, TxnRequest};
/// let pool = ElectionPool::new(store, SessionConfig::default());
/// let candidate = Candidate::spawn(&pool, CandidateConfig::new("scheduler", "web-1"), |term: Term| async move {
///     loop {
///         let tick = TxnRequest::new().and_then([PutRequest::new("scheduler/last", term.token().to_string())]);
///         tokio::select! {
///             _ = term.over() => return,
///             r = term.txn(tick) => if r.is_err() { return },
///         }
///         tokio::time::sleep(std::time::Duration::from_secs(1)).await;
///     }
/// });
/// // ... later: stop the work of the term in progress, and hand over.
/// candidate.stop().await?;
/// # Ok(()) }
/// ```
#[must_use = "dropping the candidate stops it"]
#[derive(Debug)]
pub struct Candidate {
    status: watch::Receiver<CandidateStatus>,
    task: Task,
    result: Arc<std::sync::Mutex<Option<Result<()>>>>,
}

impl Candidate {
    /// Starts campaigning on `pool` (a pool of its own, or one on the host's shared session)
    /// and running `work` in every term won. Returns at once; the first campaign may wait for
    /// the store.
    ///
    /// Dropping the handle stops the candidate in the background: the term's work is told,
    /// awaited (within the grace), and the leadership resigned.
    pub fn spawn<W, F>(pool: &ElectionPool, config: CandidateConfig, work: W) -> Candidate
    where
        W: FnMut(Term) -> F + Send + 'static,
        F: Future<Output = ()> + Send + 'static,
    {
        let (status_tx, status) = watch::channel(CandidateStatus::Campaigning);
        let result = Arc::new(std::sync::Mutex::new(None));
        let span = tracing::info_span!("candidate", election = %config.name);
        let pool = pool.clone();
        let out = result.clone();
        let task = Task::spawn(span, move |cancel| async move {
            let r = run(pool, config, work, cancel, &status_tx).await;
            status_tx.send_replace(CandidateStatus::Stopped);
            *out.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
        });
        Candidate {
            status,
            task,
            result,
        }
    }

    /// Where it stands.
    pub fn status(&self) -> CandidateStatus {
        self.status.get()
    }

    /// Follows its status.
    pub fn subscribe(&self) -> watch::Receiver<CandidateStatus> {
        self.status.clone()
    }

    /// Whether it leads now: false from the instant its term ends (the leadership lost, a
    /// step-down, the work returned, a stop), before the term's work has wound down and before
    /// the resignation.
    pub fn is_leader(&self) -> bool {
        matches!(self.status(), CandidateStatus::Leading { .. })
    }

    /// Stops: tells the term's work its term is over, waits for it (within the grace),
    /// resigns, and campaigns no more. `Ok` means its key is gone: resigned, or ended by the
    /// store itself (its lease or key reported gone, its fence refused); from a candidate
    /// still waiting, withdrawn once the campaign's write in flight settled (as
    /// [`Election::leave`](crate::recipes::Election::leave) does); from one resting between
    /// terms, the last term's key resigned now if the term could not (the store out of
    /// reach when it ended).
    ///
    /// # Errors
    /// Whatever the resignation or withdrawal fails with (the key then goes with the
    /// session's lease); a stopped pool's [`Error::Cancelled`] if the candidate had stopped
    /// on its own for that.
    pub async fn stop(mut self) -> Result<()> {
        self.task.stop().await;
        self.result
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .unwrap_or(Ok(()))
    }
}

/// How a [`Term`] ended: [`Term::end`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TermEnd {
    /// The leadership was lost: the store ended it, or this process's view of it (the
    /// session's deadline passed).
    Lost(LossReason),
    /// Renewals stopped working and less than the grace was left before the deadline: the
    /// term stepped down, its key standing until the resignation (or its lease) removed it.
    SteppedDown,
    /// The work returned: the leadership was handed over.
    WorkReturned,
    /// The candidate was stopped.
    Stopped,
}

impl TermEnd {
    fn describe(&self) -> &'static str {
        match self {
            TermEnd::Lost(_) => "lost",
            TermEnd::SteppedDown => "stepped down before the deadline",
            TermEnd::WorkReturned => "work returned",
            TermEnd::Stopped => "candidate stopping",
        }
    }
}

/// Whether the store itself ended the leader key: it reported the lease gone, the key
/// deleted, or refused the key's fence. The other losses are this process's view alone.
fn store_ended_key(why: LossReason) -> bool {
    matches!(
        why,
        LossReason::LeaseLost | LossReason::KeyDeleted | LossReason::FencedOut
    )
}

/// Resolves once less than `grace` is left before the leadership's deadline (renewals stopped
/// working), so that the work can wind down before the store could elect someone else.
async fn step_down(leadership: &Leadership, grace: Duration) {
    loop {
        let at = leadership
            .deadline()
            .checked_sub(grace)
            .unwrap_or_else(Instant::now);
        if Instant::now() >= at {
            return;
        }
        tokio::time::sleep_until(at).await;
    }
}

/// The candidate's loop; see the module docs.
async fn run<W, F>(
    pool: ElectionPool,
    config: CandidateConfig,
    mut work: W,
    cancel: Stop,
    status: &watch::Sender<CandidateStatus>,
) -> Result<()>
where
    W: FnMut(Term) -> F + Send + 'static,
    F: Future<Output = ()> + Send + 'static,
{
    let seed = retry::seed(&[config.name.as_bytes(), &config.value]);
    let mut backoff = Backoff::new(config.initial_backoff, config.max_backoff, seed);
    let mut terms = 0;
    loop {
        let campaigned = {
            let (pool, config, cancel) = (&pool, &config, &cancel);
            let status = &status;
            retry::until(&mut backoff, cancel.stopped(), move |attempt| async move {
                let won = tokio::select! {
                    biased;
                    _ = cancel.stopped() => return ControlFlow::Break(None),
                    r = pool.campaign(&config.name, config.value.clone()) => r,
                };
                match won {
                    Ok(l) => ControlFlow::Break(Some(Ok(l))),
                    Err(e @ Error::Cancelled { .. }) => {
                        tracing::info!(
                            error = &e as &dyn std::error::Error,
                            "the candidate's pool is stopped; candidate stops"
                        );
                        ControlFlow::Break(Some(Err(e)))
                    }
                    Err(e) => {
                        tracing::debug!(
                            error = &e as &dyn std::error::Error,
                            attempt,
                            "campaign failed; campaigning again"
                        );
                        status.send_replace(CandidateStatus::Retrying { attempt });
                        ControlFlow::Continue(())
                    }
                }
            })
        };
        let leadership = match campaigned.await {
            Ok(Some(Ok(l))) => l,
            Ok(Some(Err(e))) => return Err(e),
            Ok(None) | Err(()) => return pool.leave(&config.name).await,
        };
        backoff.reset();
        terms += 1;
        let end = term(&config, leadership, terms, &mut work, &cancel, status).await;
        status.send_replace(CandidateStatus::Campaigning);
        let standing = match end {
            Outcome::Stopped(result) => return result,
            Outcome::Over(standing) => standing,
        };
        tokio::select! {
            biased;
            // The stop wants the key gone: a key the term could not resign (its outcome
            // unknown, or only this process's view of the leadership ended) is resigned now,
            // in the session's turn, and the stop says whether it is gone.
            _ = cancel.stopped() => return match standing {
                Some(_) if crate::hooks::planted::enabled(crate::hooks::planted::Bug::CandidateRestForgetsItsKey) => Ok(()),
                Some(key) => key.resign().await,
                None => Ok(()),
            },
            _ = tokio::time::sleep(config.rest) => {}
        }
        // The next campaign rides on the same lease, so it takes the key over.
        drop(standing);
    }
}

enum Outcome {
    /// The candidate stopped during the term; the resignation's result.
    Stopped(Result<()>),
    /// The term is over; campaign again. Holds the key when it may still stand (its
    /// resignation failed or was not sent), for a stop during the rest to resign.
    Over(Option<Unresigned>),
}

/// Runs one term: the work until the leadership is lost, the work returns, or the candidate
/// stops; then the work's end, and the resignation.
async fn term<W, F>(
    config: &CandidateConfig,
    leadership: Leadership,
    number: u64,
    work: &mut W,
    cancel: &Stop,
    status: &watch::Sender<CandidateStatus>,
) -> Outcome
where
    W: FnMut(Term) -> F,
    F: Future<Output = ()> + Send + 'static,
{
    let token = leadership.token();
    let over = Stop::new();
    let ended = Arc::new(OnceLock::new());
    let t = Term {
        number,
        key: leadership.key().clone(),
        fence: leadership.fence(),
        over: over.clone(),
        end: ended.clone(),
    };
    status.send_replace(CandidateStatus::Leading { token });
    tracing::info!(token = %token, term = number, "term started");
    let grace = config
        .grace
        .unwrap_or_else(|| CandidateConfig::default_grace(leadership.ttl()));
    let mut running = Box::pin(work(t));
    let end = tokio::select! {
        biased;
        _ = cancel.stopped() => TermEnd::Stopped,
        why = leadership.lost() => TermEnd::Lost(why),
        () = step_down(&leadership, grace) => TermEnd::SteppedDown,
        () = &mut running => TermEnd::WorkReturned,
    };
    // The status is trusted like the fence: it stops saying Leading now, before the work is
    // told and wound down (its grace) and before the resignation, so a service guarding work
    // with `is_leader()` never sees two leaders at once.
    status.send_replace(CandidateStatus::Campaigning);
    let _ = ended.set(end);
    over.stop();
    if !matches!(end, TermEnd::WorkReturned) {
        // The work has its grace, and never past the deadline: the store may elect someone
        // else from then on.
        let until = (Instant::now() + grace).min(leadership.deadline());
        if crate::hooks::planted::enabled(crate::hooks::planted::Bug::CandidateSkipsWorkWait) {
            tokio::spawn(running);
        } else if matches!(end, TermEnd::Stopped)
            && crate::hooks::planted::enabled(
                crate::hooks::planted::Bug::CandidateStopWaitsOutItsWork,
            )
        {
            running.await;
        } else if tokio::time::timeout_at(until, running).await.is_err() {
            tracing::warn!(token = %token, grace_ms = grace.as_millis() as u64, "the term's work did not return in time; dropped");
        }
    }
    match end {
        TermEnd::Lost(why) => {
            tracing::info!(token = %token, reason = %why, "term lost");
            if store_ended_key(why) {
                if cancel.is_stopped() {
                    Outcome::Stopped(Ok(()))
                } else {
                    Outcome::Over(None)
                }
            } else if !cancel.is_stopped() {
                Outcome::Over(Some(leadership.unresigned()))
            } else {
                // Only this process's view of the leadership ended: the key may stand (a
                // restarted store renews every lease), so the stop is clean only once the
                // resignation deleted it.
                Outcome::Stopped(leadership.resign().await)
            }
        }
        TermEnd::SteppedDown => {
            // The store is likely out of reach: the resignation is a courtesy to the next
            // leader, and the key goes with the lease otherwise.
            let asked_before = cancel.is_stopped();
            let mut resigned = leadership.hand_over().await;
            tracing::info!(token = %token, resigned = resigned.is_ok(), "stepped down before the deadline");
            if !cancel.is_stopped() {
                return Outcome::Over(resigned.is_err().then(|| leadership.unresigned()));
            }
            // A stop asked for meanwhile wants the key gone, and says whether it is: the
            // store may answer again by now (the failed resignation was sent before it).
            if resigned.is_err() && !asked_before {
                resigned = leadership.hand_over().await;
            }
            Outcome::Stopped(resigned)
        }
        TermEnd::WorkReturned | TermEnd::Stopped => {
            let resigned = leadership.hand_over().await;
            tracing::info!(token = %token, how = end.describe(), resigned = resigned.is_ok(), "term over");
            if cancel.is_stopped() {
                Outcome::Stopped(resigned)
            } else {
                Outcome::Over(resigned.is_err().then(|| leadership.unresigned()))
            }
        }
    }
}
