//! Typed metadata (feature `serde`): registrations and watchers over a serde type.
//!
//! # Encoding
//!
//! A host's metadata is the JSON of the type (`serde_json`), as UTF-8 bytes, nothing around
//! it; what `etcdctl get` shows is the JSON itself. A service that changes its type keeps old
//! readers working the way serde does: new fields with `#[serde(default)]`, a `version` field
//! of its own if it needs one. Metadata that does not decode (another writer's, an older
//! format, garbage) is never dropped and never a panic: the host is there, with a
//! [`MetadataError`] in place of the value, and leaves with a `HostDown` like any other.
//!
//! ```no_run
//! # async fn run(store: std::sync::Arc<coord_api::DynKvLeaseStore>) -> coord_api::Result<()> {
//! use coord_api::recipes::{
//!     ClusterWatcherConfig, HostRegistration, RegistrationConfig, TypedEvent, TypedWatcher,
//! };
//!
//! #[derive(serde::Serialize, serde::Deserialize)]
//! struct Endpoint {
//!     addr: String,
//!     zone: String,
//! }
//!
//! let me = Endpoint { addr: "10.0.0.7:8080".into(), zone: "eu-1".into() };
//! let reg = HostRegistration::start(store.clone(), RegistrationConfig::json("svc/hosts/a", &me)?).await?;
//!
//! let mut peers = TypedWatcher::<Endpoint>::start(store, ClusterWatcherConfig::new("svc/hosts/")).await?;
//! while let Some(event) = peers.next().await {
//!     match event {
//!         TypedEvent::HostUp { host, metadata, .. } => println!("{host} at {}", metadata.addr),
//!         TypedEvent::Undecodable { error, .. } => eprintln!("{error}"),
//!         _ => {}
//!     }
//! }
//! # reg.stop().await
//! # }
//! ```

use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::sync::Arc;

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::registration::{HostRegistration, RegistrationConfig};
use super::watcher::{ClusterEvent, ClusterView, ClusterWatcher, ClusterWatcherConfig};
use crate::error::{Error, Result};
use crate::store::DynKvLeaseStore;
use crate::types::Revision;

/// Encodes `value` as coord's typed metadata: its JSON.
///
/// # Errors
/// [`Error::InvalidArgument`] when the type cannot be written as JSON (a map with non-string
/// keys, a `Serialize` impl that fails).
pub fn encode_metadata<T: Serialize + ?Sized>(value: &T) -> Result<Bytes> {
    serde_json::to_vec(value)
        .map(Bytes::from)
        .map_err(|e| Error::InvalidArgument {
            reason: format!("metadata cannot be encoded as JSON: {e}"),
        })
}

/// Decodes typed metadata of `host`.
///
/// # Errors
/// The [`MetadataError`] that says what did not decode.
pub fn decode_metadata<T: DeserializeOwned>(
    host: &str,
    raw: &Bytes,
) -> std::result::Result<T, MetadataError> {
    serde_json::from_slice(raw).map_err(|e| MetadataError {
        host: host.to_owned(),
        raw: raw.clone(),
        reason: e.to_string(),
    })
}

/// A host's metadata that did not decode as the watcher's type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("metadata of host {host} does not decode: {reason}")]
pub struct MetadataError {
    /// The host.
    pub host: String,
    /// The metadata as stored.
    pub raw: Bytes,
    /// What serde said.
    pub reason: String,
}

impl RegistrationConfig {
    /// A registration of `key` whose metadata is `metadata`'s JSON (see [the
    /// encoding](crate::recipes::typed)).
    ///
    /// # Errors
    /// As [`encode_metadata`].
    pub fn json<T: Serialize + ?Sized>(key: impl Into<String>, metadata: &T) -> Result<Self> {
        Ok(RegistrationConfig::new(key, encode_metadata(metadata)?))
    }
}

impl HostRegistration {
    /// [`update_metadata`](Self::update_metadata) with `metadata`'s JSON.
    ///
    /// # Errors
    /// As [`encode_metadata`] (nothing is written then), and as `update_metadata`.
    pub fn update_json<T: Serialize + ?Sized>(
        &self,
        metadata: &T,
    ) -> impl std::future::Future<Output = Result<()>> + Send + '_ {
        // Encoded before the future, so that it holds no reference to `metadata`.
        let encoded = encode_metadata(metadata);
        async move { self.update_metadata(encoded?).await }
    }
}

/// A change in membership, with the metadata decoded as `T`.
#[derive(Debug, Clone, PartialEq)]
pub enum TypedEvent<T> {
    /// A host appeared, its metadata decoded.
    HostUp {
        /// The host's name (key without the prefix).
        host: String,
        /// Its metadata.
        metadata: T,
        /// The revision this was learned at.
        revision: Revision,
    },
    /// A host's metadata changed to a value that decodes. It may not have decoded before
    /// (then this is the first typed value seen for the host).
    HostUpdated {
        /// The host's name.
        host: String,
        /// Its new metadata.
        metadata: T,
        /// The revision of the change.
        revision: Revision,
    },
    /// A host appeared, or changed its metadata, to a value that does not decode. The host
    /// is in the view all the same.
    Undecodable {
        /// What did not decode, with the raw value.
        error: MetadataError,
        /// Whether the host is new (else its metadata changed).
        appeared: bool,
        /// The revision this was learned at.
        revision: Revision,
    },
    /// A host went away.
    HostDown {
        /// The host's name.
        host: String,
        /// The last metadata seen for it, decoded (or why it did not decode).
        last_metadata: std::result::Result<T, MetadataError>,
        /// The revision this was learned at.
        revision: Revision,
    },
    /// The watcher re-listed and emitted the difference just before this event.
    Resynced {
        /// The listing's revision.
        revision: Revision,
    },
}

impl<T: DeserializeOwned> TypedEvent<T> {
    fn from_raw(event: ClusterEvent) -> Self {
        let decoded = |host: String, raw: &Bytes, revision, appeared: bool| match decode_metadata::<T>(
            &host, raw,
        ) {
            Ok(metadata) if appeared => TypedEvent::HostUp {
                host,
                metadata,
                revision,
            },
            Ok(metadata) => TypedEvent::HostUpdated {
                host,
                metadata,
                revision,
            },
            Err(error) => TypedEvent::Undecodable {
                error,
                appeared,
                revision,
            },
        };
        match event {
            ClusterEvent::HostUp {
                host,
                metadata,
                revision,
            } => decoded(host, &metadata, revision, true),
            ClusterEvent::HostUpdated {
                host,
                metadata,
                revision,
            } => decoded(host, &metadata, revision, false),
            ClusterEvent::HostDown {
                host,
                last_metadata,
                revision,
            } => TypedEvent::HostDown {
                last_metadata: decode_metadata(&host, &last_metadata),
                host,
                revision,
            },
            ClusterEvent::Resynced { revision } => TypedEvent::Resynced { revision },
        }
    }
}

/// A [`ClusterWatcher`] whose hosts' metadata is decoded as `T` (see [the
/// encoding](crate::recipes::typed)). Everything the watcher promises holds: the same events
/// in the same order, the view updated before each is emitted.
#[derive(Debug)]
#[must_use = "dropping the watcher stops it"]
pub struct TypedWatcher<T> {
    inner: ClusterWatcher,
    _metadata: PhantomData<fn() -> T>,
}

impl<T: DeserializeOwned> TypedWatcher<T> {
    /// Lists the prefix and starts watching it, as [`ClusterWatcher::start`].
    ///
    /// # Errors
    /// As [`ClusterWatcher::start`].
    pub async fn start(store: Arc<DynKvLeaseStore>, config: ClusterWatcherConfig) -> Result<Self> {
        Ok(TypedWatcher {
            inner: ClusterWatcher::start(store, config).await?,
            _metadata: PhantomData,
        })
    }

    /// The next change; `None` once stopped.
    pub async fn next(&mut self) -> Option<TypedEvent<T>> {
        self.inner.next().await.map(TypedEvent::from_raw)
    }

    /// The hosts as of the latest view, each with its decoded metadata or why it did not
    /// decode, and the view's revision.
    pub fn hosts(
        &self,
    ) -> (
        Revision,
        BTreeMap<String, std::result::Result<T, MetadataError>>,
    ) {
        let view = self.inner.view();
        let hosts = view
            .hosts()
            .map(|(host, raw)| (host.to_owned(), decode_metadata(host, raw)))
            .collect();
        (view.revision(), hosts)
    }

    /// The raw view, as [`ClusterWatcher::view`].
    pub fn view(&self) -> Arc<ClusterView> {
        self.inner.view()
    }

    /// The untyped watcher underneath.
    pub fn into_inner(self) -> ClusterWatcher {
        self.inner
    }

    /// Stops watching; returns the events not yet taken, decoded.
    pub async fn stop(self) -> Vec<TypedEvent<T>> {
        self.inner
            .stop()
            .await
            .into_iter()
            .map(TypedEvent::from_raw)
            .collect()
    }
}
