//! Settling deliveries: the core's synchronous [`Settle`] calls queue the AMQP work, and
//! one task per subscription performs it in order on the subscription's channels.
//!
//! - Ack is `basic.ack`; release (a delivery never handled) is `basic.nack` with requeue.
//! - Retry republishes the message to its own queue (default exchange, routing key = the
//!   queue) with the attempt that just ended in [`ATTEMPTS_HEADER`], waits for the
//!   broker's confirm, then acks the original. A classic queue counts nothing but a
//!   `redelivered` flag, so this is how attempts are counted on every queue type.
//! - Retry-after does the same through the delay queue, with the delay as the copy's
//!   per-message TTL (the delay queue dead-letters it back when it runs out), so the
//!   message holds no prefetch slot while it waits. Without a delay queue it is a retry.
//! - Reject, when the queue's declaration names its dead-letter exchange, republishes the
//!   message there (under the dead-letter routing key, else the queue's name) with the
//!   reason in [`REJECT_REASON_HEADER`] and without RabbitMQ's `x-death` bookkeeping,
//!   waits for the confirm, then acks the original. Otherwise (a passive queue, a policy)
//!   it is `basic.nack` without requeue: the broker dead-letters or drops it, without
//!   the reason.
//!
//! Republishing happens on one confirm-mode channel per subscription. When a republish
//! fails, the original is settled the plain AMQP way instead (requeued, or nacked to the
//! dead-letter exchange) and a warning says so.
//!
//! Every delivery carries lapin's acker for the channel it came on. When that channel
//! dies, its ackers turn into no-ops and the broker delivers the message again: so a
//! delivery whose channel is gone is never republished, which would make a second copy.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use conveyor::{Bytes, REJECT_REASON_HEADER, Settle, Settled, Settlement};
use lapin::options::{BasicAckOptions, BasicNackOptions, BasicPublishOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{Acker, BasicProperties, Channel, Confirmation};
use tokio::sync::{mpsc, oneshot};

use crate::headers::{ATTEMPTS_HEADER, DELIVERY_COUNT_HEADER};
use crate::publisher::PERSISTENT;

/// The longest per-message TTL RabbitMQ accepts, in milliseconds (2^32 - 1); a longer
/// `expiration` would close the channel.
const MAX_EXPIRATION_MS: u128 = u32::MAX as u128;

/// A received delivery the core has not settled yet.
pub(crate) struct Pending {
    pub(crate) acker: Acker,
    /// The message's AMQP properties as received, for a republished copy (the payload
    /// comes back with the settlement).
    pub(crate) properties: BasicProperties,
}

/// Where a subscription's settlements republish messages, through a confirm-mode channel.
pub(crate) struct Routes {
    pub(crate) channel: Channel,
    /// The subscription's queue: where a retry goes.
    pub(crate) queue: ShortString,
    /// Where a retry-after waits out its delay, if the source has a delay queue.
    pub(crate) delay_queue: Option<ShortString>,
    /// The dead-letter exchange and routing key of the queue, when its declaration says.
    pub(crate) dead_letter: Option<(ShortString, ShortString)>,
    pub(crate) confirm_timeout: Duration,
}

enum Action {
    Ack,
    Release,
    /// Again now (`None`) or after the delay; `attempt` is the attempt that just ended.
    Retry {
        delay: Option<Duration>,
        attempt: u32,
    },
    Reject(String),
}

// Nearly every op is a settlement; boxing it would cost an allocation per message to
// spare the rare flush a few hundred bytes of channel slot.
#[allow(clippy::large_enum_variant)]
enum Op {
    Settle {
        pending: Pending,
        action: Action,
        payload: Bytes,
    },
    Flush(oneshot::Sender<()>),
}

/// The [`Settle`] of one subscription.
pub(crate) struct Settler {
    queue: Arc<str>,
    pending: Mutex<HashMap<u64, Pending>>,
    ops: mpsc::UnboundedSender<Op>,
}

impl Settler {
    /// A settler for `queue`, and the task that performs its settlements.
    pub(crate) fn start(
        queue: Arc<str>,
        routes: Routes,
    ) -> (Arc<Settler>, tokio::task::JoinHandle<()>) {
        let (ops, rx) = mpsc::unbounded_channel();
        let settler = Arc::new(Settler {
            queue: queue.clone(),
            pending: Mutex::new(HashMap::new()),
            ops,
        });
        let task = tokio::spawn(run(rx, queue, routes));
        (settler, task)
    }

    /// Remembers a delivery under `tag` until the core settles it.
    pub(crate) fn track(&self, tag: u64, pending: Pending) {
        self.pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(tag, pending);
    }

    /// Waits until every settlement queued so far has been performed.
    pub(crate) async fn flush(&self) {
        let (done, flushed) = oneshot::channel();
        if self.ops.send(Op::Flush(done)).is_ok() {
            let _ = flushed.await;
        }
    }
}

impl Settle for Settler {
    fn settle(&self, settled: Settled<'_>) {
        let pending = self
            .pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&settled.tag);
        let Some(pending) = pending else {
            return;
        };
        let attempt = settled.attempt;
        let action = match settled.settlement {
            Settlement::Ack => Action::Ack,
            Settlement::Retry => Action::Retry {
                delay: None,
                attempt,
            },
            Settlement::RetryAfter(delay) => Action::Retry {
                delay: Some(delay),
                attempt,
            },
            Settlement::Reject { reason } => {
                tracing::debug!(queue = %self.queue, reason, "rejecting a message");
                Action::Reject(reason.to_string())
            }
            _ => Action::Release,
        };
        // If the task is gone the channel is closing, and closing it returns the message.
        let _ = self.ops.send(Op::Settle {
            pending,
            action,
            payload: settled.payload,
        });
    }
}

async fn run(mut ops: mpsc::UnboundedReceiver<Op>, queue: Arc<str>, routes: Routes) {
    while let Some(op) = ops.recv().await {
        match op {
            Op::Flush(done) => {
                let _ = done.send(());
            }
            Op::Settle {
                pending,
                action,
                payload,
            } => perform(pending, action, payload, &queue, &routes).await,
        }
    }
}

async fn perform(pending: Pending, action: Action, payload: Bytes, queue: &str, routes: &Routes) {
    let Pending { acker, properties } = pending;
    let result = match action {
        Action::Ack => acker.ack(BasicAckOptions::default()).await,
        Action::Release => nack(&acker, true).await,
        // The channel the message came on is gone, so the broker delivers the original
        // again: a copy would be a duplicate. (The nack below is then a no-op.)
        Action::Retry { .. } | Action::Reject(_) if !acker.usable() => nack(&acker, true).await,
        Action::Retry { delay, attempt } => {
            let (destination, properties) = match (delay, &routes.delay_queue) {
                (Some(delay), Some(delay_queue)) => {
                    let ttl = delay.as_millis().clamp(1, MAX_EXPIRATION_MS).to_string();
                    let properties = retry_copy(properties, attempt).with_expiration(ttl.into());
                    (delay_queue, properties)
                }
                _ => (&routes.queue, retry_copy(properties, attempt)),
            };
            let copy = Copy {
                exchange: ShortString::from(""),
                routing_key: destination.clone(),
                properties,
            };
            match republish(routes, copy, &payload).await {
                Ok(()) => acker.ack(BasicAckOptions::default()).await,
                Err(error) => {
                    tracing::warn!(
                        queue,
                        to = %destination,
                        %error,
                        "cannot republish a message to retry it; requeueing it as it is (this attempt is not counted)"
                    );
                    nack(&acker, true).await
                }
            }
        }
        Action::Reject(reason) => match &routes.dead_letter {
            Some((exchange, routing_key)) => {
                let copy = Copy {
                    exchange: exchange.clone(),
                    routing_key: routing_key.clone(),
                    properties: dead_letter_copy(properties, &reason),
                };
                match republish(routes, copy, &payload).await {
                    Ok(()) => acker.ack(BasicAckOptions::default()).await,
                    Err(error) => {
                        tracing::warn!(
                            queue,
                            dead_letter_exchange = %exchange,
                            %error,
                            "cannot dead-letter a message with its reason; nacking it to the broker's own dead-lettering"
                        );
                        nack(&acker, false).await
                    }
                }
            }
            None => nack(&acker, false).await,
        },
    };
    match result {
        Ok(true) => {}
        Ok(false) => tracing::debug!(
            queue,
            "the channel this message came on is gone; the broker delivers it again"
        ),
        Err(error) => tracing::warn!(
            queue,
            %error,
            "settling failed; the broker delivers the message again"
        ),
    }
}

async fn nack(acker: &Acker, requeue: bool) -> lapin::Result<bool> {
    acker
        .nack(BasicNackOptions {
            multiple: false,
            requeue,
        })
        .await
}

/// The received headers, as a map to edit.
fn header_map(properties: &BasicProperties) -> BTreeMap<ShortString, AMQPValue> {
    properties
        .headers()
        .as_ref()
        .map(|table| table.inner().clone())
        .unwrap_or_default()
}

/// The properties of a retried copy: the received ones, with the attempt count in place
/// of the queue's delivery count.
fn retry_copy(properties: BasicProperties, attempt: u32) -> BasicProperties {
    let mut headers = header_map(&properties);
    headers.remove(DELIVERY_COUNT_HEADER);
    headers.insert(
        ATTEMPTS_HEADER.into(),
        AMQPValue::LongLongInt(attempt.into()),
    );
    properties
        .with_headers(FieldTable::from(headers))
        .with_delivery_mode(PERSISTENT)
}

/// The properties of a dead letter: the received ones with the reason, and without the
/// broker's dead-lettering history (`x-death`, `x-first-death-*`, `x-last-death-*`, left
/// by the delay queue) nor the attempt counts, so a message moved back from the
/// dead-letter queue starts afresh.
fn dead_letter_copy(properties: BasicProperties, reason: &str) -> BasicProperties {
    let mut headers = header_map(&properties);
    headers.retain(|name, _| {
        let name = name.as_str();
        name != "x-death"
            && !name.starts_with("x-first-death-")
            && !name.starts_with("x-last-death-")
            && name != ATTEMPTS_HEADER
            && name != DELIVERY_COUNT_HEADER
    });
    headers.insert(
        REJECT_REASON_HEADER.into(),
        AMQPValue::LongString(LongString::from(reason.as_bytes())),
    );
    properties
        .with_headers(FieldTable::from(headers))
        .with_delivery_mode(PERSISTENT)
}

/// A copy of a message to publish, and where.
struct Copy {
    exchange: ShortString,
    routing_key: ShortString,
    properties: BasicProperties,
}

/// Publishes `copy` (mandatory) on the routes' confirm channel, and waits for the confirm.
async fn republish(routes: &Routes, copy: Copy, payload: &[u8]) -> Result<(), String> {
    let confirm = routes
        .channel
        .basic_publish(
            copy.exchange,
            copy.routing_key,
            BasicPublishOptions {
                mandatory: true,
                immediate: false,
            },
            payload,
            copy.properties,
        )
        .await
        .map_err(|e| e.to_string())?;
    match tokio::time::timeout(routes.confirm_timeout, confirm).await {
        Ok(Ok(Confirmation::Ack(None))) => Ok(()),
        Ok(Ok(Confirmation::Ack(Some(returned)))) => {
            Err(format!("returned unroutable: {}", returned.reply_text))
        }
        Ok(Ok(other)) => Err(format!("the broker did not take it: {other:?}")),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no confirm within {:?}", routes.confirm_timeout)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn received(headers: &[(&str, AMQPValue)]) -> BasicProperties {
        let mut table = FieldTable::default();
        for (name, value) in headers {
            table.insert((*name).into(), value.clone());
        }
        BasicProperties::default()
            .with_headers(table)
            .with_message_id("m1".into())
    }

    fn text(value: &str) -> AMQPValue {
        AMQPValue::LongString(LongString::from(value.as_bytes()))
    }

    #[test]
    fn a_retried_copy_counts_the_attempt_instead_of_the_delivery_count() {
        let copy = retry_copy(
            received(&[
                (DELIVERY_COUNT_HEADER, AMQPValue::LongLongInt(4)),
                ("app", text("kept")),
            ]),
            3,
        );
        let headers = header_map(&copy);
        assert_eq!(
            headers.get(ATTEMPTS_HEADER),
            Some(&AMQPValue::LongLongInt(3))
        );
        assert!(!headers.contains_key(DELIVERY_COUNT_HEADER));
        assert_eq!(headers.get("app"), Some(&text("kept")));
        assert_eq!(copy.message_id().as_ref().map(|m| m.as_str()), Some("m1"));
        assert_eq!(*copy.delivery_mode(), Some(PERSISTENT));
    }

    #[test]
    fn a_dead_letter_carries_the_reason_and_no_death_history() {
        let copy = dead_letter_copy(
            received(&[
                ("x-death", AMQPValue::FieldArray(Default::default())),
                ("x-first-death-reason", text("expired")),
                ("x-first-death-queue", text("q.delay")),
                ("x-last-death-reason", text("expired")),
                (ATTEMPTS_HEADER, AMQPValue::LongLongInt(2)),
                ("app", text("kept")),
            ]),
            "bad input",
        );
        let headers = header_map(&copy);
        let names: Vec<&str> = headers.keys().map(ShortString::as_str).collect();
        assert_eq!(names, vec!["app", REJECT_REASON_HEADER]);
        assert_eq!(headers.get(REJECT_REASON_HEADER), Some(&text("bad input")));
    }
}
