//! What a settlement asks of a pulling broker ([`Verdict`]), the same on every transport,
//! and a rejected message kept until it is in its dead-letter queue ([`Rejected`]).

use std::time::Duration;

use bytes::Bytes;

use crate::{Headers, Message, PartitionKey, Settled, Settlement};

/// What a settlement asks of the broker, recorded on the message's lease for the keeper:
/// a transport's [`Keep`](super::Keep) turns each into its broker's calls.
///
/// ```
/// use std::time::Duration;
/// use conveyor::kit::Verdict;
/// use conveyor::{Settled, Settlement};
///
/// let later = Verdict::of(Settled::new(1, Settlement::RetryAfter(Duration::from_secs(5))));
/// assert!(matches!(later, Verdict::Retry { after: Some(_) }));
/// let released = Verdict::of(Settled::new(2, Settlement::Release));
/// assert!(matches!(released, Verdict::Retry { after: None }));
/// ```
#[derive(Debug)]
pub enum Verdict {
    /// Handled: the message leaves the queue (SQS's delete, JetStream's ack, Redis's
    /// `XACK`).
    Ack,
    /// Handed out again: at once (`None`: a retry, or a release of a message never
    /// handled), or once the delay is over.
    Retry {
        /// How long the message stays back first.
        after: Option<Duration>,
    },
    /// Sent to the queue's dead-letter queue, then out of the queue.
    Reject(Box<Rejected>),
}

impl Verdict {
    /// The verdict of a settlement.
    pub fn of(settled: Settled<'_>) -> Verdict {
        match settled.settlement {
            Settlement::Ack => Verdict::Ack,
            Settlement::Retry | Settlement::Release => Verdict::Retry { after: None },
            Settlement::RetryAfter(delay) => Verdict::Retry { after: Some(delay) },
            Settlement::Reject { reason } => {
                Verdict::Reject(Box::new(Rejected::new(reason, settled)))
            }
        }
    }
}

/// A rejected message, kept until it is in its dead-letter queue.
#[derive(Debug)]
pub struct Rejected {
    /// Why it was rejected.
    pub reason: String,
    /// The attempt that ended in the rejection, counting from 1.
    pub attempt: u32,
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
            attempt: settled.attempt,
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
    ///     attempt: 3,
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
            ..
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_settlement_has_its_verdict_and_a_reject_keeps_its_message_and_attempt() {
        assert!(matches!(
            Verdict::of(Settled::new(1, Settlement::Ack)),
            Verdict::Ack
        ));
        assert!(matches!(
            Verdict::of(Settled::new(1, Settlement::Retry)),
            Verdict::Retry { after: None }
        ));
        let mut settled = Settled::new(1, Settlement::Reject { reason: "bad" });
        settled.attempt = 3;
        settled.payload = Bytes::from_static(b"{}");
        settled.partition_key = Some("alice".into());
        let Verdict::Reject(rejected) = Verdict::of(settled) else {
            panic!("a reject's verdict");
        };
        assert_eq!(
            (
                rejected.reason.as_str(),
                rejected.attempt,
                &rejected.payload[..]
            ),
            ("bad", 3, &b"{}"[..])
        );
        assert_eq!(
            rejected.partition_key.map(|k| k.to_string()),
            Some("alice".into())
        );
    }
}
