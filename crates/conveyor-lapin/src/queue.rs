//! A queue to mount a handler on, by name, and how its subscription consumes it.

use conveyor::{Source, SubscribeSettings};

use crate::broker::LapinBroker;
use crate::spec::default_delay_queue;
use crate::subscriber::LapinSubscriber;

/// A RabbitMQ queue to mount a handler on, by name: from [`LapinBroker::queue`] (or
/// [`conveyor::Broker::queue`]).
///
/// Subscribing checks that the queue exists, with a passive declare that leaves its
/// settings alone, so a queue declared with arguments (quorum, dead-lettering, single
/// active consumer) keeps them. A missing queue is declared: as this broker declared it
/// before, else durable with no arguments (in [passive](Self::passive) mode, it is an
/// error). A queue this broker declared itself with
/// [`declare_queue`](LapinBroker::declare_queue) is known by its declaration: a reject
/// then goes to its dead-letter queue with the reason, and one the broker drops by itself
/// (exclusive, auto-delete, transient) is declared again on the subscription's channel,
/// so recovering the connection brings it back. Then the subscription sets its prefetch
/// window and starts a consumer with manual acks.
///
/// Retry-after goes through a delay queue, `<queue>.delay` unless named otherwise: the
/// message is republished there with a per-message TTL of the delay and its attempt
/// count, and the delay queue dead-letters it back to this queue when the TTL runs out.
/// Subscribing declares the delay queue (with the same arguments every time, so declaring
/// it again changes nothing); in passive mode there is none unless one is named with
/// [`delay_queue`](Self::delay_queue). Without one, retry-after is a retry: the message
/// goes back to the tail of this queue at once. Per-message TTLs expire at the head of
/// the queue only, so a short delay waits behind a longer one published before it.
///
/// The delay queue of a quorum queue this broker declared is a quorum queue too, so that
/// it outlives a node as its queue does, and its default name is
/// `<queue>.delay.quorum`: a classic `<queue>.delay` from an earlier version cannot be
/// declared again as a quorum queue (RabbitMQ refuses another `x-queue-type`), and the
/// messages waiting in it still come back to the queue when their delay ends. A delay
/// queue named with [`delay_queue`](Self::delay_queue) keeps its name: where it already
/// exists as a classic queue, it is used as it is, with a warning.
///
/// ```no_run
/// use conveyor::{App, Broker, QueueSpec};
/// use conveyor_lapin::{LapinBroker, RabbitQueueSpec};
///
/// async fn handle(conveyor::Json(n): conveyor::Json<u64>) {}
///
/// # async fn f() -> Result<(), conveyor::Error> {
/// let broker = LapinBroker::connect("amqp://guest:guest@127.0.0.1:5672/%2f").await?;
/// broker.declare_queue(&QueueSpec::new("numbers").quorum()).await?;
/// App::new("numbers")
///     .mount(broker.queue("numbers").prefetch(64), handle, |m| m.workers(4))
///     .run()
///     .await
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct LapinQueue {
    pub(crate) broker: LapinBroker,
    pub(crate) name: String,
    pub(crate) prefetch: Option<u16>,
    pub(crate) delay_queue: DelayQueue,
    pub(crate) consumer_tag: Option<String>,
    pub(crate) passive: bool,
}

impl LapinQueue {
    pub(crate) fn new(broker: LapinBroker, name: &str) -> Self {
        LapinQueue {
            broker,
            name: name.to_string(),
            prefetch: None,
            delay_queue: DelayQueue::Default,
            consumer_tag: None,
            passive: false,
        }
    }

    /// The queue's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The prefetch window for this queue's subscriptions; it wins over the broker's
    /// default. At least 1: a mount on a queue with 0 (AMQP's "no limit") does not start.
    pub fn prefetch(mut self, window: u16) -> Self {
        self.prefetch = Some(window);
        self
    }

    /// Uses `queue` as this queue's delay queue for retry-after (declared when the
    /// subscription starts, passive mode included).
    pub fn delay_queue(mut self, queue: impl Into<String>) -> Self {
        self.delay_queue = DelayQueue::Named(queue.into());
        self
    }

    /// No delay queue: retry-after puts the message back at once (republished with its
    /// attempt count, as a retry).
    pub fn without_delay_queue(mut self) -> Self {
        self.delay_queue = DelayQueue::None;
        self
    }

    /// The consumer tag (default: `conveyor.<process id>.<n>`, unique in the process).
    pub fn consumer_tag(mut self, tag: impl Into<String>) -> Self {
        self.consumer_tag = Some(tag.into());
        self
    }

    /// Declares nothing, for topology owned elsewhere: subscribing fails with an error
    /// naming the queue when it does not exist, and retry-after has no delay queue
    /// unless one is named with [`delay_queue`](Self::delay_queue).
    pub fn passive(mut self) -> Self {
        self.passive = true;
        self
    }

    /// The delay queue's name, if retry-after uses one: the default one is
    /// `<queue>.delay.quorum` for a quorum queue this broker has declared (by the time
    /// of the call), else `<queue>.delay`.
    pub fn delay_queue_name(&self) -> Option<String> {
        match &self.delay_queue {
            DelayQueue::Default => Some(default_delay_queue(
                &self.name,
                self.broker.declaration(&self.name).as_deref(),
            )),
            DelayQueue::Named(name) => Some(name.clone()),
            DelayQueue::None => None,
        }
    }
}

/// Which delay queue a [`LapinQueue`]'s retry-after uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum DelayQueue {
    /// The default one, named when subscribing, from what the broker then knows of the
    /// queue (a quorum queue's has a name of its own).
    Default,
    /// One named with [`LapinQueue::delay_queue`]: declared in passive mode too.
    Named(String),
    /// None: retry-after is a retry.
    None,
}

impl Source for LapinQueue {
    fn messaging_system(&self) -> &'static str {
        "rabbitmq"
    }

    /// The AMQP 0.3.0 bindings: a queue channel; deliveries acked, publishes persistent
    /// and mandatory (the portable publisher's defaults).
    fn describe(&self, queue: &str) -> conveyor::asyncapi::QueueDescription {
        conveyor::asyncapi::QueueDescription::new(Some(crate::PARTITION_KEY_HEADER))
            .channel_binding(
                "amqp",
                serde_json::json!({
                    "is": "queue",
                    "queue": { "name": queue },
                    "bindingVersion": "0.3.0",
                }),
            )
            .receive_binding(
                "amqp",
                serde_json::json!({ "ack": true, "bindingVersion": "0.3.0" }),
            )
            .send_binding(
                "amqp",
                serde_json::json!({
                    "deliveryMode": 2,
                    "mandatory": true,
                    "bindingVersion": "0.3.0",
                }),
            )
    }

    /// The broker's own publisher: a handler's outputs go out as its other publishes do.
    fn publisher(&self) -> Option<conveyor::SharedPublisher> {
        Some(conveyor::SharedPublisher::new(self.broker.clone()))
    }

    type Subscriber = LapinSubscriber;

    fn queue_name(&self) -> &str {
        &self.name
    }

    async fn subscribe(
        self,
        settings: SubscribeSettings,
    ) -> Result<LapinSubscriber, conveyor::Error> {
        let queue = self.name.clone();
        LapinSubscriber::open(self, settings)
            .await
            .map_err(|e| e.into_subscribe(&queue))
    }
}
