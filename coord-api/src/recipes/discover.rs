//! Discovery for tower and tonic (feature `tower`): a [`ClusterWatcher`] as a stream of
//! `tower::discover::Change`, which is a `tower::discover::Discover`.
//!
//! Each host the watcher sees becomes a service, made by the caller from the host's name and
//! metadata (for tonic, an `Endpoint` from the address the host registered); each HostDown
//! removes it. A load balancer fed by the stream follows membership: hosts that register are
//! called, hosts whose key goes (a stop, a crash, a lost lease) are not.
//!
//! ```no_run
//! # async fn run(store: std::sync::Arc<coord_api::DynKvLeaseStore>) -> coord_api::Result<()> {
//! use coord_api::recipes::{discover, ClusterWatcher, ClusterWatcherConfig};
//! use futures::StreamExt;
//! use tower::discover::Change;
//!
//! let watcher = ClusterWatcher::start(store, ClusterWatcherConfig::new("svc/hosts/")).await?;
//! // Each host registered its address as metadata; the "service" here is the address.
//! let mut changes = discover(watcher, |_host, metadata| {
//!     std::str::from_utf8(metadata).ok().map(str::to_owned)
//! });
//! while let Some(Ok(change)) = changes.next().await {
//!     match change {
//!         Change::Insert(host, addr) => println!("call {host} at {addr}"),
//!         Change::Remove(host) => println!("stop calling {host}"),
//!     }
//! }
//! # Ok(())
//! # }
//! ```
//!
//! With tonic, `make` builds an `Endpoint` and the changes go into the sender of
//! `Channel::balance_channel` (tonic 0.14 has its own copy of `Change`: map the two variants
//! across); `tests/examples/discovery.rs` is a complete program (two tonic servers
//! registering, a client whose calls follow them).

use std::collections::BTreeSet;
use std::convert::Infallible;

use bytes::Bytes;
use futures::stream::BoxStream;
use tower::discover::Change;

use super::watcher::{ClusterEvent, ClusterWatcher};

/// The hosts of `watcher` as a stream of `Change::Insert`/`Change::Remove`, keyed by host
/// name: a `tower::discover::Discover`. `make` turns a host's name and metadata into its
/// service; `None` (metadata it cannot use) leaves the host out, and removes it if it was in.
/// A host whose metadata changes is inserted again with the new service (balancers replace
/// it). The stream ends when the watcher stops; it never fails.
pub fn discover<S, F>(
    mut watcher: ClusterWatcher,
    mut make: F,
) -> BoxStream<'static, Result<Change<String, S>, Infallible>>
where
    S: Send + 'static,
    F: FnMut(&str, &Bytes) -> Option<S> + Send + 'static,
{
    Box::pin(async_stream::stream! {
        let mut present = BTreeSet::new();
        while let Some(event) = watcher.next().await {
            let (host, metadata) = match event {
                ClusterEvent::HostUp { host, metadata, .. }
                | ClusterEvent::HostUpdated { host, metadata, .. } => (host, Some(metadata)),
                ClusterEvent::HostDown { host, .. } => (host, None),
                ClusterEvent::Resynced { .. } => continue,
            };
            match metadata.and_then(|m| make(&host, &m)) {
                Some(service) => {
                    present.insert(host.clone());
                    tracing::debug!(%host, "discovered");
                    yield Ok(Change::Insert(host, service));
                }
                None => {
                    if present.remove(&host) {
                        tracing::debug!(%host, "no longer discovered");
                        yield Ok(Change::Remove(host));
                    }
                }
            }
        }
    })
}
