//! Settling deliveries: the core's synchronous [`Settle`] calls queue the AMQP work, and
//! one task per subscription performs it in order on the subscription's channel.
//!
//! Ack is `basic.ack`; retry and release are `basic.nack` with requeue; reject is
//! `basic.nack` without requeue (the queue's dead-letter exchange takes it, if it has
//! one). Retry-after republishes the message to the delay queue with the delay as its
//! per-message TTL and an attempt count header, waits for the broker's confirm, then acks
//! the original, so the message holds no prefetch slot while it waits.
//!
//! Every delivery carries lapin's acker for the channel it came on. When that channel
//! dies, its ackers turn into no-ops: a delivery received before a connection loss is
//! never acked on the new channel, and the broker delivers it again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use conveyor::{Bytes, Settle, Settled, Settlement};
use lapin::options::{BasicAckOptions, BasicNackOptions, BasicPublishOptions};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{Acker, BasicProperties, Channel, Confirmation};
use tokio::sync::{mpsc, oneshot};

use crate::headers::{ATTEMPTS_HEADER, DELIVERY_COUNT_HEADER};
use crate::publisher::PERSISTENT;

/// A received delivery the core has not settled yet.
pub(crate) struct Pending {
    pub(crate) acker: Acker,
    /// What a retry-after republishes; kept only when the source has a delay queue.
    pub(crate) copy: Option<Box<Copy>>,
}

/// The message as received, to republish on retry-after.
pub(crate) struct Copy {
    pub(crate) payload: Bytes,
    pub(crate) properties: BasicProperties,
    /// The attempt this delivery was, counting from 1.
    pub(crate) attempt: u32,
}

/// Where retry-after republishes: a delay queue, through a confirm-mode channel.
pub(crate) struct DelayRoute {
    pub(crate) channel: Channel,
    pub(crate) queue: ShortString,
    pub(crate) confirm_timeout: Duration,
}

enum Action {
    Ack,
    Requeue,
    Reject,
    RetryAfter(Duration),
}

enum Op {
    Settle(Pending, Action),
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
        delay: Option<DelayRoute>,
    ) -> (Arc<Settler>, tokio::task::JoinHandle<()>) {
        let (ops, rx) = mpsc::unbounded_channel();
        let settler = Arc::new(Settler {
            queue: queue.clone(),
            pending: Mutex::new(HashMap::new()),
            ops,
        });
        let task = tokio::spawn(run(rx, queue, delay));
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
        let Settled {
            tag, settlement, ..
        } = settled;
        let pending = self
            .pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&tag);
        let Some(pending) = pending else {
            return;
        };
        let action = match settlement {
            Settlement::Ack => Action::Ack,
            Settlement::RetryAfter(delay) => Action::RetryAfter(delay),
            Settlement::Reject { reason } => {
                tracing::debug!(queue = %self.queue, reason, "rejecting a message");
                Action::Reject
            }
            _ => Action::Requeue,
        };
        // If the task is gone the channel is closing, and closing it returns the message.
        let _ = self.ops.send(Op::Settle(pending, action));
    }
}

async fn run(mut ops: mpsc::UnboundedReceiver<Op>, queue: Arc<str>, delay: Option<DelayRoute>) {
    while let Some(op) = ops.recv().await {
        match op {
            Op::Flush(done) => {
                let _ = done.send(());
            }
            Op::Settle(pending, action) => perform(pending, action, &queue, delay.as_ref()).await,
        }
    }
}

async fn perform(pending: Pending, action: Action, queue: &str, delay: Option<&DelayRoute>) {
    let Pending { acker, copy } = pending;
    let result = match action {
        Action::Ack => acker.ack(BasicAckOptions::default()).await,
        Action::Requeue => nack(&acker, true).await,
        Action::Reject => nack(&acker, false).await,
        Action::RetryAfter(after) => match (delay, copy) {
            (Some(route), Some(copy)) => match republish(route, copy, after).await {
                Ok(()) => acker.ack(BasicAckOptions::default()).await,
                Err(error) => {
                    tracing::warn!(queue, %error, "cannot move a message to its delay queue; requeueing it now");
                    nack(&acker, true).await
                }
            },
            _ => {
                tracing::warn!(
                    queue,
                    ?after,
                    "retry-after without a delay queue; requeueing now"
                );
                nack(&acker, true).await
            }
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

/// Publishes `copy` to the delay queue with `after` as its TTL, and waits for the confirm.
async fn republish(route: &DelayRoute, copy: Box<Copy>, after: Duration) -> Result<(), String> {
    // The received headers, with the attempt count in place of the queue's delivery count.
    let mut headers = copy
        .properties
        .headers()
        .as_ref()
        .map(|table| table.inner().clone())
        .unwrap_or_default();
    headers.remove(DELIVERY_COUNT_HEADER);
    headers.insert(
        ATTEMPTS_HEADER.into(),
        AMQPValue::LongLongInt(copy.attempt.into()),
    );
    let ttl = after.as_millis().max(1).to_string();
    let properties = copy
        .properties
        .with_headers(FieldTable::from(headers))
        .with_expiration(ttl.into())
        .with_delivery_mode(PERSISTENT);
    let confirm = route
        .channel
        .basic_publish(
            "".into(),
            route.queue.clone(),
            BasicPublishOptions {
                mandatory: true,
                immediate: false,
            },
            &copy.payload,
            properties,
        )
        .await
        .map_err(|e| e.to_string())?;
    match tokio::time::timeout(route.confirm_timeout, confirm).await {
        Ok(Ok(Confirmation::Ack(None))) => Ok(()),
        Ok(Ok(Confirmation::Ack(Some(returned)))) => Err(format!(
            "the delay queue `{}` returned it: {}",
            route.queue, returned.reply_text
        )),
        Ok(Ok(other)) => Err(format!("the broker did not take it: {other:?}")),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no confirm within {:?}", route.confirm_timeout)),
    }
}
