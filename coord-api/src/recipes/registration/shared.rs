//! What a registration's handle and its task share: the host session, the status, the
//! metadata, and the key's writes and removal.

use super::*;

#[derive(Debug)]
pub(super) struct Shared {
    pub(super) host: HostSession,
    /// Whether the host session is the registration's own (from [`HostRegistration::start`]
    /// or [`spawn`](HostRegistration::spawn)): stopping the registration then revokes it.
    pub(super) owned: bool,
    /// The registration's id on the host session.
    pub(super) id: u64,
    pub(super) config: RegistrationConfig,
    /// The lease the key is (or is about to be) written under; 0 when none.
    pub(super) lease: AtomicI64,
    /// The session of that lease, for health.
    pub(super) session: Mutex<Option<SessionHandle>>,
    pub(super) status: watch::Sender<RegistrationStatus>,
    /// The latest metadata: what a heal (or put-back) writes. See [`Shared::put`] for why a
    /// heal never waits for an update (whose put may be waiting out a lost reply) and never
    /// writes over a newer value.
    pub(super) metadata: Mutex<Bytes>,
    /// Updates go one at a time, so two never land in the wrong order.
    pub(super) updates: tokio::sync::Mutex<()>,
    /// Held (shared) by each heal write while it is in flight, even after its caller gave up
    /// on it (a request already sent may still land): an update waits for those that may
    /// carry an older value before it returns, while a heal waits for no update.
    pub(super) heal_writes: Arc<tokio::sync::RwLock<()>>,
}

impl Shared {
    pub(super) fn store(&self) -> &Arc<DynKvLeaseStore> {
        self.host.store()
    }

    /// Writes the key under `lease` with the latest metadata, unless it already stands
    /// under `lease`; returns its create and mod revisions.
    ///
    /// An update writes the latest value there, so a key found under `lease` is not
    /// overwritten with what may by then be older: a heal never waits for an update to
    /// finish (its put may be waiting out a lost reply), and never writes over a newer value;
    /// an update waits for the heal writes in flight. Found with older metadata (a heal write
    /// that landed after its caller gave up on it), it is brought up to date
    /// ([`bring_up_to_date`](Self::bring_up_to_date)), unless `stop` was asked meanwhile:
    /// the stop removes the key, and a write sent after it was asked may land after the
    /// name went to a newer incarnation.
    pub(super) async fn put(
        &self,
        lease: LeaseId,
        stop: Option<&Stop>,
    ) -> Result<(Revision, Revision)> {
        let in_flight = self.heal_writes.clone().read_owned().await;
        // In the key's turn: a stopped registration's removal still pending is called off,
        // and one on its way lands before this write, not after it.
        let key_turn = self.host.key_turn(&self.config.key);
        key_turn.call_off_cleanup();
        let turn = key_turn.turn.clone().lock_owned();
        // A stop asked while the turn is waited for sends nothing after it.
        let _turn = match stop {
            Some(stop) => tokio::select! {
                biased;
                _ = stop.stopped() => return Err(Error::Cancelled {
                    operation: "registration (stopped while its key's turn was waited for)",
                }),
                turn = turn => turn,
            },
            None => turn.await,
        };
        let metadata = if crate::hooks::planted::enabled(
            crate::hooks::planted::Bug::HealWritesFirstMetadata,
        ) {
            self.config.metadata.clone()
        } else {
            self.latest()
        };
        let key = self.config.key.clone();
        let put = PutRequest::new(key.clone(), metadata)
            .with_lease(lease)
            .with_prev_kv();
        let txn = TxnRequest::new()
            .when([Compare::lease(key.clone(), CompareOp::NotEqual, lease)])
            .and_then([TxnOp::Put(put)])
            .or_else([TxnOp::Get(GetRequest::key(key.clone()))]);
        let r = self.write(txn, in_flight).await?;
        let revisions = match r.responses.first() {
            Some(TxnOpResponse::Put(p)) => {
                Some(p.prev_kv.as_ref().map_or((r.revision, r.revision), |kv| {
                    (kv.create_revision, r.revision)
                }))
            }
            Some(TxnOpResponse::Get(g)) => match g.kvs.first() {
                Some(kv) if stop.is_some_and(Stop::is_stopped) => {
                    tracing::debug!("stopping: the key under our lease is left for the stop");
                    Some((kv.create_revision, kv.mod_revision))
                }
                Some(kv) => Some(self.bring_up_to_date(kv, lease).await?),
                None => None,
            },
            _ => None,
        };
        // The compare failed only if the key stands under the lease, so the read found it.
        revisions.ok_or_else(|| Error::Rejected {
            backend: "coord",
            operation: "registration put",
            source: format!("the store answered {r:?}").into(),
        })
    }

    /// The key found under our lease: its create and mod revisions, once it carries the
    /// latest metadata. An update writes the latest value, but the key may carry another:
    /// a registration started again on a host session whose lease still holds the key from
    /// an earlier one, or a heal write its caller gave up on (the backend answered
    /// `Indeterminate` while its last attempt was still on the wire) that landed after an
    /// update returned. Left as it stands, the key would keep that value until the next
    /// update.
    pub(super) async fn bring_up_to_date(
        &self,
        kv: &KeyValue,
        lease: LeaseId,
    ) -> Result<(Revision, Revision)> {
        let in_flight = self.heal_writes.clone().read_owned().await;
        let latest = self.latest();
        if kv.value == latest {
            return Ok((kv.create_revision, kv.mod_revision));
        }
        tracing::warn!(
            "the key under our lease carries other metadata than the latest; rewriting it"
        );
        let key = self.config.key.clone();
        let put = PutRequest::new(key.clone(), latest).with_lease(lease);
        let txn = TxnRequest::new()
            .when([Compare::mod_revision(
                key,
                CompareOp::Equal,
                kv.mod_revision,
            )])
            .and_then([TxnOp::Put(put)]);
        let r = self.write(txn, in_flight).await?;
        // Written by someone else meanwhile: only an update (with the latest value) or an
        // operator can have; what stands is not ours to overwrite.
        let mod_revision = if r.succeeded {
            r.revision
        } else {
            kv.mod_revision
        };
        Ok((kv.create_revision, mod_revision))
    }

    /// Runs a write of the key. It runs on as a task of its own, holding its place among the
    /// heal writes until it resolves, if the heal stops waiting for it (its session ended
    /// meanwhile).
    pub(super) async fn write(
        &self,
        txn: TxnRequest,
        in_flight: tokio::sync::OwnedRwLockReadGuard<()>,
    ) -> Result<TxnResponse> {
        let store = self.store().clone();
        let write = tokio::spawn(
            async move {
                let _in_flight = in_flight;
                store.txn(txn).await
            }
            .in_current_span(),
        );
        write.await.map_err(|e| Error::Rejected {
            backend: "coord",
            operation: "registration put",
            source: e.to_string().into(),
        })?
    }

    pub(super) fn latest(&self) -> Bytes {
        self.metadata
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub(super) fn set_session(&self, session: Option<SessionHandle>) {
        *self.session.lock().unwrap_or_else(|p| p.into_inner()) = session;
    }

    /// Deletes the key if it lives under one of the host's leases (another writer's key at
    /// the same path is left alone). Retried in the background when the store cannot be
    /// reached; the error is returned.
    pub(super) async fn remove_key(self: &Arc<Self>) -> Result<()> {
        let key_turn = self.host.key_turn(&self.config.key);
        let first = {
            let _turn = key_turn.turn.clone().lock_owned().await;
            delete_if_under(self.store(), &self.config.key, &self.host.leases()).await
        };
        match first {
            Ok(()) => Ok(()),
            Err(e) => {
                // Retried until it lands, unless a registration of the key started on this
                // host session writes it first (its write calls the retries off).
                let called_off = key_turn.pending_cleanup();
                let shared = self.clone();
                tokio::spawn(
                    async move {
                        let key = shared.config.key.as_bytes();
                        let mut backoff = retry::Backoff::store(retry::seed(&[key]));
                        let leases = &shared.host.leases();
                        let _ = retry::until(&mut backoff, called_off.stopped(), |_| async {
                            let turn = tokio::select! {
                                biased;
                                _ = called_off.stopped() => return ControlFlow::Break(()),
                                turn = key_turn.turn.clone().lock_owned() => turn,
                            };
                            if called_off.is_stopped() {
                                return ControlFlow::Break(());
                            }
                            let removed =
                                delete_if_under(shared.store(), &shared.config.key, leases).await;
                            drop(turn);
                            match removed {
                                Ok(_) => ControlFlow::Break(()),
                                Err(_) => ControlFlow::Continue(()),
                            }
                        })
                        .await;
                    }
                    .in_current_span(),
                );
                Err(e)
            }
        }
    }
}

/// Deletes `key` if its lease is one of `leases`.
pub(super) async fn delete_if_under(
    store: &Arc<DynKvLeaseStore>,
    key: &str,
    leases: &[LeaseId],
) -> Result<()> {
    for &lease in leases {
        let txn = TxnRequest::new()
            .when([Compare::lease(key, CompareOp::Equal, lease)])
            .and_then([TxnOp::Delete(DeleteRequest::key(key))]);
        if store.txn(txn).await?.succeeded {
            return Ok(());
        }
    }
    Ok(())
}
