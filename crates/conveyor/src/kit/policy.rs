//! A queue's policy where its broker keeps none of its own, and taking a queue's dead
//! letters off a broker that has no call for it.

use std::future::Future;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::verdict::past_max_receives;
use crate::{DeadLetter, DeadLetterPolicy, Error, QueueSpec};

/// A queue's dead-letter policy and visibility timeout, as a transport whose broker keeps
/// no such thing stores it beside the queue (a JetStream stream's description, as JSON;
/// a Redis hash, as [`fields`](Self::fields)), where every subscriber reads it.
///
/// ```
/// use std::time::Duration;
/// use conveyor::QueueSpec;
/// use conveyor::kit::QueuePolicy;
///
/// let spec = QueueSpec::new("orders")
///     .dead_letter_queue("orders-dead", 3)
///     .visibility_timeout(Duration::from_secs(60));
/// let policy = QueuePolicy::of(&spec);
/// let fields = policy.fields();
/// let read = QueuePolicy::from_fields(|name| {
///     fields.iter().find(|(field, _)| *field == name).map(|(_, value)| value.as_str())
/// });
/// assert_eq!(read, policy);
/// assert_eq!(read.dead_letter_reason(4).as_deref(), Some("delivered 4 times; the queue's max receive count is 3"));
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueuePolicy {
    /// Where rejected messages go.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter_queue: Option<String>,
    /// After how many deliveries a message goes to the dead-letter queue without being
    /// handled again (0: no limit).
    #[serde(default)]
    pub max_receive_count: u32,
    /// How long a received message stays hidden from other consumers, where the queue
    /// sets its own. Not in the JSON form: JetStream keeps it on the consumer.
    #[serde(skip)]
    pub visibility_timeout: Option<Duration>,
}

impl QueuePolicy {
    /// The policy `spec` declares.
    pub fn of(spec: &QueueSpec) -> QueuePolicy {
        let (dead_letter_queue, max_receive_count) = match spec.dead_letter() {
            Some(DeadLetterPolicy {
                queue,
                max_receive_count,
                ..
            }) => (Some(queue.clone()), *max_receive_count),
            None => (None, 0),
        };
        QueuePolicy {
            dead_letter_queue,
            max_receive_count,
            visibility_timeout: spec.visibility(),
        }
    }

    /// Why a message delivered `attempts` times goes to the dead-letter queue unhandled,
    /// if it does: the queue has one, and the attempts are past its max receive count.
    pub fn dead_letter_reason(&self, attempts: u32) -> Option<String> {
        self.dead_letter_queue.as_ref()?;
        past_max_receives(attempts, self.max_receive_count)
    }

    /// The policy as named text fields, only those set.
    pub fn fields(&self) -> Vec<(&'static str, String)> {
        let mut fields = Vec::new();
        if let Some(queue) = &self.dead_letter_queue {
            fields.push(("dead_letter_queue", queue.clone()));
            fields.push(("max_receive_count", self.max_receive_count.to_string()));
        }
        if let Some(visibility) = self.visibility_timeout {
            fields.push(("visibility_ms", visibility.as_millis().to_string()));
        }
        fields
    }

    /// The policy of text fields as [`fields`](Self::fields) makes them, `field` giving
    /// each by name; one missing or unreadable is not set.
    pub fn from_fields<'a>(field: impl Fn(&str) -> Option<&'a str>) -> QueuePolicy {
        QueuePolicy {
            dead_letter_queue: field("dead_letter_queue").map(str::to_string),
            max_receive_count: field("max_receive_count")
                .and_then(|n| n.parse().ok())
                .unwrap_or(0),
            visibility_timeout: field("visibility_ms")
                .and_then(|n| n.parse().ok())
                .map(Duration::from_millis),
        }
    }
}

/// The most dead letters one call of a [`drain_dead_letters`] takes.
const DRAIN_BATCH: usize = 256;

/// Takes up to `max` messages off a queue, a batch at a time, and answers the dead
/// letters among them: `take(wanted)` takes up to `wanted` messages off the broker (for
/// good) and answers how many it took and the dead letters among them (a message deleted
/// meanwhile is none). Fewer than wanted ends the drain.
///
/// # Errors
///
/// The first error of `take`; what was taken before it is the caller's to lose or keep,
/// as with any failed call.
pub async fn drain_dead_letters<F, Fut>(max: usize, mut take: F) -> Result<Vec<DeadLetter>, Error>
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = Result<(usize, Vec<DeadLetter>), Error>>,
{
    let (mut taken, mut took_all) = (Vec::new(), 0usize);
    while took_all < max {
        let wanted = (max - took_all).min(DRAIN_BATCH);
        let (took, letters) = take(wanted).await?;
        taken.extend(letters);
        took_all = took_all.saturating_add(took);
        if took < wanted {
            break;
        }
    }
    Ok(taken)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_drain_takes_batches_until_one_comes_short_and_never_more_than_asked() {
        let mut asked = Vec::new();
        let mut left = 600usize;
        let taken = drain_dead_letters(1000, |wanted| {
            asked.push(wanted);
            let took = wanted.min(left);
            left -= took;
            let letters = (0..took)
                .map(|_| DeadLetter::new(bytes::Bytes::new(), crate::Headers::new(), None))
                .collect();
            async move { Ok((took, letters)) }
        })
        .await
        .unwrap();
        assert_eq!(taken.len(), 600);
        assert_eq!(asked, [256, 256, 256]);
        let taken = drain_dead_letters(10, |wanted| async move { Ok((wanted, Vec::new())) })
            .await
            .unwrap();
        assert!(taken.is_empty(), "what was taken held no dead letter");
        // Bounded by what it takes off the broker, dead letters or not.
    }

    #[test]
    fn a_policy_without_a_dead_letter_queue_dead_letters_nothing() {
        let policy = QueuePolicy {
            max_receive_count: 3,
            ..QueuePolicy::default()
        };
        assert_eq!(policy.dead_letter_reason(10), None);
    }
}
