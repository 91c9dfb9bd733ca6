//! A keep-alive channel: renewals over the client's link, dead once the store closes its
//! streams.
//!
//! A renewal is a call like any other (it crosses the link both ways on the store's arrival
//! queue, and is lost, held or refused as a call is), but its state lives in the channel
//! from one renewal to the next: the queue carries the channel itself, not a closure, and
//! the answer comes back in it, not in a fresh channel. A thousand sessions renew a thousand
//! times a simulated second, and each renewal allocated three times (its reply's channel, its
//! request's closure and its reply's) into memory that had gone cold.

use std::future::poll_fn;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Poll, Waker};
use std::time::Duration;

use async_trait::async_trait;
use coord_api::{KeepAlive, LeaseId, Result};
use tokio::time::Instant;

use crate::arrivals::{Arrival, Kept};
use crate::link::Leg;
use crate::store::{Call, Delivery, SimStore};

/// A keep-alive channel on a [`SimStore`]. See the module docs.
#[derive(Debug)]
pub(crate) struct SimKeepAlive {
    channel: Arc<Channel>,
    lease: LeaseId,
    epoch: u64,
    /// The client's connection it was opened on.
    generation: u64,
}

impl SimKeepAlive {
    /// A channel for `lease` on `client`'s link, opened under the store's stream `epoch` and
    /// the link's connection `generation`.
    pub(crate) fn new(client: SimStore, lease: LeaseId, epoch: u64, generation: u64) -> Self {
        SimKeepAlive {
            channel: Arc::new(Channel {
                client,
                lease,
                state: Mutex::new(Renewal::default()),
            }),
            lease,
            epoch,
            generation,
        }
    }
}

/// What a channel keeps between renewals. Its [`Kept`] legs are numbered `renewal << 1`
/// for the request and `renewal << 1 | 1` for the reply.
#[derive(Debug)]
struct Channel {
    /// The client that opened the channel: its link's faults apply to renewals.
    client: SimStore,
    lease: LeaseId,
    state: Mutex<Renewal>,
}

/// The latest renewal: a leg of an earlier one (its caller gave up) finds another number
/// here and goes no further, as an answer sent to a dropped oneshot went nowhere.
///
/// Each leg of each renewal reads and writes it (the send, the landing, the reply, the
/// caller's wake-up), a thousand sessions' worth between one leg of a session and its next:
/// it is kept small (errors boxed), so the channel takes two lines of memory, not five.
#[derive(Debug, Default)]
struct Renewal {
    number: u64,
    /// Its caller still waits for it.
    waiting: bool,
    /// The latest renewal's outcome, applied at the store and on its way back.
    on_its_way: Option<std::result::Result<Duration, Box<coord_api::Error>>>,
    answer: Option<Reply>,
    waker: Option<Waker>,
}

/// A renewal's answer, as its channel keeps it for the caller.
#[derive(Debug)]
enum Reply {
    Renewed(Duration),
    Failed(Box<coord_api::Error>),
    /// The request or its reply: the caller waits out its timeout.
    Lost,
}

impl Channel {
    fn lock(&self) -> MutexGuard<'_, Renewal> {
        // Nothing runs under the lock but the channel's own bookkeeping.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Answers renewal `number`, if it is still the latest and waited for.
    fn answer(&self, number: u64, answer: Reply) {
        let waker = {
            let mut state = self.lock();
            if state.number != number || !state.waiting {
                return;
            }
            state.answer = Some(answer);
            state.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// Renewal `number`'s request reaches the store `now` over `leg`: lost, refused by a
    /// crashed store, or applied and its reply sent back.
    fn landed(self: &Arc<Self>, number: u64, leg: Leg, now: Instant) {
        let store = &self.client;
        let lease = self.lease;
        let landed = match leg {
            Leg::Lost => Delivery::Lost,
            Leg::Delivered => store.arrive("keep-alive", |c| {
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
            }),
        };
        let result = match landed {
            Delivery::Applied(result) => result,
            // Nothing comes back: the caller waits out its timeout.
            Delivery::Lost => return self.answer(number, Reply::Lost),
            Delivery::Refused(e) => return self.answer(number, Reply::Failed(Box::new(e))),
        };
        {
            let mut state = self.lock();
            // A request of an earlier renewal can land after the latest one's (it was held,
            // or slower): its outcome never takes the place of the latest one's.
            if state.number == number {
                state.on_its_way = Some(result.map_err(Box::new));
            }
        }
        let base = store.shared.config.latency;
        match store.link.reply_arrival(now, base) {
            Some(at) => store
                .shared
                .arrivals
                .push(at, Arrival::Kept(self.clone(), number << 1 | 1)),
            None => {
                let this = self.clone();
                tokio::spawn(async move {
                    this.client.link.reply_way(base).await;
                    this.replied(number);
                });
            }
        }
    }

    /// Renewal `number`'s reply reaches the client now, unless the link loses it.
    fn replied(&self, number: u64) {
        let result = {
            let mut state = self.lock();
            // A reply nobody waits for any more takes no lost reply from the link.
            if state.number != number || !state.waiting {
                return;
            }
            state.on_its_way.take()
        };
        if let Some(result) = result {
            let leg = self.client.link.replied(false);
            let reply = match (leg, result) {
                (Leg::Lost, _) => Reply::Lost,
                (Leg::Delivered, Ok(ttl)) => Reply::Renewed(ttl),
                (Leg::Delivered, Err(e)) => Reply::Failed(e),
            };
            self.answer(number, reply);
        }
    }
}

impl Kept for Channel {
    fn land(self: Arc<Self>, step: u64, now: Instant) {
        let number = step >> 1;
        if step & 1 == 0 {
            let leg = self.client.link.arrived();
            self.landed(number, leg, now);
        } else {
            self.replied(number);
        }
    }
}

/// Marks the caller gone when its renewal's future is dropped before its answer.
struct Waiting<'a>(&'a Channel);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        state.waiting = false;
        state.waker = None;
    }
}

#[async_trait]
impl KeepAlive for SimKeepAlive {
    fn lease(&self) -> LeaseId {
        self.lease
    }

    async fn renew(&mut self) -> Result<Duration> {
        let store = &self.channel.client;
        // A stream whose connection broke (or that the store closed) fails at once; a
        // renewal on a live one crosses the link like any call.
        if store.shared.stream_epoch.load(Ordering::SeqCst) != self.epoch
            || store.link.state().generation != self.generation
        {
            return Err(coord_api::Error::StreamClosed {
                stream: "keep-alive",
                source: Some("the simulated stream was closed".into()),
            });
        }
        let sent = store.shared.now();
        let number = {
            let mut state = self.channel.lock();
            state.number += 1;
            state.waiting = true;
            state.on_its_way = None;
            state.answer = None;
            state.number
        };
        let waiting = Waiting(&self.channel);
        let latency = store.shared.config.latency;
        match store.link.arrival(sent, latency) {
            // On the wire: it lands at its instant, in send order with every other call.
            Some(at) => store
                .shared
                .arrivals
                .push(at, Arrival::Kept(self.channel.clone(), number << 1)),
            // Held: it waits out the hold on its own, then goes the same way.
            None => {
                let channel = self.channel.clone();
                tokio::spawn(async move {
                    let leg = channel.client.link.request(latency).await;
                    let now = channel.client.shared.now();
                    channel.landed(number, leg, now);
                });
            }
        }
        let answer = poll_fn(|cx| {
            let mut state = waiting.0.lock();
            if let Some(answer) = state.answer.take() {
                return Poll::Ready(answer);
            }
            crate::waker::keep(&mut state.waker, cx.waker());
            Poll::Pending
        })
        .await;
        drop(waiting);
        match answer {
            Reply::Renewed(ttl) => Ok(ttl),
            Reply::Failed(e) => Err(*e),
            // Boxed, and the store named afresh rather than held across the wait: waiting out
            // a lost renewal is rare, and its state made every renewal's future (allocated
            // afresh each time) a line of memory larger.
            Reply::Lost => {
                Err(Box::pin(self.channel.client.lost("keep-alive", Call::Renew, sent)).await)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use coord_api::{Error, KvLeaseStore};
    use tokio::time::Instant;

    use crate::{SimConfig, SimStore};

    const LATENCY: Duration = Duration::from_millis(10);
    const TIMEOUT: Duration = Duration::from_secs(2);
    const TTL: Duration = Duration::from_secs(5);

    fn store() -> SimStore {
        SimStore::with_config(
            SimConfig::default()
                .with_latency(LATENCY)
                .with_request_timeout(TIMEOUT),
        )
    }

    /// A lease of `TTL` and a keep-alive channel for it.
    async fn open(store: &SimStore) -> (coord_api::LeaseId, Box<dyn coord_api::KeepAlive>) {
        let lease = store.grant(TTL).await.unwrap().id;
        (lease, store.keep_alive(lease).await.unwrap())
    }

    fn remaining(store: &SimStore, lease: coord_api::LeaseId) -> Duration {
        let s = store.shared.lock();
        let now = Instant::now();
        s.state.lease_deadline(lease).expect("alive") - now
    }

    #[tokio::test(start_paused = true)]
    async fn a_renewal_crosses_the_link_both_ways() {
        let store = store();
        let (lease, mut ch) = open(&store).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let sent = Instant::now();
        assert_eq!(ch.renew().await.unwrap(), TTL);
        assert_eq!(sent.elapsed(), 2 * LATENCY, "a latency each way");
        // Applied when it landed, one latency after it was sent.
        assert_eq!(remaining(&store, lease), TTL - LATENCY);
    }

    #[tokio::test(start_paused = true)]
    async fn a_renewal_lost_on_its_way_waits_out_the_timeout_and_renews_nothing() {
        let store = store();
        let (lease, mut ch) = open(&store).await;
        let sent = Instant::now();
        let renewal = tokio::spawn(async move { ch.renew().await });
        // Cut while the request is on the wire.
        tokio::time::sleep(LATENCY / 2).await;
        store.partition();
        let err = renewal.await.unwrap().unwrap_err();
        assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
        assert_eq!(sent.elapsed(), TIMEOUT);
        assert_eq!(remaining(&store, lease), TTL - LATENCY - TIMEOUT);
    }

    #[tokio::test(start_paused = true)]
    async fn a_held_renewal_lands_and_answers_once_released() {
        let store = store();
        let (lease, mut ch) = open(&store).await;
        store.hold();
        let renewal = tokio::spawn(async move { ch.renew().await });
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!renewal.is_finished(), "held");
        store.release();
        assert_eq!(renewal.await.unwrap().unwrap(), TTL);
        assert_eq!(remaining(&store, lease), TTL - LATENCY);
    }

    #[tokio::test(start_paused = true)]
    async fn a_renewal_given_up_still_lands_and_its_late_reply_is_not_the_next_ones() {
        let store = store();
        let (lease, mut ch) = open(&store).await;
        // The first renewal's reply comes back 100 ms late; its caller gives up before.
        store.set_reply_latency(Duration::from_millis(100));
        let given_up = tokio::time::timeout(LATENCY * 2, ch.renew()).await;
        assert!(given_up.is_err(), "still on its way back");
        assert_eq!(remaining(&store, lease), TTL - LATENCY, "it landed");
        // The next one's comes back later than the first one's.
        let slow = Duration::from_millis(500);
        store.set_reply_latency(slow);
        let sent = Instant::now();
        assert_eq!(ch.renew().await.unwrap(), TTL);
        assert_eq!(sent.elapsed(), 2 * LATENCY + slow, "its own answer");
    }

    #[tokio::test(start_paused = true)]
    async fn an_earlier_renewal_landing_late_does_not_answer_the_latest() {
        let store = store();
        let (lease, mut ch) = open(&store).await;
        // The first renewal's request takes half a second to land; its caller gives up.
        store.set_latency(Duration::from_millis(500));
        let given_up = tokio::time::timeout(LATENCY * 2, ch.renew()).await;
        assert!(given_up.is_err());
        // The second lands at once and renews; its reply takes a second to come back.
        store.set_latency(Duration::ZERO);
        store.set_reply_latency(Duration::from_secs(1));
        let second = tokio::spawn(async move { ch.renew().await });
        // Meanwhile another client revokes the lease, so the first renewal, landing after
        // the second, finds it gone.
        tokio::time::sleep(LATENCY * 5).await;
        store.connect().revoke(lease).await.unwrap();
        assert_eq!(
            second.await.unwrap().unwrap(),
            TTL,
            "the second renewal's own outcome, not the first's"
        );
    }
}
