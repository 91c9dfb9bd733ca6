//! What a held key offers, written once for the handles that hold one: [`MutexGuard`] and
//! [`Permit`]. Both wrap a [`Leadership`] (`held: Option<Leadership>`, taken only when the
//! handle is consumed), so fencing and loss mean the same for a lock, a permit and a leader.
//!
//! [`MutexGuard`]: super::MutexGuard
//! [`Permit`]: super::Permit
//! [`Leadership`]: super::Leadership

/// The fencing and loss methods of a handle with a `held: Option<Leadership>` field; `$what`
/// names what is held ("lock", "permit") in their docs.
macro_rules! held_key_methods {
    ($what:literal) => {
        fn held(&self) -> &Leadership {
            self.held
                .as_ref()
                .expect("held until the handle is consumed")
        }

        #[doc = concat!("The fencing token: the ", $what, " key's create revision. A key created later has a larger one.")]
        pub fn token(&self) -> Revision {
            self.held().token()
        }

        #[doc = concat!("The ", $what, " key (name, key, token, lease).")]
        pub fn key(&self) -> &LeaderKey {
            self.held().key()
        }

        #[doc = concat!("The instant after which the ", $what, " must not be trusted (the session's deadline).")]
        pub fn deadline(&self) -> Instant {
            self.held().deadline()
        }

        #[doc = concat!("True until the ", $what, " is known lost or its deadline passed.")]
        pub fn is_held(&self) -> bool {
            self.held().is_leader()
        }

        #[doc = concat!("Resolves when the ", $what, " is over, with why: the session's deadline passed or it ended, the key was deleted, or a fenced write was refused.")]
        pub async fn lost(&self) -> LossReason {
            self.held().lost().await
        }

        #[doc = concat!("`txn` made conditional on still holding the ", $what, "; see [`Leadership::fenced`].")]
        pub fn fenced(&self, txn: TxnRequest) -> TxnRequest {
            self.held().fenced(txn)
        }

        /// The compare behind [`fenced`](Self::fenced), for building transactions by hand.
        pub fn guard(&self) -> Compare {
            self.held().guard()
        }

        #[doc = concat!("A handle that runs transactions fenced by this ", $what, ", which a task can own.")]
        pub fn fence(&self) -> Fence {
            self.held().fence()
        }

        #[doc = concat!("Runs `txn` only while this ", $what, " is held; see [`Fence::txn`].")]
        ///
        /// # Errors
        /// [`Error::FencedOut`] when the store refuses it because the key no longer counts
        /// (the handle is then lost); whatever the store fails with.
        pub async fn txn(&self, txn: TxnRequest) -> Result<TxnResponse> {
            self.held().txn(txn).await
        }
    };
}

pub(crate) use held_key_methods;
