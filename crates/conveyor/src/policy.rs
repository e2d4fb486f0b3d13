//! What a mount does when its handler fails: the failure policy.

use std::time::Duration;

/// How long to wait before retrying a failed delivery, growing with the attempt.
///
/// ```
/// use std::time::Duration;
/// use conveyor::Backoff;
///
/// let backoff = Backoff::exponential(Duration::from_millis(100), Duration::from_secs(1));
/// assert_eq!(backoff.delay(1), Duration::from_millis(100));
/// assert_eq!(backoff.delay(2), Duration::from_millis(200));
/// assert_eq!(backoff.delay(10), Duration::from_secs(1));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    base: Duration,
    max: Duration,
    exponential: bool,
}

impl Backoff {
    /// The same delay every time.
    pub fn fixed(delay: Duration) -> Self {
        Backoff {
            base: delay,
            max: delay,
            exponential: false,
        }
    }

    /// `base` after the first attempt, doubling after each further one, at most `max`.
    pub fn exponential(base: Duration, max: Duration) -> Self {
        Backoff {
            base,
            max,
            exponential: true,
        }
    }

    /// The first delay, the longest, and whether it doubles: for describing it.
    pub(crate) fn parts(&self) -> (Duration, Duration, bool) {
        (self.base, self.max, self.exponential)
    }

    /// The delay after attempt `attempt` (counting from 1) has failed.
    pub fn delay(&self, attempt: u32) -> Duration {
        if !self.exponential {
            return self.base;
        }
        let doublings = attempt.saturating_sub(1).min(31);
        self.base
            .checked_mul(1 << doublings)
            .map_or(self.max, |d| d.min(self.max))
    }
}

/// What happens to a delivery whose handler returned `Err` or panicked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnError {
    /// Back on the queue at once.
    Retry,
    /// Back on the queue after the backoff's delay for this attempt.
    RetryAfter(Backoff),
    /// Dead-letter (or discard where the queue has no dead-letter queue).
    Reject,
}

/// A mount's failure policy: what to do on error, and after how many attempts to give up
/// and reject.
///
/// The default retries after an exponential backoff (1 s doubling up to 60 s) and rejects
/// on the fifth failed attempt. Attempts are counted by the broker (see
/// [`Delivery::attempt`](crate::Delivery::attempt)), so they survive restarts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FailurePolicy {
    /// What to do with a failed delivery that has attempts left.
    pub on_error: OnError,
    /// The attempt on whose failure the delivery is rejected; `None` retries forever.
    pub max_attempts: Option<u32>,
}

impl Default for FailurePolicy {
    fn default() -> Self {
        FailurePolicy {
            on_error: OnError::RetryAfter(Backoff::exponential(
                Duration::from_secs(1),
                Duration::from_secs(60),
            )),
            max_attempts: Some(5),
        }
    }
}

impl FailurePolicy {
    /// Whether attempt number `attempt` is the last this policy allows: its failure is
    /// rejected whatever `on_error` says.
    pub(crate) fn attempts_exhausted(&self, attempt: u32) -> bool {
        self.max_attempts.is_some_and(|max| attempt >= max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempts_run_out_on_the_max_attempt() {
        let policy = FailurePolicy {
            on_error: OnError::Retry,
            max_attempts: Some(3),
        };
        assert!(!policy.attempts_exhausted(1));
        assert!(!policy.attempts_exhausted(2));
        assert!(policy.attempts_exhausted(3));
        let forever = FailurePolicy {
            max_attempts: None,
            ..policy
        };
        assert!(!forever.attempts_exhausted(u32::MAX));
    }

    #[test]
    fn retry_after_grows_with_the_attempt() {
        let backoff = Backoff::exponential(Duration::from_secs(1), Duration::from_secs(5));
        assert_eq!(backoff.delay(1), Duration::from_secs(1));
        assert_eq!(backoff.delay(3), Duration::from_secs(4));
        assert_eq!(backoff.delay(50), Duration::from_secs(5));
    }
}
