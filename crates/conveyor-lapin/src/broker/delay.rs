//! What the broker knows of its queues' declarations and delay queues.

use super::*;

impl LapinBroker {
    /// The declaration this broker made of `queue`, if it declared it.
    pub(crate) fn declaration(&self, queue: &str) -> Option<Arc<Declaration>> {
        conveyor::kit::lock(&self.inner.declared)
            .get(queue)
            .cloned()
    }

    /// Whether `queue_depth` found `queue`'s default delay queue missing lately.
    pub(super) fn delay_queue_missing(&self, queue: &str) -> bool {
        conveyor::kit::lock(&self.inner.missing_delay_queues)
            .get(queue)
            .is_some_and(|since| since.elapsed() < MISSING_DELAY_QUEUE_RECHECK)
    }

    /// The delay queue a subscription of this broker declared for `queue`, if any.
    pub(super) fn remembered_delay_queue(&self, queue: &str) -> Option<String> {
        conveyor::kit::lock(&self.inner.delay_queues)
            .get(queue)
            .cloned()
    }

    /// Remembers that a subscription declared `delay_queue` for `queue`.
    pub(crate) fn remember_delay_queue(&self, queue: &str, delay_queue: &str) {
        conveyor::kit::lock(&self.inner.delay_queues)
            .insert(queue.to_string(), delay_queue.to_string());
    }
}
