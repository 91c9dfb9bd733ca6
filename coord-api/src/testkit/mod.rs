//! The conformance suite: one set of cases every [`KvLeaseStore`](crate::KvLeaseStore) backend must pass, with the
//! same assertions, so that a test that passes on the simulator predicts the same behaviour on
//! etcd. Not API-stable; breaking changes may land in minor releases.
//!
//! A backend runs the whole suite with one line in a test file:
//!
//! ```text
//! coord_api::conformance_tests!(my_backend::TestHarness::default());
//! ```
//!
//! which expands to one `#[test]` per case in a module `conformance`, so cases filter by name
//! (`cargo test conformance::watch_`) and fail alone. The harness decides how to run a case:
//! which runtime (virtual time for a simulator, real time for a live store), and which store:
//! a fresh one per case (some cases assert exact global revision arithmetic, or compact).
//!
//! Cases are written to run on real etcd too: TTLs come from [`Limits`], every wait is bounded
//! and polls a condition instead of sleeping a fixed time, and each case keeps to its own key
//! prefix ([`Ctx::key`]).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::StreamExt;

use crate::store::{DynKvLeaseStore, WatchStream};
use crate::types::Limits;
use crate::{Event, WatchResponse};

pub mod compact;
pub mod election;
pub mod kv;
pub mod lease;
mod macros;
pub mod process;
pub mod proxy;
pub mod recipes;
pub mod txn;
pub mod watch;

/// One conformance case.
#[derive(Debug, Clone, Copy)]
pub struct Case {
    /// The case's name, which is also its test's name.
    pub name: &'static str,
    /// The case's body.
    pub run: fn(Ctx) -> BoxFuture<'static, ()>,
}

/// How a backend runs a [`Case`]: what runtime, which store. Implement it once per backend.
pub trait Harness {
    /// Runs `case` to completion on a fresh [`Ctx`], panicking (as the case does) if it fails.
    fn run(&self, case: &Case);
}

/// Every case of the suite, in order.
pub fn all_cases() -> &'static [Case] {
    crate::__coord_cases!(all)
}

/// What a case gets: the store, as the trait object every recipe takes, and its own prefix.
#[derive(Debug, Clone)]
pub struct Ctx {
    store: Arc<DynKvLeaseStore>,
    prefix: String,
}

impl Ctx {
    /// A context for one case. `prefix` must be unique among cases sharing the store.
    pub fn new(store: Arc<DynKvLeaseStore>, prefix: impl Into<String>) -> Self {
        Ctx {
            store,
            prefix: prefix.into(),
        }
    }

    /// The same case, run through a [`Namespaced`](crate::Namespaced) view of the store
    /// under `namespace`. A decoy key is written first outside the namespace, at the case's
    /// own prefix, where a case would trip on it if the namespace leaked.
    pub async fn in_namespace(self, namespace: &str) -> Ctx {
        use crate::KvLeaseStoreExt;
        self.store
            .put_value(self.key("~outside-the-namespace"), "decoy")
            .await
            .expect("write the decoy key");
        Ctx {
            store: Arc::new(crate::Namespaced::new(self.store, namespace)),
            prefix: self.prefix,
        }
    }

    /// The store under test, used through `Arc<dyn KvLeaseStore>` (object safety exercised,
    /// not assumed).
    pub fn store(&self) -> &Arc<DynKvLeaseStore> {
        &self.store
    }

    /// The case's own key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// A key under the case's prefix.
    pub fn key(&self, name: &str) -> String {
        format!("{}{}", self.prefix, name)
    }

    /// The store's limits.
    pub fn limits(&self) -> Limits {
        self.store.limits()
    }

    /// The TTL cases use for leases meant to expire: the store's minimum, and at least 2 s
    /// so that real-time runs are not at the mercy of scheduling jitter.
    pub fn short_ttl(&self) -> Duration {
        self.limits().min_lease_ttl.max(Duration::from_secs(2))
    }

    /// A TTL long enough that the lease outlives the case.
    pub fn long_ttl(&self) -> Duration {
        Duration::from_secs(60)
    }

    /// The longest a lease of `ttl` may outlive its last renewal on this store, plus a
    /// second of slack for delivery and scheduling.
    pub fn expiry_bound(&self, ttl: Duration) -> Duration {
        ttl + self.limits().expiry_granularity + Duration::from_secs(1)
    }
}

/// How long a case waits for something that should happen promptly (a watch event, a
/// campaign after its predecessor resigned) before failing.
pub const PROMPT: Duration = Duration::from_secs(5);

/// Polls `cond` every 50 ms until it returns true, failing the case with `what` after `bound`.
pub async fn eventually<F, Fut>(bound: Duration, what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + bound;
    loop {
        if cond().await {
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out after {bound:?} waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits up to `bound` for `fut`, failing the case with `what` if it does not finish.
pub async fn within<T>(bound: Duration, what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(bound, fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {bound:?} waiting for: {what}"),
    }
}

/// The next batch of a watch that carries events, skipping progress notifications; fails the
/// case if none comes within [`PROMPT`] or the stream errors or ends.
pub async fn next_events(stream: &mut WatchStream) -> WatchResponse {
    loop {
        let item = within(PROMPT, "a watch batch", stream.next()).await;
        match item {
            Some(Ok(batch)) if batch.events.is_empty() => continue,
            Some(Ok(batch)) => return batch,
            Some(Err(e)) => panic!("watch failed: {e}"),
            None => panic!("watch ended"),
        }
    }
}

/// Collects exactly `n` events from a watch (across batches), failing the case otherwise.
pub async fn collect_events(stream: &mut WatchStream, n: usize) -> Vec<Event> {
    let mut out = Vec::new();
    while out.len() < n {
        out.extend(next_events(stream).await.events);
    }
    assert_eq!(out.len(), n, "more events than expected: {out:#?}");
    out
}

/// Asserts that a watch delivers no event batch within `quiet`; progress notifications are
/// allowed.
pub async fn assert_no_events(stream: &mut WatchStream, quiet: Duration) {
    let deadline = tokio::time::Instant::now() + quiet;
    loop {
        match tokio::time::timeout_at(deadline, stream.next()).await {
            Err(_) => return,
            Ok(Some(Ok(batch))) if batch.events.is_empty() => continue,
            Ok(other) => panic!("expected no events, got {other:?}"),
        }
    }
}

/// Runs one case on `harness`: what the generated tests call.
pub fn run_case<H: Harness + ?Sized>(harness: &H, case: &Case) {
    harness.run(case)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_suite_has_at_least_sixty_uniquely_named_cases() {
        let cases = all_cases();
        assert!(cases.len() >= 60, "only {} cases", cases.len());
        let mut names: Vec<_> = cases.iter().map(|c| c.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), cases.len(), "duplicate case names");
    }
}
