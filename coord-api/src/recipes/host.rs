//! [`HostSession`]: the one lease a host's recipes share, replaced when it is lost.
//!
//! A host that registers and leads would otherwise hold a lease for each: one renewal stream
//! per lease, and as many keys to expire after a crash. A `HostSession` grants one lease (a
//! [`Session`]), hands it to every recipe started on it (registrations, election pools,
//! candidates), and grants a new one when it ends; the recipes heal onto the new lease.
//!
//! A lease given up at its local deadline may still live at the store (its renewals arrived,
//! their replies did not), with the keys under it: a registration's key, queued candidates.
//! The session revokes it once every registration on it has put its key back under the new
//! lease (so watchers see no flap), at once when none is attached, and retries the revoke
//! until it lands. Until then the lease is still the host's: a stop (the host's, or a shared
//! pool's) ends the keys under it before it returns `Ok`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tracing::Instrument;

use super::session::{release_lease_then, Session, SessionConfig, SessionEnd, SessionHandle};
use super::turn::KeyTurn;
use crate::error::{Error, Result};
use crate::store::DynKvLeaseStore;
use crate::sync::watch;
use crate::types::LeaseId;

/// Where a [`HostSession`]'s lease stands: what [`HostSession::subscribe`] reports, changed the
/// moment the lease's session begins or ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum HostLease {
    /// No lease yet: none was asked for.
    None,
    /// The live lease, the `generation`-th granted (from 1).
    Live {
        /// The lease.
        lease: LeaseId,
        /// How many leases the host session has granted, this one included.
        generation: u64,
    },
    /// The last lease's session ended, and none replaces it yet (the next recipe that needs
    /// one grants it).
    Ended {
        /// The lease.
        lease: LeaseId,
        /// How it ended: its deadline passed, or the store said it is gone.
        end: SessionEnd,
    },
    /// The host session was stopped: it grants no more.
    Stopped,
}

/// How many sessions a [`HostSession`] has granted, and how many it found dead and replaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct HostSessionStats {
    /// Sessions (leases) granted over its life.
    pub sessions: u64,
    /// Dead sessions found and replaced.
    pub replaced: u64,
}

/// One lease shared by a host's recipes, replaced when lost. See the module docs.
///
/// Cheap to clone; every clone is the same session. [`stop`](HostSession::stop) revokes it
/// for all of them.
///
/// ```no_run
/// # async fn run(store: std::sync::Arc<coord_api::DynKvLeaseStore>) -> coord_api::Result<()> {
/// use coord_api::recipes::{ElectionPool, HostRegistration, HostSession, RegistrationConfig, SessionConfig};
/// let host = HostSession::new(store, SessionConfig::default());
/// // One lease for both.
/// let registration = HostRegistration::start_on(&host, RegistrationConfig::new("hosts/web-1", "10.0.0.7:8080")).await?;
/// let pool = ElectionPool::on(&host);
/// let leadership = pool.campaign("scheduler", "web-1").await?;
/// # let _ = leadership;
/// registration.stop().await?;
/// host.stop().await
/// # }
/// ```
#[must_use = "dropping every handle stops renewing the host's lease"]
#[derive(Debug, Clone)]
pub struct HostSession {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    store: Arc<DynKvLeaseStore>,
    config: SessionConfig,
    /// The live session; one grant at a time.
    current: tokio::sync::Mutex<Option<Arc<Session>>>,
    /// A handle on the live session, readable without waiting.
    latest: Mutex<Option<SessionHandle>>,
    /// Leases given up at their deadline, still to be revoked once the registrations on
    /// them have moved off.
    abandoned: Mutex<Vec<Abandoned>>,
    /// Leases being revoked in the background, until the store says each is gone: keys
    /// under them may still stand.
    releasing: Arc<Mutex<BTreeSet<LeaseId>>>,
    /// The registrations started on this session.
    attached: Mutex<BTreeSet<u64>>,
    /// Per registered key: whose turn it is to write or remove it (a stopped registration's
    /// removal, retried after its stop returned an error, must not land after a registration
    /// started since wrote the key).
    keys: Mutex<BTreeMap<String, Arc<KeyTurn>>>,
    next_id: AtomicU64,
    stopped: AtomicBool,
    granted: AtomicU64,
    replaced: AtomicU64,
    /// Where the lease stands, for [`HostSession::subscribe`].
    lifecycle: watch::Sender<HostLease>,
}

#[derive(Debug)]
struct Abandoned {
    lease: LeaseId,
    /// Registrations whose key may still be under it.
    waiting: BTreeSet<u64>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl HostSession {
    /// A host session on `store`, whose leases follow `config` (their revocation at expiry is
    /// the host session's: see the module docs). No lease is granted until a recipe needs
    /// one, so it can be created while the store is unreachable.
    pub fn new(store: Arc<DynKvLeaseStore>, config: SessionConfig) -> Self {
        HostSession {
            inner: Arc::new(Inner {
                store,
                config: config.with_revoke_on_expiry(false),
                current: tokio::sync::Mutex::new(None),
                latest: Mutex::new(None),
                abandoned: Mutex::new(Vec::new()),
                releasing: Arc::default(),
                attached: Mutex::new(BTreeSet::new()),
                keys: Mutex::default(),
                next_id: AtomicU64::new(0),
                stopped: AtomicBool::new(false),
                granted: AtomicU64::new(0),
                replaced: AtomicU64::new(0),
                lifecycle: watch::Sender::new(HostLease::None),
            }),
        }
    }

    /// The store.
    pub fn store(&self) -> &Arc<DynKvLeaseStore> {
        &self.inner.store
    }

    /// How its leases are kept.
    pub fn config(&self) -> &SessionConfig {
        &self.inner.config
    }

    /// The live session: the current one, or a new one granted in place of a dead one.
    ///
    /// # Errors
    /// Whatever the grant fails with; [`Error::Cancelled`] once the host session is stopped.
    pub async fn session(&self) -> Result<SessionHandle> {
        let mut current = self.inner.current.lock().await;
        if self.inner.stopped.load(Ordering::SeqCst) {
            return Err(Error::Cancelled {
                operation: "host session (stopped)",
            });
        }
        if let Some(s) = current.as_ref() {
            if !s.is_done() {
                return Ok(s.handle());
            }
            tracing::warn!(lease_id = %s.lease(), "the host's session is over; replacing it");
            self.inner.replaced.fetch_add(1, Ordering::Relaxed);
            self.abandon(s);
            *current = None;
        }
        let session =
            Arc::new(Session::new(self.inner.store.clone(), self.inner.config.clone()).await?);
        let generation = self.inner.granted.fetch_add(1, Ordering::Relaxed) + 1;
        let handle = session.handle();
        *lock(&self.inner.latest) = Some(handle.clone());
        tracing::info!(lease_id = %handle.lease(), generation, "the host's lease granted");
        self.inner.lifecycle.send_replace(HostLease::Live {
            lease: handle.lease(),
            generation,
        });
        // When it ends at its deadline, what it leaves behind is released (see `abandon`)
        // even if nobody asks for a new session.
        let host = Arc::downgrade(&self.inner);
        let watched = handle.clone();
        tokio::spawn(
            async move {
                let end = watched.done().await;
                let Some(inner) = host.upgrade() else {
                    return;
                };
                let host = HostSession { inner };
                host.ended(watched.lease(), end);
                if end == SessionEnd::Expired {
                    host.expired(&watched).await;
                }
            }
            .in_current_span(),
        );
        *current = Some(session);
        Ok(handle)
    }

    /// The live session, if there is one, without granting.
    pub fn current(&self) -> Option<SessionHandle> {
        lock(&self.inner.latest).clone().filter(|s| !s.is_done())
    }

    /// Where the lease stands, now and at every change: granted, ended (and why), stopped.
    /// The receiver is coord's own `watch` ([`crate::sync::watch`]): `get()` for now,
    /// `changed().await` for the next change, `wait_for` for a condition.
    pub fn subscribe(&self) -> watch::Receiver<HostLease> {
        self.inner.lifecycle.subscribe()
    }

    /// The live lease's session ended: said at once, unless a newer lease or the stop was
    /// said since.
    fn ended(&self, lease: LeaseId, end: SessionEnd) {
        self.inner.lifecycle.send_if_modified(|now| match *now {
            HostLease::Live { lease: live, .. } if live == lease => {
                *now = HostLease::Ended { lease, end };
                true
            }
            _ => false,
        });
    }

    /// Sessions granted and replaced.
    pub fn stats(&self) -> HostSessionStats {
        HostSessionStats {
            sessions: self.inner.granted.load(Ordering::Relaxed),
            replaced: self.inner.replaced.load(Ordering::Relaxed),
        }
    }

    /// A session that ended at its deadline: replaced, and what it holds released once the
    /// registrations on it moved off.
    async fn expired(&self, session: &SessionHandle) {
        let mut current = self.inner.current.lock().await;
        if current
            .as_ref()
            .is_some_and(|s| s.lease() == session.lease())
        {
            if let Some(s) = current.take() {
                self.inner.replaced.fetch_add(1, Ordering::Relaxed);
                self.abandon(&s);
            }
        }
    }

    /// Sets aside a dead session's lease: released at once when nothing registered may
    /// still be under it, else when every registration on it has moved off.
    fn abandon(&self, s: &Session) {
        if s.health().ended != Some(SessionEnd::Expired) {
            return;
        }
        let waiting = lock(&self.inner.attached).clone();
        if waiting.is_empty() {
            self.release(s.lease());
        } else {
            lock(&self.inner.abandoned).push(Abandoned {
                lease: s.lease(),
                waiting,
            });
        }
    }

    /// The turn on registration key `key` of the registrations started on this session.
    pub(crate) fn key_turn(&self, key: &str) -> Arc<KeyTurn> {
        lock(&self.inner.keys)
            .entry(key.to_owned())
            .or_default()
            .clone()
    }

    /// A registration starts on this session; its id.
    pub(crate) fn attach(&self) -> u64 {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        lock(&self.inner.attached).insert(id);
        id
    }

    /// A registration is gone (stopped or dropped): it holds nothing under any lease.
    pub(crate) fn detach(&self, id: u64) {
        lock(&self.inner.attached).remove(&id);
        self.moved_off(id, |_| true);
    }

    /// A registration put its key under `lease`: it holds nothing under the others.
    pub(crate) fn moved(&self, id: u64, lease: LeaseId) {
        self.moved_off(id, |l| l != lease);
    }

    /// A recipe found `lease` gone at the store: if it is the live session's, that session
    /// ends and the next [`session`](Self::session) grants a new one.
    pub(crate) async fn evict(&self, lease: LeaseId) {
        let mut current = self.inner.current.lock().await;
        if current.as_ref().is_some_and(|s| s.lease() == lease) {
            if let Some(s) = current.take() {
                tracing::warn!(lease_id = %lease, "the host's lease is gone; replacing it");
                self.inner.replaced.fetch_add(1, Ordering::Relaxed);
                s.end(SessionEnd::LeaseLost);
                self.ended(lease, SessionEnd::LeaseLost);
            }
        }
    }

    fn moved_off(&self, id: u64, lease: impl Fn(LeaseId) -> bool) {
        let released: Vec<LeaseId> = {
            let mut abandoned = lock(&self.inner.abandoned);
            for a in abandoned.iter_mut().filter(|a| lease(a.lease)) {
                a.waiting.remove(&id);
            }
            let (done, pending): (Vec<_>, Vec<_>) =
                abandoned.drain(..).partition(|a| a.waiting.is_empty());
            *abandoned = pending;
            done.into_iter().map(|a| a.lease).collect()
        };
        for lease in released {
            self.release(lease);
        }
    }

    /// Revokes `lease` in the background, retried until it lands; until then it counts among
    /// the host's leases (see [`leases`](Self::leases) and [`stop`](Self::stop)).
    fn release(&self, lease: LeaseId) {
        lock(&self.inner.releasing).insert(lease);
        let releasing = self.inner.releasing.clone();
        release_lease_then(self.inner.store.clone(), lease, move || {
            lock(&releasing).remove(&lease);
        });
    }

    /// Every lease a key of this host may still live under: the live one first (the one a
    /// key was most likely last written under), then those whose revoke has not landed yet,
    /// then those set aside. A registration's removal tries them in this order, a round trip
    /// each: with the live one last, a removal whose first, useless, compare went unanswered
    /// waited out the request timeout before it tried the lease that held the key
    /// (`--defaults` seed 2012913: a stopped old incarnation's key stood 13 s past the new
    /// one's registration, S7).
    pub(crate) fn leases(&self) -> Vec<LeaseId> {
        let mut all: Vec<LeaseId> = lock(&self.inner.latest)
            .as_ref()
            .map(|s| s.lease())
            .into_iter()
            .collect();
        all.extend(lock(&self.inner.releasing).iter().copied());
        all.extend(lock(&self.inner.abandoned).iter().map(|a| a.lease));
        all
    }

    /// Revokes every lease of the host: the live one, those set aside, and those whose
    /// background revoke has not landed yet. Every recipe on it ends (their keys go with the
    /// leases); the host session grants no more.
    ///
    /// # Errors
    /// Whatever a revoke fails with (a lease already gone is success); the revoke is then
    /// retried in the background until it lands.
    pub async fn stop(self) -> Result<()> {
        self.inner.stopped.store(true, Ordering::SeqCst);
        self.inner.lifecycle.send_replace(HostLease::Stopped);
        let current = self.inner.current.lock().await.take();
        let abandoned: Vec<LeaseId> = lock(&self.inner.abandoned)
            .drain(..)
            .map(|a| a.lease)
            .collect();
        let mut result = match current {
            Some(s) => s.close().await,
            None => Ok(()),
        };
        // Those being revoked in the background too: a stop that returns Ok has ended
        // every key of the host, not left some to a revoke still on its way.
        let releasing: Vec<LeaseId> = lock(&self.inner.releasing).iter().copied().collect();
        for (lease, in_background) in abandoned
            .into_iter()
            .map(|l| (l, false))
            .chain(releasing.into_iter().map(|l| (l, true)))
        {
            match self.inner.store.revoke(lease).await {
                Ok(_) | Err(Error::LeaseNotFound { .. }) => {
                    lock(&self.inner.releasing).remove(&lease);
                }
                Err(e) => {
                    if !in_background {
                        self.release(lease);
                    }
                    if result.is_ok() {
                        result = Err(e);
                    }
                }
            }
        }
        result
    }
}
