//! The pump: one per subscription, at most one receive ahead of the handlers.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::MessageSystemAttributeName;
use conveyor::Delivery;
use tokio::sync::Notify;

use crate::attributes;
use crate::broker::Settings;
use crate::error::SqsError;
use crate::inflight::InFlight;
use crate::queue::QueueInfo;
use crate::settle::{BATCH_LIMIT, Settler};

/// Deliveries received and not yet taken by the dispatcher: one receive's worth at most.
#[derive(Default)]
pub(crate) struct Handover {
    ready: Mutex<VecDeque<Delivery>>,
    /// Notified when the pump adds deliveries.
    pub(crate) arrived: Notify,
    /// Notified when the dispatcher takes the last one.
    emptied: Notify,
}

impl Handover {
    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Delivery>> {
        self.ready
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Takes the next delivery, if one is waiting.
    pub(crate) fn take(&self) -> Option<Delivery> {
        let mut ready = self.lock();
        let delivery = ready.pop_front();
        if delivery.is_some() && ready.is_empty() {
            self.emptied.notify_waiters();
        }
        delivery
    }

    /// Releases every waiting delivery back to SQS (dropped outside the lock).
    pub(crate) fn release_all(&self) {
        drop(std::mem::take(&mut *self.lock()));
    }

    async fn wait_empty(&self) {
        loop {
            let emptied = self.emptied.notified();
            tokio::pin!(emptied);
            emptied.as_mut().enable();
            if self.lock().is_empty() {
                return;
            }
            emptied.await;
        }
    }
}

/// What the pump needs to run.
pub(crate) struct Pump {
    pub(crate) client: Client,
    pub(crate) queue: Arc<QueueInfo>,
    pub(crate) settings: Settings,
    /// How many the dispatcher can hold at once.
    pub(crate) max_in_flight: usize,
    /// For a batch mount, its size: one receive per batch, once the last is settled.
    pub(crate) batch_size: Option<usize>,
    pub(crate) handover: Arc<Handover>,
    pub(crate) in_flight: Arc<InFlight>,
    pub(crate) settler: Arc<Settler>,
}

const RETRY_MIN: Duration = Duration::from_millis(200);
const RETRY_MAX: Duration = Duration::from_secs(30);

impl Pump {
    /// Receives until aborted. It issues a receive once the dispatcher has taken the last
    /// one's messages and has room for more, asking for as many as the dispatcher can
    /// hold (at most ten), so receives stay full and SQS bills few of them; what does not
    /// fit yet waits hidden in the hand-over. A batch mount receives once its last batch
    /// is settled. A failed receive is retried after a pause that doubles up to 30 s and
    /// resets on success.
    pub(crate) async fn run(self) {
        let mut pause = RETRY_MIN;
        let (room, wanted) = match self.batch_size {
            Some(size) => (1, size),
            None => (self.max_in_flight, self.max_in_flight),
        };
        let wanted = wanted.clamp(1, BATCH_LIMIT);
        loop {
            self.handover.wait_empty().await;
            self.wait_for_room(room).await;
            match self.receive(wanted).await {
                Ok(count) => {
                    pause = RETRY_MIN;
                    tracing::trace!(queue = self.queue.name, count, "received");
                }
                Err(error) => {
                    tracing::warn!(queue = self.queue.name, %error, retry_in = ?pause, "receive failed");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(RETRY_MAX);
                }
            }
        }
    }

    /// Waits until fewer than `limit` messages are unsettled.
    async fn wait_for_room(&self, limit: usize) {
        loop {
            let settled = self.in_flight.settled.notified();
            tokio::pin!(settled);
            settled.as_mut().enable();
            if self.in_flight.len() < limit {
                return;
            }
            settled.await;
        }
    }

    /// One `ReceiveMessage`; its messages go to the hand-over, registered with the
    /// extender first so they stay hidden while they wait.
    async fn receive(&self, wanted: usize) -> Result<usize, SqsError> {
        let visibility = self.settings.visibility_timeout;
        let output = self
            .client
            .receive_message()
            .queue_url(&self.queue.url)
            .max_number_of_messages(wanted as i32)
            .wait_time_seconds(self.settings.wait_time.as_secs() as i32)
            .visibility_timeout(visibility.as_secs() as i32)
            .message_system_attribute_names(MessageSystemAttributeName::ApproximateReceiveCount)
            .message_system_attribute_names(MessageSystemAttributeName::MessageGroupId)
            .message_attribute_names("All")
            .send()
            .await
            .map_err(|e| SqsError::call("ReceiveMessage", &self.queue.name, e))?;
        let messages = output.messages.unwrap_or_default();
        let count = messages.len();
        if count == 0 {
            return Ok(0);
        }
        let name: Arc<str> = self.queue.name.as_str().into();
        let mut deliveries = Vec::with_capacity(count);
        for message in messages {
            let Some(receipt) = message.receipt_handle.clone() else {
                continue;
            };
            let (payload, headers, key) = attributes::decode(&message);
            let receive_count = message
                .attributes()
                .and_then(|a| a.get(&MessageSystemAttributeName::ApproximateReceiveCount))
                .and_then(|n| n.parse().ok())
                .unwrap_or(1);
            let tag = self.in_flight.insert(receipt, visibility);
            deliveries.push(
                Delivery::new(payload, name.clone(), self.settler.clone(), tag)
                    .with_headers(headers)
                    .with_partition_key(key)
                    .with_receive_count(receive_count),
            );
        }
        self.handover.lock().extend(deliveries);
        self.handover.arrived.notify_waiters();
        Ok(count)
    }
}
