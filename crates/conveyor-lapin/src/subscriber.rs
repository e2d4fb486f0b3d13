//! The receive side of one subscription: one channel, one consumer, deliveries in the
//! order the queue pushed them.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use conveyor::{Bytes, ConnectionProbe, Delivery, Settle, SubscribeSettings, Subscriber};
use futures_util::{FutureExt, StreamExt};
use lapin::options::{BasicCancelOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::{FieldTable, ShortString};
use lapin::{Channel, Consumer};

use crate::ack_window::Places;
use crate::broker::LapinBroker;
use crate::error::{LapinError, is_precondition_failed, short};
use crate::headers::{self, ATTEMPTS_HEADER, DELIVERY_COUNT_HEADER};
use crate::queue::{DelayQueue, LapinQueue};
use crate::settle::{self, Pending, Routes, Settler};
use crate::spec::{Declaration, default_delay_queue};

/// The smallest prefetch window chosen by default.
const MIN_DEFAULT_PREFETCH: usize = 16;

/// Distinguishes the consumer tags of one process.
static CONSUMERS: AtomicU64 = AtomicU64::new(0);

/// A subscription to a RabbitMQ queue, opened by mounting a [`LapinQueue`].
///
/// It owns one channel with a prefetch window (basic.qos) and one consumer with manual
/// acks, plus a confirm-mode channel its settlements republish on (retries with their
/// attempt count, retry-afters to the delay queue, dead letters with their reason). The
/// dispatcher takes deliveries one at a time (or a batch of what has already arrived) in
/// the order the broker pushed them. When the connection is lost it waits for the client
/// to recover, then goes on with the same consumer.
///
/// When the app starts draining, [`stop_receiving`](Subscriber::stop_receiving) cancels
/// the consumer and hands the deliveries still waiting in the prefetch window back to
/// the queue, while the handlers in flight finish and settle on the same channel. If the
/// connection is lost at that moment, the cancel is owed: lapin restores the consumer
/// with the channel, and a task cancels it then and hands back what it was pushed.
///
/// Closed without draining first (a shard that [`conveyor::shards::Shards`] hands to
/// another replica), it closes its channel without cancelling the consumer: the broker
/// takes back what the channel held and ends the consumer in one step, so the next
/// consumer of a single-active-consumer queue starts from the oldest message left.
pub struct LapinSubscriber {
    queue: Arc<str>,
    channel: Channel,
    consumer: Consumer,
    consumer_tag: ShortString,
    settler: Arc<Settler>,
    settle_task: tokio::task::JoinHandle<()>,
    /// The confirm-mode channel retries, retry-afters and dead letters are republished on.
    /// Where settlements republish copies; closed with the subscription.
    routes: Arc<Routes>,
    /// The consuming connection's status, for the mount's health.
    connection: lapin::ConnectionStatus,
    /// An error met while taking a batch, reported by the next receive.
    stashed: Option<lapin::Error>,
    /// The delivery tags' runs, so that settlements can be acked together.
    places: Places,
    /// False once [`Subscriber::stop_receiving`] has run.
    receiving: bool,
    /// Whether the broker has confirmed the consumer's cancellation.
    cancelled: bool,
    /// Cancels the consumer once lapin has restored it, where stopping receiving found
    /// the channel down ([`cancel_when_restored`]).
    owed_cancel: Option<OwedCancel>,
    /// The queue's consumer timeout, where this broker declared one.
    consumer_timeout: Option<Duration>,
}

/// The window a mount gets when neither it nor its queue nor its broker names one:
/// twice what it can hold, so the next deliveries are on their way while it works.
fn default_prefetch(settings: &SubscribeSettings) -> u16 {
    let holds = settings
        .max_in_flight
        .max(settings.batch_size.unwrap_or(1))
        .max(1);
    let window = holds.saturating_mul(2).max(MIN_DEFAULT_PREFETCH);
    u16::try_from(window).unwrap_or(u16::MAX)
}

/// What a subscription declares of its queue on its consuming channel (where recovering
/// the channel declares it again), given whether the queue exists and what this broker
/// declared of it. `None`: the queue stays as it is.
fn to_declare(
    queue: &str,
    exists: bool,
    passive: bool,
    known: Option<&Declaration>,
) -> Result<Option<Declaration>, LapinError> {
    Ok(match (exists, passive, known) {
        (false, true, _) => {
            return Err(LapinError::MissingQueue {
                queue: queue.to_string(),
            });
        }
        (true, true, _) => None,
        // The broker drops such a queue by itself (with the connection, its last
        // consumer, a restart): declared here, it comes back with the channel.
        (true, false, Some(known)) if known.vanishes() => Some(known.clone()),
        (true, false, _) => None,
        (false, false, Some(known)) => Some(known.clone()),
        (false, false, None) => Some(Declaration::plain(queue)),
    })
}

/// Declares the delay queue `delay_queue` of `queue`, if it has one, on the consuming
/// channel (so that recovering the channel declares it again).
///
/// The delay queue lives as long as its queue, where this broker declared the queue:
/// durable with a durable one, gone with the connection with an exclusive one; durable
/// otherwise; a quorum queue with a quorum queue. It dead-letters expired messages back
/// to `queue`.
///
/// A delay queue the user named for a quorum queue may exist already as a classic
/// queue, from an earlier version: RabbitMQ refuses to declare it again as a quorum
/// queue (PRECONDITION_FAILED, which closes the channel), so that is tried on a channel
/// of its own first, and on a refusal the classic queue is used as it is, with a
/// warning. (The default name of a quorum queue's delay queue is new, so it never
/// meets an old classic one.)
async fn declare_delay_queue(
    broker: &LapinBroker,
    channel: &Channel,
    queue: &str,
    known: Option<&Declaration>,
    delay_queue: Option<(&str, bool)>,
) -> Result<(), LapinError> {
    let Some((name, named)) = delay_queue else {
        return Ok(());
    };
    let mut declaration = Declaration::delay_queue(name, queue, known);
    if named && declaration.is_quorum() {
        let probe = broker.open_channel("delay queue check").await?;
        let result = declaration.declare(&probe).await;
        let _ = probe.close(200, "done".into()).await;
        match result {
            Ok(()) => {}
            Err(LapinError::Declare { source, .. }) if is_precondition_failed(&source) => {
                tracing::warn!(
                    queue = %queue,
                    delay_queue = %name,
                    "the delay queue exists as another type than its quorum queue (a classic queue, from an earlier version?); using it as it is, but it lives on one node, and if that node is lost the subscription does not resume: name a new delay queue, or delete this one once it is empty"
                );
                declaration = Declaration::classic_delay_queue(name, queue, None);
            }
            Err(error) => return Err(error),
        }
    }
    declaration.declare(channel).await?;
    broker.remember_delay_queue(queue, name);
    Ok(())
}

/// Where a subscription's settlements republish copies: the queue, its delay queue and
/// its dead-letter target. The channel they go out on opens with the first copy.
fn routes(
    broker: &LapinBroker,
    queue: &str,
    known: Option<&Declaration>,
    delay_queue: Option<String>,
) -> Result<Routes, LapinError> {
    let dead_letter = match known.and_then(Declaration::dead_letter_target) {
        Some((exchange, key)) => Some((
            short("dead-letter exchange", exchange)?,
            short("dead-letter routing key", key)?,
        )),
        None => None,
    };
    Ok(Routes {
        channel: tokio::sync::Mutex::default(),
        broker: broker.clone(),
        queue: short("queue name", queue)?,
        delay_queue: delay_queue
            .map(|name| short("queue name", &name))
            .transpose()?,
        dead_letter,
        confirm_timeout: broker.inner.confirm_timeout,
        refused: std::sync::Mutex::default(),
        closing: tokio::sync::watch::Sender::new(false),
    })
}

impl LapinSubscriber {
    pub(crate) async fn open(
        source: LapinQueue,
        settings: SubscribeSettings,
    ) -> Result<Self, LapinError> {
        let LapinQueue {
            broker,
            name,
            prefetch,
            delay_queue,
            consumer_tag,
            passive,
        } = source;
        let queue: Arc<str> = name.as_str().into();
        // Checked on a channel of its own: a passive declare of a missing queue closes
        // its channel.
        let exists = broker.ready_in(&queue).await?.is_some();
        let known = broker.declaration(&queue);
        let declaration = to_declare(&queue, exists, passive, known.as_deref())?;
        // Named by its role only: the subscription's error names the queue.
        let channel = broker.open_channel("consuming").await?;
        if let Some(declaration) = &declaration {
            if !exists {
                tracing::info!(queue = %queue, "the queue does not exist; declaring it");
            }
            declaration.declare(&channel).await?;
        }
        // Passive mode declares nothing of its own accord: no default delay queue.
        let delay_queue = match delay_queue {
            DelayQueue::Default if !passive => {
                Some((default_delay_queue(&queue, known.as_deref()), false))
            }
            DelayQueue::Named(name) => Some((name, true)),
            DelayQueue::Default | DelayQueue::None => None,
        };
        declare_delay_queue(
            &broker,
            &channel,
            &queue,
            known.as_deref(),
            delay_queue
                .as_ref()
                .map(|(name, named)| (name.as_str(), *named)),
        )
        .await?;
        let delay_queue = delay_queue.map(|(name, _)| name);
        let routes = Arc::new(routes(&broker, &queue, known.as_deref(), delay_queue)?);

        let window = prefetch
            .or(broker.inner.prefetch)
            .unwrap_or_else(|| default_prefetch(&settings));
        if window == 0 {
            return Err(crate::broker::zero_prefetch());
        }
        if usize::from(window) < settings.max_in_flight {
            // Workers and lanes then take turns, and batches never fill.
            tracing::warn!(
                queue = %queue,
                prefetch = window,
                mount_holds = settings.max_in_flight,
                "the prefetch window is smaller than what the mount can hold, so it waits for the broker; raise the prefetch"
            );
        }
        channel
            .basic_qos(window, BasicQosOptions::default())
            .await
            .map_err(|source| LapinError::Channel {
                purpose: "consuming".to_string(),
                source,
            })?;

        let tag = consumer_tag.unwrap_or_else(|| {
            format!(
                "conveyor.{}.{}",
                std::process::id(),
                CONSUMERS.fetch_add(1, Ordering::Relaxed)
            )
        });
        let consumer_tag = short("consumer tag", &tag)?;
        let consumer = channel
            .basic_consume(
                short("queue name", &queue)?,
                consumer_tag.clone(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|source| LapinError::Consume {
                queue: queue.to_string(),
                source,
            })?;
        tracing::info!(queue = %queue, prefetch = window, consumer = %tag, "subscribed");

        let (settler, settle_task) = Settler::start(queue.clone(), routes.clone());
        Ok(LapinSubscriber {
            queue,
            channel,
            consumer,
            consumer_tag,
            settler,
            settle_task,
            routes,
            connection: broker.inner.connection.status().clone(),
            stashed: None,
            places: Places::default(),
            receiving: true,
            cancelled: false,
            owed_cancel: None,
            consumer_timeout: known.as_deref().and_then(Declaration::consumer_timeout),
        })
    }

    /// The core delivery for a lapin delivery, tracked until it is settled.
    fn convert(&mut self, delivery: lapin::message::Delivery) -> Delivery {
        let lapin::message::Delivery {
            delivery_tag,
            redelivered,
            properties,
            data,
            acker,
            ..
        } = delivery;
        let empty = FieldTable::default();
        let table = properties.headers().as_ref().unwrap_or(&empty);
        let headers = headers::received(&properties);
        let key = headers::partition_key(table);
        let earlier_attempts = headers::int_value(table, ATTEMPTS_HEADER);
        // A quorum queue's count of earlier deliveries; a first delivery has none, so a
        // header another producer set (or copied from elsewhere) is not taken for one.
        let delivery_count = redelivered
            .then(|| headers::int_value(table, DELIVERY_COUNT_HEADER))
            .flatten();
        let count = match (earlier_attempts, delivery_count) {
            (None, None) => None,
            (earlier, here) => {
                let here = here.unwrap_or(u64::from(redelivered));
                let total = earlier.unwrap_or(0).saturating_add(here).saturating_add(1);
                Some(u32::try_from(total).unwrap_or(u32::MAX))
            }
        };

        let payload = Bytes::from(data);
        let place = self.places.next(delivery_tag);
        let tag = self.settler.track(Pending {
            acker,
            place,
            properties,
        });
        let settler: Arc<dyn Settle> = self.settler.clone();
        let mut out = Delivery::new(payload, self.queue.clone(), settler, tag)
            .with_headers(headers)
            .with_partition_key(key)
            .with_redelivered(redelivered);
        if let Some(count) = count {
            out = out.with_receive_count(count);
        }
        out
    }

    /// Cancels the consumer (`basic.cancel`) unless the broker has confirmed that already.
    /// When the channel is down the cancel fails (lapin sends nothing on a channel it is
    /// recovering): what the channel held goes back to the queue with it, and the next
    /// call (closing the subscription) tries again.
    async fn cancel_consumer(&mut self) {
        if self.cancelled {
            return;
        }
        match self
            .channel
            .basic_cancel(self.consumer_tag.clone(), BasicCancelOptions::default())
            .await
        {
            Ok(()) => self.cancelled = true,
            Err(error) => {
                tracing::debug!(queue = %self.queue, error = %conveyor::Report(&error), "cancelling the consumer failed");
            }
        }
    }

    /// Waits for the client to recover the channel after `error`, or gives up with it.
    async fn recover(&mut self, error: lapin::Error) -> Result<(), conveyor::Error> {
        tracing::warn!(queue = %self.queue, error = %conveyor::Report(&error), "subscription channel lost; waiting for recovery");
        match self.channel.wait_for_recovery(error).await {
            Ok(()) => {
                tracing::info!(queue = %self.queue, "subscription recovered");
                Ok(())
            }
            Err(source) => Err(LapinError::Receive {
                queue: self.queue.to_string(),
                source,
            }
            .into()),
        }
    }
}

/// Owes the cancel of a consumer that [`Subscriber::stop_receiving`] could not cancel,
/// its channel being down, until the subscription closes.
///
/// lapin restores every consumer of a channel it recovers, this one too, and the broker
/// then fills its prefetch window for a subscription that no longer reads. Each delivery
/// it gets goes back to the queue at once (`basic.nack` with requeue), after a cancel:
/// the first delivery of the restored consumer proves that the broker has it again, so
/// a cancel sent then reaches it (one sent as soon as the channel is open could come
/// before lapin's own `basic.consume`, cancel nothing and leave the consumer restored
/// after it), and the broker pushes nothing after its `cancel-ok`. A cancel that fails
/// (the connection lost again) is sent again at the next delivery. The consumer's stream
/// ends once lapin has dropped the consumer, on the broker's `cancel-ok`.
///
/// Deliveries from before the loss are still in the stream, or dropped by lapin as it
/// restores the consumer; their ackers are dead, so they cause no cancel and their nack
/// does nothing: the broker took them back with the connection.
///
/// Until its first delivery, a restored consumer of an empty queue stays subscribed:
/// it holds nothing, and the first message pushed to it is handed back within a round
/// trip. A subscription closed while the channel is still down leaves this to go on
/// (`closed`), and then closes the channel once the consumer is cancelled; closed with
/// the channel back, it stops this and cancels the consumer itself.
async fn cancel_when_restored(
    channel: Channel,
    mut consumer: Consumer,
    consumer_tag: ShortString,
    queue: Arc<str>,
    closed: Arc<AtomicBool>,
) {
    let mut cancelled = false;
    let mut released = 0usize;
    while let Some(next) = consumer.next().await {
        // An error is the channel's, which lapin recovers (the stream goes on) or not
        // (the stream ends, and the channel's deliveries are back in the queue).
        let Ok(delivery) = next else { continue };
        if !cancelled && delivery.acker.usable() {
            match channel
                .basic_cancel(consumer_tag.clone(), BasicCancelOptions::default())
                .await
            {
                Ok(()) => {
                    cancelled = true;
                    tracing::info!(queue = %queue, "cancelled the consumer lapin restored after the subscription stopped receiving");
                }
                Err(error) => {
                    tracing::debug!(queue = %queue, error = %conveyor::Report(&error), "cancelling the restored consumer failed");
                }
            }
        }
        match settle::nack(&delivery.acker, true).await {
            Ok(true) => released += 1,
            Ok(false) => {}
            Err(error) => {
                tracing::debug!(queue = %queue, error = %conveyor::Report(&error), "releasing a delivery of the restored consumer failed");
            }
        }
    }
    tracing::debug!(queue = %queue, released, "the restored consumer is cancelled");
    if closed.load(Ordering::SeqCst)
        && let Err(error) = channel.close(200, "subscription closed".into()).await
    {
        tracing::debug!(queue = %queue, error = %conveyor::Report(&error), "closing the subscription channel failed");
    }
}

/// Closes a subscription's channel once lapin has restored it with its consumer: closed
/// while its connection was down, it comes back. The first delivery to the restored
/// consumer says its recovery is complete (lapin's own notice comes as soon as the
/// channel reopens, before the consumer is); closing the channel then hands that
/// delivery and the rest of the window back at once, without the cancel that would
/// activate a single-active-consumer queue's next consumer first. A consumer that never
/// gets a delivery holds nothing.
async fn close_when_restored(channel: Channel, mut consumer: Consumer, queue: Arc<str>) {
    loop {
        match consumer.next().await {
            // One of the restored consumer's, not one read before the connection went
            // (whose acker went with it).
            Some(Ok(delivery)) if delivery.acker.usable() => break,
            // Those, and the channel's errors, which lapin recovers (the stream goes on)
            // or not (it ends).
            Some(_) => {}
            None => return,
        }
    }
    match channel.close(200, "subscription closed".into()).await {
        Ok(()) => tracing::info!(
            queue = %queue,
            "closed the channel lapin restored after the subscription closed"
        ),
        Err(error) => {
            tracing::debug!(queue = %queue, error = %conveyor::Report(&error), "closing the restored subscription channel failed");
        }
    }
}

/// A cancel [`cancel_when_restored`] owes, and whether the subscription has closed since.
struct OwedCancel {
    task: tokio::task::JoinHandle<()>,
    closed: Arc<AtomicBool>,
}

/// A consuming connection's status, as a probe: lost while it is not connected (lapin
/// recovering it).
struct Consuming(lapin::ConnectionStatus);

impl ConnectionProbe for Consuming {
    fn is_lost(&self) -> bool {
        !self.0.connected()
    }
}

impl Subscriber for LapinSubscriber {
    /// The queue's consumer timeout (its spec's `visibility_timeout`), past which
    /// RabbitMQ 3.12+ closes the channel, so that retries in place stay well within it.
    /// A queue declared elsewhere gets the core's own cap, below RabbitMQ's default of
    /// 30 minutes.
    fn max_hold(&self) -> Option<Duration> {
        self.consumer_timeout
    }

    /// The consuming connection's status: the mount shows as reconnecting while lapin
    /// recovers the connection.
    fn connection(&self) -> Option<Arc<dyn ConnectionProbe>> {
        Some(Arc::new(Consuming(self.connection.clone())))
    }

    async fn recv(&mut self) -> Option<Result<Delivery, conveyor::Error>> {
        if !self.receiving {
            return None;
        }
        loop {
            if let Some(error) = self.stashed.take()
                && let Err(e) = self.recover(error).await
            {
                return Some(Err(e));
            }
            match self.consumer.next().await {
                Some(Ok(delivery)) => return Some(Ok(self.convert(delivery))),
                Some(Err(error)) => self.stashed = Some(error),
                None => {
                    tracing::warn!(queue = %self.queue, "the broker cancelled the consumer (queue deleted?)");
                    return None;
                }
            }
        }
    }

    async fn recv_batch(
        &mut self,
        max: usize,
        batch: &mut Vec<Delivery>,
    ) -> Option<Result<(), conveyor::Error>> {
        match self.recv().await? {
            Ok(first) => batch.push(first),
            Err(e) => return Some(Err(e)),
        }
        while batch.len() < max {
            match self.consumer.next().now_or_never() {
                Some(Some(Ok(delivery))) => batch.push(self.convert(delivery)),
                Some(Some(Err(error))) => {
                    self.stashed = Some(error);
                    break;
                }
                Some(None) | None => break,
            }
        }
        Some(Ok(()))
    }

    /// Cancels the consumer (`basic.cancel`), then releases (`basic.nack` with requeue)
    /// every delivery the broker had already pushed into the consumer's buffer, so the
    /// prefetch window goes back to the queue at once. Deliveries already returned by
    /// `recv` stay valid, and are settled on the same channel later.
    ///
    /// When the channel is down the cancel cannot be sent, and what the channel held is
    /// back in the queue already; lapin will restore the consumer with the channel, so a
    /// task cancels it then and releases what it is pushed.
    async fn stop_receiving(&mut self) {
        if !self.receiving {
            return;
        }
        self.receiving = false;
        self.cancel_consumer().await;
        if !self.cancelled {
            let closed = Arc::new(AtomicBool::new(false));
            let task = tokio::spawn(cancel_when_restored(
                self.channel.clone(),
                self.consumer.clone(),
                self.consumer_tag.clone(),
                self.queue.clone(),
                closed.clone(),
            ));
            self.owed_cancel = Some(OwedCancel { task, closed });
            tracing::info!(queue = %self.queue, "stopped receiving; the consumer is cancelled once its channel is back");
            return;
        }
        // The broker sends nothing after its cancel-ok, and lapin queues what came before
        // it, then the end of the stream: all that is left to release is here now.
        let mut released = 0usize;
        while let Some(Some(next)) = self.consumer.next().now_or_never() {
            let Ok(delivery) = next else { continue };
            match settle::nack(&delivery.acker, true).await {
                Ok(true) => released += 1,
                Ok(false) => {}
                Err(error) => {
                    tracing::debug!(queue = %self.queue, error = %conveyor::Report(&error), "releasing a buffered delivery failed");
                }
            }
        }
        tracing::info!(queue = %self.queue, released, "stopped receiving");
    }

    async fn close(mut self) {
        if let Some(owed) = self.owed_cancel.take() {
            if self.channel.status().connected() {
                // Closing the channel below returns whatever the restored consumer holds.
                owed.task.abort();
                let _ = owed.task.await;
            } else {
                // Nothing can be sent on the channel yet, and lapin restores its consumer
                // after this: the task cancels it then, and closes the channel.
                owed.closed.store(true, Ordering::SeqCst);
            }
        }
        // A subscription closed without `stop_receiving` (a shard handed to another
        // replica) is not cancelled first: closing the channel puts back what it holds
        // and ends the consumer in one step, whereas after a cancel the broker would
        // activate a single-active-consumer queue's next consumer while this channel
        // still held read-ahead, which that consumer would then get after later
        // messages. After `stop_receiving`, this retries a cancel that failed.
        if !self.receiving {
            self.cancel_consumer().await;
        }
        let LapinSubscriber {
            queue,
            channel,
            settler,
            mut settle_task,
            routes,
            consumer,
            ..
        } = self;
        // An original held after its retry copy was refused goes back now, with the
        // channel, instead of holding up the close.
        routes.closing();
        // A settle task that died cannot answer the flush.
        tokio::select! {
            () = settler.flush() => {}
            _ = &mut settle_task => {}
        }
        // Closing the channel returns every delivery it holds unacked to the queue at once,
        // and ends the consumer with it. The consumer is dropped only then: dropped while
        // still active, lapin would cancel it by itself (`basic.cancel`), racing the close.
        match channel.close(200, "subscription closed".into()).await {
            Ok(()) => drop(consumer),
            // Down with its connection: lapin brings the channel back, consumer and all,
            // which would then hold a window (and a single-active-consumer queue) for no
            // one. It is closed once back.
            Err(_) if channel.status().reconnecting() => {
                tokio::spawn(close_when_restored(channel, consumer, queue.clone()));
            }
            Err(error) => {
                tracing::debug!(queue = %queue, error = %conveyor::Report(&error), "closing the subscription channel failed");
                drop(consumer);
            }
        }
        routes.close().await;
        drop(settler);
        settle_task.abort();
        tracing::info!(queue = %queue, "unsubscribed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(max_in_flight: usize, batch: Option<usize>) -> SubscribeSettings {
        let mut settings = SubscribeSettings::new(max_in_flight);
        settings.batch_size = batch;
        settings
    }

    #[test]
    fn a_subscription_declares_a_queue_only_where_it_is_missing_or_vanishes() {
        use conveyor::QueueSpec;

        use crate::RabbitQueueSpec;

        let known = Declaration::from_spec(&QueueSpec::new("q").quorum()).unwrap();
        let exclusive =
            Declaration::from_spec(&QueueSpec::new("q").durable(false).exclusive()).unwrap();
        // (exists, passive, known) -> what is declared on the consuming channel.
        let cases = [
            (true, false, None, None),
            (true, false, Some(&known), None),
            (true, false, Some(&exclusive), Some(&exclusive)),
            (true, true, Some(&exclusive), None),
            (false, false, Some(&known), Some(&known)),
            (true, true, None, None),
        ];
        for (exists, passive, declared, expected) in cases {
            assert_eq!(
                to_declare("q", exists, passive, declared).unwrap().as_ref(),
                expected,
                "exists {exists}, passive {passive}, known {declared:?}"
            );
        }
        assert_eq!(
            to_declare("q", false, false, None).unwrap(),
            Some(Declaration::plain("q"))
        );
        assert!(matches!(
            to_declare("q", false, true, Some(&known)),
            Err(LapinError::MissingQueue { .. })
        ));
    }

    #[test]
    fn the_default_window_covers_what_the_mount_holds() {
        assert_eq!(default_prefetch(&settings(1, None)), 16);
        assert_eq!(default_prefetch(&settings(9, None)), 18);
        assert_eq!(default_prefetch(&settings(10, Some(100))), 200);
        assert_eq!(default_prefetch(&settings(usize::MAX, None)), u16::MAX);
    }
}
