//! The cases of typed metadata (feature `serde`).

use serde::{Deserialize, Serialize};

use crate::recipes::{
    ClusterWatcherConfig, HostRegistration, RegistrationConfig, TypedEvent, TypedWatcher,
};
use crate::testkit::within;
use crate::{KvLeaseStoreExt, Revision};

use super::fixture::Fixture;
use super::support::*;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Endpoint {
    addr: String,
    weight: u32,
}

fn endpoint(addr: &str, weight: u32) -> Endpoint {
    Endpoint {
        addr: addr.to_owned(),
        weight,
    }
}

async fn next(fx: &dyn Fixture, w: &mut TypedWatcher<Endpoint>) -> TypedEvent<Endpoint> {
    within(prompt(fx), "the next typed event", w.next())
        .await
        .expect("the watcher runs")
}

/// Hosts whose metadata decodes arrive typed; a host whose metadata does not decode is there
/// all the same, as `Undecodable` with the raw value, changes back and forth, and leaves with a
/// `HostDown`; the view agrees with the events.
pub async fn typed_watcher_decodes_and_keeps_undecodable_hosts(fx: &dyn Fixture) {
    let store = fx.store();
    let mut w = TypedWatcher::<Endpoint>::start(store.clone(), ClusterWatcherConfig::new("typed/"))
        .await
        .unwrap();
    let a = HostRegistration::start(
        store.clone(),
        RegistrationConfig::json("typed/a", &endpoint("a:1", 1))
            .unwrap()
            .with_ttl(fx.ttl()),
    )
    .await
    .unwrap();
    match next(fx, &mut w).await {
        TypedEvent::HostUp { host, metadata, .. } => {
            assert_eq!((host.as_str(), metadata), ("a", endpoint("a:1", 1)))
        }
        other => panic!("expected a's HostUp, got {other:?}"),
    }
    // Another writer's format: the host is up, undecodable.
    let b = HostRegistration::start(store.clone(), reg(fx, "typed/b", "b:2 weight=2"))
        .await
        .unwrap();
    match next(fx, &mut w).await {
        TypedEvent::Undecodable {
            error, appeared, ..
        } => {
            assert!(appeared, "b is new");
            assert_eq!(error.host, "b");
            assert_eq!(&error.raw[..], b"b:2 weight=2");
        }
        other => panic!("expected b undecodable, got {other:?}"),
    }
    b.update_json(&endpoint("b:2", 2)).await.unwrap();
    match next(fx, &mut w).await {
        TypedEvent::HostUpdated { host, metadata, .. } => {
            assert_eq!((host.as_str(), metadata), ("b", endpoint("b:2", 2)))
        }
        other => panic!("expected b's typed update, got {other:?}"),
    }
    a.update_metadata("{\"addr\": 7}").await.unwrap();
    let at: Revision = match next(fx, &mut w).await {
        TypedEvent::Undecodable {
            error,
            appeared,
            revision,
        } => {
            assert!(!appeared, "a was there");
            assert_eq!(error.host, "a");
            revision
        }
        other => panic!("expected a undecodable, got {other:?}"),
    };
    let (rev, hosts) = w.hosts();
    assert!(rev >= at);
    assert_eq!(hosts.len(), 2, "{hosts:?}");
    assert!(hosts["a"].is_err(), "{hosts:?}");
    assert_eq!(hosts["b"].as_ref().ok(), Some(&endpoint("b:2", 2)));
    b.stop().await.unwrap();
    match next(fx, &mut w).await {
        TypedEvent::HostDown {
            host,
            last_metadata,
            ..
        } => {
            assert_eq!(host, "b");
            assert_eq!(last_metadata.ok(), Some(endpoint("b:2", 2)));
        }
        other => panic!("expected b's HostDown, got {other:?}"),
    }
    a.stop().await.unwrap();
    match next(fx, &mut w).await {
        TypedEvent::HostDown {
            host,
            last_metadata,
            ..
        } => {
            assert_eq!(host, "a");
            assert!(last_metadata.is_err(), "a's last metadata did not decode");
        }
        other => panic!("expected a's HostDown, got {other:?}"),
    }
    let _ = w.stop().await;
}

/// A value serde cannot write as JSON is refused before anything is written.
pub async fn typed_metadata_that_cannot_be_encoded_is_refused(fx: &dyn Fixture) {
    let store = fx.store();
    // JSON object keys must be strings.
    let bad: std::collections::BTreeMap<(u8, u8), u8> = [((1, 2), 3)].into();
    let refused = RegistrationConfig::json("typed/c", &bad);
    assert!(
        matches!(refused, Err(crate::Error::InvalidArgument { .. })),
        "{refused:?}"
    );
    let r = HostRegistration::start(store.clone(), reg(fx, "typed/c", "{}"))
        .await
        .unwrap();
    let update = r.update_json(&bad).await;
    assert!(
        matches!(update, Err(crate::Error::InvalidArgument { .. })),
        "{update:?}"
    );
    assert_eq!(
        &store.get_key("typed/c").await.unwrap().unwrap().value[..],
        b"{}",
        "the refused update wrote nothing"
    );
    r.stop().await.unwrap();
}
