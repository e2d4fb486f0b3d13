//! Whether a pulling subscription's calls to its broker fail now.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::ConnectionProbe;

/// Whether calls to a queue fail now (and are retried): set by the last receive, renewal
/// or settlement call. The mounts on the queue show as reconnecting while it is.
///
/// ```
/// use conveyor::ConnectionProbe;
/// use conveyor::kit::CallHealth;
///
/// let health = CallHealth::default();
/// health.failed();
/// assert!(health.is_lost());
/// health.succeeded();
/// assert!(!health.is_lost());
/// ```
#[derive(Clone, Debug, Default)]
pub struct CallHealth(Arc<AtomicBool>);

impl CallHealth {
    /// A call failed.
    pub fn failed(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// A call succeeded.
    pub fn succeeded(&self) {
        // Read first: the flag is shared by every call, and a store on each success would
        // move its cache line between cores for nothing.
        if self.0.load(Ordering::Relaxed) {
            self.0.store(false, Ordering::Relaxed);
        }
    }
}

impl ConnectionProbe for CallHealth {
    fn is_lost(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}
