//! The one retry policy of coord: exponential backoff with jitter, seeded so that a
//! simulation replays exactly, and diverse across hosts so that a fleet that lost the same
//! etcd does not come back in lockstep.
//!
//! Every wait that retries, in the recipes and in the backends (a heal, a renewal after a
//! failure, a watch re-opened, a listing retried, a clean-up retried until it lands, a request
//! sent again to another member), draws its delays from a [`Backoff`]; nothing sleeps a fixed
//! time or doubles without jitter. A backend or a service of your own can use it too:
//!
//! ```
//! use std::time::Duration;
//! use coord_api::retry::{seed, Backoff};
//!
//! // Seeded from what identifies the waiter: the same delays in every run of a simulation,
//! // different ones from one host to the next.
//! let mut backoff = Backoff::new(
//!     Duration::from_millis(100),
//!     Duration::from_secs(5),
//!     seed(&[b"jobs/host-7"]),
//! );
//! let first = backoff.next_delay();
//! assert!(first <= Duration::from_millis(100) && first >= Duration::from_millis(50));
//! backoff.reset(); // after a success
//! ```
//!
//! The loop around it is written once: [`until`] runs attempts until one finishes, waiting
//! the next delay between them and ending the wait at a stop; [`call`] retries a store call
//! while its error is [`Retryable`](crate::ErrorClass::Retryable). The delays come from the
//! presets below ([`Backoff::store`], [`Backoff::request`], [`Backoff::renewal`]) or from a
//! recipe's own settings (a registration's or a candidate's `initial_backoff` and
//! `max_backoff`).

use std::future::Future;
use std::ops::ControlFlow;
use std::time::Duration;

/// Exponential backoff: `initial`, doubling, capped at `max`, each delay jittered down by up
/// to half.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
    rng: u64,
}

impl Backoff {
    /// A backoff from `initial` to `max` (at least `initial`), jittered from `seed` (see
    /// [`seed`]).
    pub fn new(initial: Duration, max: Duration, seed: u64) -> Self {
        Backoff {
            initial,
            max: max.max(initial),
            next: initial,
            rng: seed,
        }
    }

    /// The next delay: the current step, less a jitter of up to half of it; the step then
    /// doubles, up to the cap.
    pub fn next_delay(&mut self) -> Duration {
        let base = self.next;
        self.next = (self.next * 2).min(self.max);
        // splitmix64: cheap, seedable, good enough for jitter.
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        let fraction = (z >> 11) as f64 / (1u64 << 53) as f64;
        base.mul_f64(1.0 - fraction / 2.0)
    }

    /// The longest delay it waits (its cap): what a bound on a loop paced by it adds.
    pub fn max_delay(&self) -> Duration {
        self.max
    }

    /// Starts over from `initial` (after a success).
    pub fn reset(&mut self) {
        self.next = self.initial;
    }

    /// Sleeps the next delay (on tokio's clock: virtual in a simulation).
    pub async fn wait(&mut self) {
        tokio::time::sleep(self.next_delay()).await;
    }
}

/// A jitter seed from what identifies the waiter (a key, an election, a lease): the same in
/// every run of a simulation, different from one host to the next.
pub fn seed(parts: &[&[u8]]) -> u64 {
    // FNV-1a, with a separator so that ("ab", "c") and ("a", "bc") differ.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for b in part.iter().chain(&[0xff]) {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

impl Backoff {
    /// The preset of waits on the store that must not give up (re-opening a watch,
    /// re-reading, retrying a clean-up): 100 ms, doubling to 1 s, so a recipe is back within
    /// about a second of the store answering again.
    pub fn store(seed: u64) -> Backoff {
        Backoff::new(Duration::from_millis(100), Duration::from_secs(1), seed)
    }

    /// The preset of a request sent again (to another member) within its request timeout:
    /// 20 ms, doubling to 500 ms.
    pub fn request(seed: u64) -> Backoff {
        Backoff::new(Duration::from_millis(20), Duration::from_millis(500), seed)
    }

    /// The preset of a lease's renewal after one failed, sooner than the regular cadence
    /// (`every`): a quarter of it (at least 50 ms), doubling to the cadence.
    pub fn renewal(every: Duration, seed: u64) -> Backoff {
        Backoff::new((every / 4).max(Duration::from_millis(50)), every, seed)
    }
}

/// Runs `attempt` (given its number, from 1) until it finishes with
/// [`ControlFlow::Break`], waiting `backoff`'s next delay after each
/// [`ControlFlow::Continue`]. `stop` ends a wait between attempts: the loop then returns its
/// output as `Err`. An attempt in flight is never dropped here; one that must end at the stop
/// selects on it itself. `backoff` is not reset: what counts as a success is the caller's to
/// say.
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// use std::ops::ControlFlow;
/// use coord_api::retry::{self, Backoff};
///
/// let mut backoff = Backoff::store(retry::seed(&[b"example"]));
/// let done = retry::until(&mut backoff, std::future::pending::<()>(), |n| async move {
///     if n < 3 { ControlFlow::Continue(()) } else { ControlFlow::Break(n) }
/// })
/// .await;
/// assert_eq!(done, Ok(3));
/// # }
/// ```
pub async fn until<T, S, F, Fut>(
    backoff: &mut Backoff,
    stop: impl Future<Output = S>,
    mut attempt: F,
) -> Result<T, S>
where
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = ControlFlow<T>>,
{
    let mut stop = std::pin::pin!(stop);
    let mut n = 0;
    loop {
        n += 1;
        if let ControlFlow::Break(done) = attempt(n).await {
            return Ok(done);
        }
        tokio::select! {
            biased;
            stopped = &mut stop => return Err(stopped),
            () = backoff.wait() => {}
        }
    }
}

/// Sends `request` until it succeeds or fails with an error retrying cannot mend (any class
/// but [`Retryable`](crate::ErrorClass::Retryable)), waiting `backoff`'s delays between
/// attempts and resetting it after a success. `what` names the request in the debug event
/// of each retry. The caller bounds the whole (a session's end, a cancellation).
pub async fn call<T, F, Fut>(
    backoff: &mut Backoff,
    what: &str,
    mut request: F,
) -> crate::error::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = crate::error::Result<T>>,
{
    let done = until(
        backoff,
        std::future::pending::<std::convert::Infallible>(),
        |attempt| {
            let sent = request();
            async move {
                match sent.await {
                    Err(e) if e.is_retryable() => {
                        tracing::debug!(
                            what,
                            attempt,
                            error = &e as &dyn std::error::Error,
                            "retrying"
                        );
                        ControlFlow::Continue(())
                    }
                    done => ControlFlow::Break(done),
                }
            }
        },
    )
    .await;
    let Ok(done) = done;
    if done.is_ok() {
        backoff.reset();
    }
    done
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_from_100ms_to_a_30s_cap_with_bounded_jitter() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(30), 7);
        let mut base = Duration::from_millis(100);
        for _ in 0..12 {
            let d = b.next_delay();
            assert!(
                d <= base && d >= base / 2,
                "{d:?} not in [{:?}, {base:?}]",
                base / 2
            );
            base = (base * 2).min(Duration::from_secs(30));
        }
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(100));
    }

    #[test]
    fn the_same_seed_gives_the_same_delays_and_hosts_differ() {
        let run = |seed| {
            let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(30), seed);
            (0..8).map(|_| b.next_delay()).collect::<Vec<_>>()
        };
        assert_eq!(run(1), run(1));
        assert_ne!(run(1), run(2));
        let (a, b) = (seed(&[b"hosts/a"]), seed(&[b"hosts/b"]));
        assert_ne!(run(a), run(b), "two hosts back off differently");
        assert_ne!(seed(&[b"ab", b"c"]), seed(&[b"a", b"bc"]));
    }
}
