//! Synchronisation the recipes share with their users, deterministic under simulation: every
//! wake-up happens in an order fixed by the program, never by a random generator, so a
//! simulation replays from its seed in any build (no `--cfg tokio_unstable` needed).

pub mod watch;
