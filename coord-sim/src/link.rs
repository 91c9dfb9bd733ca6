//! One client's connection to a [`SimStore`](crate::SimStore), and the network faults set on
//! it: cut off (a partition), held (messages stall until released), deaf (requests arrive,
//! replies are lost: a one-way partition), latency and lost replies.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use coord_api::{Error, Result};
use tokio::sync::watch;

/// The link's fault state; streams and calls wait on its changes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct LinkState {
    /// Partitioned both ways: calls fail fast, streams stall, then die.
    pub(crate) cut: bool,
    /// Requests reach the store, replies do not: calls apply and then time out, streams
    /// stall, then die.
    pub(crate) deaf: bool,
    /// Everything stalls until released; nothing is lost.
    pub(crate) held: bool,
    /// Bumped whenever the connection breaks (cut or deaf): streams opened before are dead.
    pub(crate) generation: u64,
}

impl LinkState {
    /// Whether a stream can deliver now.
    pub(crate) fn flowing(&self) -> bool {
        !self.cut && !self.deaf && !self.held
    }
}

/// A client's link. Clones of a `SimStore` handle share it.
#[derive(Debug)]
pub(crate) struct Link {
    /// Unique within the store; the journal names clients by it.
    pub(crate) id: u64,
    state: watch::Sender<LinkState>,
    /// How many of the client's next writes lose their reply.
    lost_replies: AtomicU32,
    /// Extra time every call of the client takes, in nanoseconds.
    latency_ns: AtomicU64,
}

impl Link {
    pub(crate) fn new(id: u64) -> Self {
        Link {
            id,
            state: watch::Sender::new(LinkState::default()),
            lost_replies: AtomicU32::new(0),
            latency_ns: AtomicU64::new(0),
        }
    }

    pub(crate) fn state(&self) -> LinkState {
        *self.state.borrow()
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<LinkState> {
        self.state.subscribe()
    }

    /// Changes the fault state; entering a cut or deaf state breaks the connection.
    pub(crate) fn update(&self, change: impl FnOnce(&mut LinkState)) {
        self.state.send_modify(|s| {
            let before = s.cut || s.deaf;
            change(s);
            if !before && (s.cut || s.deaf) {
                s.generation += 1;
            }
        });
    }

    pub(crate) fn set_lost_replies(&self, count: u32) {
        self.lost_replies.store(count, Ordering::SeqCst);
    }

    pub(crate) fn set_latency(&self, latency: Duration) {
        let ns = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        self.latency_ns.store(ns, Ordering::SeqCst);
    }

    /// The way to the store: waits while held, takes the latency, fails when cut off.
    /// Returns whether the reply will be lost (the link is deaf).
    pub(crate) async fn travel(
        &self,
        base_latency: Duration,
        operation: &'static str,
    ) -> Result<bool> {
        let mut rx = self.subscribe();
        while rx.borrow_and_update().held {
            if rx.changed().await.is_err() {
                break;
            }
        }
        let latency = base_latency + Duration::from_nanos(self.latency_ns.load(Ordering::SeqCst));
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        let state = self.state();
        if state.cut {
            return Err(Error::Unavailable {
                backend: "sim",
                operation,
                source: "this client is cut off from the simulated store".into(),
            });
        }
        Ok(state.deaf)
    }

    /// Takes one lost reply, if one is due.
    pub(crate) fn take_lost_reply(&self) -> bool {
        self.lost_replies
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }

    /// Waits until a stream opened under `generation` may deliver: `Ok` when it can, `Err`
    /// when its connection broke meanwhile (it must end with `StreamClosed`).
    pub(crate) async fn wait_flowing(&self, generation: u64) -> std::result::Result<(), ()> {
        let mut rx = self.subscribe();
        loop {
            let s = *rx.borrow_and_update();
            if s.flowing() {
                return if s.generation == generation {
                    Ok(())
                } else {
                    Err(())
                };
            }
            if rx.changed().await.is_err() {
                return Err(());
            }
        }
    }
}
