//! Schedule exploration, for simulations.
//!
//! One thread in virtual time runs a task until it waits, so a consumer only ever runs after
//! a recipe's task yields: a task that signals before it publishes its state (an event sent
//! before the view it explains) is never caught, because the consumer never runs between
//! the two. The recipes call [`point`] at their await points and between such steps; when a
//! simulation has called [`enable`] on its thread, each point yields to the other ready tasks
//! a number of times drawn from the simulation's seed (none most of the time, up to three),
//! so those interleavings happen, and replay from the seed. Off by default: a point then
//! costs one thread-local read.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! coord_api::hooks::explore::enable(42);
//! coord_api::hooks::explore::point().await; // may yield, deterministically from seed 42
//! coord_api::hooks::explore::disable();
//! # }
//! ```

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

thread_local! {
    /// The explorer's generator state, when exploring on this thread.
    static STATE: Cell<Option<u64>> = const { Cell::new(None) };
}

/// Starts exploring schedules on this thread, drawing from `seed`.
pub fn enable(seed: u64) {
    STATE.with(|s| s.set(Some(seed)));
}

/// Stops exploring on this thread.
pub fn disable() {
    STATE.with(|s| s.set(None));
}

/// Whether this thread explores schedules.
pub fn enabled() -> bool {
    STATE.with(|s| s.get().is_some())
}

/// How many times to yield at the next point: 0 three times in four, else 1 to 3.
fn draw() -> u32 {
    STATE.with(|s| {
        let Some(mut x) = s.get() else { return 0 };
        // splitmix64
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        s.set(Some(x));
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        if z % 4 != 0 {
            0
        } else {
            1 + ((z >> 8) % 3) as u32
        }
    })
}

/// A point where a simulation may let other tasks run; see the module docs.
pub fn point() -> Point {
    Point { left: draw() }
}

/// The future [`point`] returns: ready after yielding its drawn number of times.
#[derive(Debug)]
#[must_use = "a point does nothing unless awaited"]
pub struct Point {
    left: u32,
}

impl Future for Point {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.left == 0 {
            return Poll::Ready(());
        }
        self.left -= 1;
        // Wake at once: the task goes to the back of the run queue, behind every task that
        // is ready now.
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_draws_the_same_yields_and_off_draws_none() {
        let run = |seed| {
            enable(seed);
            let v: Vec<u32> = (0..64).map(|_| draw()).collect();
            disable();
            v
        };
        assert_eq!(run(1), run(1));
        assert_ne!(run(1), run(2));
        assert!(run(1).iter().any(|n| *n > 0) && run(1).contains(&0));
        assert!((0..64).all(|_| draw() == 0), "off: no yields");
    }
}
