//! The benches' shared election set-up: a leader, and a successor queued behind it.

use std::sync::Arc;
use std::time::Duration;

use coord_api::recipes::{Election, Leadership, Session, SessionConfig};
use coord_api::{DynKvLeaseStore, KvLeaseStoreExt};
use tokio::task::JoinHandle;

/// Session a leads election `name`; session b's campaign is queued behind it.
pub(crate) async fn leader_and_waiting(
    store: &Arc<DynKvLeaseStore>,
    name: &str,
    ttl: Duration,
) -> (
    Session,
    Session,
    Leadership,
    JoinHandle<coord_api::Result<Leadership>>,
) {
    let a = Session::new(store.clone(), SessionConfig::default().with_ttl(ttl))
        .await
        .unwrap();
    let b = Session::new(store.clone(), SessionConfig::default().with_ttl(ttl))
        .await
        .unwrap();
    let lead = Election::new(&a, name).campaign("a").await.unwrap();
    let eb = Election::new(&b, name);
    let waiting = tokio::spawn(async move { eb.campaign("b").await });
    while store.get_prefix(format!("{name}/")).await.unwrap().count < 2 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    (a, b, lead, waiting)
}
