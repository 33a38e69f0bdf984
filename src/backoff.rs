//! Exponential backoff with jitter, for anything that retries a remote call.

use std::time::Duration;

use rand::Rng;

/// Delays that double from `base` up to `cap`, each drawn at random from the upper half of
/// its step so that many clients failing together do not retry in lockstep, while no delay
/// collapses to nothing.
#[derive(Debug, Clone)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    attempt: u32,
}

impl Backoff {
    /// A backoff whose first delay is at most `base` and no delay exceeds `cap`.
    pub fn new(base: Duration, cap: Duration) -> Self {
        Backoff {
            base,
            cap: cap.max(base),
            attempt: 0,
        }
    }

    /// The pause before the next attempt; each call moves one step further.
    pub fn next_delay(&mut self) -> Duration {
        let factor = 1u32.checked_shl(self.attempt).unwrap_or(u32::MAX);
        let ceiling = self.base.saturating_mul(factor).min(self.cap);
        self.attempt = self.attempt.saturating_add(1);
        rand::thread_rng().gen_range(ceiling / 2..=ceiling)
    }

    /// Starts again from `base`, as after a success.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn doubles_within_jitter_and_stops_at_the_cap() {
        let mut backoff = Backoff::new(100 * MS, 1000 * MS);
        for ceiling in [100, 200, 400, 800, 1000, 1000, 1000] {
            let delay = backoff.next_delay();
            assert!(
                delay >= ceiling / 2 * MS && delay <= ceiling * MS,
                "{delay:?} outside [{}ms, {ceiling}ms]",
                ceiling / 2
            );
        }
    }

    #[test]
    fn survives_many_attempts_without_overflow() {
        let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(300));
        for _ in 0..200 {
            assert!(backoff.next_delay() <= Duration::from_secs(300));
        }
    }

    #[test]
    fn reset_starts_from_base_again() {
        let mut backoff = Backoff::new(100 * MS, 10_000 * MS);
        for _ in 0..6 {
            backoff.next_delay();
        }
        backoff.reset();
        assert!(backoff.next_delay() <= 100 * MS);
    }
}
