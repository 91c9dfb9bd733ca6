//! The lock and semaphore parts of coord's own node: each node takes one shared [`Mutex`] now
//! and then, and a permit of one shared [`Semaphore`] of [`PERMITS`] permits (by `lock` or
//! `acquire`, or by a `try_` and a pause when none is free), writes its token through the
//! fence while it holds it, and lets go.
//!
//! Lock holdings are recorded as leaderships of the election [`LOCK`], so every election
//! invariant holds the lock: one holder at a time (S2), growing tokens and a fenced resource
//! that only the holder writes (S1), no phantom holder (S3), a waiter next in line taking over
//! from a crashed holder (L6), and a holder existing after the heal (L5: some node always
//! waits for it). Permits are recorded as permits of [`SEMAPHORE`], held to P1-P3
//! ([`Permits`](crate::Permits)) and to P4: a permit believed after the heal (some node
//! always wants one).

use std::time::Duration;

use coord_api::recipes::{
    Fence, HostSession, LossReason, Mutex, MutexGuard, Permit, Semaphore, SessionHandle,
};
use coord_api::sync::Stop;
use coord_api::Revision;

use super::node::stop_part;
use crate::fenced_act::write_through;
use crate::history::Part;
use crate::rng::Rng;
use crate::service::Node;

/// The shared lock's name.
pub(crate) const LOCK: &str = "locks/shared";

/// Where the lock's holders write their token through the fence.
pub(crate) const LOCK_WORK_PREFIX: &str = "work/locks/";

/// The shared semaphore's name.
pub(crate) const SEMAPHORE: &str = "semaphores/shared";

/// How many permits it has.
pub(crate) const PERMITS: u32 = 2;

/// Where the permits' holders write their token through the fence, a key per node.
pub(crate) const PERMIT_WORK_PREFIX: &str = "work/semaphores/";

/// What a part takes now and then.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Shared {
    Lock,
    Permit,
}

impl Shared {
    fn name(self) -> &'static str {
        match self {
            Shared::Lock => LOCK,
            Shared::Permit => SEMAPHORE,
        }
    }

    fn work_key(self, node: &Node) -> String {
        match self {
            Shared::Lock => format!("{LOCK_WORK_PREFIX}shared"),
            Shared::Permit => format!("{PERMIT_WORK_PREFIX}{}", node.who().node),
        }
    }

    fn believed(self, node: &Node, token: Revision) {
        match self {
            Shared::Lock => node.leader_start(LOCK, token),
            Shared::Permit => node.permit_start(SEMAPHORE, token),
        }
    }

    fn no_longer(self, node: &Node, token: Revision, let_go: bool) {
        match self {
            Shared::Lock => node.leader_end(LOCK, token, let_go),
            Shared::Permit => node.permit_end(SEMAPHORE, token, let_go),
        }
    }
}

/// A held lock or permit.
enum Guard {
    Lock(MutexGuard),
    Permit(Permit),
}

impl Guard {
    fn token(&self) -> Revision {
        match self {
            Guard::Lock(g) => g.token(),
            Guard::Permit(p) => p.token(),
        }
    }

    fn fence(&self) -> Fence {
        match self {
            Guard::Lock(g) => g.fence(),
            Guard::Permit(p) => p.fence(),
        }
    }

    async fn lost(&self) -> LossReason {
        match self {
            Guard::Lock(g) => g.lost().await,
            Guard::Permit(p) => p.lost().await,
        }
    }

    async fn release(self) -> coord_api::Result<()> {
        match self {
            Guard::Lock(g) => g.unlock().await,
            Guard::Permit(p) => p.release().await,
        }
    }
}

/// How a holding ended.
enum Held {
    Lost,
    LetGo,
    Stopped,
}

/// Takes and releases `what` until `stop` (part of the node's pool: the pool's stop waits
/// for this to return). Returns once its key is gone, held or waiting, or with why not.
pub(crate) async fn locker(
    what: Shared,
    node: Node,
    host: HostSession,
    mut rng: Rng,
    stop: Stop,
) -> coord_api::Result<()> {
    let ttl = node.scenario().ttl;
    // Every session it queued under: after a store restart refreshed an abandoned lease, a
    // key under it lives on.
    let mut sessions = Vec::new();
    while !stop.is_stopped() {
        let Some(guard) = take(what, &node, &host, &mut rng, &stop, &mut sessions).await else {
            continue;
        };
        let token = guard.token();
        what.believed(&node, token);
        let held = hold(what, &node, &guard, &mut rng, &stop, ttl).await;
        // The belief ends before the key goes: the delete may apply long before its reply.
        what.no_longer(&node, token, !matches!(held, Held::Lost));
        match held {
            Held::LetGo if rng.chance(0.5) => drop(guard),
            Held::LetGo | Held::Stopped => {
                let part = Part::Hold {
                    of: what.name().to_owned(),
                    token,
                };
                let _ = stop_part(&node, part, guard.release()).await;
            }
            Held::Lost => {}
        }
    }
    // A wait called off by the stop, or a guard dropped, leaves its key to a background
    // delete, and may leave a write in flight: the stop must not return before they have
    // settled and the keys are gone.
    for session in sessions {
        let part = Part::Queue {
            of: what.name().to_owned(),
            lease: session.lease(),
        };
        let leave = async {
            match what {
                Shared::Lock => Mutex::new(session, LOCK).leave().await,
                Shared::Permit => Semaphore::new(session, SEMAPHORE, PERMITS).leave().await,
            }
        };
        stop_part(&node, part, leave).await?;
    }
    Ok(())
}

/// One attempt: `lock`/`acquire` (queued), or `try_lock`/`try_acquire` and a short pause
/// when none is free.
async fn take(
    what: Shared,
    node: &Node,
    host: &HostSession,
    rng: &mut Rng,
    stop: &Stop,
    sessions: &mut Vec<SessionHandle>,
) -> Option<Guard> {
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
        if !sessions.iter().any(|s| s.lease() == session.lease()) {
            sessions.push(session.clone());
        }
        if rng.chance(0.3) {
            let tried = match what {
                Shared::Lock => Mutex::new(session, LOCK)
                    .try_lock()
                    .await
                    .map(|g| g.map(Guard::Lock)),
                Shared::Permit => Semaphore::new(session, SEMAPHORE, PERMITS)
                    .try_acquire()
                    .await
                    .map(|p| p.map(Guard::Permit)),
            };
            if let Ok(Some(guard)) = tried {
                return Some(guard);
            }
            tokio::time::sleep(pause(rng)).await;
            return None;
        }
        let queued = match what {
            Shared::Lock => Mutex::new(session, LOCK).lock().await.map(Guard::Lock),
            Shared::Permit => Semaphore::new(session, SEMAPHORE, PERMITS)
                .acquire()
                .await
                .map(Guard::Permit),
        };
        match queued {
            Ok(guard) => Some(guard),
            Err(_) => {
                tokio::time::sleep(s.initial_backoff).await;
                None
            }
        }
    };
    tokio::select! {
        biased;
        _ = stop.stopped() => None,
        got = attempt => got,
    }
}

/// Holds it for up to half a TTL, writing through its fence every TTL/8.
async fn hold(
    what: Shared,
    node: &Node,
    guard: &Guard,
    rng: &mut Rng,
    stop: &Stop,
    ttl: Duration,
) -> Held {
    let until = tokio::time::Instant::now()
        + Duration::from_millis(rng.between(0, (ttl / 2).as_millis() as u64));
    let token = guard.token();
    loop {
        tokio::select! {
            biased;
            _ = guard.lost() => return Held::Lost,
            _ = stop.stopped() => return Held::Stopped,
            _ = tokio::time::sleep_until(until) => return Held::LetGo,
            _ = tokio::time::sleep(ttl / 8) => {}
        }
        let write = write_through(
            node,
            what.work_key(node),
            what.name().to_owned(),
            token,
            guard.fence(),
        );
        // A stop does not wait for a write stuck behind a lost reply: the write goes on by
        // itself, and the store judges it by the fence.
        tokio::select! {
            biased;
            _ = guard.lost() => return Held::Lost,
            _ = stop.stopped() => return Held::Stopped,
            _ = write => {}
        }
    }
}
