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
        for i in 0..pool.len() {
            let now = Instant::now();
            let Some(mut client) = pool.quiet_and_waited_on(i, now - QUIET) else {
                continue;
            };
            pool.asked(i, now);
            match tokio::time::timeout(ANSWER_BY, client.status()).await {
                Ok(Ok(_)) => pool.answered(i, now),
                // A refusal is an answer from a live member.
                Ok(Err(e)) if from_member(&e) => pool.answered(i, now),
                // A broken connection: the watches on it hear of it themselves.
                Ok(Err(_)) => {}
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
