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
//! The loop around it is written once: [`until`] runs attempts until one finishes, each
//! that does not saying how to go on ([`Pace`]: after the next delay, at once, or starting
//! the backoff over) and a stop ending a wait; [`until_with`] is the same loop lending each
//! attempt the caller's state; [`call`] retries a store call while its error is
//! [`Retryable`](crate::ErrorClass::Retryable). The delays come from the
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

/// How the loop of [`until`] goes on after an attempt that did not finish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pace {
    /// Wait the backoff's next delay first: the attempt failed.
    Backoff,
    /// Go again at once, the backoff as it is: the attempt made progress and has more to
    /// do, or what failed has another way to try without waiting (another member).
    AtOnce,
    /// Start the backoff over and go again at once: what failed had worked until now (a
    /// stream that delivered before it broke).
    StartOver,
}

/// `Continue(())` waits the next delay, as most attempts that fail want.
impl From<()> for Pace {
    fn from((): ()) -> Pace {
        Pace::Backoff
    }
}

/// Runs `attempt` (given its number, from 1) until it finishes with
/// [`ControlFlow::Break`]; after a [`ControlFlow::Continue`] it goes on as the [`Pace`] it
/// carries says (`Continue(())`: after the next delay). `stop` ends a wait between attempts:
/// the loop then returns its output as `Err`. An attempt in flight is never dropped here; one
/// that must end at the stop selects on it itself. `backoff` is not reset on a `Break`: what
/// counts as a success is the caller's to say. An attempt that must change what the caller
/// holds takes it from [`until_with`].
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// use std::ops::ControlFlow;
/// use coord_api::retry::{self, Backoff, Pace};
///
/// let mut backoff = Backoff::store(retry::seed(&[b"example"]));
/// let done = retry::until(&mut backoff, std::future::pending::<()>(), |n| async move {
///     match n {
///         1 => ControlFlow::Continue(Pace::AtOnce),
///         2 => ControlFlow::Continue(Pace::Backoff),
///         _ => ControlFlow::Break(n),
///     }
/// })
/// .await;
/// assert_eq!(done, Ok(3));
/// # }
/// ```
pub async fn until<T, S, C, F, Fut>(
    backoff: &mut Backoff,
    stop: impl Future<Output = S>,
    mut attempt: F,
) -> Result<T, S>
where
    C: Into<Pace>,
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = ControlFlow<T, C>>,
{
    let mut stop = std::pin::pin!(stop);
    let mut n = 0;
    loop {
        n += 1;
        match attempt(n).await {
            ControlFlow::Break(done) => return Ok(done),
            ControlFlow::Continue(pace) => pause(backoff, stop.as_mut(), pace.into()).await?,
        }
    }
}

/// An attempt of [`until_with`]: lent the caller's state for as long as it runs.
pub type Attempt<'a, T, C> = std::pin::Pin<Box<dyn Future<Output = ControlFlow<T, C>> + Send + 'a>>;

/// As [`until`], lending each attempt `state` (a worker's own fields, a stream it keeps
/// between attempts). The attempt returns its future boxed (`Box::pin(async move { .. })`),
/// which is what lets it borrow `state` and still be `Send`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// use std::ops::ControlFlow;
/// use coord_api::retry::{self, Backoff, Pace};
///
/// let mut backoff = Backoff::store(retry::seed(&[b"example"]));
/// let mut seen = Vec::new();
/// let done = retry::until_with(&mut backoff, std::future::pending::<()>(), &mut seen, |seen, n| {
///     Box::pin(async move {
///         seen.push(n);
///         if n < 3 { ControlFlow::Continue(Pace::StartOver) } else { ControlFlow::Break(n) }
///     })
/// })
/// .await;
/// assert_eq!((done, seen), (Ok(3), vec![1, 2, 3]));
/// # }
/// ```
pub async fn until_with<St, T, S, C, F>(
    backoff: &mut Backoff,
    stop: impl Future<Output = S>,
    state: &mut St,
    mut attempt: F,
) -> Result<T, S>
where
    St: ?Sized,
    C: Into<Pace>,
    F: for<'a> FnMut(&'a mut St, u32) -> Attempt<'a, T, C>,
{
    let mut stop = std::pin::pin!(stop);
    let mut n = 0;
    loop {
        n += 1;
        match attempt(&mut *state, n).await {
            ControlFlow::Break(done) => return Ok(done),
            ControlFlow::Continue(pace) => pause(backoff, stop.as_mut(), pace.into()).await?,
        }
    }
}

/// Between two attempts: what `pace` asks, or the stop's output if it comes first. For a
/// loop whose first attempt runs before [`until_with`] (a hot path that should pay for the
/// loop's state, a seeded backoff and a boxed attempt, only when it goes again): the pause
/// after that attempt, before the loop's own first one.
pub async fn pause<S>(
    backoff: &mut Backoff,
    stop: std::pin::Pin<&mut impl Future<Output = S>>,
    pace: Pace,
) -> Result<(), S> {
    match pace {
        Pace::AtOnce => Ok(()),
        Pace::StartOver => {
            backoff.reset();
            Ok(())
        }
        Pace::Backoff => tokio::select! {
            biased;
            stopped = stop => Err(stopped),
            () = backoff.wait() => Ok(()),
        },
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

    /// Each pace as it says: at once waits nothing and leaves the backoff where it was, a
    /// start-over waits nothing and starts it over, a backoff waits its next delay; a stop
    /// ends a wait.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn each_pace_waits_as_it_says_and_a_stop_ends_a_wait() {
        use tokio::time::Instant;
        let ms = Duration::from_millis;
        let fresh = || Backoff::new(ms(100), ms(10_000), 3);
        // What the loop waited before each attempt, for a run of paces.
        async fn waits(backoff: &mut Backoff, paces: &[Pace]) -> Vec<Duration> {
            let mut last = Instant::now();
            let mut waited = Vec::new();
            let done = until(backoff, std::future::pending::<()>(), |n| {
                waited.push(last.elapsed());
                last = Instant::now();
                let pace = paces.get(n as usize - 1).copied();
                async move { pace.map_or(ControlFlow::Break(n), ControlFlow::Continue) }
            })
            .await;
            assert_eq!(done, Ok(paces.len() as u32 + 1));
            waited
        }
        let mut b = fresh();
        let w = waits(
            &mut b,
            &[Pace::Backoff, Pace::Backoff, Pace::AtOnce, Pace::Backoff],
        )
        .await;
        let mut expected = fresh();
        let (d1, d2, d3) = (
            expected.next_delay(),
            expected.next_delay(),
            expected.next_delay(),
        );
        // tokio's timer rounds a sleep up to its next millisecond.
        let rounded = |d: Duration| ms(d.as_nanos().div_ceil(1_000_000) as u64);
        let expected = [Duration::ZERO, d1, d2, Duration::ZERO, d3].map(rounded);
        assert_eq!(w, expected, "at once keeps the step");
        let mut b = fresh();
        let w = waits(
            &mut b,
            &[Pace::Backoff, Pace::Backoff, Pace::StartOver, Pace::Backoff],
        )
        .await;
        assert_eq!(w[3], Duration::ZERO);
        assert!(w[4] <= ms(100), "started over: {:?}", w[4]);

        let mut b = fresh();
        let start = Instant::now();
        let stopped = until(&mut b, tokio::time::sleep(ms(30)), |_| async {
            ControlFlow::<(), Pace>::Continue(Pace::Backoff)
        })
        .await;
        assert_eq!((stopped, start.elapsed()), (Err(()), ms(30)));
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
