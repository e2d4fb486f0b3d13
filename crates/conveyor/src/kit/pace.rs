//! Pacing: when a delay ends, and the pause between retries of a failing broker call.

use std::time::Duration;

use crate::policy::Backoff;

/// The instant `delay` from now, for a delay that comes from outside (user settings, a
/// handler's retry-after): one too long for the clock means never, in practice, rather
/// than the overflow panic of `Instant + Duration`.
///
/// ```
/// use std::time::Duration;
///
/// let far = conveyor::kit::due_after(Duration::MAX);
/// assert!(far > tokio::time::Instant::now() + Duration::from_secs(50 * 365 * 24 * 3600));
/// ```
pub fn due_after(delay: Duration) -> tokio::time::Instant {
    const FAR: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);
    let now = tokio::time::Instant::now();
    now.checked_add(delay)
        .or_else(|| now.checked_add(FAR))
        .unwrap_or(now)
}

/// The pause before retrying a broker call that keeps failing (a receive, a reconnect):
/// from 100 ms, doubling with each failure in a row, up to 30 s; back to the shortest
/// after a success.
///
/// ```
/// use std::time::Duration;
/// use conveyor::kit::RetryPause;
///
/// let mut pause = RetryPause::new();
/// assert_eq!(pause.failed(), Duration::from_millis(100));
/// assert_eq!(pause.failed(), Duration::from_millis(200));
/// pause.reset();
/// assert_eq!(pause.failed(), Duration::from_millis(100));
/// ```
#[derive(Clone, Debug)]
pub struct RetryPause {
    backoff: Backoff,
    failures: u32,
}

impl Default for RetryPause {
    fn default() -> Self {
        Self::new()
    }
}

impl RetryPause {
    /// The shortest pause.
    pub const MIN: Duration = Duration::from_millis(100);
    /// The longest pause.
    pub const MAX: Duration = Duration::from_secs(30);

    /// No failure yet.
    pub fn new() -> Self {
        RetryPause {
            backoff: Backoff::exponential(Self::MIN, Self::MAX),
            failures: 0,
        }
    }

    /// The pause before the next try, after one more failure.
    pub fn failed(&mut self) -> Duration {
        self.failures = self.failures.saturating_add(1);
        self.backoff.delay(self.failures)
    }

    /// The pause the next failure will get, without counting one.
    pub fn peek(&self) -> Duration {
        self.backoff.delay(self.failures.saturating_add(1))
    }

    /// The pause after `failures` failures in a row (1 for the first), counting nothing:
    /// for a caller that keeps its own count.
    pub fn after(failures: u32) -> Duration {
        Backoff::exponential(Self::MIN, Self::MAX).delay(failures)
    }

    /// How many failures in a row it has counted.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// Back to the shortest pause, after a call that worked.
    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

/// `delay` plus up to as much again at random, so that the clients of a broker that
/// restarts do not all come back at the same moment (a reconnect's pause, say).
///
/// ```
/// use std::time::Duration;
/// use conveyor::kit::jittered;
///
/// let delay = jittered(Duration::from_secs(1));
/// assert!(delay >= Duration::from_secs(1) && delay <= Duration::from_secs(2));
/// ```
pub fn jittered(delay: Duration) -> Duration {
    delay.saturating_add(delay.mul_f64(random_fraction()))
}

/// A number in `[0, 1)`, different on each call: std's randomly keyed hasher, since
/// jitter needs no better randomness than that.
fn random_fraction() -> f64 {
    use std::hash::BuildHasher;
    let random = std::collections::hash_map::RandomState::new().hash_one(0u8);
    (random >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_adds_at_most_the_delay_again() {
        for delay in [Duration::ZERO, RetryPause::MIN, RetryPause::MAX] {
            let jittered = jittered(delay);
            assert!(
                delay <= jittered && jittered <= delay * 2,
                "{delay:?}: {jittered:?}"
            );
        }
    }

    #[test]
    fn the_retry_pause_doubles_up_to_its_ceiling_and_resets() {
        let mut pause = RetryPause::new();
        let pauses: Vec<_> = (0..12).map(|_| pause.failed()).collect();
        assert_eq!(pauses[0], RetryPause::MIN);
        assert_eq!(pauses[1], RetryPause::MIN * 2);
        assert_eq!(pauses[11], RetryPause::MAX);
        assert_eq!(pause.peek(), RetryPause::MAX);
        pause.reset();
        assert_eq!(pause.peek(), RetryPause::MIN);
    }
}
