//! A queue to mount a handler on: what a subscription declares, and how it consumes.

use conveyor::{Source, SubscribeSettings};

use crate::broker::LapinBroker;
use crate::subscriber::LapinSubscriber;
use crate::topology::QueueSpec;

/// The delay queue of `<queue>` is `<queue>.delay` unless named otherwise.
const DELAY_QUEUE_SUFFIX: &str = ".delay";

/// A RabbitMQ queue to mount a handler on, made by [`LapinBroker::queue`].
///
/// Subscribing declares the queue (or checks it, in passive mode) on the subscription's
/// own channel, sets its prefetch window and starts a consumer with manual acks.
///
/// Retry-after goes through a delay queue, `<queue>.delay` unless named otherwise: the
/// message is republished there with a per-message TTL of the delay and its attempt
/// count, and the delay queue dead-letters it back to this queue when the TTL runs out.
/// The transport declares the delay queue for queues it declares; for a passive queue,
/// ask with [`delay_queue`](Self::delay_queue). Without one, retry-after is a retry: the
/// message goes back to the tail of this queue at once. Per-message TTLs expire at the
/// head of the queue only, so a short delay waits behind a longer one published before
/// it.
#[derive(Clone, Debug)]
pub struct LapinSource {
    pub(crate) broker: LapinBroker,
    pub(crate) spec: QueueSpec,
    pub(crate) prefetch: Option<u16>,
    pub(crate) delay_queue: Option<String>,
    pub(crate) consumer_tag: Option<String>,
}

impl LapinSource {
    pub(crate) fn new(broker: LapinBroker, spec: QueueSpec) -> Self {
        let delay_queue =
            (!spec.is_passive()).then(|| format!("{}{DELAY_QUEUE_SUFFIX}", spec.name()));
        LapinSource {
            broker,
            spec,
            prefetch: None,
            delay_queue,
            consumer_tag: None,
        }
    }

    /// The prefetch window for this source, over the broker's default (a mount's own
    /// `prefetch(..)` still wins).
    pub fn prefetch(mut self, window: u16) -> Self {
        self.prefetch = Some(window);
        self
    }

    /// Declares (and uses) `queue` as this source's delay queue for retry-after.
    pub fn delay_queue(mut self, queue: impl Into<String>) -> Self {
        self.delay_queue = Some(queue.into());
        self
    }

    /// No delay queue: retry-after puts the message back at once (republished with its
    /// attempt count, as a retry).
    pub fn without_delay_queue(mut self) -> Self {
        self.delay_queue = None;
        self
    }

    /// The consumer tag (default: `conveyor.<process id>.<n>`, unique in the process).
    pub fn consumer_tag(mut self, tag: impl Into<String>) -> Self {
        self.consumer_tag = Some(tag.into());
        self
    }

    /// The queue's declaration.
    pub fn spec(&self) -> &QueueSpec {
        &self.spec
    }

    /// The delay queue's name, if retry-after uses one.
    pub fn delay_queue_name(&self) -> Option<&str> {
        self.delay_queue.as_deref()
    }
}

impl Source for LapinSource {
    type Subscriber = LapinSubscriber;

    fn queue_name(&self) -> &str {
        self.spec.name()
    }

    async fn subscribe(
        self,
        settings: SubscribeSettings,
    ) -> Result<LapinSubscriber, conveyor::Error> {
        let queue = self.spec.name().to_string();
        LapinSubscriber::open(self, settings)
            .await
            .map_err(|e| e.into_subscribe(&queue))
    }
}
