//! A mount site's settings: dispatch mode, batch size, window and failure policy.

use crate::policy::{Backoff, FailurePolicy, OnError};

/// How a mount runs its deliveries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dispatch {
    /// One at a time, in the order received.
    Sequential,
    /// Up to `n` at once, finishing in any order.
    Workers(usize),
    /// `n` lanes; a delivery goes to the lane its partition key hashes to, and each lane
    /// runs its deliveries one at a time in arrival order.
    Lanes(usize),
}

/// The settings of one mount site, built in the closure given to
/// [`App::mount`](crate::App::mount).
///
/// ```
/// use std::time::Duration;
/// use conveyor::{Backoff, Dispatch, MountOptions};
///
/// let lanes = MountOptions::default().workers(4).by_key();
/// assert_eq!(lanes.dispatch(), Dispatch::Lanes(4));
///
/// let careful = MountOptions::default()
///     .retry_after(Backoff::fixed(Duration::from_secs(5)))
///     .max_attempts(3);
/// assert_eq!(careful.dispatch(), Dispatch::Sequential);
/// ```
#[derive(Clone, Debug)]
pub struct MountOptions {
    dispatch: Dispatch,
    /// `by_key()` was asked for: lanes once there are workers, a startup error without.
    keyed: bool,
    batch_size: Option<usize>,
    policy: FailurePolicy,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            dispatch: Dispatch::Sequential,
            keyed: false,
            batch_size: None,
            policy: FailurePolicy::default(),
        }
    }
}

/// The batch size when a batch handler's mount names none.
pub const DEFAULT_BATCH_SIZE: usize = 10;

/// How many deliveries may wait in a lane behind the one it is running.
pub(crate) const LANE_BUFFER: usize = 1;

impl MountOptions {
    /// Runs up to `n` handlers at once, finishing in any order. While `n` are in flight
    /// the subscription reads nothing further. A retry goes back to the broker. Follow
    /// with [`by_key`](Self::by_key) for ordered lanes.
    pub fn workers(mut self, n: usize) -> Self {
        self.dispatch = if self.keyed {
            Dispatch::Lanes(n)
        } else {
            Dispatch::Workers(n)
        };
        self
    }

    /// Turns `workers(n)` into `n` ordered lanes keyed by the partition key: one key never
    /// spreads over two lanes, a lane runs its deliveries one at a time in arrival order,
    /// and deliveries without a key rotate over the lanes. Without `workers(n)` it is a
    /// startup error: a sequential mount already keeps every key's order.
    ///
    /// A lane retries a failed delivery in place, after its backoff, before it runs the
    /// next one, so each key keeps its order across retries; meanwhile the lane's other
    /// keys wait.
    pub fn by_key(mut self) -> Self {
        self.keyed = true;
        if let Dispatch::Workers(n) = self.dispatch {
            self.dispatch = Dispatch::Lanes(n);
        }
        self
    }

    /// Whether `by_key()` was asked for without `workers(n)`.
    pub(crate) fn keyed_without_workers(&self) -> bool {
        self.keyed && self.dispatch == Dispatch::Sequential
    }

    /// The most deliveries a batch handler gets at once (default
    /// [`DEFAULT_BATCH_SIZE`]). Batches are never empty and often smaller.
    pub fn batch(mut self, size: usize) -> Self {
        self.batch_size = Some(size);
        self
    }

    /// On handler error, puts the delivery back on the queue at once.
    pub fn retry(mut self) -> Self {
        self.policy.on_error = OnError::Retry;
        self
    }

    /// On handler error, puts the delivery back after the backoff's delay.
    pub fn retry_after(mut self, backoff: Backoff) -> Self {
        self.policy.on_error = OnError::RetryAfter(backoff);
        self
    }

    /// On handler error, rejects the delivery at once (dead-letters it where the queue
    /// has a dead-letter queue).
    pub fn reject_on_error(mut self) -> Self {
        self.policy.on_error = OnError::Reject;
        self
    }

    /// Rejects a delivery whose attempt number `n` fails, or asks for a retry
    /// ([`Outcome::Retry`](crate::Outcome::Retry), `RetryAfter`), whatever the policy
    /// says. So a message that keeps failing always ends in a reject.
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.policy.max_attempts = Some(n);
        self
    }

    /// Never gives up: retries as the policy says, however many attempts fail.
    pub fn unlimited_attempts(mut self) -> Self {
        self.policy.max_attempts = None;
        self
    }

    /// The dispatch mode.
    pub fn dispatch(&self) -> Dispatch {
        self.dispatch
    }

    /// The batch size set with [`batch`](Self::batch).
    pub fn batch_size(&self) -> Option<usize> {
        self.batch_size
    }

    /// The failure policy.
    pub fn failure_policy(&self) -> FailurePolicy {
        self.policy
    }

    /// How many deliveries the mount can hold at once: running, queued in lanes, or in the
    /// dispatcher's hand.
    pub(crate) fn max_in_flight(&self) -> usize {
        match (self.batch_size, self.dispatch) {
            (Some(size), _) => size,
            (None, Dispatch::Sequential) => 1,
            (None, Dispatch::Workers(n)) => n,
            (None, Dispatch::Lanes(n)) => n * (1 + LANE_BUFFER) + 1,
        }
    }
}
