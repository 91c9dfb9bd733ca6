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

use std::sync::Weak;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::from_member;
use crate::pool::Pool;

/// How long a connection that something waits on may answer nothing before it is asked.
const QUIET: Duration = Duration::from_secs(1);

/// How long a member has to answer a status request: it answers from its own state, without
/// raft, in milliseconds when it is alive.
const ANSWER_BY: Duration = Duration::from_secs(1);

/// How often the pool's connections are looked at.
const EVERY: Duration = Duration::from_millis(250);

/// Runs until the pool is dropped, from the pool's first request or watch; see the module
/// docs.
pub(crate) async fn probe_quiet_connections(pool: Weak<Pool>) {
    let mut tick = tokio::time::interval(EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(pool) = pool.upgrade() else { return };
        let now = Instant::now();
        let quiet: Vec<_> = (0..pool.len())
            .filter_map(|i| pool.quiet_and_waited_on(i, now - QUIET).map(|c| (i, c)))
            .collect();
        // All at once: members cut off together are left together, not one ANSWER_BY each.
        let asked = quiet.into_iter().map(|(i, mut client)| {
            pool.asked(i, now);
            async move { (i, tokio::time::timeout(ANSWER_BY, client.status()).await) }
        });
        for (i, answer) in futures::future::join_all(asked).await {
            match answer {
                Ok(Ok(_)) => pool.answered(i, now),
                // A refusal is an answer from a live member.
                Ok(Err(e)) if from_member(&e) => pool.answered(i, now),
                // A broken connection: the watches on it hear of it themselves.
                Ok(Err(_)) => {}
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
