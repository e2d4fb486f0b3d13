//! The in-process transport: named queues in memory, for tests and local runs.
//!
//! Queues are created on first use. A standard queue keeps publish order; a queue whose
//! name ends in `.fifo` also holds back a message group (the partition key) while one of
//! its messages is in flight, like an SQS FIFO queue. Several subscriptions on one queue
//! compete: each message goes to one of them. Retry puts a message back at the head of
//! its queue, retry-after after a delay (on tokio's clock, so paused-time tests work),
//! and reject moves it to the queue's dead-letter queue, if it has one, with the reason
//! in [`REJECT_REASON_HEADER`]. A queue with a max receive count dead-letters a message
//! received more often than that, as SQS's redrive policy does.
//!
//! ```
//! use conveyor::{Broker, MemoryBroker, Message, Publisher, QueueSpec};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), conveyor::Error> {
//! let broker = MemoryBroker::new();
//! broker.declare_queue(&QueueSpec::new("orders").dead_letter_queue("orders.dlq", 3)).await?;
//! broker.publish("orders", Message::builder().partition_key("alice").payload("hello")).await?;
//! assert_eq!(broker.queue_depth("orders").await?.ready, 1);
//! # Ok(())
//! # }
//! ```

mod history;
mod queue;
mod subscriber;

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::Notify;
use tokio::time::Instant;

pub use history::{RecordedMessage, Rejected};
pub use subscriber::MemorySubscriber;

use crate::admin::{DeadLetter, QueueDepth, QueueSpec};
use crate::error::Error;
use crate::headers::Headers;
use crate::kit;
use crate::message::{CONTENT_TYPE_HEADER, JSON_CONTENT_TYPE, Message, PartitionKey};
use crate::request::Replies;
use crate::transport::{Broker, Publisher, Source, SubscribeSettings};
use history::History;
use queue::{Queue, Stored};

/// The header that carries a message's partition key on the in-process transport.
pub const PARTITION_KEY_HEADER: &str = "x-partition-key";

pub use crate::outcome::REJECT_REASON_HEADER;

/// Settings of one in-process queue, from its [`QueueSpec`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct QueueOptions {
    /// Where rejected messages go; `None` discards them.
    dead_letter_queue: Option<String>,
    /// With a dead-letter queue: a message received more often than this is
    /// dead-lettered instead of delivered again.
    max_receive_count: Option<u32>,
    /// How long a message published without a delay of its own waits.
    delay: Option<Duration>,
}

impl From<&QueueSpec> for QueueOptions {
    fn from(spec: &QueueSpec) -> Self {
        QueueOptions {
            dead_letter_queue: spec.dead_letter().map(|policy| policy.queue.clone()),
            max_receive_count: spec.dead_letter().map(|policy| policy.max_receive_count),
            delay: spec.delivery_delay(),
        }
    }
}

/// Counts for one in-process queue.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueStats {
    /// Messages waiting to be received.
    pub ready: usize,
    /// Messages waiting for a delay to pass.
    pub delayed: usize,
    /// Messages received and not yet settled.
    pub in_flight: usize,
    /// Subscriptions reading the queue.
    pub consumers: usize,
    /// Messages ever published to it.
    pub published: u64,
    /// Messages acked.
    pub acked: u64,
    /// Retries (now or later).
    pub retried: u64,
    /// Messages rejected (dead-lettered or discarded).
    pub rejected: u64,
}

/// An in-process broker: a set of named queues. Cloning gives another handle to the same
/// queues.
#[derive(Clone, Default)]
pub struct MemoryBroker {
    inner: Arc<BrokerInner>,
}

#[derive(Default)]
pub(crate) struct BrokerInner {
    queues: Mutex<HashMap<String, Arc<Queue>>>,
    /// Notified on every change to any queue while [`MemoryBroker::wait_idle`] waits.
    changed: Notify,
    /// How many idle-waits are under way: a broker in steady use with none pays nothing
    /// to wake nobody.
    idle_waiters: AtomicUsize,
    /// Settlements under way: a message gone from in flight whose record (acked,
    /// rejected) or dead letter is not yet kept. The broker is not idle while one is, or
    /// a wait could return before the history shows the last ack.
    settling: AtomicUsize,
    history: History,
    /// The requests of [`Broker::request`] waiting for their replies.
    replies: Replies,
}

/// A settlement under way, counted from before its message leaves the queue until the
/// guard is dropped, when idle-waiters are told.
pub(crate) struct Settling(Arc<BrokerInner>);

impl Settling {
    pub(crate) fn begin(broker: Arc<BrokerInner>) -> Self {
        broker.settling.fetch_add(1, Ordering::SeqCst);
        Settling(broker)
    }

    pub(crate) fn broker(&self) -> &Arc<BrokerInner> {
        &self.0
    }
}

impl Drop for Settling {
    fn drop(&mut self) {
        self.0.settling.fetch_sub(1, Ordering::SeqCst);
        self.0.notify_changed();
    }
}

/// The reply address of in-process requests: a reply published here goes straight to the
/// request waiting for it, never to a queue.
pub(crate) const REPLY_ADDRESS: &str = "conveyor.in-process.reply";

impl BrokerInner {
    /// Tells idle-waiters that a queue changed. Called after the change, with the queue's
    /// lock let go: a waiter counts itself before it looks at the queues under their
    /// locks, so either it sees the change or this sees it counted.
    pub(crate) fn notify_changed(&self) {
        if self.idle_waiters.load(Ordering::SeqCst) > 0 {
            self.changed.notify_waiters();
        }
    }

    fn queue(self: &Arc<Self>, name: &str) -> Arc<Queue> {
        let mut queues = kit::lock(&self.queues);
        // Looked up first: the name is copied only for a queue met for the first time,
        // not on every publish.
        if let Some(queue) = queues.get(name) {
            return queue.clone();
        }
        queues
            .entry(name.to_string())
            .or_insert_with(|| {
                Arc::new(Queue::new(
                    name,
                    QueueOptions::default(),
                    Arc::downgrade(self),
                ))
            })
            .clone()
    }

    fn all_queues(&self) -> Vec<Arc<Queue>> {
        let queues = kit::lock(&self.queues);
        queues.values().cloned().collect()
    }
}

impl MemoryBroker {
    /// A broker with no queues.
    pub fn new() -> Self {
        Self::default()
    }

    /// The queue `name` as a source to mount a handler on. The queue is created on first
    /// use; a name ending in `.fifo` makes a FIFO queue.
    pub fn queue(&self, name: impl Into<String>) -> MemoryQueue {
        MemoryQueue {
            broker: self.clone(),
            name: name.into(),
        }
    }

    /// Counts for the queue `name` (all zero for a queue never used).
    pub fn stats(&self, name: &str) -> QueueStats {
        self.inner.queue(name).stats()
    }

    /// Starts or stops keeping copies of what is published, acked and rejected, for
    /// [`published`](Self::published), [`acked`](Self::acked) and
    /// [`rejected`](Self::rejected). Off by default.
    pub fn record_history(&self, on: bool) {
        self.inner.history.set_recording(on);
    }

    /// Messages published to `queue` while recording, in publish order.
    pub fn published(&self, queue: &str) -> Vec<RecordedMessage> {
        self.inner.history.published(queue)
    }

    /// Messages acked from `queue` while recording, in ack order.
    pub fn acked(&self, queue: &str) -> Vec<RecordedMessage> {
        self.inner.history.acked(queue)
    }

    /// Messages rejected from `queue` while recording, in reject order: those
    /// dead-lettered and those discarded.
    pub fn rejected(&self, queue: &str) -> Vec<Rejected> {
        self.inner.history.rejected(queue)
    }

    /// Whether every consumed queue has nothing ready or due and no queue has anything in
    /// flight. With `delayed`, messages waiting out a delay count as work too.
    pub fn is_idle(&self, delayed: bool) -> bool {
        let now = Instant::now();
        // Under the map's lock (a queue locks its own state inside it, never the other way
        // round), so checking allocates nothing.
        let queues = kit::lock(&self.inner.queues);
        // Looked at after the queues: a settlement counts itself before it takes its
        // message out of flight, under the queue's lock, so a message seen gone is seen
        // settling until its record is kept.
        queues.values().all(|queue| queue.is_idle(now, delayed))
            && self.inner.settling.load(Ordering::SeqCst) == 0
    }

    /// Waits until [`is_idle(false)`](Self::is_idle): everything published and due has
    /// been settled.
    pub async fn wait_idle(&self) {
        self.wait_for(false).await;
    }

    /// Waits until [`is_idle(true)`](Self::is_idle): delayed messages too have fallen due
    /// and been settled.
    pub async fn wait_drained(&self) {
        self.wait_for(true).await;
    }

    async fn wait_for(&self, delayed: bool) {
        /// Counts an idle-wait for as long as it lasts, cancelled or not.
        struct Waiting<'a>(&'a AtomicUsize);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        self.inner.idle_waiters.fetch_add(1, Ordering::SeqCst);
        let _waiting = Waiting(&self.inner.idle_waiters);
        // Every step towards idle notifies: a take, a settle, and a delayed message
        // falling due, which its waiting subscriber then takes.
        kit::wait_for(&self.inner.changed, || self.is_idle(delayed).then_some(())).await;
    }

    fn store(&self, destination: &str, message: Message) -> (Arc<Queue>, Stored, Option<Duration>) {
        let mut parts = message.into_parts();
        let mut headers = std::mem::take(&mut parts.headers);
        let key = match parts.partition_key.take() {
            Some(key) => {
                headers.insert(PARTITION_KEY_HEADER, key.as_str().to_string());
                Some(key)
            }
            None => headers
                .get_str(PARTITION_KEY_HEADER)
                .map(PartitionKey::from),
        };
        let json_only = headers.is_empty()
            && matches!(parts.content_type, Some(Cow::Borrowed(JSON_CONTENT_TYPE)))
            && parts.property_headers().count() == 1;
        if json_only {
            // The commonest message: JSON with no header of its own. All such share one
            // header list, so publishing one allocates none.
            static JSON_ONLY: LazyLock<Headers> = LazyLock::new(|| {
                let mut headers = Headers::new();
                headers.insert(
                    CONTENT_TYPE_HEADER,
                    Bytes::from_static(JSON_CONTENT_TYPE.as_bytes()),
                );
                headers
            });
            headers = JSON_ONLY.clone();
            parts.content_type = None;
        }
        // A content type known at compile time (`application/json`) is not copied.
        if let Some(content_type) = parts.content_type.take() {
            let value = match content_type {
                Cow::Borrowed(text) => Bytes::from_static(text.as_bytes()),
                Cow::Owned(text) => Bytes::from(text),
            };
            headers.insert(CONTENT_TYPE_HEADER, value);
        }
        for (name, value) in parts.property_headers() {
            headers.insert(name, value.to_string());
        }
        let stored = Stored {
            payload: parts.payload,
            headers,
            key,
            receive_count: 0,
            seq: 0, // given when it arrives
        };
        (self.inner.queue(destination), stored, parts.delay)
    }
}

impl Publisher for MemoryBroker {
    /// Adds the message to the queue `destination`, creating it if needed.
    async fn publish(&self, destination: &str, mut message: Message) -> Result<(), Error> {
        if destination == REPLY_ADDRESS {
            let correlation_id = message.correlation_id().unwrap_or_default().to_string();
            self.inner.replies.deliver(&correlation_id, message);
            return Ok(());
        }
        let span = crate::trace::publish_span("conveyor_in_process", destination);
        crate::trace::inject_context(&span, message.headers_mut());
        let _in_span = span.enter();
        let (queue, stored, delay) = self.store(destination, message);
        if self.inner.history.is_recording() {
            self.inner.history.record_published(
                destination,
                RecordedMessage {
                    payload: stored.payload.clone(),
                    headers: stored.headers.clone(),
                    partition_key: stored.key.clone(),
                    receive_count: 0,
                },
            );
        }
        queue.push(stored, delay);
        queue.sent.record("conveyor_in_process", destination, 1);
        Ok(())
    }
}

impl Broker for MemoryBroker {
    type Queue = MemoryQueue;

    /// Publishes the request with `conveyor.in-process.reply` as its reply address: the
    /// responder's reply is handed straight to this request.
    async fn request(
        &self,
        destination: &str,
        mut message: Message,
        timeout: Duration,
    ) -> Result<Message, Error> {
        self.inner
            .replies
            .request(destination, timeout, |correlation_id| {
                message.set_correlation_id(correlation_id);
                message.set_reply_to(REPLY_ADDRESS);
                self.publish(destination, message)
            })
            .await
    }

    fn queue(&self, name: &str) -> MemoryQueue {
        MemoryBroker::queue(self, name)
    }

    /// Creates the queue, or changes an existing queue's settings. The visibility
    /// timeout is moot here: a delivery stays held until it is settled or its
    /// subscription ends.
    async fn declare_queue(&self, spec: &QueueSpec) -> Result<(), Error> {
        self.inner.queue(spec.name()).set_options(spec.into());
        Ok(())
    }

    /// Forgets the queue and what it holds. Subscriptions still open on it keep reading
    /// the forgotten queue; a publish to the name makes a new one.
    async fn delete_queue(&self, name: &str) -> Result<(), Error> {
        kit::lock(&self.inner.queues).remove(name);
        self.inner.changed.notify_waiters();
        Ok(())
    }

    async fn queue_depth(&self, name: &str) -> Result<QueueDepth, Error> {
        let stats = self.stats(name);
        let count = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
        Ok(QueueDepth::new(count(stats.ready))
            .in_flight(count(stats.in_flight))
            .delayed(count(stats.delayed)))
    }

    async fn take_dead_letters(
        &self,
        dead_letter_queue: &str,
        max: usize,
    ) -> Result<Vec<DeadLetter>, Error> {
        let taken = self.inner.queue(dead_letter_queue).take_ready(max);
        Ok(taken
            .into_iter()
            .map(|stored| DeadLetter::new(stored.payload, stored.headers, stored.key))
            .collect())
    }

    /// Nothing to close: the queues live as long as a handle does.
    async fn close(&self) -> Result<(), Error> {
        Ok(())
    }
}

impl fmt::Debug for MemoryBroker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut names: Vec<_> = self
            .inner
            .all_queues()
            .iter()
            .map(|q| q.name.clone())
            .collect();
        names.sort();
        f.debug_struct("MemoryBroker")
            .field("queues", &names)
            .finish()
    }
}

/// An in-process queue to mount a handler on, from [`MemoryBroker::queue`].
#[derive(Clone, Debug)]
pub struct MemoryQueue {
    broker: MemoryBroker,
    name: String,
}

impl Source for MemoryQueue {
    fn messaging_system(&self) -> &'static str {
        "conveyor_in_process"
    }

    /// The partition key's header; AsyncAPI has no bindings for an in-process queue.
    fn describe(&self, _queue: &str) -> crate::asyncapi::QueueDescription {
        crate::asyncapi::QueueDescription::new(Some(PARTITION_KEY_HEADER))
    }

    /// The broker's own publisher: a handler's outputs go out as its other publishes do.
    fn publisher(&self) -> Option<crate::SharedPublisher> {
        Some(crate::SharedPublisher::new(self.broker.clone()))
    }

    type Subscriber = MemorySubscriber;

    fn queue_name(&self) -> &str {
        &self.name
    }

    async fn subscribe(self, _settings: SubscribeSettings) -> Result<MemorySubscriber, Error> {
        Ok(MemorySubscriber::new(self.broker.inner.queue(&self.name)))
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::outcome::Settlement;
    use crate::transport::Subscriber;

    /// Settles the delivery on another thread while the history is held, waits until the
    /// message has left flight, and checks the broker is not idle before it is recorded.
    async fn settle_while_the_history_is_held(settlement: Settlement<'static>) -> MemoryBroker {
        let broker = MemoryBroker::new();
        broker.record_history(true);
        broker.publish_json("jobs", &1u32).await.unwrap();
        let mut subscriber = broker
            .queue("jobs")
            .subscribe(SubscribeSettings::new(1))
            .await
            .unwrap();
        let delivery = subscriber.recv().await.unwrap().unwrap();

        let held = broker.inner.history.hold();
        let settling = std::thread::spawn(move || delivery.settle(settlement));
        let deadline = Instant::now() + Duration::from_secs(10);
        while broker.stats("jobs").in_flight > 0 {
            assert!(
                Instant::now() < deadline,
                "the settlement never took the message"
            );
            std::thread::yield_now();
        }
        assert!(
            !broker.is_idle(false),
            "idle while the settlement was not yet recorded"
        );
        drop(held);
        settling.join().unwrap();
        assert!(broker.is_idle(false));
        broker
    }

    #[tokio::test]
    async fn the_broker_is_not_idle_until_an_ack_is_in_its_history() {
        let broker = settle_while_the_history_is_held(Settlement::Ack).await;
        assert_eq!(broker.acked("jobs").len(), 1);
    }

    #[tokio::test]
    async fn the_broker_is_not_idle_until_a_reject_is_in_its_history() {
        let broker = settle_while_the_history_is_held(Settlement::Reject { reason: "bad" }).await;
        assert_eq!(broker.rejected("jobs").len(), 1);
    }
}
