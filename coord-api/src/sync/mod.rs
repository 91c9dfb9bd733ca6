//! Synchronisation the recipes share with their users, deterministic under simulation: every
//! wake-up happens in an order fixed by the program, never by a random generator, so a
//! simulation replays from its seed in any build (no `--cfg tokio_unstable` needed); and a
//! stop signal that a task's select loop can poll at every wake-up for the price of a load.

mod stop;
mod waiters;
pub mod watch;

pub use stop::{Stop, Stopped};
