//! The registration's task: register, hold the key while the session lives, heal when it
//! ends.

use super::*;

/// A registered key: its session, and the key's create and mod revisions.
pub(super) type Held = (SessionHandle, (Revision, Revision));

/// Takes the host's live session, publishes its lease, then writes the key under it. A stop
/// (`cancel`) that comes while the lease is still being granted ends the attempt before
/// anything is written: a heal held up by a slow grant must not put the key seconds after its
/// stop was asked (by then a newer incarnation may hold the name). A put already sent is
/// waited for, and `stop` removes what it wrote; nothing more is sent (a key it finds with
/// older metadata is left for the stop, not rewritten).
///
/// Starting, it takes the key from whatever lease holds it (`takes_over`); healing, it waits
/// while another's lease holds it (see [`Shared::put`]).
pub(super) async fn register(
    shared: &Shared,
    cancel: Option<&Stop>,
    takes_over: bool,
) -> Result<Held> {
    let cancel = cancel.filter(|_| {
        !crate::hooks::planted::enabled(crate::hooks::planted::Bug::StopSkipsTheHeal)
            && !crate::hooks::planted::enabled(crate::hooks::planted::Bug::HealOutlivesTheStop)
    });
    let session = match cancel {
        Some(cancel) => tokio::select! {
            biased;
            _ = cancel.stopped() => {
                return Err(Error::Cancelled {
                    operation: "registration (stopped while its lease was granted)",
                })
            }
            session = shared.host.session() => session?,
        },
        None => shared.host.session().await?,
    };
    // Published before the put, so that a stop() that comes later removes the key whatever
    // lease it is written under (see the module docs).
    shared.lease.store(session.lease().0, Ordering::SeqCst);
    let written = loop {
        match shared.put(&session, cancel, takes_over).await {
            Ok(Written::Taken(kv)) => {
                tracing::warn!(
                    lease_id = %kv.lease,
                    "registered key taken by another lease; waiting for it to be freed"
                );
                let freed = until_freed(shared, &kv);
                match cancel {
                    Some(cancel) => tokio::select! {
                        biased;
                        _ = cancel.stopped() => break Err(Error::Cancelled {
                            operation: "registration (stopped while another lease held its key)",
                        }),
                        _ = freed => {}
                    },
                    None => freed.await,
                }
            }
            Ok(Written::Stands(revisions)) => break Ok(revisions),
            Err(e) => break Err(e),
        }
    };
    match written {
        Ok(revisions) => {
            shared.set_session(Some(session.clone()));
            // A reply that came after the session's deadline (a held link, a slow store)
            // registered nothing to rely on: the hold that follows ends at once and heals.
            if !session.is_done() {
                shared.status.send_replace(RegistrationStatus::Registered {
                    lease: session.lease(),
                });
            }
            // The key is under the live lease: older leases of the host hold nothing of ours.
            shared.host.moved(shared.id, session.lease());
            crate::hooks::explore::point().await;
            Ok((session, revisions))
        }
        Err(e) => {
            shared.lease.store(0, Ordering::SeqCst);
            if let Error::LeaseNotFound { lease } = e {
                shared.host.evict(lease).await;
            }
            Err(e)
        }
    }
}

/// Waits until `kv`, the key as another lease holds it, is gone or written under another.
async fn until_freed(shared: &Shared, kv: &KeyValue) {
    let created = kv.create_revision;
    Follow::new(
        shared.store().clone(),
        kv.key.clone(),
        kv.mod_revision.next(),
        Some((created, kv.mod_revision)),
    )
    .until_gone(|now| now.create_revision == created && now.lease == kv.lease)
    .await;
}

/// Registers (unless `first` did) and keeps the key while the session lives; heals when it
/// dies.
pub(super) async fn run(shared: Arc<Shared>, first: Option<Held>, cancel: Stop) {
    let cfg = &shared.config;
    let seed = cfg.backoff_seed ^ retry::seed(&[cfg.key.as_bytes()]);
    let mut backoff = Backoff::new(cfg.initial_backoff, cfg.max_backoff, seed);
    let mut next = first;
    let mut healing = false;
    loop {
        let (session, revisions) = match next.take() {
            Some(held) => held,
            None => match establish(&shared, &mut backoff, healing, &cancel).await {
                Some(held) => held,
                None => return,
            },
        };
        if healing {
            tracing::info!(lease_id = %session.lease(), "registration healed");
            crate::metrics::record::registration_healed();
        } else {
            tracing::info!(lease_id = %session.lease(), "registered");
        }
        // Hold the key until the session ends (or the registration stops).
        let end = tokio::select! {
            biased;
            _ = cancel.stopped() => return,
            end = hold(&shared, &session, revisions) => end,
        };
        tracing::warn!(lease_id = %session.lease(), reason = %end, "registration lost; healing");
        crate::metrics::record::registration_lost();
        // Said at once: evicting the lease below may wait behind a grant another recipe of
        // the host has in flight.
        shared
            .status
            .send_replace(RegistrationStatus::Healing { attempt: 0 });
        shared.lease.store(0, Ordering::SeqCst);
        shared.set_session(None);
        if end == SessionEnd::LeaseLost {
            // The store may have said so to us alone: the host's session must not be reused.
            shared.host.evict(session.lease()).await;
        }
        healing = true;
        if crate::hooks::planted::enabled(crate::hooks::planted::Bug::RegistrationGivesUpOnLoss) {
            shared
                .status
                .send_replace(RegistrationStatus::Healing { attempt: 0 });
            cancel.stopped().await;
            return;
        }
    }
}

/// Registers, backing off between attempts (and before the first, when healing: the loss
/// may be the store restarting). `None` when cancelled.
pub(super) async fn establish(
    shared: &Shared,
    backoff: &mut Backoff,
    healing: bool,
    cancel: &Stop,
) -> Option<Held> {
    let healing_at = |attempt| {
        if healing {
            shared
                .status
                .send_replace(RegistrationStatus::Healing { attempt });
        }
    };
    healing_at(1);
    let registered = retry::until(&mut *backoff, cancel.stopped(), |turn| async move {
        // Healing, the first turn only waits: the loss may be the store restarting.
        let attempt = if healing { turn - 1 } else { turn };
        if attempt == 0 {
            return ControlFlow::Continue(());
        }
        crate::hooks::explore::point().await;
        // A cancel that lands while the lease is granted ends the attempt; one that lands
        // during the put waits for it: the attempt has published its lease first, so stop()
        // removes whatever it wrote.
        match register(shared, Some(cancel), !healing).await {
            Ok(held) => {
                if attempt > 1 || healing {
                    tracing::debug!(attempts = attempt, "registered after retrying");
                }
                ControlFlow::Break(held)
            }
            Err(e) => {
                tracing::debug!(
                    attempt,
                    error = &e as &dyn std::error::Error,
                    "registration attempt failed"
                );
                // Said before the wait, which is part of the next attempt.
                healing_at(attempt + 1);
                ControlFlow::Continue(())
            }
        }
    });
    let held = registered.await.ok()?;
    if !crate::hooks::planted::enabled(crate::hooks::planted::Bug::BackoffNeverResets) {
        backoff.reset();
    }
    Some(held)
}

/// Follows the key while the session lives, putting it back if it is deleted under a live
/// lease. Returns why the session ended.
pub(super) async fn hold(
    shared: &Shared,
    session: &SessionHandle,
    (created, modified): (Revision, Revision),
) -> SessionEnd {
    let mut follow = Follow::new(
        shared.store().clone(),
        shared.config.key.clone().into_bytes(),
        modified.next(),
        Some((created, modified)),
    )
    .answered_within(session.ttl() / 3);
    // One wait for the session's end, for the hold's life: each metadata update comes back
    // as a change to the followed key, and a fresh wait per change subscribed to the session
    // and read the clock again.
    let done = session.done();
    tokio::pin!(done);
    loop {
        let change = tokio::select! {
            biased;
            end = &mut done => return end,
            change = follow.next() => change,
        };
        let registered = RegistrationStatus::Registered {
            lease: session.lease(),
        };
        if let Change::Put(kv) = &change {
            // Another lease took the key: a newer incarnation of the host (or another process
            // under the same name). The name is not ours while it holds it, and fighting for
            // it would have two owners take turns: not registered until the key is freed (a
            // delete, put back below) or ours again.
            let ours = kv.lease == session.lease();
            if !ours && shared.status.get() == registered {
                tracing::warn!(
                    lease_id = %kv.lease,
                    "registered key taken by another lease; waiting for it to be freed"
                );
                shared
                    .status
                    .send_replace(RegistrationStatus::Healing { attempt: 0 });
            } else if ours && matches!(shared.status.get(), RegistrationStatus::Healing { .. }) {
                shared.status.send_replace(registered);
            }
            continue;
        }
        if let Change::Deleted(_) = change {
            if session.is_done() {
                continue;
            }
            // The key is gone: whoever reads the status must not take it for present while
            // it is put back (the put may wait out a lost reply).
            shared
                .status
                .send_replace(RegistrationStatus::Healing { attempt: 0 });
            match put_back(shared, session).await {
                PutBack::Ended(end) => return end,
                // The follow sees the other lease's put, and what becomes of it.
                PutBack::Taken => {}
                PutBack::Back => {
                    shared.status.send_replace(RegistrationStatus::Registered {
                        lease: session.lease(),
                    });
                }
            }
        }
    }
}

/// What became of a key put back.
pub(super) enum PutBack {
    /// Under the live lease again.
    Back,
    /// Another lease took it after it was deleted (see [`Shared::put`]).
    Taken,
    /// The session ended first.
    Ended(SessionEnd),
}

/// Puts the key back after it was deleted, retrying until it is back, taken, or the session
/// ends. A lease that turns out to be gone (the delete was its expiry or revocation) ends the
/// hold at once, so the heal starts now rather than at the session's next renewal.
pub(super) async fn put_back(shared: &Shared, session: &SessionHandle) -> PutBack {
    let mut backoff = retry::Backoff::store(retry::seed(&[shared.config.key.as_bytes()]));
    let put_back = retry::until(&mut backoff, session.done(), |_| async {
        let put = tokio::select! {
            biased;
            end = session.done() => return ControlFlow::Break(PutBack::Ended(end)),
            // Dropped, not asked, at a stop (the hold is): no stop to look at.
            put = shared.put(session, None, false) => put,
        };
        match put {
            Ok(Written::Taken(_)) => ControlFlow::Break(PutBack::Taken),
            Ok(Written::Stands(_)) => {
                tracing::warn!("registered key was deleted under a live lease; put it back");
                crate::metrics::record::registration_repaired();
                ControlFlow::Break(PutBack::Back)
            }
            Err(Error::LeaseNotFound { .. }) => {
                ControlFlow::Break(PutBack::Ended(SessionEnd::LeaseLost))
            }
            Err(e) => {
                tracing::debug!(
                    error = &e as &dyn std::error::Error,
                    "could not put the key back; retrying"
                );
                ControlFlow::Continue(())
            }
        }
    });
    match put_back.await {
        Ok(done) => done,
        Err(end) => PutBack::Ended(end),
    }
}
