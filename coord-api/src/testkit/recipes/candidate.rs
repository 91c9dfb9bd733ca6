//! The cases of `Candidate`.

use std::sync::Arc;
use std::time::Duration;

use crate::recipes::{
    Candidate, CandidateConfig, CandidateStatus, ElectionPool, LossReason, SessionConfig, Term,
    TermEnd,
};
use crate::testkit::{eventually, within};
use crate::{Error, KvLeaseStore, KvLeaseStoreExt};
use tokio::time::Instant;

use super::fixture::Fixture;
use super::support::*;

/// The work of each term a candidate won: its token, when it began, when it stopped.
#[derive(Debug, Clone)]
struct Worked {
    who: &'static str,
    token: crate::Revision,
    from: Instant,
    until: Option<Instant>,
}

type Log = Arc<std::sync::Mutex<Vec<Worked>>>;

/// Records the end of a term's work when the work returns or is dropped.
struct Ends(Log, usize);

impl Drop for Ends {
    fn drop(&mut self) {
        self.0.lock().unwrap()[self.1].until = Some(Instant::now());
    }
}

/// Work that runs until its term is over (or, if `stubborn`, forever), recording itself.
fn logged(
    who: &'static str,
    log: &Log,
    stubborn: bool,
) -> impl FnMut(Term) -> futures::future::BoxFuture<'static, ()> + Send + 'static {
    let log = log.clone();
    move |term: Term| {
        let log = log.clone();
        Box::pin(async move {
            let i = {
                let mut l = log.lock().unwrap();
                l.push(Worked {
                    who,
                    token: term.token(),
                    from: Instant::now(),
                    until: None,
                });
                l.len() - 1
            };
            let _ends = Ends(log, i);
            if stubborn {
                std::future::pending::<()>().await;
            }
            term.over().await;
        })
    }
}

fn assert_no_overlap(log: &Log) {
    let l = log.lock().unwrap().clone();
    for (i, a) in l.iter().enumerate() {
        for b in &l[i + 1..] {
            let a_end = a.until.expect("every term's work ended");
            assert!(
                b.from >= a_end,
                "the work of {} (token {}) ran until {:?} after {} (token {}) began: {l:?}",
                a.who,
                a.token,
                a_end - b.from,
                b.who,
                b.token
            );
        }
    }
}

async fn leading(c: &Candidate, bound: Duration) -> crate::Revision {
    let mut status = c.subscribe();
    let s = within(
        bound,
        "a term",
        status.wait_for(|s| matches!(s, CandidateStatus::Leading { .. })),
    )
    .await
    .unwrap();
    match s {
        CandidateStatus::Leading { token } => token,
        _ => unreachable!(),
    }
}

pub async fn a_candidate_hands_over_only_once_its_work_stopped(fx: &dyn Fixture) {
    let store = fx.store();
    let log = Log::default();
    let config = |v: &str| CandidateConfig::new("jobs", v.to_owned());
    let pa = ElectionPool::new(store.clone(), SessionConfig::default().with_ttl(fx.ttl()));
    let pb = ElectionPool::new(store.clone(), SessionConfig::default().with_ttl(fx.ttl()));
    let a = Candidate::spawn(&pa, config("a"), logged("a", &log, false));
    let first = leading(&a, prompt(fx)).await;
    let b = Candidate::spawn(&pb, config("b"), logged("b", &log, false));
    // b waits behind a; a's stop ends a's work, then resigns, and b leads.
    tokio::time::sleep(prompt(fx)).await;
    assert!(!b.is_leader());
    a.stop().await.unwrap();
    let second = leading(&b, prompt(fx)).await;
    assert!(second > first);
    b.stop().await.unwrap();
    assert_no_overlap(&log);
    assert_eq!(log.lock().unwrap().len(), 2);
    assert!(matches!(
        store.leader("jobs").await,
        Err(Error::NoLeader { .. })
    ));
}

pub async fn a_cut_off_candidate_stops_its_work_before_anyone_else_leads(fx: &dyn Fixture) {
    let store = fx.store();
    let log = Log::default();
    let client = fx.client().await;
    let pa = ElectionPool::new(
        client.store.clone(),
        SessionConfig::default().with_ttl(fx.ttl()),
    );
    let pb = ElectionPool::new(store.clone(), SessionConfig::default().with_ttl(fx.ttl()));
    // a's work ignores the end of its term: the candidate must drop it by the deadline.
    let a = Candidate::spawn(
        &pa,
        CandidateConfig::new("jobs", "a"),
        logged("a", &log, true),
    );
    leading(&a, prompt(fx)).await;
    let b = Candidate::spawn(
        &pb,
        CandidateConfig::new("jobs", "b"),
        logged("b", &log, false),
    );
    client.cut_off(true);
    // b leads once a's lease expires at the store; a's work is gone by then.
    leading(&b, fx.ttl() * 2 + fx.slack()).await;
    assert_no_overlap(&log);
    client.cut_off(false);
    b.stop().await.unwrap();
    a.stop().await.unwrap();
}

/// A candidate stopped while it steps down cut off from the store (its deadline near, its
/// renewals unanswered) cannot resign: its stop says so rather than `Ok` (a restarted etcd
/// renews every lease, so the key may well stand), and the key goes with its lease.
pub async fn a_candidate_stopped_while_cut_off_reports_its_key_left(fx: &dyn Fixture) {
    let store = fx.store();
    let client = fx.client().await;
    let pool = ElectionPool::new(
        client.store.clone(),
        SessionConfig::default().with_ttl(fx.ttl()),
    );
    let (over_tx, mut over) = tokio::sync::mpsc::unbounded_channel();
    // The work outlives the end of its term by half its grace (a quarter of the TTL): the
    // stop comes meanwhile.
    let linger = fx.ttl() / 8;
    let work = move |term: Term| {
        let over_tx = over_tx.clone();
        async move {
            term.over().await;
            let _ = over_tx.send(());
            tokio::time::sleep(linger).await;
        }
    };
    let a = Candidate::spawn(&pool, CandidateConfig::new("jobs", "a"), work);
    leading(&a, prompt(fx)).await;
    client.cut_off(true);
    within(fx.ttl() + fx.slack(), "the term to end", over.recv())
        .await
        .unwrap();
    let stopped = a.stop().await;
    assert!(
        stopped.is_err(),
        "stop() returned Ok with the store out of reach and nothing resigned"
    );
    client.cut_off(false);
    eventually(
        fx.ttl() + fx.slack(),
        "the key to go with its lease",
        || async { store.get_prefix("jobs/").await.is_ok_and(|r| r.count == 0) },
    )
    .await;
}

/// A candidate stopped while it rests between terms, after its term's resignation failed
/// (the store out of reach as the work returned), resigns then: the key still stands under
/// the live lease, and a stop that returns `Ok` has deleted it. Where the TTL is shorter than
/// a request's timeout (real etcd's fixture) the lease runs out first and the key goes with
/// it; the simulator's keeps the key standing, which is the case that matters.
pub async fn a_candidate_stopped_resting_after_a_failed_resignation_resigns(fx: &dyn Fixture) {
    let store = fx.store();
    let client = fx.client().await;
    let pool = ElectionPool::new(
        client.store.clone(),
        SessionConfig::default().with_ttl(fx.ttl()),
    );
    let (done_tx, done) = tokio::sync::watch::channel(false);
    let work = move |_term: Term| {
        let mut done = done.clone();
        async move {
            let _ = done.wait_for(|d| *d).await;
        }
    };
    // Rests long enough that the stop comes before the next campaign.
    let config = CandidateConfig::new("jobs", "a").with_rest(fx.request_timeout() * 4);
    let a = Candidate::spawn(&pool, config, work);
    leading(&a, prompt(fx)).await;
    client.cut_off(true);
    done_tx.send_replace(true);
    // The resignation, sent as the work returned, fails within a request's timeout (a
    // shorter wait only lets it land, and the case then proves less, not wrongly).
    tokio::time::sleep(fx.request_timeout() + prompt(fx)).await;
    client.cut_off(false);
    assert!(!a.is_leader(), "the term is over");
    let stopped = a.stop().await;
    let standing = store.get_prefix("jobs/").await.unwrap().count;
    assert!(
        stopped.is_err() || standing == 0,
        "stop() returned Ok while {standing} key(s) of the election stand: the failed \
         resignation's key was left behind"
    );
    pool.stop().await.unwrap();
}

/// A candidate's status is trusted like its fence: it stops saying `Leading` the instant its
/// term ends, before the term's work has wound down (its grace) and before the resignation,
/// so that a service guarding work with `is_leader()` never sees two leaders. Here an
/// operator deletes the leader key and the work lingers past its grace.
pub async fn a_candidate_stops_saying_it_leads_the_instant_its_term_ends(fx: &dyn Fixture) {
    let store = fx.store();
    let pool = ElectionPool::new(store.clone(), SessionConfig::default().with_ttl(fx.ttl()));
    let (over_tx, mut over) = tokio::sync::mpsc::unbounded_channel();
    let (key_tx, mut key) = tokio::sync::mpsc::unbounded_channel();
    let work = move |term: Term| {
        let (over_tx, key_tx) = (over_tx.clone(), key_tx.clone());
        async move {
            let _ = key_tx.send(term.key().key.to_vec());
            term.over().await;
            let _ = over_tx.send(Instant::now());
            // Ignores the end of its term: the candidate drops it after its grace.
            std::future::pending::<()>().await;
        }
    };
    let a = Candidate::spawn(&pool, CandidateConfig::new("jobs", "a"), work);
    let first = leading(&a, prompt(fx)).await;
    let leader_key = key.recv().await.expect("the term's key");
    let mut status = a.subscribe();
    store
        .delete(crate::DeleteRequest::key(leader_key))
        .await
        .unwrap();
    within(prompt(fx), "the term to end", over.recv())
        .await
        .unwrap();
    assert!(
        !a.is_leader(),
        "the candidate says {:?} though its term's work was told the term is over",
        a.status()
    );
    // Nor says Leading in that term again while the work lingers and it resigns (a new
    // term, with a new token, may begin).
    let window = tokio::time::sleep(CandidateConfig::default_grace(fx.ttl()) + fx.slack());
    tokio::pin!(window);
    loop {
        tokio::select! {
            _ = &mut window => break,
            changed = status.changed() => {
                if changed.is_err() {
                    break;
                }
                let now = status.get_and_update();
                assert_ne!(now, CandidateStatus::Leading { token: first }, "the ended term again");
            }
        }
    }
    a.stop().await.unwrap();
}

pub async fn a_candidate_rests_between_terms_and_counts_them(fx: &dyn Fixture) {
    let store = fx.store();
    let pool = ElectionPool::new(store.clone(), SessionConfig::default().with_ttl(fx.ttl()));
    let terms = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = terms.clone();
    let rest = Duration::from_millis(300);
    // Each term's work returns at once: the candidate resigns, rests, and campaigns again.
    let c = Candidate::spawn(
        &pool,
        CandidateConfig::new("jobs", "a").with_rest(rest),
        move |term: Term| {
            seen.lock()
                .unwrap()
                .push((term.number(), term.token(), Instant::now()));
            async {}
        },
    );
    eventually(prompt(fx) * 4, "three terms", || async {
        terms.lock().unwrap().len() >= 3
    })
    .await;
    c.stop().await.unwrap();
    let terms = terms.lock().unwrap().clone();
    for pair in terms.windows(2) {
        let ((n0, t0, at0), (n1, t1, at1)) = (pair[0], pair[1]);
        assert_eq!(n1, n0 + 1, "terms are counted");
        assert!(t1 > t0, "each term's token is larger");
        assert!(at1 - at0 >= rest, "rested {:?} between terms", at1 - at0);
    }
    assert!(matches!(
        store.leader("jobs").await,
        Err(Error::NoLeader { .. })
    ));
}

/// A candidate whose campaigns fail says so ([`CandidateStatus::Retrying`]) rather than only
/// logging it, and leads once the store answers again.
pub async fn a_candidate_whose_campaigns_fail_says_so(fx: &dyn Fixture) {
    let client = fx.client().await;
    client.cut_off(true);
    let pool = ElectionPool::new(
        client.store.clone(),
        SessionConfig::default().with_ttl(fx.ttl()),
    );
    let c = Candidate::spawn(
        &pool,
        CandidateConfig::new("jobs", "c"),
        |term: Term| async move {
            term.over().await;
        },
    );
    let mut status = c.subscribe();
    // A campaign fails once its grant goes unanswered for the request timeout.
    within(
        fx.request_timeout() * 2 + prompt(fx),
        "the failing campaigns reported",
        status.wait_for(|s| matches!(s, CandidateStatus::Retrying { attempt } if *attempt >= 1)),
    )
    .await
    .unwrap();
    client.cut_off(false);
    leading(&c, fx.request_timeout() * 2 + fx.ttl() * 2).await;
    c.stop().await.unwrap();
    pool.stop().await.unwrap();
}

pub async fn a_term_says_how_it_ended(fx: &dyn Fixture) {
    let store = fx.store();
    let pool = ElectionPool::new(store.clone(), SessionConfig::default().with_ttl(fx.ttl()));
    // What each term's work saw when it was told its term was over (the second term's work
    // returns of its own accord, and is read after).
    let (ends_tx, mut ends) = tokio::sync::mpsc::unbounded_channel();
    let (started_tx, mut started) = tokio::sync::mpsc::unbounded_channel();
    let work = move |term: Term| {
        let (ends_tx, started_tx) = (ends_tx.clone(), started_tx.clone());
        async move {
            let _ = started_tx.send(term.clone());
            if term.number() == 2 {
                let _ = ends_tx.send((term.clone(), None));
                return;
            }
            term.over().await;
            let _ = ends_tx.send((term.clone(), Some(term.end())));
        }
    };
    let config = CandidateConfig::new("jobs", "a").with_rest(Duration::from_millis(100));
    let a = Candidate::spawn(&pool, config, work);
    leading(&a, prompt(fx)).await;
    let running = started.recv().await.unwrap();
    assert_eq!(running.end(), None, "a term in force has not ended");
    let leader = store.leader("jobs").await.unwrap();
    store
        .delete(crate::DeleteRequest::key(leader.key))
        .await
        .unwrap();
    let (first, seen) = within(prompt(fx), "the first term to end", ends.recv())
        .await
        .unwrap();
    assert_eq!(first.number(), 1);
    assert_eq!(
        seen,
        Some(Some(TermEnd::Lost(LossReason::KeyDeleted))),
        "the work, told its term is over, reads why"
    );
    assert_eq!(first.loss(), Some(LossReason::KeyDeleted));
    let (second, _) = within(fx.ttl() + prompt(fx), "the second term", ends.recv())
        .await
        .unwrap();
    within(prompt(fx), "the second term to end", second.over()).await;
    assert_eq!(second.end(), Some(TermEnd::WorkReturned));
    assert_eq!(second.loss(), None, "handed over, not lost");
    // The status left Leading before the second term's `over` resolved.
    leading(&a, fx.ttl() + prompt(fx)).await;
    a.stop().await.unwrap();
    let (third, seen) = within(prompt(fx), "the third term's end", ends.recv())
        .await
        .unwrap();
    assert_eq!(third.number(), 3);
    assert_eq!(seen, Some(Some(TermEnd::Stopped)));
    assert_eq!(third.loss(), None, "stopped, not lost");
    pool.stop().await.unwrap();
}
