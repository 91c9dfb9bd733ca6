//! Hooks for coord's own simulator, chaos runner and backends: not part of the API.
//!
//! Hidden from the docs and outside semver: what is here changes with the simulator. The
//! recipes read the clock through [`clock`] (once per turn of a simulation's runtime), yield
//! at [`explore`] points (schedule exploration from a simulation's seed), and consult
//! [`planted`] (deliberate defects, compiled in only with the `planted-bugs` feature, for
//! proving that checkers catch them). Outside a simulation each costs a thread-local read.

pub mod clock;
pub mod explore;
pub mod planted;
