//! A keep-alive channel: renewals over the client's link, dead once the store closes its
//! streams.

use std::sync::atomic::Ordering;
use std::time::Duration;

use async_trait::async_trait;
use coord_api::{KeepAlive, LeaseId, Result};

use crate::store::{Call, SimStore};

/// A keep-alive channel on a [`SimStore`]: each renewal is one call into the state machine.
#[derive(Debug)]
pub(crate) struct SimKeepAlive {
    /// The client that opened the channel: its link's faults apply to renewals.
    pub(crate) client: SimStore,
    pub(crate) lease: LeaseId,
    pub(crate) epoch: u64,
    /// The client's connection it was opened on.
    pub(crate) generation: u64,
}

#[async_trait]
impl KeepAlive for SimKeepAlive {
    fn lease(&self) -> LeaseId {
        self.lease
    }

    async fn renew(&mut self) -> Result<Duration> {
        // A stream whose connection broke (or that the store closed) fails at once; a
        // renewal on a live one crosses the link like any call.
        if self.client.shared.stream_epoch.load(Ordering::SeqCst) != self.epoch
            || self.client.link.state().generation != self.generation
        {
            return Err(coord_api::Error::StreamClosed {
                stream: "keep-alive",
                source: Some("the simulated stream was closed".into()),
            });
        }
        let lease = self.lease;
        self.client
            .call("keep-alive", Call::Renew, move |c| {
                let (r, earlier) = c.apply(|s, now| {
                    let before = s.next_deadline();
                    let r = s.renew(now, lease);
                    (r, s.next_deadline() < before)
                });
                // A renewal can move the earliest deadline earlier too: after a leader
                // change refreshed the lease to TTL + election timeout, a renewal sets it
                // back to now + TTL, as etcd's does. Only then does the expiry task need
                // waking (waking it on every renewal costs a scan of every watch, per
                // renewal).
                if earlier {
                    c.shared.deadlines_changed.notify_one();
                }
                r
            })
            .await
    }
}
