//! Probes connections that carry watch streams or requests and have gone quiet. A watch waits
//! on the server to speak, so on a connection that died without a reset (a partition that
//! outlived TCP, a middlebox that forgot it) it waits until HTTP/2 keep-alive gives up, 15 s
//! at the defaults (etcd refuses pings more often than every 5 s): a waiting candidate would
//! miss its turn that long. A request waits out its timeout. So a connection that has
//! answered nothing for [`QUIET`] while something waits on it is asked for the member's
//! status; one that does not answer within [`ANSWER_BY`] is left like any other that stopped
//! answering: replaced, its streams ended (their watchers resume on a fresh one, reads go
//! again), requests moved to the next member. A member that is alive answers at once, however
//! long a request of its waits on raft. A connection that also carries a lease's renewals
//! answers every renewal period and is never asked.
//!
//! The same status request, asked of a member that holds any request past
//! [`SETTLE_AFTER`], tells its raft term: when the member reports a leader in a newer term
//! than it answered in after a write was sent, and serves a linearizable read in it, that
//! write is settled (`crate::settle`).

use std::sync::Weak;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::from_member;
use crate::pool::Pool;
use crate::settle::{Terms, SETTLE_AFTER};

/// How long a connection that something waits on may answer nothing before it is asked.
const QUIET: Duration = Duration::from_secs(1);

/// How long a member has to answer a status request: it answers from its own state, without
/// raft, in milliseconds when it is alive.
const ANSWER_BY: Duration = Duration::from_secs(1);

/// How often the pool's connections are looked at: a request held past [`SETTLE_AFTER`] is
/// asked about within this much more.
const EVERY: Duration = Duration::from_millis(50);

/// Runs until the pool is dropped, from the pool's first request or watch; see the module
/// docs.
pub(crate) async fn probe_quiet_connections(pool: Weak<Pool>) {
    let mut tick = tokio::time::interval(EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(pool) = pool.upgrade() else { return };
        let now = Instant::now();
        // The quiet (to leave if they do not answer) and those holding a request (to learn
        // their term from).
        let ask: Vec<_> = (0..pool.len())
            .filter_map(|i| {
                let (client, terms) = pool.open_at(i)?;
                let quiet = pool.quiet_and_waited_on(i, now - QUIET);
                let holding = terms
                    .writing_since()
                    .is_some_and(|since| since + SETTLE_AFTER <= now);
                (quiet || holding).then_some((i, quiet, client, terms))
            })
            .collect();
        // All at once: members cut off together are left together, not one ANSWER_BY each.
        let asked = ask.into_iter().map(|(i, quiet, mut client, terms)| {
            pool.asked(i, now);
            async move {
                let answer = tokio::time::timeout(ANSWER_BY, client.status()).await;
                if let Ok(Ok(status)) = &answer {
                    settle(&mut client, &terms, now, status).await;
                }
                (i, quiet, answer)
            }
        });
        for (i, quiet, answer) in futures::future::join_all(asked).await {
            match answer {
                Ok(Ok(_)) => pool.answered(i, now),
                // A refusal is an answer from a live member.
                Ok(Err(e)) if from_member(&e) => pool.answered(i, now),
                // A broken connection: the watches on it hear of it themselves.
                Ok(Err(_)) => {}
                // Not quiet long enough to leave: a slow answer from a busy member.
                Err(_) if !quiet => {}
                // Replaced already, with another one left just before.
                Err(_) if !pool.is_waited_on(i) => {}
                Err(_) => {
                    tracing::debug!(
                        endpoint = i,
                        quiet_ms = QUIET.as_millis() as u64,
                        "a quiet connection did not answer a status request; leaving it"
                    );
                    pool.abandon_if_silent_since(i, now);
                }
            }
        }
    }
}

/// Learns the member's term from its status, asked at `asked`; if it reports a leader in a
/// newer term than it answered in before, and serves a linearizable read in it, settles the
/// writes sent before that answer (see `crate::settle`).
async fn settle(
    client: &mut etcd_client::Client,
    terms: &Terms,
    asked: Instant,
    status: &etcd_client::StatusResponse,
) {
    let term = status.raft_term();
    terms.observe(asked, term);
    let before = terms.settled_by(term);
    tracing::trace!(
        term,
        leader = status.leader(),
        settles = before.is_some(),
        "a held member's term"
    );
    let Some(before) = before.filter(|_| status.leader() != 0) else {
        return;
    };
    // Any key: the read's point is its read index, taken in the leader's term. A key the
    // client may not read (RBAC) fails it, and the write waits out its timeout as before.
    let read = client.get(
        b"\0".to_vec(),
        Some(etcd_client::GetOptions::new().with_count_only()),
    );
    match tokio::time::timeout(ANSWER_BY, read).await {
        Ok(Ok(r)) if r.header().is_some_and(|h| h.raft_term() >= term) => {
            tracing::debug!(
                term,
                "the member's leader changed; writes sent before are settled"
            );
            terms.settle(before);
        }
        other => {
            tracing::trace!(term, read = ?other.map(|r| r.map(|_| ())), "no read in the newer term yet")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::EtcdConfig;

    /// Three members whose connections went quiet together under watches (they accepted, and
    /// answer nothing) are left together, ANSWER_BY after they are asked, not one ANSWER_BY
    /// each: a watch waits on no request, so leaving one replaces no other.
    #[tokio::test(start_paused = true)]
    async fn quiet_connections_are_asked_and_left_together() {
        let (_silent, channel) = Pool::silent_member();
        let pool = Pool::new(
            EtcdConfig::new(["unused:1"]).with_request_timeout(Duration::from_secs(60)),
            vec![channel; 3],
        );
        let mut replaced = Vec::new();
        for i in 0..3 {
            replaced.push(pool.connection_at(i).await.unwrap().1);
        }
        // A watch on each, asking nothing (the first starts the probe).
        let sent = Instant::now();
        let _watches: Vec<_> = (0..3).map(|i| pool.watching(i)).collect();
        for token in &replaced {
            token.cancelled().await;
        }
        // Quiet for QUIET, noticed within a tick, then one ANSWER_BY for all three.
        let took = sent.elapsed();
        assert!(
            took <= QUIET + EVERY + ANSWER_BY,
            "left {took:?} after going quiet"
        );
    }
}
