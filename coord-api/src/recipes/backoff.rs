//! Exponential backoff with jitter from an injected seed, so a simulation replays exactly.

use std::time::Duration;

/// Exponential backoff: `initial`, doubling, capped at `max`, each delay jittered down by up
/// to half (so a fleet that lost the same etcd does not come back in lockstep).
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
    rng: u64,
}

impl Backoff {
    /// A backoff from `initial` to `max`, jittered from `seed`.
    pub fn new(initial: Duration, max: Duration, seed: u64) -> Self {
        Backoff {
            initial,
            max,
            next: initial,
            rng: seed,
        }
    }

    /// The next delay.
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

    /// Starts over from `initial` (after a success).
    pub fn reset(&mut self) {
        self.next = self.initial;
    }
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
    fn the_same_seed_gives_the_same_delays() {
        let run = |seed| {
            let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(30), seed);
            (0..8).map(|_| b.next_delay()).collect::<Vec<_>>()
        };
        assert_eq!(run(1), run(1));
        assert_ne!(run(1), run(2));
    }
}
