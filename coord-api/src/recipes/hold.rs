//! [`HeldKey`]: a key held at the head of a queue others wait in, the one type behind a
//! [`MutexGuard`] and a [`Permit`]. It wraps a [`Leadership`], so fencing and loss mean the
//! same for a lock, a permit and a leader; unlike a leadership, dropping it gives the key up
//! (in the background), so that a handle forgotten in a task that ended does not keep the
//! queue waiting for a TTL.
//!
//! [`MutexGuard`]: super::MutexGuard
//! [`Permit`]: super::Permit

use tokio::time::Instant;

use super::election::{Fence, Leadership};
use super::loss::LossReason;
use crate::error::Result;
use crate::leader_key::LeaderKey;
use crate::txn::{Compare, TxnRequest, TxnResponse};
use crate::types::Revision;

/// A held key of a lock or a semaphore: its fencing token, its loss signal, and fenced
/// transactions. A [`MutexGuard`](super::MutexGuard) and a [`Permit`](super::Permit) are one
/// each, and offer these methods through `Deref`.
#[derive(Debug)]
pub struct HeldKey {
    /// Taken only when the handle is given up (its release, or its drop).
    held: Option<Leadership>,
    /// What is held, for the logs: "lock", "permit".
    what: &'static str,
}

impl HeldKey {
    pub(super) fn new(held: Leadership, what: &'static str) -> Self {
        HeldKey {
            held: Some(held),
            what,
        }
    }

    fn held(&self) -> &Leadership {
        self.held
            .as_ref()
            .expect("held until the handle is consumed")
    }

    /// The fencing token: the key's create revision. A key created later has a larger one.
    pub fn token(&self) -> Revision {
        self.held().token()
    }

    /// The key (name, key, token, lease).
    pub fn key(&self) -> &LeaderKey {
        self.held().key()
    }

    /// The instant after which the key must not be trusted (the session's deadline).
    pub fn deadline(&self) -> Instant {
        self.held().deadline()
    }

    /// True until the key is known lost or its deadline passed.
    pub fn is_held(&self) -> bool {
        self.held().is_leader()
    }

    /// Resolves when holding the key is over, with why: the session's deadline passed or it
    /// ended, the key was deleted, or a fenced write was refused.
    pub async fn lost(&self) -> LossReason {
        self.held().lost().await
    }

    /// `txn` made conditional on still holding the key; see [`Leadership::fenced`].
    pub fn fenced(&self, txn: TxnRequest) -> TxnRequest {
        self.held().fenced(txn)
    }

    /// The compare behind [`fenced`](Self::fenced), for building transactions by hand.
    pub fn guard(&self) -> Compare {
        self.held().guard()
    }

    /// A handle that runs transactions fenced by this key, which a task can own.
    pub fn fence(&self) -> Fence {
        self.held().fence()
    }

    /// Runs `txn` only while the key is held; see [`Fence::txn`].
    ///
    /// # Errors
    /// [`Error::FencedOut`](crate::Error::FencedOut) when the store refuses it because the
    /// key no longer counts (the handle is then lost); whatever the store fails with.
    pub async fn txn(&self, txn: TxnRequest) -> Result<TxnResponse> {
        self.held().txn(txn).await
    }

    /// Deletes the key if it is still this one, and this handle's (not taken over by a newer
    /// acquisition on the same session), in the caller.
    pub(super) async fn release(mut self) -> Result<()> {
        let held = self.held.take().expect("held until the handle is consumed");
        let (name, token) = (held.key().name.clone(), held.token());
        held.resign().await?;
        tracing::info!(what = self.what, %name, %token, "released");
        Ok(())
    }

    /// Deletes the key in the background (see [`Leadership::withdraw_in_background`]).
    pub(super) fn release_in_background(mut self) {
        if let Some(held) = self.held.take() {
            held.withdraw_in_background();
        }
    }
}

impl Drop for HeldKey {
    fn drop(&mut self) {
        if let Some(held) = self.held.take() {
            tracing::info!(what = self.what, name = %held.key().name, token = %held.token(), "released on drop");
            // In the session's turn: an acquisition on the same session right after this drop
            // takes the key over instead of racing its delete.
            held.withdraw_in_background();
        }
    }
}
