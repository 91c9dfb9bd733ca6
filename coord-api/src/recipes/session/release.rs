//! Revoking a lease nobody renews any more, in the background, until the store says it is
//! gone.

use super::*;

/// Revokes `lease` in the background until the store says it is gone. A lease we no longer
/// renew may still live at the store (renewals arrived without their replies, an etcd restart
/// refreshed it), and keys under it, such as a queued candidate, block others until it
/// expires; after a long outage a restarted etcd refreshes it again, so the revoke must keep
/// trying, not give up after a while.
///
/// It keeps trying for as long as the store client is in use: the task holds it weakly, and
/// ends once every other handle to it is gone (the process shutting down, or a test's host
/// crashed with everything it held), as the process it served would have.
pub(crate) fn release_lease(store: Arc<DynKvLeaseStore>, lease: LeaseId) {
    release_lease_then(store, lease, || {});
}

/// [`release_lease`], calling `gone` once the store says the lease is gone.
pub(crate) fn release_lease_then(
    store: Arc<DynKvLeaseStore>,
    lease: LeaseId,
    gone: impl FnOnce() + Send + 'static,
) {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        tracing::warn!(lease_id = %lease, "no runtime to revoke an abandoned lease; it will expire");
        return;
    };
    let store = Arc::downgrade(&store);
    rt.spawn(
        async move {
            let mut backoff = retry::Backoff::store(retry::seed(&[&lease.0.to_le_bytes()]));
            let revoked = retry::until(&mut backoff, pending::<Infallible>(), |attempts| {
                let store = store.upgrade();
                async move {
                    let Some(store) = store else {
                        tracing::debug!(lease_id = %lease, "the store client is gone; no more revokes of an abandoned lease");
                        return ControlFlow::Break(false);
                    };
                    match store.revoke(lease).await {
                        Ok(_) => {
                            tracing::info!(lease_id = %lease, attempts, "revoked an abandoned lease");
                            ControlFlow::Break(true)
                        }
                        Err(Error::LeaseNotFound { .. }) => ControlFlow::Break(true),
                        Err(e) => {
                            tracing::debug!(
                                lease_id = %lease,
                                attempts,
                                error = &e as &dyn std::error::Error,
                                "could not revoke an abandoned lease yet; retrying"
                            );
                            ControlFlow::Continue(())
                        }
                    }
                }
            });
            let Ok(revoked) = revoked.await;
            if revoked {
                gone();
            }
        }
        .in_current_span(),
    );
}
