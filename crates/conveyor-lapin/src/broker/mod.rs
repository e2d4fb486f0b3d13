//! The connection to RabbitMQ: opened from a URL, recovered by itself after loss.
//!
//! A broker holds two connections, as RabbitMQ advises: one serves every subscription (a
//! channel each) and the broker-level declarations (one topology channel); the other
//! carries every publish (the publishers' channels, and each subscription's channel for
//! the copies its settlements republish). RabbitMQ blocks a connection that publishes
//! during a resource alarm, and a blocked connection sends nothing, acks included: kept
//! apart, subscriptions go on acking while publishes wait. Recovery is the client's:
//! when a connection drops, lapin reconnects with exponential backoff and replays each
//! channel's declarations, QoS, confirm mode and consumers on the new connection, then
//! subscriptions resume. A reconnect's handshake that gets no answer is cut after the
//! reconnect handshake timeout (10 s by default) and tried again (see `dialer`).
//! Deliveries that were in flight on the dead channel cannot be acked any more (their
//! acks become no-ops), so the broker delivers them again.

mod admin;
mod builder;
mod channels;
mod delay;
mod events;

pub(crate) use builder::zero_prefetch;
pub use builder::{
    DEFAULT_CONFIRM_TIMEOUT, DEFAULT_FIRST_CONNECT_TIMEOUT, DEFAULT_RECONNECT_HANDSHAKE_TIMEOUT,
    LapinBrokerBuilder,
};
pub(crate) use channels::Block;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use conveyor::{Bytes, DeadLetter, Message, Publisher, QueueDepth, QueueSpec};
use lapin::AsyncTcpStream;
use lapin::options::{BasicAckOptions, BasicGetOptions, ConfirmSelectOptions};
use lapin::tcp::AMQPUriTcpExt;
use lapin::types::ShortString;
use lapin::uri::AMQPScheme;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use tokio::sync::Mutex;

use crate::dialer::{self, Dialer, Failure, LAPIN_RETRIES, Stage};
use crate::error::{LapinError, is_not_found, short};
use crate::headers;
use crate::nodes::Rotation;
use crate::publisher::LapinPublisher;
use crate::queue::LapinQueue;
use crate::redeclare::{Declared, Record};
use crate::request::Requester;
use crate::spec::{
    Declaration, QUORUM_DELAY_QUEUE_SUFFIX, check, default_delay_queue, delay_queue_of,
};
use crate::tls::{TlsSettings, is_tls_failure};
use crate::topology::{Binding, ExchangeSpec};
use crate::url::redact_url;

/// A connection to RabbitMQ: the [`conveyor::Broker`] of this transport. It opens
/// queues to mount handlers on, publishes with confirms, and declares and inspects
/// queues. Cloning gives another handle to the same connection.
///
/// Its inherent methods are the [`conveyor::Broker`] ones, with the same signatures (so
/// they mean the same with or without the trait in scope), plus RabbitMQ's own:
/// exchanges and bindings ([`declare_exchange`](Self::declare_exchange),
/// [`bind`](Self::bind), [`ConsistentHash`](crate::ConsistentHash)) and a
/// [`LapinPublisher`] for per-publish AMQP options.
///
/// ```no_run
/// use conveyor::{App, Message, Publisher, QueueSpec};
/// use conveyor_lapin::{LapinBroker, RabbitQueueSpec};
///
/// async fn handle(conveyor::Json(n): conveyor::Json<u64>) {}
///
/// # async fn f() -> Result<(), conveyor::Error> {
/// let broker = LapinBroker::connect("amqp://guest:guest@127.0.0.1:5672").await?;
/// broker.declare_queue(&QueueSpec::new("numbers.dead").quorum()).await?;
/// broker
///     .declare_queue(&QueueSpec::new("numbers").dead_letter_queue("numbers.dead", 5).quorum())
///     .await?;
/// broker.publish("numbers", Message::builder().partition_key("alice").json(&7u64)?).await?;
/// App::new("numbers")
///     .broker(broker.clone())
///     .mount(broker.queue("numbers"), handle, |m| m.workers(4).by_key())
///     .run()
///     .await
/// # }
/// ```
#[derive(Clone)]
pub struct LapinBroker {
    pub(crate) inner: Arc<BrokerInner>,
}

pub(crate) struct BrokerInner {
    /// Subscriptions consume and settle on this connection; declarations and checks are
    /// made on it too.
    pub(crate) connection: Connection,
    /// Every publish goes out on this one: the broker's and its publishers', and the
    /// copies settlements republish (retries, delays, dead letters).
    pub(crate) publishing: Connection,
    /// The dialers of the two connections, which [`LapinBroker::close`] stops.
    dialers: [Arc<Dialer>; 2],
    /// Notified when RabbitMQ unblocks a connection (or it reconnects, unblocked).
    unblocked: Arc<tokio::sync::Notify>,
    pub(crate) url: String,
    pub(crate) prefetch: Option<u16>,
    pub(crate) confirm_timeout: Duration,
    /// The channel broker-level declarations are made on (and replayed from).
    topology: Mutex<Option<Channel>>,
    /// The confirm-mode publisher behind [`Publisher`] on the broker, opened on the first
    /// publish (and again when its channel has closed).
    publisher: std::sync::Mutex<Option<Arc<LapinPublisher>>>,
    /// Held while a publisher is being opened, so that tasks publishing at once open one.
    opening_publisher: Mutex<()>,
    /// The channel requests go out and replies come back on, opened by the first
    /// request (and again when it has closed).
    requester: Mutex<Option<Arc<Requester>>>,
    /// The declarations this broker made, by queue name: a subscription to one of these
    /// queues knows its dead-letter target and whether to declare it again on recovery.
    declared: std::sync::Mutex<HashMap<String, Arc<Declaration>>>,
    /// What was declared on the topology channel, to declare again on the next one
    /// (see [`crate::redeclare`]).
    topology_record: std::sync::Mutex<Record>,
    /// The delay queues this broker's subscriptions declared, by the name of their queue:
    /// the ones [`LapinBroker::queue_depth`] can count without checking for a missing
    /// queue (which would close a channel, and have the client log an error).
    delay_queues: std::sync::Mutex<HashMap<String, String>>,
    /// The queues whose default delay queue `queue_depth` found missing, and when: not
    /// looked for again for [`MISSING_DELAY_QUEUE_RECHECK`], since each look at a missing
    /// queue closes a channel and has the server log an error.
    missing_delay_queues: std::sync::Mutex<HashMap<String, std::time::Instant>>,
}

/// How long `queue_depth` trusts that a queue has no delay queue.
const MISSING_DELAY_QUEUE_RECHECK: Duration = Duration::from_secs(60);

impl std::fmt::Debug for LapinBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LapinBroker")
            .field("url", &self.inner.url)
            .field("prefetch", &self.inner.prefetch)
            .finish_non_exhaustive()
    }
}

/// Closes a channel opened for one operation. It may be closed already: a failed
/// operation (a missing queue, say) closes it on the broker's side.
async fn close_quietly(channel: Channel) {
    let _ = channel.close(200, "done".into()).await;
}

impl LapinBroker {
    /// The broker URL, password redacted.
    pub fn url(&self) -> &str {
        &self.inner.url
    }

    /// The queue `name` to mount a handler on. Subscribing checks that it exists and
    /// declares it, durable with no arguments, only where it is missing, so a queue
    /// declared with its own settings keeps them (see [`LapinQueue`]).
    pub fn queue(&self, name: &str) -> LapinQueue {
        LapinQueue::new(self.clone(), name)
    }

    /// A publisher on its own confirm-mode channel, for what the portable
    /// [`Publisher`] cannot say: an exchange and routing key, priority, expiration,
    /// transient or non-mandatory messages ([`PublishOptions`](crate::PublishOptions)).
    /// For plain publishing to a queue, the broker itself is a [`Publisher`].
    ///
    /// # Errors
    ///
    /// A [`LapinError`] when no channel can be opened on the publishing connection (a
    /// blocked connection included).
    pub async fn publisher(&self) -> Result<LapinPublisher, LapinError> {
        self.publishing_connected().await;
        LapinPublisher::open(self.clone()).await
    }

    /// Closes the connections. Subscriptions still open end, and their unacked
    /// deliveries go back to their queues.
    ///
    /// # Errors
    ///
    /// [`conveyor::Error::Transport`] (with the [`LapinError`] as its source) when RabbitMQ fails the call.
    pub async fn close(&self) -> Result<(), conveyor::Error> {
        let reason = "closed by the application";
        let [consuming, publishing] = &self.inner.dialers;
        let (consuming, publishing) = tokio::join!(
            close(&self.inner.connection, consuming, reason),
            close(&self.inner.publishing, publishing, reason)
        );
        consuming
            .and(publishing)
            .map_err(|source| LapinError::Close { source }.into())
    }
}

/// Closes `connection`. One that is down, waiting to recover, cannot be closed the AMQP
/// way: its dialer stops instead, so it never comes back. Closing one that is closed
/// already succeeds.
async fn close(connection: &Connection, dialer: &Dialer, reason: &str) -> lapin::Result<()> {
    match connection.close(200, reason.into()).await {
        Err(_) if !connection.status().connected() => {
            dialer.give_up();
            Ok(())
        }
        closed => closed,
    }
}

/// Opens a channel on `connection` for `purpose` (named in errors).
async fn on(connection: &Connection, purpose: &str) -> Result<Channel, LapinError> {
    connection
        .create_channel()
        .await
        .map_err(|source| LapinError::Channel {
            purpose: purpose.to_string(),
            source,
        })
}

/// A publish of `count` messages that found no channel to go out on: counted as refused.
fn no_channel(error: LapinError, destination: &str, count: u64) -> conveyor::Error {
    conveyor::telemetry::record_sent("rabbitmq", destination, count, Some(error.kind()));
    error.into_publish(destination)
}

impl LapinBroker {
    /// Publishes `payload` with `properties` as they are, AMQP's own (typed header values,
    /// `type`, `app_id`, `timestamp`, ...), to `exchange` under `routing_key` (the empty
    /// exchange and a queue's name: to that queue), mandatory, and waits for the confirm.
    /// What the portable [`Message`] cannot carry; [`fresh_copy`](crate::fresh_copy) of
    /// [`amqp_properties`](crate::amqp_properties) publishes a received message again.
    ///
    /// Refused before it is sent, as [`LapinError::Invalid`] or
    /// [`LapinError::HeadersTooLarge`] in a [`conveyor::Error::Refused`], where the broker
    /// would close the channel (or the connection) over it: an `expiration` that is not a
    /// number of milliseconds up to 2^32 − 1, headers over the frame limit. A `user_id`
    /// other than the login's is refused by the broker, which closes the publishing channel
    /// (the next publish opens another). No trace context is added.
    ///
    /// ```no_run
    /// # async fn f(broker: conveyor_lapin::LapinBroker, delivery: conveyor::Delivery) -> Result<(), conveyor::Error> {
    /// use conveyor_lapin::{amqp_properties, fresh_copy};
    ///
    /// if let Some(received) = amqp_properties(&delivery) {
    ///     let copy = fresh_copy(&received).with_app_id("audit".into());
    ///     broker.publish_amqp("", "audit", delivery.payload().clone(), copy).await?;
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`LapinPublisher::publish_to`](crate::LapinPublisher::publish_to).
    pub async fn publish_amqp(
        &self,
        exchange: &str,
        routing_key: &str,
        payload: Bytes,
        properties: BasicProperties,
    ) -> Result<(), conveyor::Error> {
        let destination = crate::publisher::destination_name(exchange, routing_key);
        let publisher = self
            .confirm_publisher()
            .await
            .map_err(|e| no_channel(e, destination, 1))?;
        publisher
            .publish_amqp(exchange, routing_key, payload, properties)
            .await
            .map_err(|e| e.into_publish(destination))
    }
}

/// Publishes to the queue `destination` through the default exchange, persistent and
/// mandatory (a queue that does not exist is an error), with a confirm, on a channel the
/// broker opens on the first publish.
impl Publisher for LapinBroker {
    async fn publish(&self, destination: &str, message: Message) -> Result<(), conveyor::Error> {
        let publisher = self
            .confirm_publisher()
            .await
            .map_err(|e| no_channel(e, destination, 1))?;
        publisher.publish(destination, message).await
    }

    /// Sends every message, then waits for all their confirms.
    async fn publish_batch(
        &self,
        destination: &str,
        messages: Vec<Message>,
    ) -> Result<(), conveyor::Error> {
        let publisher = self
            .confirm_publisher()
            .await
            .map_err(|e| no_channel(e, destination, messages.len() as u64))?;
        publisher.publish_batch(destination, messages).await
    }
}

/// The inherent methods of the same names, which say what each does on RabbitMQ. An app
/// given this broker with `App::broker` closes its connection at the end of shutdown,
/// after every mount has settled its deliveries.
impl conveyor::Broker for LapinBroker {
    type Queue = LapinQueue;

    /// Through RabbitMQ's direct reply-to: requests go out, and replies come back, on one
    /// channel of the publishing connection, opened by the first request; no queue is
    /// declared. The request is persistent and mandatory (a missing queue fails it at
    /// once); the reply is transient and not mandatory.
    async fn request(
        &self,
        destination: &str,
        message: Message,
        timeout: std::time::Duration,
    ) -> Result<Message, conveyor::Error> {
        // The timeout covers opening the requester: a stalled broker holds no one past it.
        conveyor::request::within(destination, timeout, async {
            let requester = self
                .requester()
                .await
                .map_err(|e| no_channel(e, destination, 1))?;
            requester
                .reader
                .replies()
                .exchange(destination, timeout, |correlation_id| {
                    requester.send(destination, message, correlation_id)
                })
                .await
        })
        .await
    }

    /// The consuming connection and the publishing one.
    fn connections(&self) -> Vec<conveyor::ConnectionHealth> {
        [
            ("consuming", &self.inner.connection),
            ("publishing", &self.inner.publishing),
        ]
        .into_iter()
        .map(|(name, connection)| {
            let status = connection.status();
            let state = if status.connected() && status.blocked() {
                conveyor::ConnectionState::Blocked
            } else if status.connected() {
                conveyor::ConnectionState::Connected
            } else if status.closed() || status.errored() {
                conveyor::ConnectionState::Closed
            } else {
                conveyor::ConnectionState::Reconnecting
            };
            conveyor::ConnectionHealth::new(name, state)
        })
        .collect()
    }

    fn queue(&self, name: &str) -> LapinQueue {
        LapinBroker::queue(self, name)
    }

    async fn declare_queue(&self, spec: &QueueSpec) -> Result<(), conveyor::Error> {
        LapinBroker::declare_queue(self, spec).await
    }

    async fn delete_queue(&self, name: &str) -> Result<(), conveyor::Error> {
        LapinBroker::delete_queue(self, name).await
    }

    async fn queue_depth(&self, name: &str) -> Result<QueueDepth, conveyor::Error> {
        LapinBroker::queue_depth(self, name).await
    }

    async fn take_dead_letters(
        &self,
        dead_letter_queue: &str,
        max: usize,
    ) -> Result<Vec<DeadLetter>, conveyor::Error> {
        LapinBroker::take_dead_letters(self, dead_letter_queue, max).await
    }

    async fn close(&self) -> Result<(), conveyor::Error> {
        LapinBroker::close(self).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The live broker the crate's tests use (`scripts/services/rabbitmq.sh`).
    const URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

    async fn publish_channel(broker: &LapinBroker) -> Option<Channel> {
        let slot = conveyor::kit::lock(&broker.inner.publisher);
        slot.as_ref().map(|publisher| publisher.channel.clone())
    }

    #[tokio::test]
    async fn the_publish_channel_is_opened_on_the_first_publish_and_again_once_closed() {
        let broker = LapinBroker::connect(URL).await.unwrap();
        let queue = format!("conveyor-test.publish-channel.{}", std::process::id());
        broker
            .declare_queue(&QueueSpec::new(&*queue))
            .await
            .unwrap();
        assert!(
            publish_channel(&broker).await.is_none(),
            "connecting opens no publish channel"
        );

        broker.publish(&queue, Message::new("one")).await.unwrap();
        let first = publish_channel(&broker).await.unwrap();
        broker.publish(&queue, Message::new("two")).await.unwrap();
        let same = publish_channel(&broker).await.unwrap();
        assert_eq!(first.id(), same.id(), "one channel for every publish");

        first.close(200, "closed by the test".into()).await.unwrap();
        broker
            .publish_batch(&queue, vec![Message::new("three"), Message::new("four")])
            .await
            .unwrap();
        let reopened = publish_channel(&broker).await.unwrap();
        assert!(reopened.status().connected());
        assert_eq!(broker.queue_depth(&queue).await.unwrap().ready, 4);
        broker.delete_queue(&queue).await.unwrap();
        broker.close().await.unwrap();
    }
}
