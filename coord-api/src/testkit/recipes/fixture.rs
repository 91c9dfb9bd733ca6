//! What a recipe test needs from a backend: a store, clients whose connection a test can
//! break, and the backend's timing.

use std::sync::Arc;
use std::time::Duration;

use crate::DynKvLeaseStore;

/// One client of the store whose connection a test controls.
pub struct Client {
    /// The client's store handle.
    pub store: Arc<DynKvLeaseStore>,
    control: Box<dyn Control>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// A client whose connection `control` breaks.
    pub fn new(store: Arc<DynKvLeaseStore>, control: impl Control + 'static) -> Self {
        Client {
            store,
            control: Box::new(control),
        }
    }

    /// Ends every keep-alive and watch stream of the client; new ones work.
    pub async fn close_streams(&self) {
        self.control.close_streams().await
    }

    /// Cuts the client off from the store, or reconnects it.
    pub fn cut_off(&self, on: bool) {
        self.control.cut_off(on)
    }

    /// Delays every request the client sends from now on by `by` on its way to the store
    /// (zero: no delay); a request already on its way keeps the delay it had.
    pub fn delay_requests(&self, by: Duration) {
        self.control.delay_requests(by)
    }

    /// Holds every request the client has sent that has not reached the store yet, until
    /// called with `false`; then they land, after whatever passed them. Whether requests sent
    /// meanwhile pass is the backend's: the simulator lets them (as a request stuck at a
    /// stalled member is passed by the next one, sent to another); through one TCP
    /// connection they wait behind the held ones.
    pub fn hold_in_flight(&self, on: bool) {
        self.control.hold_in_flight(on)
    }
}

/// How a backend breaks one client's connection.
#[async_trait::async_trait]
pub trait Control: Send + Sync {
    async fn close_streams(&self);
    fn cut_off(&self, on: bool);
    fn delay_requests(&self, by: Duration);
    fn hold_in_flight(&self, on: bool);
}

/// A backend for the recipe tests.
#[async_trait::async_trait]
pub trait Fixture: Send + Sync {
    /// A store handle nobody cuts off (the "rest of the world").
    fn store(&self) -> Arc<DynKvLeaseStore>;
    /// A fresh client with its own connection.
    async fn client(&self) -> Client;
    /// The TTL recipes use here.
    fn ttl(&self) -> Duration;
    /// How long a client waits for a reply before a call fails (a request lost in a
    /// partition is retried only then).
    fn request_timeout(&self) -> Duration;
    /// How late the backend may be against exact timing: 0 in virtual time; etcd's 500 ms
    /// expiry tick plus scheduling on a loaded machine on real etcd.
    fn slack(&self) -> Duration;
    /// A client of the same store whose every call takes some time, so operations
    /// interleave (for races); what it writes is visible through [`store`](Fixture::store).
    async fn slow_store(&self) -> Arc<DynKvLeaseStore>;
    /// Offsets (ms) at which to land a `stop()` inside a heal.
    fn stop_offsets(&self) -> Vec<u64>;
}

/// A backend's fixture seen through a namespace ([`Namespaced`](crate::Namespaced)): every
/// store handle it gives out, the clients' included, sees the store under `prefix`, so the
/// recipe cases run through the wrapper.
#[derive(Debug)]
pub struct InNamespace<F> {
    inner: F,
    prefix: String,
}

impl<F: Fixture> InNamespace<F> {
    /// `inner`'s store, seen under `prefix`.
    pub fn new(inner: F, prefix: impl Into<String>) -> Self {
        InNamespace {
            inner,
            prefix: prefix.into(),
        }
    }

    fn wrap(&self, store: Arc<DynKvLeaseStore>) -> Arc<DynKvLeaseStore> {
        Arc::new(crate::Namespaced::new(store, self.prefix.clone()))
    }
}

#[async_trait::async_trait]
impl<F: Fixture> Fixture for InNamespace<F> {
    fn store(&self) -> Arc<DynKvLeaseStore> {
        self.wrap(self.inner.store())
    }

    async fn client(&self) -> Client {
        let mut client = self.inner.client().await;
        client.store = self.wrap(client.store);
        client
    }

    fn ttl(&self) -> Duration {
        self.inner.ttl()
    }

    fn request_timeout(&self) -> Duration {
        self.inner.request_timeout()
    }

    fn slack(&self) -> Duration {
        self.inner.slack()
    }

    async fn slow_store(&self) -> Arc<DynKvLeaseStore> {
        self.wrap(self.inner.slow_store().await)
    }

    fn stop_offsets(&self) -> Vec<u64> {
        self.inner.stop_offsets()
    }
}
