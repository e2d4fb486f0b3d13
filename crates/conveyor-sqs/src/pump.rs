//! The pump: one per subscription, at most one receive ahead of the handlers.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::MessageSystemAttributeName;
use conveyor::kit::RetryPause;
use conveyor::{Delivery, Error};
use tokio::sync::{Notify, watch};

use crate::attributes;
use crate::broker::Settings;
use conveyor::Report;

use crate::error::{SqsError, cannot_heal, shown};
use crate::inflight::InFlight;
use crate::queue::QueueInfo;
use crate::settle::{Settler, whole_seconds_down};

/// Deliveries received and not yet taken by the dispatcher: one receive's worth at most.
#[derive(Default)]
pub(crate) struct Handover {
    waiting: Mutex<Waiting>,
    /// Notified when the pump adds deliveries, fails, or the hand-over closes.
    pub(crate) arrived: Notify,
    /// Notified when the dispatcher takes the last one.
    emptied: Notify,
}

#[derive(Default)]
struct Waiting {
    ready: VecDeque<Delivery>,
    /// No more deliveries: receiving has stopped.
    closed: bool,
    /// Why the subscription cannot go on, for the dispatcher once `ready` is empty.
    failed: Option<Error>,
}

/// What the dispatcher finds in the hand-over.
pub(crate) enum Next {
    Delivery(Delivery),
    /// The subscription failed for good.
    Failed(Error),
    /// Receiving has stopped; nothing more will come.
    Closed,
    /// Nothing yet.
    Empty,
}

impl Handover {
    fn lock(&self) -> std::sync::MutexGuard<'_, Waiting> {
        conveyor::kit::lock(&self.waiting)
    }

    /// Takes the next delivery; once none is left, the failure or the end.
    pub(crate) fn take(&self) -> Next {
        let mut waiting = self.lock();
        if let Some(delivery) = self.pop(&mut waiting) {
            return Next::Delivery(delivery);
        }
        if let Some(error) = waiting.failed.take() {
            return Next::Failed(error);
        }
        if waiting.closed {
            Next::Closed
        } else {
            Next::Empty
        }
    }

    /// Takes the next delivery, if one is waiting.
    pub(crate) fn take_ready(&self) -> Option<Delivery> {
        self.pop(&mut self.lock())
    }

    fn pop(&self, waiting: &mut Waiting) -> Option<Delivery> {
        let delivery = waiting.ready.pop_front()?;
        if waiting.ready.is_empty() {
            self.emptied.notify_waiters();
        }
        Some(delivery)
    }

    /// Adds a receive's deliveries; gives them back if receiving has stopped meanwhile
    /// (dropping them releases them).
    fn offer(&self, deliveries: Vec<Delivery>) -> Result<(), Vec<Delivery>> {
        {
            let mut waiting = self.lock();
            if waiting.closed {
                return Err(deliveries);
            }
            waiting.ready.extend(deliveries);
        }
        self.arrived.notify_waiters();
        Ok(())
    }

    /// Stops taking deliveries and releases every waiting one back to SQS (dropped outside
    /// the lock: each drop settles a release).
    pub(crate) fn close(&self) {
        let released = {
            let mut waiting = self.lock();
            waiting.closed = true;
            std::mem::take(&mut waiting.ready)
        };
        drop(released);
        self.arrived.notify_waiters();
        self.emptied.notify_waiters();
    }

    /// Ends the subscription with `error`, after the deliveries still waiting.
    fn fail(&self, error: Error) {
        {
            let mut waiting = self.lock();
            waiting.failed = Some(error);
            waiting.closed = true;
        }
        self.arrived.notify_waiters();
    }

    async fn wait_empty(&self) {
        conveyor::kit::wait_for(&self.emptied, || self.lock().ready.is_empty().then_some(())).await;
    }
}

/// What the pump needs to run.
pub(crate) struct Pump {
    pub(crate) client: Client,
    pub(crate) queue: Arc<QueueInfo>,
    pub(crate) settings: Settings,
    /// How many messages each receive asks for (1 to 10).
    pub(crate) wanted: usize,
    /// The pump receives only while fewer than this many messages are in flight (held,
    /// or settled with their call not yet made).
    pub(crate) limit: usize,
    pub(crate) handover: Arc<Handover>,
    pub(crate) in_flight: Arc<InFlight>,
    pub(crate) settler: Arc<Settler>,
    /// Becomes `true` (or closes) when receiving must stop.
    pub(crate) stop: watch::Receiver<bool>,
}

/// Why a receive failed, and whether trying again can help.
struct Failure {
    error: SqsError,
    for_good: bool,
}

impl Pump {
    /// Receives until told to stop. It issues a receive once the dispatcher has taken the
    /// last one's messages and fewer than `limit` messages are in flight, asking for
    /// `wanted`; what the dispatcher cannot take yet waits hidden in the hand-over.
    ///
    /// Stopping never cuts a receive short: one under way completes, and its messages are
    /// released at once. A failed receive is logged as a warning and retried after a pause
    /// that doubles from 100 ms up to 30 s and resets on success ([`RetryPause`]); one known never to succeed (the
    /// queue is gone, access or credentials refused: [`cannot_heal`]) ends the
    /// subscription with [`Error::Subscribe`]. An error code this transport does not
    /// recognise is retried.
    pub(crate) async fn run(mut self) {
        let mut pause = RetryPause::new();
        loop {
            let handover = &self.handover;
            let in_flight = &self.in_flight;
            let limit = self.limit;
            let ready = async move {
                handover.wait_empty().await;
                wait_for_room(in_flight, limit).await;
            };
            tokio::select! {
                biased;
                () = stopped(&mut self.stop) => return,
                () = ready => {}
            }
            match self.receive().await {
                Ok(deliveries) => {
                    pause.reset();
                    self.queue.calls.succeeded();
                    let count = deliveries.len();
                    tracing::trace!(queue = self.queue.name, count, "received");
                    if let Err(late) = self.handover.offer(deliveries) {
                        tracing::debug!(
                            queue = self.queue.name,
                            count,
                            "received after receiving stopped; releasing them"
                        );
                        drop(late);
                        return;
                    }
                }
                Err(Failure {
                    error,
                    for_good: true,
                }) => {
                    tracing::error!(queue = self.queue.name, error = %Report(&error), "receive failed and cannot succeed by trying again; the subscription ends");
                    self.handover.fail(Error::Subscribe {
                        queue: shown(&self.queue.name).into_owned(),
                        source: Box::new(error),
                    });
                    return;
                }
                Err(Failure { error, .. }) => {
                    self.queue.calls.failed();
                    let retry_in = pause.failed();
                    tracing::warn!(queue = self.queue.name, error = %Report(&error), ?retry_in, "receive failed");
                    tokio::select! {
                        biased;
                        () = stopped(&mut self.stop) => return,
                        () = tokio::time::sleep(retry_in) => {}
                    }
                }
            }
        }
    }

    /// One `ReceiveMessage`; its messages become deliveries, registered with the keeper
    /// first so they stay hidden while they wait.
    async fn receive(&self) -> Result<Vec<Delivery>, Failure> {
        // The whole seconds SQS hides them for, and what the keeper records: one value, so
        // that its renewals are timed by the visibility SQS applies.
        let (seconds, visibility) = whole_seconds_down(self.settings.visibility_timeout);
        let output = self
            .client
            .receive_message()
            .queue_url(&self.queue.url)
            .max_number_of_messages(i32::try_from(self.wanted).unwrap_or(10))
            .wait_time_seconds(i32::try_from(self.settings.wait_time.as_secs()).unwrap_or(20))
            .visibility_timeout(seconds)
            .message_system_attribute_names(MessageSystemAttributeName::ApproximateReceiveCount)
            .message_system_attribute_names(MessageSystemAttributeName::MessageGroupId)
            .message_attribute_names("All")
            .customize()
            .config_override(self.settings.long_poll())
            .send()
            .await
            .map_err(|e| Failure {
                for_good: cannot_heal(&e),
                error: SqsError::call("ReceiveMessage", &self.queue.name, e),
            })?;
        let messages = output.messages.unwrap_or_default();
        let name: Arc<str> = self.queue.name.as_str().into();
        let mut deliveries = Vec::with_capacity(messages.len());
        for message in messages {
            let attributes::Decoded {
                payload,
                headers,
                key,
                types,
            } = attributes::decode(&message);
            let receive_count = message
                .attributes()
                .and_then(|a| a.get(&MessageSystemAttributeName::ApproximateReceiveCount))
                .and_then(|n| n.parse().ok())
                .unwrap_or(1);
            let Some(receipt) = message.receipt_handle else {
                continue;
            };
            let tag = self
                .in_flight
                .insert(receipt, message.message_id, types, visibility);
            deliveries.push(
                Delivery::new(payload, name.clone(), self.settler.clone(), tag)
                    .with_headers(headers)
                    .with_partition_key(key)
                    .with_receive_count(receive_count)
                    // Read ahead: it may wait here before its handler starts.
                    .arrived_now(),
            );
        }
        Ok(deliveries)
    }
}

/// Resolves once receiving must stop (or the subscriber is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await;
}

/// Waits until fewer than `limit` messages are in flight.
async fn wait_for_room(in_flight: &InFlight, limit: usize) {
    conveyor::kit::wait_for(&in_flight.room, || (in_flight.len() < limit).then_some(())).await;
}
