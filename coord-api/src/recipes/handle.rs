//! The one shape of the recipes' handles: [`Handle`], and the table of what each handle's
//! stop and drop do.

use async_trait::async_trait;

use super::{
    Candidate, ClusterEvent, ClusterWatcher, ElectionPool, HostRegistration, HostSession,
    Leadership, MutexGuard, Permit, Session,
};
use crate::error::Result;

/// A handle to something a recipe keeps going or holds: a lease, a key, a watch, a term.
///
/// Every handle ends the same two ways. [`stop`](Handle::stop) ends it now, in the caller,
/// and gives back what is left (the outcome of the clean-up it sent, or what a watcher had
/// not handed out yet). Dropping it ends it without waiting, and what it leaves behind
/// follows one rule per kind of handle (the table). Each handle also keeps the verb of its
/// domain, which `stop` calls: `resign`, `unlock`, `release`.
///
/// # The handle table
///
/// | handle | made by | `stop` (its own verb) returns | dropping it |
/// |---|---|---|---|
/// | [`Session`] | `Session::new` | `Result<()>`: the lease revoked | stops renewing; the lease ends with its TTL, as after a crash (`revoke_on_drop`: revoked in the background) |
/// | [`HostSession`] | `HostSession::new` | `Result<()>`: every lease of the host revoked | the last handle: as a `Session` |
/// | [`HostRegistration`] | `start`, `spawn`, `start_on`, `spawn_on` | `Result<()>`: the key removed | stops healing; the key ends with its lease (`revoke_on_drop`: removed in the background) |
/// | [`ClusterWatcher`] (and `TypedWatcher`) | `start` | the events not yet taken | stops watching |
/// | [`ElectionPool`] | `ElectionPool::new`, `on` | `Result<()>`: its keys deleted, every leadership lost | the last handle: its keys end with its lease |
/// | [`Candidate`] | `Candidate::spawn` | `Result<()>`: its work ended, its key deleted | as `stop`, in the background |
/// | [`Leadership`] | `Election::campaign` | (`resign`) `Result<()>`: the key deleted | stops watching; the key stays until the session ends |
/// | [`MutexGuard`] | `Mutex::lock` | (`unlock`) `Result<()>`: the key deleted | unlocks in the background |
/// | [`Permit`] | `Semaphore::acquire` | (`release`) `Result<()>`: the key deleted | releases in the background |
///
/// The three drop rules, and why:
/// * **What others queue behind goes at once** (a candidate, a lock, a permit): a handle
///   forgotten in a task that ended must not keep the others waiting for a TTL.
/// * **What the store should see end as a crash ends** (a session, a registration, a
///   pool's keys): dropped, they stop being kept and expire with their lease; stopping
///   removes them now. A service that exits without stopping looks like one that crashed.
/// * **A leadership belongs to its session**, not to the handle (as in etcd's Go
///   `concurrency` package): dropping the handle stops watching, resigning is explicit.
///
/// Constructors: `start` returns once the thing is established (registered, listed);
/// `spawn` returns at once and establishes it in the background; `_on` runs it on a
/// [`HostSession`]'s shared lease rather than a lease of its own.
///
/// ```no_run
/// use coord_api::recipes::{Handle, HostRegistration, RegistrationConfig};
/// # async fn run(store: std::sync::Arc<coord_api::DynKvLeaseStore>) -> coord_api::Result<()> {
/// async fn shut_down<H: Handle>(handle: H) -> H::Stopped {
///     handle.stop().await
/// }
/// let reg = HostRegistration::start(store, RegistrationConfig::new("hosts/a", "10.0.0.1")).await?;
/// shut_down(reg).await?;
/// # Ok(()) }
/// ```
#[async_trait]
pub trait Handle: Send + Sized {
    /// What [`stop`](Handle::stop) gives back.
    type Stopped;

    /// Ends the handle now and returns what is left; see the table.
    async fn stop(self) -> Self::Stopped;
}

/// A handle whose inherent verb already is the table's `stop`.
macro_rules! handle {
    ($handle:ty, $stopped:ty, $verb:ident) => {
        #[async_trait]
        impl Handle for $handle {
            type Stopped = $stopped;

            async fn stop(self) -> $stopped {
                <$handle>::$verb(self).await
            }
        }
    };
}

handle!(Session, Result<()>, stop);
handle!(HostSession, Result<()>, stop);
handle!(HostRegistration, Result<()>, stop);
handle!(ClusterWatcher, Vec<ClusterEvent>, stop);
handle!(ElectionPool, Result<()>, stop);
handle!(Candidate, Result<()>, stop);
handle!(Leadership, Result<()>, resign);
handle!(MutexGuard, Result<()>, unlock);
handle!(Permit, Result<()>, release);

#[cfg(feature = "serde")]
#[async_trait]
impl<T> Handle for super::TypedWatcher<T>
where
    T: serde::de::DeserializeOwned + Send + Sync + 'static,
{
    type Stopped = Vec<super::TypedEvent<T>>;

    async fn stop(self) -> Self::Stopped {
        super::TypedWatcher::stop(self).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Compiles only if `H` stops to `S`: one row of the table each.
    fn stops_to<H: Handle<Stopped = S>, S>() {}

    #[test]
    fn every_handle_stops_as_the_table_says() {
        stops_to::<Session, Result<()>>();
        stops_to::<HostSession, Result<()>>();
        stops_to::<HostRegistration, Result<()>>();
        stops_to::<ClusterWatcher, Vec<ClusterEvent>>();
        stops_to::<ElectionPool, Result<()>>();
        stops_to::<Candidate, Result<()>>();
        stops_to::<Leadership, Result<()>>();
        stops_to::<MutexGuard, Result<()>>();
        stops_to::<Permit, Result<()>>();
        #[cfg(feature = "serde")]
        stops_to::<
            super::super::TypedWatcher<serde_json::Value>,
            Vec<super::super::TypedEvent<serde_json::Value>>,
        >();
    }
}
