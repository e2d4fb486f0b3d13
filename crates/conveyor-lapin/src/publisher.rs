//! Publishing: to a queue through the default exchange (the core [`Publisher`] trait), or
//! to any exchange with a routing key, with publisher confirms.

use std::time::{Duration, Instant};

use conveyor::{Bytes, Message, Publisher};
use lapin::options::BasicPublishOptions;
use lapin::types::ShortString;
use lapin::{BasicProperties, Channel, Confirmation, PublisherConfirm};
use tracing::Instrument;

use crate::broker::{Block, LapinBroker};
use crate::error::{LapinError, short};
use crate::headers::{oversize_header_frame, to_table};

/// AMQP delivery mode 2: the broker writes the message to disk (on a durable queue).
pub(crate) const PERSISTENT: u8 = 2;
/// AMQP delivery mode 1: kept in memory only.
const TRANSIENT: u8 = 1;

/// Per-publish AMQP settings beyond what a portable [`Message`] carries.
///
/// The default is persistent and mandatory: a message no queue takes comes back as
/// [`LapinError::Returned`] instead of vanishing.
///
/// ```
/// use std::time::Duration;
/// use conveyor_lapin::PublishOptions;
///
/// let urgent = PublishOptions::default().priority(9).expiration(Duration::from_secs(60));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PublishOptions {
    persistent: bool,
    mandatory: bool,
    priority: Option<u8>,
    expiration: Option<Duration>,
}

impl Default for PublishOptions {
    fn default() -> Self {
        PublishOptions {
            persistent: true,
            mandatory: true,
            priority: None,
            expiration: None,
        }
    }
}

impl PublishOptions {
    /// Whether the broker writes the message to disk (default `true`).
    pub fn persistent(mut self, persistent: bool) -> Self {
        self.persistent = persistent;
        self
    }

    /// Whether an unroutable message is an error (default `true`). Without it, a message
    /// that matches no queue is dropped by the broker, and the publish still succeeds.
    pub fn mandatory(mut self, mandatory: bool) -> Self {
        self.mandatory = mandatory;
        self
    }

    /// The message priority (the queue needs `x-max-priority`).
    pub fn priority(mut self, priority: u8) -> Self {
        self.priority = Some(priority);
        self
    }

    /// How long the message may wait in a queue before it expires (per-message TTL): at
    /// most 2^32 - 1 ms (about 49.7 days), RabbitMQ's limit; a longer one fails the
    /// publish with [`LapinError::Invalid`].
    pub fn expiration(mut self, ttl: Duration) -> Self {
        self.expiration = Some(ttl);
        self
    }
}

/// Publishes messages on its own channel, in confirm mode: a publish returns once the
/// broker has taken the message, and fails if the broker nacks it, returns it
/// unroutable, or does not confirm within the broker's confirm timeout. After a
/// connection loss it waits for the client to recover, then tries once more; a
/// connection that does not recover within the confirm timeout fails the publish with
/// [`LapinError::Unavailable`], and one RabbitMQ keeps blocked for a resource alarm that
/// long with [`LapinError::Blocked`]: neither sends the message.
///
/// ```no_run
/// use conveyor::{Bytes, Message, Publisher};
/// use conveyor_lapin::{LapinBroker, PublishOptions};
///
/// # async fn f() -> Result<(), conveyor::Error> {
/// let broker = LapinBroker::connect("amqp://guest:guest@127.0.0.1:5672").await?;
/// let publisher = broker.publisher().await?;
/// // To a queue, through the default exchange:
/// publisher.publish("orders", Message::builder().partition_key("alice").json(&42)?).await?;
/// // To an exchange with a routing key; `into_publish` names it in the core's error
/// // (`Error::Refused` for a message refused before it was sent, as `Publisher` gives):
/// publisher
///     .publish_to("events", "orders.created", Message::new("hi"), PublishOptions::default())
///     .await
///     .map_err(|error| error.into_publish("events"))?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LapinPublisher {
    pub(crate) channel: Channel,
    /// The connection's negotiated settings, for its frame limit (frame_max).
    connection: lapin::Configuration,
    /// The connection's block by a resource alarm, which a publish waits out.
    block: Block,
    confirm_timeout: Duration,
    defaults: PublishOptions,
}

impl std::fmt::Debug for LapinPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LapinPublisher")
            .field("channel", &self.channel.id())
            .field("defaults", &self.defaults)
            .finish()
    }
}

/// The longest per-message TTL RabbitMQ accepts, in milliseconds (2^32 - 1); a longer
/// `expiration` would close the channel.
pub(crate) const MAX_EXPIRATION_MS: u128 = u32::MAX as u128;

/// Whether `channel` can still publish: open, or waiting for the connection to recover
/// (a publish then waits for the recovery). A channel the broker closed (a publish to a
/// missing exchange, say) stays closed: lapin reopens channels only with their
/// connection.
pub(crate) fn can_publish(channel: &Channel) -> bool {
    let status = channel.status();
    status.connected() || status.reconnecting() || status.initializing()
}

impl LapinPublisher {
    pub(crate) async fn open(broker: LapinBroker) -> Result<Self, LapinError> {
        Self::open_for(broker, "publisher").await
    }

    /// A publisher on a channel opened for `purpose` (named in errors).
    pub(crate) async fn open_for(broker: LapinBroker, purpose: &str) -> Result<Self, LapinError> {
        let channel = broker.open_publishing_channel(purpose).await?;
        Ok(LapinPublisher {
            channel,
            connection: broker.publishing_settings(),
            block: broker.publishing_block(),
            confirm_timeout: broker.inner.confirm_timeout,
            defaults: PublishOptions::default(),
        })
    }

    /// Whether its channel can still publish ([`can_publish`]).
    pub(crate) fn is_open(&self) -> bool {
        can_publish(&self.channel)
    }

    /// The options [`Publisher::publish`] uses (default: persistent, mandatory).
    pub fn with_defaults(mut self, defaults: PublishOptions) -> Self {
        self.defaults = defaults;
        self
    }

    /// Publishes `message` to `exchange` under `routing_key`, and waits for the confirm.
    /// [`LapinError::into_publish`] makes the error the core's publish error
    /// ([`conveyor::Error::Refused`] or [`conveyor::Error::Publish`]); `?` into a
    /// [`conveyor::Error`] gives [`conveyor::Error::Config`] for bad input and
    /// [`conveyor::Error::Transport`] for anything else.
    ///
    /// # Errors
    ///
    /// A [`LapinError`]: a message AMQP cannot carry (refused before it is sent), no
    /// confirm within the confirm timeout, or the broker's nack or return.
    pub async fn publish_to(
        &self,
        exchange: &str,
        routing_key: &str,
        message: Message,
        options: PublishOptions,
    ) -> Result<(), LapinError> {
        let span = publish_span(exchange, routing_key);
        let mut message = message;
        conveyor::trace::inject_context(&span, message.headers_mut());
        self.send_one(exchange, routing_key, span, || {
            self.prepare(exchange, routing_key, message, options)
        })
        .await
    }

    /// Sends the message `prepare` makes (a refusal counts as a failed publish), in
    /// `span`, waits for its confirm, and counts it in the publish metrics.
    async fn send_one(
        &self,
        exchange: &str,
        routing_key: &str,
        span: tracing::Span,
        prepare: impl FnOnce() -> Result<Prepared, LapinError>,
    ) -> Result<(), LapinError> {
        let started = Instant::now();
        let sent = async {
            let prepared = prepare()?;
            let confirm = self.send(&prepared).await?;
            self.confirmed(prepared.destination, confirm).await
        }
        .instrument(span)
        .await;
        record(exchange, routing_key, 1, started, &sent);
        sent
    }

    /// Publishes every message to `exchange` under `routing_key`, in order, then waits
    /// for all their confirms. Returns the first error; a message AMQP cannot carry (a
    /// name too long, headers over the frame limit, ...) fails the batch before any is
    /// sent.
    ///
    /// # Errors
    ///
    /// As [`publish_to`](Self::publish_to), for the first message that fails.
    pub async fn publish_all_to(
        &self,
        exchange: &str,
        routing_key: &str,
        messages: Vec<Message>,
        options: PublishOptions,
    ) -> Result<(), LapinError> {
        let span = publish_span(exchange, routing_key);
        let started = Instant::now();
        let count = messages.len() as u64;
        let prepared = messages
            .into_iter()
            .map(|mut message| {
                conveyor::trace::inject_context(&span, message.headers_mut());
                self.prepare(exchange, routing_key, message, options)
            })
            .collect::<Result<Vec<_>, _>>();
        let sent = match prepared {
            Ok(prepared) => self.send_all(prepared).instrument(span).await,
            Err(error) => Err(error),
        };
        record(exchange, routing_key, count, started, &sent);
        sent
    }

    /// Publishes `payload` with `properties` as they are, mandatory, and waits for the
    /// confirm: [`LapinBroker::publish_amqp`](crate::LapinBroker::publish_amqp).
    pub(crate) async fn publish_amqp(
        &self,
        exchange: &str,
        routing_key: &str,
        payload: Bytes,
        properties: BasicProperties,
    ) -> Result<(), LapinError> {
        let span = publish_span(exchange, routing_key);
        self.send_one(exchange, routing_key, span, || {
            let options = BasicPublishOptions {
                mandatory: true,
                immediate: false,
            };
            self.checked(Prepared::new(
                exchange,
                routing_key,
                options,
                payload,
                properties,
            )?)
        })
        .await
    }

    /// Sends every message, then waits for all their confirms.
    async fn send_all(&self, prepared: Vec<Prepared>) -> Result<(), LapinError> {
        let mut sent = Vec::with_capacity(prepared.len());
        for prepared in prepared {
            let confirm = self.send(&prepared).await?;
            sent.push((prepared.destination, confirm));
        }
        let mut first_error = None;
        for (destination, confirm) in sent {
            if let Err(error) = self.confirmed(destination, confirm).await {
                first_error.get_or_insert(error);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// `message` mapped onto AMQP, if the connection can take it ([`Self::checked`]).
    fn prepare(
        &self,
        exchange: &str,
        routing_key: &str,
        message: Message,
        options: PublishOptions,
    ) -> Result<Prepared, LapinError> {
        self.checked(prepare(exchange, routing_key, message, options)?)
    }

    /// `prepared`, if the connection can take it: a message whose header frame is over
    /// the connection's frame limit is refused here, before the broker closes the
    /// connection over it (and every other channel on it with it).
    fn checked(&self, prepared: Prepared) -> Result<Prepared, LapinError> {
        let limit = self.connection.frame_max();
        match oversize_header_frame(&prepared.properties, limit) {
            Some(size) => Err(LapinError::HeadersTooLarge {
                destination: prepared.destination,
                size,
                limit,
            }),
            None => Ok(prepared),
        }
    }

    /// Sends one message; after a connection loss, waits for recovery (at most the
    /// confirm timeout, so that a publish never hangs on a broker that stays away) and
    /// tries once more.
    ///
    /// A connection RabbitMQ blocks (a resource alarm) writes nothing: a message sent
    /// into it would wait in the client until the alarm ends, however long. So a publish
    /// waits for the block to end first, at most the confirm timeout, and is not sent if
    /// it does not ([`LapinError::Blocked`]). One whose frames are still not written a
    /// confirm timeout on (the block began meanwhile) is a [`LapinError::ConfirmTimeout`]:
    /// they go out when the alarm ends.
    async fn send(&self, prepared: &Prepared) -> Result<PublisherConfirm, LapinError> {
        let failed = |source| LapinError::Publish {
            destination: prepared.destination.clone(),
            source,
        };
        match self.write(prepared).await? {
            Ok(confirm) => Ok(confirm),
            Err(error) => {
                let recovery = self.channel.wait_for_recovery(error);
                match tokio::time::timeout(self.confirm_timeout, recovery).await {
                    Ok(recovered) => recovered.map_err(failed)?,
                    Err(_) => {
                        return Err(LapinError::Unavailable {
                            destination: prepared.destination.clone(),
                            after: self.confirm_timeout,
                        });
                    }
                }
                self.write(prepared).await?.map_err(failed)
            }
        }
    }

    /// Writes one message to the channel, once the connection is not blocked: the
    /// client's error, or its confirm to wait for. See [`Self::send`] for the errors.
    async fn write(
        &self,
        prepared: &Prepared,
    ) -> Result<Result<PublisherConfirm, lapin::Error>, LapinError> {
        let after = self.confirm_timeout;
        if tokio::time::timeout(after, self.block.over())
            .await
            .is_err()
        {
            let destination = prepared.destination.clone();
            return Err(LapinError::Blocked { destination, after });
        }
        let publish = self.channel.basic_publish(
            prepared.exchange.clone(),
            prepared.routing_key.clone(),
            prepared.options,
            &prepared.payload,
            prepared.properties.clone(),
        );
        tokio::time::timeout(after, publish)
            .await
            .map_err(|_| LapinError::ConfirmTimeout {
                destination: prepared.destination.clone(),
                after,
            })
    }

    /// Waits for the broker's confirm of one message.
    async fn confirmed(
        &self,
        destination: String,
        confirm: PublisherConfirm,
    ) -> Result<(), LapinError> {
        let confirmation = match tokio::time::timeout(self.confirm_timeout, confirm).await {
            Err(_) => {
                return Err(LapinError::ConfirmTimeout {
                    destination,
                    after: self.confirm_timeout,
                });
            }
            Ok(Err(source)) => {
                return Err(LapinError::Publish {
                    destination,
                    source,
                });
            }
            Ok(Ok(confirmation)) => confirmation,
        };
        match confirmation {
            Confirmation::Ack(None) | Confirmation::NotRequested => Ok(()),
            Confirmation::Ack(Some(returned)) | Confirmation::Nack(Some(returned)) => {
                Err(LapinError::Returned {
                    destination,
                    code: returned.reply_code,
                    text: returned.reply_text.to_string(),
                })
            }
            Confirmation::Nack(None) => Err(LapinError::Nacked { destination }),
        }
    }
}

/// A message mapped onto AMQP, ready to send.
struct Prepared {
    destination: String,
    exchange: ShortString,
    routing_key: ShortString,
    options: BasicPublishOptions,
    payload: Bytes,
    properties: BasicProperties,
}

fn prepare(
    exchange: &str,
    routing_key: &str,
    message: Message,
    options: PublishOptions,
) -> Result<Prepared, LapinError> {
    let parts = message.into_parts();
    if parts.delay.is_some() {
        return Err(LapinError::Invalid {
            what: "message",
            reason: "it asks for a delivery delay, which plain RabbitMQ cannot do".to_string(),
        });
    }
    let mut properties = BasicProperties::default().with_delivery_mode(if options.persistent {
        PERSISTENT
    } else {
        TRANSIENT
    });
    // No table at all when there is nothing in it: an empty one still costs the broker
    // its parsing, on every message.
    let table = to_table(&parts.headers, parts.partition_key.as_ref())?;
    if !table.inner().is_empty() {
        properties = properties.with_headers(table);
    }
    if let Some(v) = parts.content_type {
        properties = properties.with_content_type(short("content type", &v)?);
    }
    if let Some(v) = parts.message_id {
        properties = properties.with_message_id(short("message id", &v)?);
    }
    if let Some(v) = parts.correlation_id {
        properties = properties.with_correlation_id(short("correlation id", &v)?);
    }
    if let Some(v) = parts.reply_to {
        properties = properties.with_reply_to(short("reply-to", &v)?);
    }
    if let Some(v) = options.priority {
        properties = properties.with_priority(v);
    }
    if let Some(ttl) = options.expiration {
        // One over RabbitMQ's longest is refused by `Prepared::new`.
        properties = properties.with_expiration(ttl.as_millis().to_string().into());
    }
    Prepared::new(
        exchange,
        routing_key,
        BasicPublishOptions {
            mandatory: options.mandatory,
            immediate: false,
        },
        parts.payload,
        properties,
    )
}

impl Prepared {
    /// `payload` with `properties` to `exchange` under `routing_key`, if AMQP can carry
    /// the names, and the broker takes the properties' expiration: it would close the
    /// channel over one that is not a number of milliseconds up to [`MAX_EXPIRATION_MS`]
    /// (about 49.7 days), failing every publish under way on it.
    fn new(
        exchange: &str,
        routing_key: &str,
        options: BasicPublishOptions,
        payload: Bytes,
        properties: BasicProperties,
    ) -> Result<Prepared, LapinError> {
        if let Some(expiration) = properties.expiration() {
            let millis = expiration.as_str().parse::<u64>().ok();
            if millis.is_none_or(|millis| u128::from(millis) > MAX_EXPIRATION_MS) {
                return Err(LapinError::Invalid {
                    what: "expiration",
                    reason: format!(
                        "`{}` is not a number of milliseconds up to {MAX_EXPIRATION_MS}, the longest per-message TTL RabbitMQ takes",
                        conveyor::kit::bounded(expiration.as_str(), 40)
                    ),
                });
            }
        }
        Ok(Prepared {
            exchange: short("exchange name", exchange)?,
            routing_key: short("routing key", routing_key)?,
            destination: if exchange.is_empty() {
                routing_key.to_string()
            } else {
                format!("{exchange}/{routing_key}")
            },
            options,
            payload,
            properties,
        })
    }
}

impl LapinPublisher {
    /// The options for a publish to `destination`: the defaults, but a reply to a
    /// request (a direct reply-to address) is transient and not mandatory.
    fn options_for(&self, destination: &str) -> PublishOptions {
        if crate::request::is_reply_address(destination) {
            self.defaults.mandatory(false).persistent(false)
        } else {
            self.defaults
        }
    }
}

impl Publisher for LapinPublisher {
    /// Publishes to the queue `destination` through the default exchange. A reply to a
    /// request (to a direct reply-to address) is transient and not mandatory: a
    /// requester that has gone takes nothing, and its reply is dropped instead of
    /// failing the responder's run.
    async fn publish(&self, destination: &str, message: Message) -> Result<(), conveyor::Error> {
        self.publish_to("", destination, message, self.options_for(destination))
            .await
            .map_err(|e| e.into_publish(destination))
    }

    /// Sends every message to the queue `destination`, then waits for all the confirms.
    async fn publish_batch(
        &self,
        destination: &str,
        messages: Vec<Message>,
    ) -> Result<(), conveyor::Error> {
        self.publish_all_to("", destination, messages, self.options_for(destination))
            .await
            .map_err(|e| e.into_publish(destination))
    }
}

/// Counts a publish of `count` messages, and how long it took to be confirmed (or
/// refused), in the publish metrics.
fn record(
    exchange: &str,
    routing_key: &str,
    count: u64,
    started: Instant,
    sent: &Result<(), LapinError>,
) {
    let error = sent.as_ref().err().map(LapinError::kind);
    let destination = destination_name(exchange, routing_key);
    conveyor::telemetry::record_sent("rabbitmq", destination, count, error);
    // A message refused before it was sent made no broker call.
    if !matches!(
        sent,
        Err(LapinError::Invalid { .. } | LapinError::HeadersTooLarge { .. })
    ) {
        conveyor::telemetry::record_operation("rabbitmq", "publish", started.elapsed(), error);
    }
}

/// The span a publish to `exchange` under `routing_key` runs in ([`destination_name`]).
fn publish_span(exchange: &str, routing_key: &str) -> tracing::Span {
    conveyor::trace::publish_span("rabbitmq", destination_name(exchange, routing_key))
}

/// What a publish to `exchange` under `routing_key` is named by in spans, metrics and
/// errors: the exchange, or the queue for the default exchange.
pub(crate) fn destination_name<'a>(exchange: &'a str, routing_key: &'a str) -> &'a str {
    if exchange.is_empty() {
        routing_key
    } else {
        exchange
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_expiration_over_rabbitmqs_longest_is_refused_before_it_closes_the_channel() {
        let publish = |ttl| {
            let options = PublishOptions::default().expiration(ttl);
            prepare("", "q", Message::new("x"), options)
        };
        let longest = Duration::from_millis(u32::MAX.into());
        assert!(publish(longest).is_ok());
        let refused = publish(longest + Duration::from_millis(1)).err();
        assert!(
            matches!(
                refused,
                Some(LapinError::Invalid {
                    what: "expiration",
                    ..
                })
            ),
            "{refused:?}"
        );
    }

    #[test]
    fn a_message_without_headers_or_key_carries_no_header_table() {
        let bare = prepare("", "q", Message::new("x"), PublishOptions::default()).unwrap();
        assert!(bare.properties.headers().is_none());
        let keyed = prepare(
            "",
            "q",
            Message::builder().partition_key("k").payload("x"),
            PublishOptions::default(),
        )
        .unwrap();
        let table = keyed.properties.headers().as_ref().expect("a table");
        assert!(table.inner().contains_key(crate::PARTITION_KEY_HEADER));
    }
}
