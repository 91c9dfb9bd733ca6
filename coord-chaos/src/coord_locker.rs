//! The lock part of coord's own node: each node takes one shared [`Mutex`] now and then (by
//! `lock`, or by `try_lock` and a pause when it is taken), writes its token through the
//! guard's fence while it holds it, and lets go. Its holdings are recorded as leaderships of
//! the election [`LOCK`], so every election invariant holds it: one holder at a time (S2),
//! growing tokens and a fenced resource that only the holder writes (S1), no phantom holder
//! (S3), a waiter next in line taking over from a crashed holder (L6), and a holder existing
//! after the heal (L5: some node always waits for it).

use std::time::Duration;

use coord_api::recipes::{HostSession, Mutex, MutexGuard};
use coord_api::{DeleteRequest, Error, KvLeaseStore, LeaseId, PutRequest, TxnRequest};
use tokio_util::sync::CancellationToken;

use crate::history::{Happening, Outcome};
use crate::rng::Rng;
use crate::service::Node;

/// The shared lock's name.
pub(crate) const LOCK: &str = "locks/shared";

/// Where the lock's holders write their token through the fence.
pub(crate) const LOCK_WORK_PREFIX: &str = "work/locks/";

fn lock_work_key() -> String {
    format!("{LOCK_WORK_PREFIX}shared")
}

/// How a holding ended.
enum Held {
    Lost,
    LetGo,
    Stopped,
}

/// Takes and releases the lock until `stop` (part of the node's pool: the pool's stop waits
/// for this to return). Returns once its key is gone, held or waiting, or with why not.
pub(crate) async fn locker(
    node: Node,
    host: HostSession,
    mut rng: Rng,
    stop: CancellationToken,
) -> coord_api::Result<()> {
    let ttl = node.scenario().ttl;
    // Every lease it queued under: after a store restart refreshed an abandoned one, a key
    // under it lives on.
    let mut leases = Vec::new();
    while !stop.is_cancelled() {
        let Some(guard) = take(&node, &host, &mut rng, &stop, &mut leases).await else {
            continue;
        };
        let token = guard.token();
        node.leader_start(LOCK, token);
        let held = hold(&node, &guard, &mut rng, &stop, ttl).await;
        // The belief ends before the key goes: the delete may apply long before its reply.
        node.leader_end(LOCK, token, !matches!(held, Held::Lost));
        match held {
            Held::LetGo if rng.chance(0.5) => drop(guard),
            Held::LetGo | Held::Stopped => {
                let _ = guard.unlock().await;
            }
            Held::Lost => {}
        }
    }
    // A wait called off by the stop, or a guard dropped, leaves its key to a background
    // delete: the stop must not return before the keys are gone.
    for lease in leases {
        let key = coord_api::candidate_key(LOCK, lease);
        host.store().delete(DeleteRequest::key(key)).await?;
    }
    Ok(())
}

/// One attempt at the lock: `lock` (queued), or `try_lock` and a short pause when it is held.
async fn take(
    node: &Node,
    host: &HostSession,
    rng: &mut Rng,
    stop: &CancellationToken,
    leases: &mut Vec<LeaseId>,
) -> Option<MutexGuard> {
    let s = node.scenario();
    let pause = |rng: &mut Rng| {
        let ms = (s.ttl / 4).as_millis() as u64;
        Duration::from_millis(rng.between(ms / 4, ms))
    };
    let attempt = async {
        let session = match host.session().await {
            Ok(session) => session,
            Err(_) => {
                tokio::time::sleep(s.initial_backoff).await;
                return None;
            }
        };
        if !leases.contains(&session.lease()) {
            leases.push(session.lease());
        }
        let lock = Mutex::new(session, LOCK);
        if rng.chance(0.3) {
            match lock.try_lock().await {
                Ok(Some(guard)) => Some(guard),
                _ => {
                    tokio::time::sleep(pause(rng)).await;
                    None
                }
            }
        } else {
            match lock.lock().await {
                Ok(guard) => Some(guard),
                Err(_) => {
                    tokio::time::sleep(s.initial_backoff).await;
                    None
                }
            }
        }
    };
    tokio::select! {
        biased;
        _ = stop.cancelled() => None,
        got = attempt => got,
    }
}

/// Holds the lock for up to half a TTL, writing through its fence every TTL/8.
async fn hold(
    node: &Node,
    guard: &MutexGuard,
    rng: &mut Rng,
    stop: &CancellationToken,
    ttl: Duration,
) -> Held {
    let until = tokio::time::Instant::now()
        + Duration::from_millis(rng.between(0, (ttl / 2).as_millis() as u64));
    let token = guard.token();
    loop {
        tokio::select! {
            biased;
            _ = guard.lost() => return Held::Lost,
            _ = stop.cancelled() => return Held::Stopped,
            _ = tokio::time::sleep_until(until) => return Held::LetGo,
            _ = tokio::time::sleep(ttl / 8) => {}
        }
        // As a leader's work does (see `coord_node`): a paused process acts late, and only
        // the fence stops it; the write is judged by the store whenever it lands.
        let fence = guard.fence();
        let writer = node.clone();
        let write = tokio::spawn(async move {
            writer.unpaused().await;
            let txn =
                TxnRequest::new().and_then([PutRequest::new(lock_work_key(), token.to_string())]);
            let outcome = match fence.txn(txn).await {
                Ok(r) if r.succeeded => Outcome::Accepted,
                Ok(_) => Outcome::Unknown,
                Err(Error::FencedOut { .. }) => Outcome::FencedOut,
                Err(_) => Outcome::Unknown,
            };
            writer.record(Happening::FencedWrite {
                who: writer.who(),
                election: LOCK.to_owned(),
                token,
                outcome,
            });
        });
        // A stop does not wait for a write stuck behind a lost reply: the write goes on by
        // itself, and the store judges it by the fence.
        tokio::select! {
            biased;
            _ = guard.lost() => return Held::Lost,
            _ = stop.cancelled() => return Held::Stopped,
            _ = write => {}
        }
    }
}
