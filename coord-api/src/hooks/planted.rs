//! Planted bugs: deliberate defects, compiled in only with the `planted-bugs` feature and
//! switched on one at a time at run time, so the simulator's checkers can prove they catch
//! what they claim to catch (FoundationDB's and etcd's "canaries").
//!
//! Without the feature, [`enabled`] is a constant `false` and every planted branch compiles
//! away; with it, every bug is still off until [`enable`] is called. Never enable the feature
//! outside tests.

/// A deliberate defect, each one a bug that real coordination libraries have shipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Bug {
    /// A waiting campaign trusts "no predecessor left" and never re-checks that its own key
    /// still stands (etcd#11051): a deleted candidate becomes a phantom leader. Caught by S3.
    CampaignSkipsOwnKeyCheck,
    /// After a broken watch stream the cluster watcher re-watches from the current revision
    /// instead of re-listing from its own: changes made during the gap are never seen.
    /// Caught by S4/S5.
    WatcherResumesFromNow,
    /// On `Compacted` the cluster watcher resumes at the compaction point instead of
    /// re-listing: the net changes inside the compacted window are lost. Caught by S4/S5.
    WatcherIgnoresCompaction,
    /// `HostRegistration::stop` deletes the key by name instead of revoking its own lease, so
    /// it deletes another incarnation's key (etcd#22082). Caught by S6.
    StopDeletesUnconditionally,
    /// A registration whose lease is lost gives up instead of granting a new one: the host
    /// stays unregistered forever. Caught by L1.
    RegistrationGivesUpOnLoss,
    /// A session ends only when a renewal reply says the lease is gone, never at its local
    /// deadline: a partitioned leader keeps believing it leads. Caught by S2.
    StepDownOnRenewalReply,
    /// A session counts its deadline from when a renewal's reply came back, not from when it
    /// was sent: a slow reply makes it trust the lease longer than the store keeps it.
    /// Caught by S2/S3 (needs slow replies).
    SessionDeadlineFromReply,
    /// A fenced write is checked against the local belief instead of at the store: while the
    /// leadership believes it leads, the write goes out without the compare, and a leader
    /// that was paused (or cut off) after checking writes over its successor. Caught by the
    /// fence invariant (S1).
    FenceCheckedLocally,
    /// `HostRegistration::stop` neither ends nor waits for a heal in progress, which then
    /// writes the key after the stop returned. Caught by L7.
    StopSkipsTheHeal,
    /// The cluster watcher paces its reopens and re-lists with a registration's backoff
    /// (100 ms doubling to 30 s) that never starts over: after a run of failed reopens, the
    /// watcher sleeps on long after the store answers again. Caught by L8 (current again
    /// within its bound of a heal).
    WatcherBackoffNeverResets,
    /// A registration's backoff does not start over after a heal: the next loss waits twice
    /// as long, then four times... Caught by L1 (a lone loss healed in the first step).
    BackoffNeverResets,
    /// A heal writes the metadata the registration started with, not the latest. Caught by
    /// M1.
    HealWritesFirstMetadata,
    /// A session treats a closed keep-alive stream as a lost lease, so a registration
    /// re-grants (and watchers see its lease change) on every stream close. Caught by L2.
    RegrantOnClosedStream,
    /// The cluster watcher emits a batch's events before it publishes the view they
    /// explain. Caught by C1 when schedules are explored.
    WatcherEmitsBeforePublish,
    /// A candidate that loses its term campaigns again without waiting for the term's work
    /// to stop: the old term's work runs on beside the next one's. Caught by W1.
    CandidateSkipsWorkWait,
    /// `try_lock` (and `try_campaign`) takes the lock when its own key is absent, instead of
    /// when no key at all is queued: it walks past the holder. Caught by S2 and the fence (S1).
    TryLockIgnoresTheQueue,
    /// A semaphore counts its seats one too many: N + 1 sessions hold permits at once. Caught
    /// by P1 and P2.
    SemaphoreOneTooMany,
    /// The cluster watcher takes the answer to its progress request as a progress
    /// notification and moves its resume point to the answer's revision, so events the
    /// answer overtook (etcd 3.4 sends it ahead of queued events) are dropped as already
    /// seen. Caught by S4/S5.
    WatcherTrustsProgressAnswers,
    /// `EtcdStore` retries a member that answers `no leader` instead of moving to the next:
    /// a client whose member is cut off from its peers stays on it while a majority serves.
    /// A session leaves such a member on its own (its renewals go unanswered there, and an
    /// abandoned renewal moves the pool), so the chaos runs cannot see it; a client with no
    /// session can. Caught by the member suites' bare-request case (coord-tests'
    /// `planted_suites`), not by the chaos checkers.
    FailoverStaysOnNoLeader,
    /// A semaphore's waiter follows only its own key, not the keys ahead of it: a release
    /// never wakes it, and a seat it reaches goes unused (its key holds the seat, nobody
    /// believes in it) until its session ends. Caught by P4.
    SemaphoreWaiterNeverWakes,
    /// A leadership's resign deletes its key even after a newer campaign of the same session
    /// rejoined it (the two share the key, create revision and all): the node's own hand-over
    /// deposes the leadership it handed over to. Caught by S9.
    ResignIgnoresNewerCampaign,
    /// A registration's heal waits out its lease's grant when stopped (the stop waits for it),
    /// then writes the key: seconds after the stop was asked, over a newer incarnation's key
    /// in a rolling restart. Caught by L7 (a write of the host key sent after the stop was
    /// asked).
    HealOutlivesTheStop,
    /// `EtcdStore` replaces the connection of a renewal the session abandoned unanswered but
    /// keeps requests on the same member: on a stalled or slow member the renewal sent instead
    /// waits there too, and the session runs out while two healthy members stand beside it.
    /// Caught by L2 (a follower stalled or slow is ridden through), over turmoil with members.
    AbandonedRenewalStaysOnMember,
    /// A mutex guard's `unlock` hands its key's delete to the background (as a drop does) and
    /// returns `Ok` at once: the lock is free a moment later, so exclusivity and liveness
    /// hold, but a caller told "released" may exit with its key still standing. Caught only
    /// by L7 on a hold's end (a clean unlock leaves no key).
    UnlockReturnsBeforeDelete,
    /// `SimStore` judges a compare over a prefix by the last key under it alone, where etcd
    /// requires every key to pass: a transaction the simulator accepts, etcd refuses. Caught
    /// only by the differential test's prefix compares (coord-tests' `planted_suites`), not by
    /// the conformance kit's prefix case nor the chaos checkers.
    SimPrefixCompareChecksLastKey,
    /// A candidate's stop waits for its term's work to return, without the grace a loss
    /// gives it: work that ignores the end runs on, and the stop with it, while the key's
    /// lease runs out and another node leads. Caught by W1, only since the chaos nodes' work
    /// now and then never returns on its own (0 of 200 seeds before, 9 of 40 after).
    CandidateStopWaitsOutItsWork,
    /// A candidate stopped while it waits in the queue returns at once and leaves its key to
    /// a background withdrawal, which a campaign write still in flight can overtake: the
    /// key stands after `stop` returned `Ok`, a candidate nobody runs. Caught by the recipe
    /// case that holds the campaign's write in flight during the stop, on the simulator
    /// (coord-tests' `planted_suites`), and by L7 since the chaos nodes' part stops reach a
    /// candidate still in the queue.
    CandidateStopLeavesItsQueuedKey,
    /// A candidate stopped while it rests between terms returns `Ok` without a look back:
    /// a term whose resignation failed (its store out of reach) leaves its key standing
    /// under the live lease, and the stop says it is gone. Caught by the recipe case that
    /// stops a candidate resting after a failed resignation (coord-tests'
    /// `planted_suites`).
    CandidateRestForgetsItsKey,
    /// `PostgresStore` takes each write's revision from a sequence instead of under the
    /// writers' lock (kine's and many outbox tables' mistake): two writers commit out of
    /// revision order, and a watch that has read up to the later revision never sees the
    /// earlier one. Caught by coord-tests' concurrent writers' watch (`planted_suites`).
    PostgresRevisionFromSequence,
    /// `PostgresStore`'s watches learn of new revisions from notifications alone (no poll):
    /// a notification lost while the listener's connection was down leaves a committed write
    /// undelivered until some later write wakes the watch. Caught by coord-tests' missed
    /// notification case (`planted_suites`).
    PostgresWatchFedByNotifications,
    /// `PostgresStore` sends a transaction again when the answer to its commit was lost, as
    /// if it had failed: the first attempt commits after all, and the second, judged against
    /// it, reports the compare failed (or writes twice). Caught by coord-tests' held-commit
    /// case (`planted_suites`).
    PostgresRetriesUnknownCommit,
    /// A session's write of its candidate key whose outcome is unknown is not fenced before
    /// its turn passes on: a campaign's write held by a stalled member applies after the
    /// withdrawal that followed it (the key stands again, a candidate nobody runs), a
    /// resignation after a newer campaign took the key over (the session deposes itself).
    /// Caught by the recipe cases that hold such a write past the point its client gives up
    /// (coord-tests' `planted_suites`), and by L7 and S9 over turmoil now and then.
    UnknownWriteNotFenced,
}

impl Bug {
    /// Every planted bug.
    pub const ALL: [Bug; 32] = [
        Bug::CampaignSkipsOwnKeyCheck,
        Bug::WatcherResumesFromNow,
        Bug::WatcherIgnoresCompaction,
        Bug::StopDeletesUnconditionally,
        Bug::RegistrationGivesUpOnLoss,
        Bug::StepDownOnRenewalReply,
        Bug::SessionDeadlineFromReply,
        Bug::FenceCheckedLocally,
        Bug::StopSkipsTheHeal,
        Bug::BackoffNeverResets,
        Bug::HealWritesFirstMetadata,
        Bug::RegrantOnClosedStream,
        Bug::WatcherEmitsBeforePublish,
        Bug::CandidateSkipsWorkWait,
        Bug::TryLockIgnoresTheQueue,
        Bug::SemaphoreOneTooMany,
        Bug::WatcherTrustsProgressAnswers,
        Bug::FailoverStaysOnNoLeader,
        Bug::SemaphoreWaiterNeverWakes,
        Bug::ResignIgnoresNewerCampaign,
        Bug::HealOutlivesTheStop,
        Bug::AbandonedRenewalStaysOnMember,
        Bug::UnlockReturnsBeforeDelete,
        Bug::SimPrefixCompareChecksLastKey,
        Bug::CandidateStopWaitsOutItsWork,
        Bug::CandidateStopLeavesItsQueuedKey,
        Bug::CandidateRestForgetsItsKey,
        Bug::PostgresRevisionFromSequence,
        Bug::PostgresWatchFedByNotifications,
        Bug::PostgresRetriesUnknownCommit,
        Bug::WatcherBackoffNeverResets,
        Bug::UnknownWriteNotFenced,
    ];

    /// A stable name for command lines and reports.
    pub fn name(self) -> &'static str {
        match self {
            Bug::CampaignSkipsOwnKeyCheck => "campaign-skips-own-key-check",
            Bug::WatcherResumesFromNow => "watcher-resumes-from-now",
            Bug::WatcherIgnoresCompaction => "watcher-ignores-compaction",
            Bug::StopDeletesUnconditionally => "stop-deletes-unconditionally",
            Bug::RegistrationGivesUpOnLoss => "registration-gives-up-on-loss",
            Bug::StepDownOnRenewalReply => "step-down-on-renewal-reply",
            Bug::SessionDeadlineFromReply => "session-deadline-from-reply",
            Bug::FenceCheckedLocally => "fence-checked-locally",
            Bug::StopSkipsTheHeal => "stop-skips-the-heal",
            Bug::BackoffNeverResets => "backoff-never-resets",
            Bug::WatcherBackoffNeverResets => "watcher-backoff-never-resets",
            Bug::HealWritesFirstMetadata => "heal-writes-first-metadata",
            Bug::RegrantOnClosedStream => "regrant-on-closed-stream",
            Bug::WatcherEmitsBeforePublish => "watcher-emits-before-publish",
            Bug::CandidateSkipsWorkWait => "candidate-skips-work-wait",
            Bug::TryLockIgnoresTheQueue => "try-lock-ignores-the-queue",
            Bug::SemaphoreOneTooMany => "semaphore-one-too-many",
            Bug::WatcherTrustsProgressAnswers => "watcher-trusts-progress-answers",
            Bug::FailoverStaysOnNoLeader => "failover-stays-on-no-leader",
            Bug::SemaphoreWaiterNeverWakes => "semaphore-waiter-never-wakes",
            Bug::ResignIgnoresNewerCampaign => "resign-ignores-newer-campaign",
            Bug::HealOutlivesTheStop => "heal-outlives-the-stop",
            Bug::AbandonedRenewalStaysOnMember => "abandoned-renewal-stays-on-member",
            Bug::UnlockReturnsBeforeDelete => "unlock-returns-before-delete",
            Bug::SimPrefixCompareChecksLastKey => "sim-prefix-compare-checks-last-key",
            Bug::CandidateStopWaitsOutItsWork => "candidate-stop-waits-out-its-work",
            Bug::CandidateStopLeavesItsQueuedKey => "candidate-stop-leaves-its-queued-key",
            Bug::CandidateRestForgetsItsKey => "candidate-rest-forgets-its-key",
            Bug::PostgresRevisionFromSequence => "postgres-revision-from-a-sequence",
            Bug::PostgresWatchFedByNotifications => "postgres-watch-fed-by-notifications",
            Bug::PostgresRetriesUnknownCommit => "postgres-retries-an-unknown-commit",
            Bug::UnknownWriteNotFenced => "unknown-write-not-fenced",
        }
    }

    /// The bug named `name` (see [`name`](Self::name)).
    pub fn from_name(name: &str) -> Option<Bug> {
        Bug::ALL.into_iter().find(|b| b.name() == name)
    }

    #[cfg(feature = "planted-bugs")]
    fn bit(self) -> u32 {
        1 << (self as u32)
    }
}

#[cfg(feature = "planted-bugs")]
static ENABLED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Whether `bug` is switched on. Always `false` without the `planted-bugs` feature.
#[inline]
pub fn enabled(bug: Bug) -> bool {
    #[cfg(feature = "planted-bugs")]
    {
        ENABLED.load(std::sync::atomic::Ordering::Relaxed) & bug.bit() != 0
    }
    #[cfg(not(feature = "planted-bugs"))]
    {
        let _ = bug;
        false
    }
}

/// Whether this build can plant bugs at all (the `planted-bugs` feature).
pub const AVAILABLE: bool = cfg!(feature = "planted-bugs");

/// Switches exactly `bugs` on, process-wide (every other bug off).
///
/// # Panics
/// When asked to switch a bug on in a build without the `planted-bugs` feature: a test that
/// believes it planted a bug must not silently run without it.
pub fn enable(bugs: &[Bug]) {
    #[cfg(feature = "planted-bugs")]
    {
        let mask = bugs.iter().fold(0, |m, b| m | b.bit());
        ENABLED.store(mask, std::sync::atomic::Ordering::SeqCst);
    }
    #[cfg(not(feature = "planted-bugs"))]
    assert!(
        bugs.is_empty(),
        "planted bugs need the `planted-bugs` feature of coord-api"
    );
}
