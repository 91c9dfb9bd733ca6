//! The planted bugs the chaos runs cannot see, each caught by the suite that holds its promise.
//!
//! - `failover-stays-on-no-leader` keeps an `EtcdStore` on a member that answers `no leader`.
//!   A session leaves such a member on its own (an abandoned renewal moves the pool), so the
//!   chaos checkers, whose nodes all hold sessions, never see it; the member suites' bare
//!   client (`members/bare.rs`: no session, no watcher) must.
//! - `sim-prefix-compare-checks-last-key` makes `SimStore` judge a prefix compare by its last
//!   key alone; the conformance kit's prefix case passes on it, and only the differential
//!   test's prefix compares, against real etcd, show the simulator wrong.
//! - `candidate-stop-leaves-its-queued-key` lets a waiting candidate's stop return before
//!   its key is gone; only a campaign write held in flight during the stop (the recipe case
//!   `in_flight::a_candidate_stop_outlasts_its_held_campaign_write`, on the simulator) lands
//!   after the background withdrawal and leaves the key standing.
//! - `unknown-write-not-fenced` lets a session's candidate write whose outcome is unknown
//!   land after the withdrawal that followed it; only a write its client gave up on while it
//!   was held, released after `leave()` (the recipe case
//!   `in_flight::a_leave_outlasts_a_campaign_write_of_unknown_outcome`, on the simulator),
//!   brings the key back every time. Over turmoil, a stalled member does it now and then.
//! - `candidate-rest-forgets-its-key` lets a candidate stopped between terms return `Ok`
//!   with a key its failed resignation left; the chaos nodes meet that rarely (9 of 10,000
//!   seeds when first seen), the recipe case
//!   `candidate::a_candidate_stopped_resting_after_a_failed_resignation_resigns` every time.
//! - `postgres-revision-from-a-sequence` makes `PostgresStore` take revisions from a
//!   sequence, unlocked: only writers racing on a real server commit out of revision order,
//!   and a watch then misses a write (`postgres/ordering.rs`).
//! - `postgres-watch-fed-by-notifications` drops `PostgresStore`'s poll of the revision: a
//!   write whose notification was lost while the watching store was cut off never reaches
//!   its watch (`postgres/notifications.rs`).
//! - `postgres-retries-an-unknown-commit` sends a transaction again when its commit's answer
//!   was lost: a commit the server holds past the request timeout applies, and the second
//!   attempt reports the caller's own create as a failed compare (`postgres/commit.rs`).
//!
//! Built only with `--features planted-bugs` (coord-api then compiles its planted defects in,
//! all off); a bug is switched on process-wide, so this binary holds one test, and each suite
//! is first run clean, so that a catch is the bug's doing.

#[path = "members/bare.rs"]
mod bare;
// The harness serves the member probe too; this binary runs the bare case alone.
#[allow(dead_code)]
#[path = "members/cluster.rs"]
mod cluster;
#[path = "postgres/commit.rs"]
mod postgres_commit;
#[path = "postgres/notifications.rs"]
mod postgres_notifications;
// What a passing run covered goes unread here.
#[path = "postgres/ordering.rs"]
mod postgres_ordering;
#[allow(dead_code)]
#[path = "differential/sequences.rs"]
mod sequences;
#[allow(dead_code)]
#[path = "members/sim.rs"]
mod sim;
#[path = "recipes/sim_fixture.rs"]
mod sim_fixture;

use std::panic::{catch_unwind, AssertUnwindSafe};

use coord_api::hooks::planted::{self, Bug};
use coord_sim::grpc::EtcdVersion;

/// The differential's sequences per run, from a fixed seed: enough that a prefix compare
/// meets keys that disagree (the bug's divergence came within the first 30 when measured).
const SEQUENCES: u32 = 100;
const SEED: u64 = 1;

fn bare_case() -> bool {
    catch_unwind(AssertUnwindSafe(|| {
        sim::on_the_simulator(EtcdVersion::V3_5, |m| async move {
            bare::bare_requests(&m).await
        })
    }))
    .is_ok()
}

fn differential() -> bool {
    // A catch is all this asks: no shrinking.
    match sequences::sim_and_etcd_agree(SEQUENCES, sequences::rng(SEED), 0) {
        Ok(_) => true,
        Err(e) => {
            println!("differential: {}", e.lines().next().unwrap_or_default());
            false
        }
    }
}

fn candidate_stop_in_flight() -> bool {
    use coord_api::testkit::recipes::in_flight;
    catch_unwind(AssertUnwindSafe(|| {
        sim_fixture::run(|fx| {
            Box::pin(in_flight::a_candidate_stop_outlasts_its_held_campaign_write(fx))
        })
    }))
    .is_ok()
}

fn unknown_outcome() -> bool {
    use coord_api::testkit::recipes::in_flight;
    catch_unwind(AssertUnwindSafe(|| {
        sim_fixture::run(|fx| {
            Box::pin(in_flight::a_leave_outlasts_a_campaign_write_of_unknown_outcome(fx))
        })
    }))
    .is_ok()
}

fn candidate_stop_resting() -> bool {
    use coord_api::testkit::recipes::candidate;
    catch_unwind(AssertUnwindSafe(|| {
        sim_fixture::run(|fx| {
            Box::pin(candidate::a_candidate_stopped_resting_after_a_failed_resignation_resigns(fx))
        })
    }))
    .is_ok()
}

/// Runs one PostgreSQL case on a runtime of its own; true if it passed.
fn postgres_case(case: fn() -> futures::future::BoxFuture<'static, ()>) -> bool {
    catch_unwind(AssertUnwindSafe(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime")
            .block_on(case())
    }))
    .is_ok()
}

fn postgres_ordering() -> bool {
    postgres_case(|| {
        Box::pin(postgres_ordering::concurrent_writes_reach_a_watch_in_revision_order())
    })
}

fn postgres_notifications() -> bool {
    postgres_case(|| {
        Box::pin(postgres_notifications::a_write_whose_notification_was_lost_reaches_the_watch())
    })
}

fn postgres_commit() -> bool {
    postgres_case(|| Box::pin(postgres_commit::a_held_commit_is_indeterminate_and_not_sent_again()))
}

/// A bug, the suite that must catch it, and a run of that suite (true: it passed).
type Hunt = (Bug, &'static str, fn() -> bool);

#[test]
fn each_planted_bug_is_caught_by_its_suite() {
    let hunts: [Hunt; 8] = [
        (
            Bug::FailoverStaysOnNoLeader,
            "the bare-request case",
            bare_case,
        ),
        (
            Bug::SimPrefixCompareChecksLastKey,
            "the differential test",
            differential,
        ),
        (
            Bug::CandidateStopLeavesItsQueuedKey,
            "the recipe case holding a candidate's campaign write in flight during its stop",
            candidate_stop_in_flight,
        ),
        (
            Bug::UnknownWriteNotFenced,
            "the recipe case whose campaign write is given up on while held",
            unknown_outcome,
        ),
        (
            Bug::CandidateRestForgetsItsKey,
            "the recipe case stopping a candidate resting after a failed resignation",
            candidate_stop_resting,
        ),
        (
            Bug::PostgresRevisionFromSequence,
            "the concurrent writers' reads and watch on real PostgreSQL",
            postgres_ordering,
        ),
        (
            Bug::PostgresWatchFedByNotifications,
            "the write whose notification was lost, on real PostgreSQL",
            postgres_notifications,
        ),
        (
            Bug::PostgresRetriesUnknownCommit,
            "the commit held past the request timeout, on real PostgreSQL",
            postgres_commit,
        ),
    ];
    let mut missed = Vec::new();
    for (bug, suite, passes) in hunts {
        planted::enable(&[]);
        assert!(passes(), "{suite} fails with no bug planted");
        planted::enable(&[bug]);
        let caught = !passes();
        planted::enable(&[]);
        println!(
            "{:<36} {} by {suite}",
            bug.name(),
            if caught { "caught" } else { "MISSED" }
        );
        if !caught {
            missed.push(bug.name());
        }
    }
    assert!(
        missed.is_empty(),
        "planted bugs their suites missed: {missed:?}"
    );
}
