//! The store's clock: the background task that expires leases at their deadlines, syncs
//! watches that fell behind, and sends progress notifications, on `tokio::time`.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::journal::Origin;
use crate::store::Shared;

/// The store's own clock work, as etcd's server loops do it: expires leases at their
/// deadlines (so delete events appear without anyone calling the store), and catches up
/// watches that started in the past on a fixed cadence. It holds the store weakly and ends
/// when the store is gone.
pub(crate) async fn background(shared: Weak<Shared>, wake: Arc<Notify>) {
    let epoch = Instant::now();
    loop {
        let Some((deadline, sync_at)) = shared.upgrade().map(|s| {
            if s.down.load(Ordering::SeqCst) {
                // Crashed: nothing expires until the restart wakes us.
                return (None, None);
            }
            let mut inner = s.lock();
            let sync_at = inner
                .state
                .has_unsynced_watchers()
                .then(|| next_tick(epoch, Instant::now(), s.config.watch_sync_interval));
            (inner.state.next_deadline(), sync_at)
        }) else {
            return;
        };
        let next = match (deadline, sync_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        // `notify_one` leaves a permit when nobody waits, so a grant or a watch registered
        // between the read above and the wait below still wakes us.
        match next {
            Some(at) => {
                tokio::select! {
                    biased;
                    _ = wake.notified() => {}
                    _ = tokio::time::sleep_until(at) => {}
                }
            }
            None => wake.notified().await,
        }
        let Some(strong) = shared.upgrade() else {
            return;
        };
        if strong.down.load(Ordering::SeqCst) {
            continue;
        }
        strong.apply(Origin::Store, |state, now| {
            state.expire(now);
            // Sync on the cadence's ticks only, like etcd's loop, not whenever we woke.
            if sync_at.is_some_and(|at| now >= at) {
                state.sync_watchers(now);
            }
        });
    }
}

/// The first tick of the cadence `epoch + k * every` strictly after `now`.
fn next_tick(epoch: Instant, now: Instant, every: Duration) -> Instant {
    let every_ns = every.as_nanos().max(1);
    let k = (now - epoch).as_nanos() / every_ns + 1;
    epoch + Duration::from_nanos((k * every_ns) as u64)
}
