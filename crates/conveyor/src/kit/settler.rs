//! Settling a pulling subscription's deliveries: a settlement is recorded on its
//! message's lease at once (settling never blocks), for the keeper to make the call; and
//! a rejected message kept until its dead letter is sent.

use std::sync::Arc;

use bytes::Bytes;

use super::lease::Leases;
use super::pull::Alive;
use crate::{Headers, Message, PartitionKey, Settle, Settled};

/// A subscription's [`Settle`]: turns each settlement into the transport's operation
/// (`op`, given the message's leased data) and records it on the lease, where the keeper
/// takes it. Holds an [`Alive`] token, so the keeper knows when no settler is left.
pub struct LeaseSettler<D, O> {
    leases: Arc<Leases<D, O>>,
    op: fn(&D, Settled<'_>) -> O,
    _alive: Alive,
}

impl<D, O> LeaseSettler<D, O> {
    /// A settler of `leases`, turning settlements into operations with `op`.
    pub fn new(leases: Arc<Leases<D, O>>, alive: Alive, op: fn(&D, Settled<'_>) -> O) -> Self {
        LeaseSettler {
            leases,
            op,
            _alive: alive,
        }
    }
}

impl<D: Send + 'static, O: Send + 'static> Settle for LeaseSettler<D, O> {
    fn settle(&self, settled: Settled<'_>) {
        let tag = settled.tag;
        let op = self.op;
        if !self.leases.settle(tag, |data| op(data, settled)) {
            tracing::debug!(tag, "settled a message this subscription no longer holds");
        }
    }
}

/// Why a message delivered `attempts` times goes to its dead-letter queue without running
/// again, where its queue allows at most `max_receive_count` receives (0: no limit);
/// `None` while it may run. For transports that count receives themselves (JetStream's
/// delivery count, a Redis entry's), as SQS's redrive policy does on the broker.
///
/// ```
/// use conveyor::kit::past_max_receives;
///
/// assert_eq!(past_max_receives(3, 3), None);
/// assert_eq!(
///     past_max_receives(4, 3).as_deref(),
///     Some("delivered 4 times; the queue's max receive count is 3")
/// );
/// assert_eq!(past_max_receives(99, 0), None); // no limit
/// ```
pub fn past_max_receives(attempts: u32, max_receive_count: u32) -> Option<String> {
    (max_receive_count > 0 && attempts > max_receive_count).then(|| {
        format!("delivered {attempts} times; the queue's max receive count is {max_receive_count}")
    })
}

/// A rejected message, kept until it is in its dead-letter queue.
#[derive(Debug)]
pub struct Rejected {
    /// Why it was rejected.
    pub reason: String,
    /// The payload.
    pub payload: Bytes,
    /// The headers, as received.
    pub headers: Headers,
    /// The partition key.
    pub partition_key: Option<PartitionKey>,
}

impl Rejected {
    /// The rejected message of a settlement, with `reason`.
    pub fn new(reason: &str, settled: Settled<'_>) -> Rejected {
        Rejected {
            reason: reason.to_string(),
            payload: settled.payload,
            headers: settled.headers,
            partition_key: settled.partition_key,
        }
    }

    /// The dead letter to publish: the message as received, its reason in
    /// [`REJECT_REASON_HEADER`](crate::REJECT_REASON_HEADER).
    ///
    /// ```
    /// use conveyor::kit::Rejected;
    /// use conveyor::{Bytes, Headers, REJECT_REASON_HEADER};
    ///
    /// let rejected = Rejected {
    ///     reason: "bad order".into(),
    ///     payload: Bytes::from_static(b"{}"),
    ///     headers: Headers::new(),
    ///     partition_key: Some("alice".into()),
    /// };
    /// let letter = rejected.into_dead_letter();
    /// assert_eq!(letter.headers().get_str(REJECT_REASON_HEADER), Some("bad order"));
    /// assert_eq!(letter.partition_key().map(|k| k.as_str()), Some("alice"));
    /// ```
    pub fn into_dead_letter(self) -> Message {
        let Rejected {
            reason,
            payload,
            mut headers,
            partition_key,
        } = self;
        headers.insert(crate::REJECT_REASON_HEADER, Bytes::from(reason));
        let mut message = Message::builder();
        for (name, value) in headers.iter() {
            message = message.header(name.to_string(), value.clone());
        }
        if let Some(key) = partition_key {
            message = message.partition_key(key);
        }
        message.payload(payload)
    }
}
