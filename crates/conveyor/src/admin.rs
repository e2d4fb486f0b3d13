//! The portable shapes of queue administration: a [`QueueSpec`] every transport can
//! declare, the [`QueueDepth`] every transport can read, and the [`DeadLetter`]s every
//! transport can take back out of a dead-letter queue. The [`Broker`](crate::Broker)
//! trait puts them to work.

use std::any::{Any, TypeId};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::headers::Headers;
use crate::message::PartitionKey;

/// A queue to declare, in the terms every transport shares: a name, a dead-letter queue
/// with a max receive count, a visibility (lock) time, and a delivery delay. A name
/// ending in `.fifo` makes a FIFO queue wherever the broker has them (SQS demands the
/// suffix; the in-process transport reads it the same way).
///
/// Transports add their own settings on top through extension traits (RabbitMQ queue
/// arguments and quorum queues in `conveyor-lapin`, SQS attributes in `conveyor-sqs`),
/// which keep them in the spec's [extensions](Self::with_extension); a transport ignores
/// the extensions of another.
///
/// ```
/// use std::time::Duration;
/// use conveyor::QueueSpec;
///
/// let spec = QueueSpec::new("orders.fifo")
///     .dead_letter_queue("orders-dead.fifo", 5)
///     .visibility_timeout(Duration::from_secs(60));
/// assert!(spec.is_fifo());
/// assert_eq!(spec.dead_letter().map(|d| d.max_receive_count), Some(5));
/// ```
#[derive(Clone)]
pub struct QueueSpec {
    name: String,
    dead_letter: Option<DeadLetterPolicy>,
    visibility_timeout: Option<Duration>,
    delay: Option<Duration>,
    extensions: Vec<(TypeId, Arc<dyn Any + Send + Sync>)>,
}

/// Where a queue's rejected messages go, and after how many receives a message that is
/// never settled goes there too (SQS's redrive policy, a quorum queue's delivery limit).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeadLetterPolicy {
    /// The dead-letter queue's name.
    pub queue: String,
    /// A message received more often than this is dead-lettered instead of delivered
    /// again.
    pub max_receive_count: u32,
}

impl QueueSpec {
    /// A queue named `name`, with no dead-letter queue and the broker's default
    /// visibility and delay.
    pub fn new(name: impl Into<String>) -> Self {
        QueueSpec {
            name: name.into(),
            dead_letter: None,
            visibility_timeout: None,
            delay: None,
            extensions: Vec::new(),
        }
    }

    /// Rejected messages, and messages received more than `max_receive_count` times,
    /// go to `queue`. Declare `queue` itself first: transports check that it exists.
    pub fn dead_letter_queue(mut self, queue: impl Into<String>, max_receive_count: u32) -> Self {
        self.dead_letter = Some(DeadLetterPolicy {
            queue: queue.into(),
            max_receive_count,
        });
        self
    }

    /// How long a received message stays hidden from other consumers before the broker
    /// gives it out again, unless a subscriber renews its hold (the SQS visibility
    /// timeout; RabbitMQ's consumer timeout).
    pub fn visibility_timeout(mut self, timeout: Duration) -> Self {
        self.visibility_timeout = Some(timeout);
        self
    }

    /// How long every message published to the queue waits before it can be received
    /// (SQS `DelaySeconds`).
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = Some(delay);
        self
    }

    /// Adds a transport's own setting, replacing one of the same type. For transport
    /// crates; users call the transport's extension trait instead.
    pub fn with_extension<T: Clone + Send + Sync + 'static>(mut self, value: T) -> Self {
        let id = TypeId::of::<T>();
        self.extensions.retain(|(kind, _)| *kind != id);
        self.extensions.push((id, Arc::new(value)));
        self
    }

    /// The transport setting of type `T`, if one was added.
    pub fn extension<T: 'static>(&self) -> Option<&T> {
        let id = TypeId::of::<T>();
        self.extensions
            .iter()
            .find(|(kind, _)| *kind == id)
            .and_then(|(_, value)| value.downcast_ref())
    }

    /// The queue's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether the name ends in `.fifo`.
    pub fn is_fifo(&self) -> bool {
        self.name.ends_with(".fifo")
    }

    /// The dead-letter queue and max receive count, if set.
    pub fn dead_letter(&self) -> Option<&DeadLetterPolicy> {
        self.dead_letter.as_ref()
    }

    /// The visibility timeout, if set.
    pub fn visibility(&self) -> Option<Duration> {
        self.visibility_timeout
    }

    /// The delivery delay, if set.
    pub fn delivery_delay(&self) -> Option<Duration> {
        self.delay
    }
}

impl fmt::Debug for QueueSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueueSpec")
            .field("name", &self.name)
            .field("dead_letter", &self.dead_letter)
            .field("visibility_timeout", &self.visibility_timeout)
            .field("delay", &self.delay)
            .field("extensions", &self.extensions.len())
            .finish()
    }
}

impl From<&str> for QueueSpec {
    fn from(name: &str) -> Self {
        QueueSpec::new(name)
    }
}

impl From<String> for QueueSpec {
    fn from(name: String) -> Self {
        QueueSpec::new(name)
    }
}

/// How many messages a queue holds, as far as its broker tells.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueDepth {
    /// Messages ready to be received now.
    pub ready: u64,
    /// Messages received and not yet settled; `None` where the broker does not say
    /// (RabbitMQ's AMQP interface).
    pub in_flight: Option<u64>,
    /// Messages waiting out a delay before they can be received; `None` where the broker
    /// does not say.
    pub delayed: Option<u64>,
}

impl QueueDepth {
    /// A depth with `ready` messages, the others unknown.
    pub fn new(ready: u64) -> Self {
        QueueDepth {
            ready,
            in_flight: None,
            delayed: None,
        }
    }

    /// Sets the count of messages in flight.
    pub fn in_flight(mut self, in_flight: u64) -> Self {
        self.in_flight = Some(in_flight);
        self
    }

    /// Sets the count of delayed messages.
    pub fn delayed(mut self, delayed: u64) -> Self {
        self.delayed = Some(delayed);
        self
    }
}

/// A message taken out of a dead-letter queue.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct DeadLetter {
    /// The payload, as published.
    pub payload: Bytes,
    /// The headers it carries, the transport's own included.
    pub headers: Headers,
    /// Its partition key, where the transport carried one.
    pub partition_key: Option<PartitionKey>,
    /// Why it was rejected: [`REJECT_REASON_HEADER`](crate::REJECT_REASON_HEADER), where
    /// Conveyor dead-lettered it (a broker's own dead-lettering carries none).
    pub reason: Option<String>,
}

impl DeadLetter {
    /// A dead letter of `payload` and `headers`; the reason is read from the headers.
    pub fn new(payload: Bytes, headers: Headers, partition_key: Option<PartitionKey>) -> Self {
        let reason = headers
            .get_str(crate::REJECT_REASON_HEADER)
            .map(str::to_string);
        DeadLetter {
            payload,
            headers,
            partition_key,
            reason,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Debug, PartialEq)]
    struct Quorum(bool);

    #[test]
    fn an_extension_is_found_by_its_type_and_replaced_by_a_new_one() {
        let spec = QueueSpec::new("q").with_extension(Quorum(false));
        assert_eq!(spec.extension::<Quorum>(), Some(&Quorum(false)));
        let spec = spec.with_extension(Quorum(true));
        assert_eq!(spec.extension::<Quorum>(), Some(&Quorum(true)));
        assert_eq!(spec.extension::<u32>(), None);
    }

    #[test]
    fn a_fifo_queue_is_named_so() {
        assert!(QueueSpec::new("a.fifo").is_fifo());
        assert!(!QueueSpec::new("a").is_fifo());
    }

    #[test]
    fn a_dead_letter_reads_its_reason_from_the_headers() {
        let mut headers = Headers::new();
        headers.insert(crate::REJECT_REASON_HEADER, "bad order");
        let dead = DeadLetter::new(Bytes::from_static(b"x"), headers, None);
        assert_eq!(dead.reason.as_deref(), Some("bad order"));
    }
}
