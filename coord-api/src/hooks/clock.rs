//! The runtime's clock as coord reads it, for simulations: one reading per turn of the
//! runtime instead of one per call.
//!
//! In a runtime with paused time, `tokio::time::Instant::now` takes the runtime's handle and
//! the clock's lock, about 150 instructions, and at a thousand simulated hosts coord read it
//! thousands of times a simulated second, nearly always to get the same instant: such a
//! clock only moves while the runtime parks (it advances to the next timer when no task is
//! ready). A simulation that builds its runtime with [`forget_at_parks`] and runs it under
//! [`read_once_per_turn`] makes coord's readings ([`now`]) on that thread read the runtime's
//! clock once between two parks and reuse that reading until the next. Anywhere else, [`now`]
//! is `tokio::time::Instant::now`.
//!
//! Only for a runtime whose clock moves at its parks alone: paused time that nothing
//! advances by hand (`tokio::time::advance` moves it without a park; coord's readings would
//! lag until the next one). Readings in the caller's own code are the runtime's as ever.
//!
//! ```
//! use coord_api::hooks::clock;
//!
//! let mut builder = tokio::runtime::Builder::new_current_thread();
//! builder.enable_time().start_paused(true);
//! clock::forget_at_parks(&mut builder);
//! let rt = builder.build().unwrap();
//! let _turns = clock::read_once_per_turn();
//! rt.block_on(async {
//!     let before = clock::now();
//!     tokio::time::sleep(std::time::Duration::from_secs(1)).await;
//!     // The sleep parked the runtime, which moved its clock on: the reading is fresh.
//!     assert_eq!(clock::now() - before, std::time::Duration::from_secs(1));
//! });
//! ```

use std::cell::Cell;

use tokio::time::Instant;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Turn {
    /// Not simulating on this thread: every reading is the runtime's.
    Off,
    /// Simulating, and the clock not read since the runtime last parked.
    Unread,
    /// Simulating: the clock's reading this turn.
    Read(Instant),
}

thread_local! {
    static TURN: Cell<Turn> = const { Cell::new(Turn::Off) };
}

/// The runtime's clock: `tokio::time::Instant::now`, read once a turn under
/// [`read_once_per_turn`] (see the module docs).
pub fn now() -> Instant {
    TURN.with(|turn| match turn.get() {
        Turn::Read(at) => at,
        Turn::Unread => {
            let at = Instant::now();
            turn.set(Turn::Read(at));
            at
        }
        Turn::Off => Instant::now(),
    })
}

/// Makes the runtime `builder` builds forget the turn's reading whenever it parks and
/// unparks, where a paused clock moves. Needed for [`read_once_per_turn`]; harmless without
/// it.
pub fn forget_at_parks(builder: &mut tokio::runtime::Builder) -> &mut tokio::runtime::Builder {
    builder.on_thread_park(forget).on_thread_unpark(forget)
}

fn forget() {
    // At a thread's end its locals may be gone: nothing to forget then.
    let _ = TURN.try_with(|turn| {
        if turn.get() != Turn::Off {
            turn.set(Turn::Unread);
        }
    });
}

/// Reads the clock once a turn on this thread until the guard is dropped (panics included),
/// for a runtime built with [`forget_at_parks`] and run on this thread meanwhile.
pub fn read_once_per_turn() -> TurnReadings {
    TURN.with(|turn| turn.set(Turn::Unread));
    TurnReadings {
        _not_send: std::marker::PhantomData,
    }
}

/// Returned by [`read_once_per_turn`]; every reading is the runtime's again once dropped.
#[must_use = "readings are per turn only while the guard lives"]
pub struct TurnReadings {
    /// The readings are the thread's: the guard stays on it.
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for TurnReadings {
    fn drop(&mut self) {
        let _ = TURN.try_with(|turn| turn.set(Turn::Off));
    }
}

impl std::fmt::Debug for TurnReadings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TurnReadings")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn paused_runtime() -> tokio::runtime::Runtime {
        let mut builder = tokio::runtime::Builder::new_current_thread();
        builder.enable_time().start_paused(true);
        forget_at_parks(&mut builder);
        builder.build().unwrap()
    }

    #[test]
    fn a_turns_readings_are_the_runtimes_clock() {
        let rt = paused_runtime();
        let _turns = read_once_per_turn();
        rt.block_on(async {
            let start = Instant::now();
            for step in 1..=50u64 {
                // Timers of several lengths, and tasks woken by others, each turn.
                let (tx, rx) = tokio::sync::oneshot::channel();
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(step % 7)).await;
                    let _ = tx.send(now());
                });
                tokio::time::sleep(Duration::from_millis(step % 5)).await;
                assert_eq!(now(), Instant::now(), "after the sleep of step {step}");
                let theirs = rx.await.unwrap();
                assert!(theirs <= Instant::now());
                assert_eq!(now(), Instant::now(), "after the wait of step {step}");
                tokio::task::yield_now().await;
                assert_eq!(now(), Instant::now(), "after the yield of step {step}");
            }
            assert!(Instant::now() > start);
        });
    }

    #[test]
    fn the_guard_gives_readings_back_to_the_runtime() {
        {
            let _turns = read_once_per_turn();
            assert!(matches!(TURN.with(Cell::get), Turn::Unread));
        }
        assert!(matches!(TURN.with(Cell::get), Turn::Off));
        // Off the guard, a runtime without the hooks reads its own clock every time.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(async {
            let before = now();
            tokio::time::advance(Duration::from_secs(1)).await;
            assert_eq!(now() - before, Duration::from_secs(1));
        });
    }
}
