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
    /// The versions the key's fences stand at, per lease (see `crate::elections::limbo`):
    /// every write of the key is conditional on its lease's, and one that comes back
    /// `Indeterminate` raises it before it counts as settled, so it cannot land after the
    /// writes that follow it (an update's newer metadata, a stop's removal).
    pub(super) fences: Arc<Mutex<Fences>>,
    /// Set as [`stop`](HostRegistration::stop) begins: from then on nothing more of the key
    /// is sent but removals (L7 in `docs/INVARIANTS.md`).
    pub(super) stopping: Arc<std::sync::atomic::AtomicBool>,
}

/// A registration's write's place among the heal writes, and the book of the key's fences.
struct InFlight {
    _place: tokio::sync::OwnedRwLockReadGuard<()>,
    fences: Arc<Mutex<Fences>>,
}

impl Hold for InFlight {
    fn book(&mut self) -> &mut (dyn FenceBook + Send) {
        &mut self.fences
    }
}

/// Where a registration's put left the key.
#[derive(Debug)]
pub(super) enum Written {
    /// Under the session's lease: its create and mod revisions.
    Stands((Revision, Revision)),
    /// Under another lease, not the host's: someone else registered the name.
    Taken(KeyValue),
}

impl Shared {
    pub(super) fn store(&self) -> &Arc<DynKvLeaseStore> {
        self.host.store()
    }

    /// Writes the key under the session's lease with the latest metadata, unless it already
    /// stands under that lease; returns its create and mod revisions, or where another
    /// holds it.
    ///
    /// A registration starting takes the key from whatever lease holds it (`takes_over`):
    /// in a rolling restart the new incarnation takes the name from the old one, whose lease
    /// may live on for a TTL. A heal, or a key put back, takes it only when it is absent or
    /// under one of the host's own earlier leases: under another, a newer incarnation (or
    /// another process under the same name) registered it meanwhile, and the name is not
    /// ours while it holds it ([`Written::Taken`]; turmoil seed 130454: an old incarnation's
    /// heal took the key from the new one in the instant it registered).
    ///
    /// An update writes the latest value there, so a key found under the lease is not
    /// overwritten with what may by then be older: a heal never waits for an update to
    /// finish (its put may be waiting out a lost reply), and never writes over a newer value;
    /// an update waits for the heal writes in flight. Found with older metadata (a heal write
    /// that landed after its caller gave up on it), it is brought up to date
    /// ([`bring_up_to_date`](Self::bring_up_to_date)), unless `stop` was asked meanwhile:
    /// the stop removes the key, and a write sent after it was asked may land after the
    /// name went to a newer incarnation.
    pub(super) async fn put(
        &self,
        session: &SessionHandle,
        stop: Option<&Stop>,
        takes_over: bool,
    ) -> Result<Written> {
        let lease = session.lease();
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
        let key = self.config.key.clone();
        // Whom the key may be taken from: any other lease, or (healing) none but the host's
        // own earlier ones, each a compare of its own.
        let mut from = if takes_over {
            Compare::lease(key.clone(), CompareOp::NotEqual, lease)
        } else {
            Compare::create_revision(key.clone(), CompareOp::Equal, 0)
        };
        loop {
            let in_flight = self.heal_writes.clone().read_owned().await;
            let metadata = if crate::hooks::planted::enabled(
                crate::hooks::planted::Bug::HealWritesFirstMetadata,
            ) {
                self.config.metadata.clone()
            } else {
                self.latest()
            };
            let put = PutRequest::new(key.clone(), metadata)
                .with_lease(lease)
                .with_prev_kv();
            let txn = TxnRequest::new()
                .when([from])
                .and_then([TxnOp::Put(put)])
                .or_else([TxnOp::Get(GetRequest::key(key.clone()))]);
            let r = self
                .write(txn, session.key_fencing(&key), in_flight)
                .await?;
            let found = match r.responses.first() {
                Some(TxnOpResponse::Put(p)) => {
                    return Ok(Written::Stands(
                        p.prev_kv.as_ref().map_or((r.revision, r.revision), |kv| {
                            (kv.create_revision, r.revision)
                        }),
                    ));
                }
                Some(TxnOpResponse::Get(g)) => g.kvs.first(),
                _ => None,
            };
            match found {
                Some(kv) if kv.lease == lease => {
                    if stop.is_some_and(Stop::is_stopped) {
                        tracing::debug!("stopping: the key under our lease is left for the stop");
                        return Ok(Written::Stands((kv.create_revision, kv.mod_revision)));
                    }
                    return self
                        .bring_up_to_date(kv, session)
                        .await
                        .map(Written::Stands);
                }
                Some(kv) if !takes_over && self.host.leases().contains(&kv.lease) => {
                    // Under an earlier lease of this host's: ours to move onto this one,
                    // unless the stop was asked meanwhile (it removes the key).
                    if stop.is_some_and(Stop::is_stopped) {
                        return Err(Error::Cancelled {
                            operation: "registration (stopped while its key was moved)",
                        });
                    }
                    from = Compare::lease(key.clone(), CompareOp::Equal, kv.lease);
                }
                Some(kv) if !takes_over => return Ok(Written::Taken(kv.clone())),
                // Gone between the compare and the read, or the fence moved on (a write of
                // unknown outcome meanwhile): tried again by the caller.
                _ => {
                    return Err(Error::Rejected {
                        backend: "coord",
                        operation: "registration put",
                        source: format!("the store answered {r:?}").into(),
                    })
                }
            }
        }
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
        session: &SessionHandle,
    ) -> Result<(Revision, Revision)> {
        let lease = session.lease();
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
                key.clone(),
                CompareOp::Equal,
                kv.mod_revision,
            )])
            .and_then([TxnOp::Put(put)]);
        let r = self
            .write(txn, session.key_fencing(&key), in_flight)
            .await?;
        // Written by someone else meanwhile: only an update (with the latest value) or an
        // operator can have; what stands is not ours to overwrite.
        let mod_revision = if r.succeeded {
            r.revision
        } else {
            kv.mod_revision
        };
        Ok((kv.create_revision, mod_revision))
    }

    /// Runs a write of the key, conditional on `fencing`'s fence. It runs on as a task of its
    /// own, holding its place among the heal writes until it resolves, if the heal stops
    /// waiting for it (its session ended meanwhile); one that comes back `Indeterminate`
    /// raises the fence before it lets go of that place (see `crate::elections::limbo`).
    pub(super) async fn write(
        &self,
        txn: TxnRequest,
        fencing: Fencing,
        in_flight: tokio::sync::OwnedRwLockReadGuard<()>,
    ) -> Result<TxnResponse> {
        let stopping = self.stopping.clone();
        let removal = !txn.success.iter().any(|op| matches!(op, TxnOp::Put(_)));
        let may_resend = move || removal || !stopping.load(Ordering::SeqCst);
        let hold = InFlight {
            _place: in_flight,
            fences: self.fences.clone(),
        };
        fenced(self.store().clone(), txn, hold, fencing, may_resend)
            .await
            .0
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
            self.delete_if_under(&self.host.leases()).await
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
                            let removed = shared.delete_if_under(leases).await;
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

impl Shared {
    /// Deletes the key if its lease is one of `leases`, each try fenced (see
    /// [`write`](Self::write)): a removal given up on cannot land after a registration started
    /// since wrote the key.
    pub(super) async fn delete_if_under(&self, leases: &[LeaseId]) -> Result<()> {
        let key = self.config.key.as_str();
        let live = self.host.current();
        for &lease in leases {
            let txn = TxnRequest::new()
                .when([Compare::lease(key, CompareOp::Equal, lease)])
                .and_then([TxnOp::Delete(DeleteRequest::key(key))]);
            let fencing = match &live {
                Some(session) if session.lease() == lease => session.key_fencing(key),
                // A lease set aside is gone at the store within its TTL of its last renewal,
                // which came before it was set aside; twice that bounds the fence's tries.
                _ => Fencing::key(key, lease, tokio::time::sleep(self.host.config().ttl * 2)),
            };
            let in_flight = self.heal_writes.clone().read_owned().await;
            if self.write(txn, fencing, in_flight).await?.succeeded {
                return Ok(());
            }
        }
        Ok(())
    }
}
