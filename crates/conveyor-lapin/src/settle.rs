//! Settling deliveries: the core's synchronous [`Settle`] calls queue the AMQP work, and
//! one task per subscription performs it on the subscription's channels.
//!
//! - Ack is `basic.ack`; release (a delivery never handled) is `basic.nack` with requeue.
//! - Retry republishes the message to its own queue (default exchange, routing key = the
//!   queue) with the attempt that just ended in [`ATTEMPTS_HEADER`], waits for the
//!   broker's confirm, then acks the original. A classic queue counts nothing but a
//!   `redelivered` flag, so this is how attempts are counted on every queue type.
//! - Retry-after does the same through the delay queue, with the delay as the copy's
//!   per-message TTL (the delay queue dead-letters it back when it runs out), so the
//!   message holds no prefetch slot while it waits. Without a delay queue it is a retry.
//! - Reject, when the queue's declaration (made by this broker) names its dead-letter
//!   exchange, republishes the message there (under the dead-letter routing key, else
//!   the queue's name) with the reason in [`REJECT_REASON_HEADER`] and without
//!   RabbitMQ's `x-death` bookkeeping, waits for the confirm, then acks the original.
//!   Otherwise (a queue declared elsewhere, a policy) it is `basic.nack` without
//!   requeue: the broker dead-letters or drops it, without the reason.
//!
//! The core's settle task ([`conveyor::kit::SettleDriver`]) performs them in order: the
//! acks and nacks queued together are handed to lapin together and awaited as one, so
//! they leave in as few writes as lapin makes of them; what is settled while a batch is
//! being written goes in the next. Acks whose lower tags are all settled on the wire go
//! as one `basic.ack` with `multiple` ([`crate::ack_window`]): fewer frames for the
//! broker to parse, which is where the time goes when it shares the machine. A republish
//! (sending the copy, its confirm, and the ack of the original after it) runs beside the
//! later settlements, at most [`MAX_CONFIRMING`] at a time: a slow confirm, or a
//! publishing connection that a resource alarm blocks, holds back nothing but its own
//! message, and the prefetch window keeps moving. [`Settler::flush`] waits for
//! everything queued before it, confirms included.
//!
//! A copy keeps the message's properties but `user_id`, which RabbitMQ checks against
//! the publishing login (another producer's would have every copy refused); a dead
//! letter also drops the message's TTL, as RabbitMQ's own dead-lettering does.
//!
//! Republishing happens on one confirm-mode channel per subscription, on the broker's
//! publishing connection, opened for the first copy and again after the broker closed it
//! over a copy it refused. When a republish fails or is not confirmed within the confirm
//! timeout, the original is settled the plain AMQP way instead (requeued, or nacked to
//! the dead-letter exchange) and a warning says so.
//!
//! Every delivery carries lapin's acker for the channel it came on. When that channel
//! dies, its ackers turn into no-ops and the broker delivers the message again: so a
//! delivery whose channel is gone is never republished, which would make a second copy.

use std::any::Any;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use conveyor::kit::{Perform, RetryPause, SettleDriver, Started, TagTable};
use conveyor::{Bytes, Settle, Settled, Settlement};
use futures_util::future::{BoxFuture, join_all};
use lapin::options::{BasicAckOptions, BasicNackOptions, BasicPublishOptions};
use lapin::types::ShortString;
use lapin::{Acker, BasicProperties, Channel, Confirmation, PublisherConfirm};

use crate::ack_window::{AckWindow, Place};
use crate::broker::LapinBroker;
use crate::copy::{dead_letter_copy, retry_copy};
use crate::error::LapinError;
use crate::headers::oversize_header_frame;
use crate::publisher::{MAX_EXPIRATION_MS, can_publish};

/// How many republishes of one subscription may wait for their confirms at once. Each
/// holds its original unacked, so the prefetch window bounds them first; past this many
/// the task takes no further settlement until one is confirmed.
const MAX_CONFIRMING: usize = 1024;

/// A received delivery the core has not settled yet.
pub(crate) struct Pending {
    pub(crate) acker: Acker,
    /// Where it sits on its channel, to ack it together with others.
    pub(crate) place: Place,
    /// The message's AMQP properties as received, for a republished copy (the payload
    /// comes back with the settlement).
    pub(crate) properties: BasicProperties,
}

/// Where a subscription's settlements republish messages, through a confirm-mode channel
/// on the broker's publishing connection.
pub(crate) struct Routes {
    /// Opened for the first copy, not with the subscription: while a resource alarm
    /// blocks the publishing connection, nothing can be opened on it, and the
    /// subscription must still start and ack. Opened again after the broker closed it
    /// (over a copy it refused): lapin reopens a channel only with its connection.
    pub(crate) channel: tokio::sync::Mutex<Option<Channel>>,
    pub(crate) broker: LapinBroker,
    /// The subscription's queue: where a retry goes.
    pub(crate) queue: ShortString,
    /// Where a retry-after waits out its delay, if the queue has one.
    pub(crate) delay_queue: Option<ShortString>,
    /// The dead-letter exchange and routing key of the queue, when its declaration says.
    pub(crate) dead_letter: Option<(ShortString, ShortString)>,
    pub(crate) confirm_timeout: Duration,
    /// How long to hold a retry's original before requeueing it, once its copy was
    /// refused: longer with each refusal in a row. A requeue is not counted as an
    /// attempt, so without the pause a copy the broker keeps refusing (a deleted delay
    /// queue, a full `reject-publish` queue) would run the handler again at once, for
    /// ever.
    pub(crate) refused: Mutex<RetryPause>,
    /// Set as the subscription closes: a held original goes back at once then.
    pub(crate) closing: tokio::sync::watch::Sender<bool>,
}

impl Routes {
    /// Waits `pause`, or less if the subscription closes meanwhile.
    async fn hold(&self, pause: Duration) {
        let mut closing = self.closing.subscribe();
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            _ = closing.wait_for(|closing| *closing) => {}
        }
    }

    /// Cuts short the holds under way and to come: the subscription is closing.
    pub(crate) fn closing(&self) {
        self.closing.send_replace(true);
    }

    /// The channel copies go out on, opened at the first call and again once closed.
    async fn channel(&self) -> Result<Channel, String> {
        self.broker.publishing_connected().await;
        let mut channel = self.channel.lock().await;
        if let Some(open) = channel.as_ref().filter(|open| can_publish(open)) {
            return Ok(open.clone());
        }
        let opened = self
            .broker
            .open_publishing_channel("republishing")
            .await
            .map_err(|error| conveyor::Report(&error).to_string())?;
        *channel = Some(opened.clone());
        Ok(opened)
    }

    /// Closes the channel, if one is open.
    pub(crate) async fn close(&self) {
        if let Some(channel) = self.channel.lock().await.take() {
            let _ = channel.close(200, "subscription closed".into()).await;
        }
    }
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

/// One settlement to perform.
struct Job {
    pending: Pending,
    action: Action,
    payload: Bytes,
}

/// The [`Settle`] of one subscription.
pub(crate) struct Settler {
    queue: Arc<str>,
    pending: Mutex<TagTable<Pending>>,
    /// Closed when the last delivery (or the subscription) lets go of the settler: the
    /// task ends once what is under way has finished.
    driver: SettleDriver<Job>,
}

impl Settler {
    /// A settler for `queue`, and the task that performs its settlements.
    pub(crate) fn start(
        queue: Arc<str>,
        routes: Arc<Routes>,
    ) -> (Arc<Settler>, tokio::task::JoinHandle<()>) {
        let settling = Settling {
            queue: queue.clone(),
            routes,
            window: Arc::default(),
        };
        let (driver, task) = SettleDriver::start(settling, MAX_CONFIRMING);
        let settler = Arc::new(Settler {
            queue,
            pending: Mutex::default(),
            driver,
        });
        (settler, task)
    }

    /// Remembers a delivery until the core settles it; returns its tag.
    pub(crate) fn track(&self, pending: Pending) -> u64 {
        conveyor::kit::lock(&self.pending).insert(pending)
    }

    /// Waits until every settlement queued so far has been performed, republishes
    /// included (their confirms, then the acks of their originals). (Should the task have
    /// died, the answer never comes: race it with the task.)
    pub(crate) async fn flush(&self) {
        self.driver.flush().await;
    }
}

impl Settle for Settler {
    fn settle(&self, settled: Settled<'_>) {
        let pending = conveyor::kit::lock(&self.pending).remove(settled.tag);
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
            Settlement::Release => Action::Release,
        };
        // If the task is gone the channel is closing, and closing it returns the message.
        self.driver.push(Job {
            pending,
            action,
            payload: settled.payload,
        });
    }

    /// The AMQP properties as received ([`crate::amqp_properties`]).
    fn record(&self, tag: u64) -> Option<Box<dyn Any + Send>> {
        let pending = conveyor::kit::lock(&self.pending);
        Some(Box::new(pending.get(tag)?.properties.clone()))
    }
}

/// Settling on RabbitMQ.
struct Settling {
    queue: Arc<str>,
    routes: Arc<Routes>,
    /// What may be acked together. Only the task and its futures use it, one at a time.
    window: Arc<Mutex<AckWindow>>,
}

/// An ack or nack of one delivery: one frame on the consuming channel.
pub(crate) struct Frame {
    acker: Acker,
    place: Place,
    kind: FrameKind,
}

#[derive(Clone, Copy)]
enum FrameKind {
    Ack,
    /// Acks every delivery of the channel up to this one (`multiple`).
    AckUpTo,
    Nack {
        requeue: bool,
    },
}

impl Frame {
    fn ack(pending: Pending) -> Self {
        Frame {
            acker: pending.acker,
            place: pending.place,
            kind: FrameKind::Ack,
        }
    }

    fn nack(pending: Pending, requeue: bool) -> Self {
        Frame {
            acker: pending.acker,
            place: pending.place,
            kind: FrameKind::Nack { requeue },
        }
    }

    async fn send(&self) -> lapin::Result<bool> {
        match self.kind {
            FrameKind::Ack => self.acker.ack(BasicAckOptions::default()).await,
            FrameKind::AckUpTo => self.acker.ack(BasicAckOptions { multiple: true }).await,
            FrameKind::Nack { requeue } => nack(&self.acker, requeue).await,
        }
    }
}

impl Settling {
    /// The frames to send for `plain`: the acks that every lower tag of the channel
    /// allows become one `multiple` ack (see [`crate::ack_window`]). Also returns where
    /// every settlement of `plain` sits, to mark them written once sent.
    fn coalesce(&self, mut plain: Vec<Frame>) -> (Vec<Frame>, Vec<Place>) {
        let places: Vec<Place> = plain.iter().map(|frame| frame.place).collect();
        let window = conveyor::kit::lock(&self.window);
        let Some(epoch) = window.epoch() else {
            return (plain, places);
        };
        let mut acks: Vec<u64> = plain
            .iter()
            .filter(|frame| matches!(frame.kind, FrameKind::Ack) && frame.place.epoch == epoch)
            .map(|frame| frame.place.tag)
            .collect();
        acks.sort_unstable();
        let Some(up_to) = window.coalescible(epoch, &acks) else {
            return (plain, places);
        };
        drop(window);
        plain.retain_mut(|frame| {
            let covered = matches!(frame.kind, FrameKind::Ack)
                && frame.place.epoch == epoch
                && frame.place.tag <= up_to;
            if covered && frame.place.tag == up_to {
                frame.kind = FrameKind::AckUpTo;
                return true;
            }
            !covered
        });
        (plain, places)
    }
}

impl Perform for Settling {
    type Job = Job;
    type Plain = Frame;

    fn send(&self, plain: Vec<Frame>) -> BoxFuture<'static, ()> {
        let queue = self.queue.clone();
        let window = self.window.clone();
        let (frames, places) = self.coalesce(plain);
        Box::pin(async move {
            let sent = join_all(frames.iter().map(Frame::send)).await;
            for result in sent {
                report(&queue, result);
            }
            let mut window = conveyor::kit::lock(&window);
            for place in places {
                window.written(place);
            }
        })
    }

    fn start(&self, job: Job) -> Started<Frame> {
        let Job {
            pending,
            action,
            payload,
        } = job;
        conveyor::kit::lock(&self.window).seen(pending.place);
        let routes = &self.routes;
        match action {
            Action::Ack => Started::Plain(Frame::ack(pending)),
            Action::Release => Started::Plain(Frame::nack(pending, true)),
            // The channel the message came on is gone, so the broker delivers the
            // original again: a copy would be a duplicate. (The nack is then a no-op.)
            Action::Retry { .. } | Action::Reject(_) if !pending.acker.usable() => {
                Started::Plain(Frame::nack(pending, true))
            }
            Action::Retry { delay, attempt } => {
                let Pending {
                    acker,
                    place,
                    properties,
                } = pending;
                let (destination, properties) = match (delay, &routes.delay_queue) {
                    (Some(delay), Some(delay_queue)) => {
                        let ttl = delay.as_millis().clamp(1, MAX_EXPIRATION_MS).to_string();
                        let properties =
                            retry_copy(&properties, attempt).with_expiration(ttl.into());
                        (delay_queue, properties)
                    }
                    _ => (&routes.queue, retry_copy(&properties, attempt)),
                };
                let copy = Copy {
                    exchange: ShortString::from(""),
                    routing_key: destination.clone(),
                    properties,
                };
                let fallback = Fallback::Requeue {
                    to: destination.clone(),
                };
                Started::Rest(self.republish_then_ack(copy, payload, (acker, place), fallback))
            }
            Action::Reject(reason) => match &routes.dead_letter {
                Some((exchange, routing_key)) => {
                    let Pending {
                        acker,
                        place,
                        properties,
                    } = pending;
                    let copy = Copy {
                        exchange: exchange.clone(),
                        routing_key: routing_key.clone(),
                        properties: dead_letter_copy(&properties, &reason),
                    };
                    let fallback = Fallback::DeadLetter {
                        exchange: exchange.clone(),
                    };
                    Started::Rest(self.republish_then_ack(copy, payload, (acker, place), fallback))
                }
                None => Started::Plain(Frame::nack(pending, false)),
            },
        }
    }
}

impl Settling {
    /// A republish, as a rest that runs beside the later settlements: publishes the copy,
    /// waits for its confirm, then acks the original (or settles it by `fallback` when
    /// the broker did not take the copy in time). Nothing of it is on the ack path: a
    /// publishing connection that a resource alarm blocks holds back this message only.
    /// Until it ends, no `multiple` ack covers the original.
    fn republish_then_ack(
        &self,
        copy: Copy,
        payload: Bytes,
        (acker, place): (Acker, Place),
        fallback: Fallback,
    ) -> BoxFuture<'static, ()> {
        let (queue, routes) = (self.queue.clone(), self.routes.clone());
        let dead_letter = matches!(fallback, Fallback::DeadLetter { .. });
        let window = self.window.clone();
        let republished = async move {
            // While a resource alarm blocks the publishing connection, a copy would only
            // wait in lapin's buffer: if it then timed out, the original would be
            // requeued, fail again and buffer another copy, every confirm timeout, all
            // landing when the alarm clears. So the original stays held (unacked) until
            // the connection is unblocked; acks of other messages go on meanwhile.
            routes.broker.publishing_unblocked().await;
            // The original's channel died while it waited: the broker delivers it again.
            if !acker.usable() {
                return;
            }
            let timeout = routes.confirm_timeout;
            let taken = match tokio::time::timeout(timeout, publish(&routes, copy, &payload)).await
            {
                Ok(Ok(confirm)) => confirmed(confirm, timeout).await,
                Ok(Err(error)) => Err(error),
                Err(_) => Err(format!("could not be sent within {timeout:?}")),
            };
            let result = match taken {
                Ok(()) => {
                    if dead_letter {
                        conveyor::telemetry::record_dead_lettered("rabbitmq", &queue);
                    } else {
                        conveyor::kit::lock(&routes.refused).reset();
                    }
                    acker.ack(BasicAckOptions::default()).await
                }
                Err(error) => fallback.settle(&acker, &routes, &queue, &error).await,
            };
            report(&queue, result);
        };
        Box::pin(async move {
            republished.await;
            conveyor::kit::lock(&window).written(place);
        })
    }
}

/// How a delivery is settled when its copy could not be republished.
enum Fallback {
    /// A retry's original is requeued as it is (this attempt is not counted), after a
    /// pause ([`Routes::refused`]).
    Requeue { to: ShortString },
    /// A reject's original is nacked to the broker's own dead-lettering (without reason).
    DeadLetter { exchange: ShortString },
}

impl Fallback {
    async fn settle(
        &self,
        acker: &Acker,
        routes: &Routes,
        queue: &str,
        error: &str,
    ) -> lapin::Result<bool> {
        match self {
            Fallback::Requeue { to } => {
                let pause = conveyor::kit::lock(&routes.refused).failed();
                tracing::warn!(
                    queue,
                    to = %to,
                    %error,
                    ?pause,
                    "cannot republish a message to retry it; requeueing it as it is after a pause (this attempt is not counted)"
                );
                routes.hold(pause).await;
                nack(acker, true).await
            }
            Fallback::DeadLetter { exchange } => {
                tracing::warn!(
                    queue,
                    dead_letter_exchange = %exchange,
                    %error,
                    "cannot dead-letter a message with its reason; nacking it to the broker's own dead-lettering"
                );
                nack(acker, false).await
            }
        }
    }
}

/// Logs what came of settling a delivery of `queue`, unless it went well.
fn report(queue: &str, result: lapin::Result<bool>) {
    match result {
        Ok(true) => {}
        Ok(false) => tracing::debug!(
            queue,
            "the channel this message came on is gone; the broker delivers it again"
        ),
        // An error, as on SQS: the settlement is lost for good, and the message comes
        // again (a handled one twice).
        Err(error) => tracing::error!(
            queue,
            error = %conveyor::Report(&error),
            "settling failed; the broker delivers the message again"
        ),
    }
}

/// `basic.nack`: back to the queue with `requeue`, else to the broker's dead-lettering
/// (or dropped). `Ok(false)` when the delivery's channel is gone.
pub(crate) async fn nack(acker: &Acker, requeue: bool) -> lapin::Result<bool> {
    acker
        .nack(BasicNackOptions {
            multiple: false,
            requeue,
        })
        .await
}

/// A copy of a message to publish, and where.
struct Copy {
    exchange: ShortString,
    routing_key: ShortString,
    properties: BasicProperties,
}

/// Publishes `copy` (mandatory) on the routes' confirm channel; the confirm is to come.
/// A copy whose header frame is over the connection's frame limit (a long reject reason
/// on headers near the limit) is not sent: the broker would close the connection over
/// it, and every delivery in flight on it would come again.
async fn publish(routes: &Routes, copy: Copy, payload: &[u8]) -> Result<PublisherConfirm, String> {
    let limit = routes.broker.publishing_frame_max();
    if let Some(size) = oversize_header_frame(&copy.properties, limit) {
        let refused = LapinError::HeadersTooLarge {
            destination: copy.routing_key.to_string(),
            size,
            limit,
        };
        return Err(refused.to_string());
    }
    routes
        .channel()
        .await?
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
        .map_err(|error| conveyor::Report(&error).to_string())
}

/// Waits up to `timeout` for the broker to take a republished copy.
async fn confirmed(confirm: PublisherConfirm, timeout: Duration) -> Result<(), String> {
    match tokio::time::timeout(timeout, confirm).await {
        Ok(Ok(Confirmation::Ack(None))) => Ok(()),
        Ok(Ok(Confirmation::Ack(Some(returned)))) => {
            Err(format!("returned unroutable: {}", returned.reply_text))
        }
        Ok(Ok(other)) => Err(format!("the broker did not take it: {other:?}")),
        Ok(Err(error)) => Err(conveyor::Report(&error).to_string()),
        Err(_) => Err(format!("no confirm within {timeout:?}")),
    }
}
