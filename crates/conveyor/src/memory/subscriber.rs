//! The receive side of an in-process queue.

use std::sync::Arc;

use super::queue::{Queue, Take};
use crate::delivery::Delivery;
use crate::error::Error;
use crate::message::PartitionKey;
use crate::transport::Subscriber;

/// A subscription to an in-process queue. Several on one queue compete: each message
/// goes to one of them.
///
/// It holds nothing back: a message stays in its queue until `recv` takes it, so closing
/// or dropping a subscriber returns nothing because it has nothing.
pub struct MemorySubscriber {
    queue: Arc<Queue>,
}

impl MemorySubscriber {
    pub(super) fn new(queue: Arc<Queue>) -> Self {
        queue.add_consumer(1);
        MemorySubscriber { queue }
    }

    /// Waits until `take` finds something, waking on every change to the queue and when
    /// the next delayed message falls due.
    async fn wait_for<T>(
        &self,
        mut take: impl FnMut(&Arc<Queue>) -> Result<T, Option<tokio::time::Instant>>,
    ) -> T {
        loop {
            // Most receives find a message at once, as does a wait once woken: they skip
            // registering as a waiter (a lock of the `Notify` to register, another to
            // deregister). Only a receive that finds nothing registers, then looks again.
            if let Ok(found) = take(&self.queue) {
                return found;
            }
            let notified = self.queue.available.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            match take(&self.queue) {
                Ok(found) => return found,
                Err(Some(due)) => {
                    tokio::select! {
                        () = notified => {}
                        () = tokio::time::sleep_until(due) => {}
                    }
                }
                Err(None) => notified.await,
            }
        }
    }
}

impl Subscriber for MemorySubscriber {
    async fn recv(&mut self) -> Option<Result<Delivery, Error>> {
        let delivery = self
            .wait_for(|queue| match queue.try_take(&[]) {
                Take::Taken(delivery) => Ok(delivery),
                Take::WaitUntil(due) => Err(due),
            })
            .await;
        Some(Ok(delivery))
    }

    async fn recv_batch(
        &mut self,
        max: usize,
        batch: &mut Vec<Delivery>,
    ) -> Option<Result<(), Error>> {
        let first = self
            .wait_for(|queue| match queue.try_take(&[]) {
                Take::Taken(delivery) => Ok(delivery),
                Take::WaitUntil(due) => Err(due),
            })
            .await;
        let mut groups: Vec<PartitionKey> = first.partition_key().cloned().into_iter().collect();
        batch.push(first);
        while batch.len() < max {
            let Take::Taken(delivery) = self.queue.try_take(&groups) else {
                break;
            };
            if let Some(key) = delivery.partition_key() {
                if !groups.contains(key) {
                    groups.push(key.clone());
                }
            }
            batch.push(delivery);
        }
        Some(Ok(()))
    }

    async fn close(self) {}
}

impl Drop for MemorySubscriber {
    fn drop(&mut self) {
        self.queue.add_consumer(-1);
    }
}
