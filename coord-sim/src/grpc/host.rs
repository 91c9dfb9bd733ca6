//! An etcd host for turmoil simulations: the store, served on a host, surviving the host's
//! crash and bounce with its data.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{incoming, EtcdService};
use crate::{SimConfig, SimStore};

/// etcd's client port, where [`add_etcd_host`] serves.
pub const ETCD_PORT: u16 = 2379;

/// The store behind a simulated etcd host; empty until the host first runs.
#[derive(Debug, Clone, Default)]
pub struct DurableStore(pub(crate) Arc<Mutex<Option<SimStore>>>);

impl DurableStore {
    /// The store, once the host has started. A handle for faults and checks from outside the
    /// network (an operator's revoke, a compaction, the journal).
    pub fn get(&self) -> Option<SimStore> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Adds host `name` to `sim`, serving a [`SimStore`] with `config` as etcd on
/// [`ETCD_PORT`]. The store is created on the host's first start and kept across crashes:
/// a bounced host serves the same data, with every lease refreshed by `election_timeout`
/// plus its TTL, as a restarted etcd member does.
pub fn add_etcd_host(
    sim: &mut turmoil::Sim<'_>,
    name: &str,
    config: SimConfig,
    election_timeout: Duration,
) -> DurableStore {
    let durable = DurableStore::default();
    let cell = durable.clone();
    sim.host(name, move || {
        let cell = cell.clone();
        let config = config.clone();
        async move {
            let store = {
                let mut slot = cell.0.lock().unwrap_or_else(|p| p.into_inner());
                match slot.as_ref() {
                    Some(store) => {
                        store.resume_on_current_runtime(election_timeout);
                        store.clone()
                    }
                    None => slot.insert(SimStore::with_config(config)).clone(),
                }
            };
            EtcdService::new(store).serve(incoming(ETCD_PORT)).await?;
            Ok(())
        }
    });
    durable
}
