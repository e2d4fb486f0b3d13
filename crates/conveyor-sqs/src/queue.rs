//! Queues: what the transport learns about one when it resolves it, and how to declare one.

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_sqs::types::QueueAttributeName;

/// What the transport knows about a queue, resolved once per name or URL.
#[derive(Clone, Debug)]
pub(crate) struct QueueInfo {
    /// The queue's name, for logs and errors.
    pub(crate) name: String,
    /// The queue's URL, for API calls.
    pub(crate) url: String,
    /// Whether it is a FIFO queue.
    pub(crate) fifo: bool,
    /// Whether SQS deduplicates its messages by content.
    pub(crate) content_based_deduplication: bool,
    /// Whether a redrive policy dead-letters its messages.
    pub(crate) redrive: bool,
    /// The largest message it accepts, in bytes.
    pub(crate) max_message_size: usize,
}

/// The SQS default for `MaximumMessageSize` (256 KiB).
const DEFAULT_MAX_MESSAGE_SIZE: usize = 262_144;

impl QueueInfo {
    pub(crate) fn from_attributes(
        url: String,
        attributes: &HashMap<QueueAttributeName, String>,
    ) -> Self {
        let name = url.rsplit('/').next().unwrap_or(&url).to_string();
        let flag = |attribute| attributes.get(&attribute).is_some_and(|v| v == "true");
        QueueInfo {
            fifo: flag(QueueAttributeName::FifoQueue) || name.ends_with(".fifo"),
            content_based_deduplication: flag(QueueAttributeName::ContentBasedDeduplication),
            redrive: attributes.contains_key(&QueueAttributeName::RedrivePolicy),
            max_message_size: attributes
                .get(&QueueAttributeName::MaximumMessageSize)
                .and_then(|v| v.parse().ok())
                .unwrap_or(DEFAULT_MAX_MESSAGE_SIZE),
            name,
            url,
        }
    }
}

/// A queue to create (or check) with [`SqsBroker::declare_queue`](crate::SqsBroker::declare_queue).
///
/// ```
/// use std::time::Duration;
/// use conveyor_sqs::QueueSpec;
///
/// let orders = QueueSpec::new("orders.fifo")
///     .content_based_deduplication()
///     .visibility_timeout(Duration::from_secs(60))
///     .dead_letter_queue("orders-dead.fifo", 5);
/// assert!(orders.is_fifo());
/// ```
#[derive(Clone, Debug)]
pub struct QueueSpec {
    pub(crate) name: String,
    pub(crate) content_based_deduplication: bool,
    pub(crate) visibility_timeout: Option<Duration>,
    pub(crate) dead_letter: Option<(String, u32)>,
    pub(crate) attributes: Vec<(QueueAttributeName, String)>,
}

impl QueueSpec {
    /// A queue named `name`; a name ending in `.fifo` makes a FIFO queue.
    pub fn new(name: impl Into<String>) -> Self {
        QueueSpec {
            name: name.into(),
            content_based_deduplication: false,
            visibility_timeout: None,
            dead_letter: None,
            attributes: Vec::new(),
        }
    }

    /// The queue's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether this is a FIFO queue.
    pub fn is_fifo(&self) -> bool {
        self.name.ends_with(".fifo")
    }

    /// FIFO only: SQS deduplicates by a hash of the body, so publishers need no ids.
    pub fn content_based_deduplication(mut self) -> Self {
        self.content_based_deduplication = true;
        self
    }

    /// The queue's default visibility timeout.
    pub fn visibility_timeout(mut self, timeout: Duration) -> Self {
        self.visibility_timeout = Some(timeout);
        self
    }

    /// A redrive policy: a message received more than `max_receive_count` times moves to
    /// `queue`, which is created (of the same kind) if it does not exist.
    pub fn dead_letter_queue(mut self, queue: impl Into<String>, max_receive_count: u32) -> Self {
        self.dead_letter = Some((queue.into(), max_receive_count));
        self
    }

    /// Any other queue attribute, as SQS spells it.
    pub fn attribute(mut self, name: QueueAttributeName, value: impl Into<String>) -> Self {
        self.attributes.push((name, value.into()));
        self
    }
}
