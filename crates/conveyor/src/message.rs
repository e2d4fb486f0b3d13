//! Outgoing messages and the partition key.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde::Serialize;

use crate::error::Error;
use crate::headers::{HeaderName, Headers};

/// The key that orders a message among its peers: deliveries with one key are handled in
/// order by `workers(n).by_key()` lanes, and FIFO queues hold a key back while one of its
/// messages is in flight.
///
/// Each transport carries it its own way (an SQS FIFO `MessageGroupId`, RabbitMQ's
/// `amqp-partition-key` header, the in-process [`memory::PARTITION_KEY_HEADER`]); set it
/// portably with [`MessageBuilder::partition_key`].
///
/// [`memory::PARTITION_KEY_HEADER`]: crate::memory::PARTITION_KEY_HEADER
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PartitionKey(Arc<str>);

impl PartitionKey {
    /// A key from text.
    pub fn new(key: impl Into<Arc<str>>) -> Self {
        PartitionKey(key.into())
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for PartitionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for PartitionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::ops::Deref for PartitionKey {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl From<&str> for PartitionKey {
    fn from(key: &str) -> Self {
        PartitionKey(key.into())
    }
}

impl From<String> for PartitionKey {
    fn from(key: String) -> Self {
        PartitionKey(key.into())
    }
}

impl PartialEq<str> for PartitionKey {
    fn eq(&self, other: &str) -> bool {
        &*self.0 == other
    }
}

impl PartialEq<&str> for PartitionKey {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

/// A message to publish: payload bytes, headers and the portable properties every
/// transport maps to its own (partition key, content type, ids, delay).
///
/// [`Message::new`] and [`Message::json`] make a message of a payload alone;
/// [`Message::builder`] sets properties and headers first, then takes the payload.
///
/// ```
/// use conveyor::Message;
///
/// #[derive(serde::Serialize)]
/// struct Order { id: u64 }
///
/// let message = Message::builder()
///     .partition_key("alice")
///     .header("x-tenant", "acme")
///     .json(&Order { id: 7 })?;
/// assert_eq!(message.payload().as_ref(), br#"{"id":7}"#);
/// assert_eq!(message.partition_key().map(|k| k.as_str()), Some("alice"));
/// assert_eq!(message.content_type(), Some("application/json"));
/// # Ok::<(), conveyor::Error>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct Message {
    payload: Bytes,
    headers: Headers,
    partition_key: Option<PartitionKey>,
    content_type: Option<Cow<'static, str>>,
    message_id: Option<String>,
    correlation_id: Option<String>,
    reply_to: Option<String>,
    delay: Option<Duration>,
}

impl Message {
    /// A message with these payload bytes and nothing else.
    pub fn new(payload: impl Into<Bytes>) -> Self {
        Message {
            payload: payload.into(),
            ..Message::default()
        }
    }

    /// A message whose payload is `value` as JSON, with content type `application/json`.
    ///
    /// # Errors
    ///
    /// [`Error::Encode`] when `value` cannot be serialized as JSON.
    pub fn json<T: Serialize + ?Sized>(value: &T) -> Result<Self, Error> {
        MessageBuilder::default().json(value)
    }

    /// A message whose payload is `value` as MessagePack (structs as maps), with content
    /// type `application/msgpack` (feature `msgpack`; see [`crate::codec`]).
    ///
    /// # Errors
    ///
    /// [`Error::Encode`] when `value` cannot be serialized as MessagePack.
    #[cfg(feature = "msgpack")]
    pub fn msgpack<T: Serialize + ?Sized>(value: &T) -> Result<Self, Error> {
        MessageBuilder::default().msgpack(value)
    }

    /// A message whose payload is `value` as CBOR, with content type `application/cbor`
    /// (feature `cbor`; see [`crate::codec`]).
    ///
    /// # Errors
    ///
    /// [`Error::Encode`] when `value` cannot be serialized as CBOR.
    #[cfg(feature = "cbor")]
    pub fn cbor<T: Serialize + ?Sized>(value: &T) -> Result<Self, Error> {
        MessageBuilder::default().cbor(value)
    }

    /// A builder: set headers and properties, then give the payload.
    pub fn builder() -> MessageBuilder {
        MessageBuilder::default()
    }

    /// The payload bytes.
    pub fn payload(&self) -> &Bytes {
        &self.payload
    }

    /// The headers.
    pub fn headers(&self) -> &Headers {
        &self.headers
    }

    /// The headers, to change in place.
    pub fn headers_mut(&mut self) -> &mut Headers {
        &mut self.headers
    }

    /// The partition key, if one was set.
    pub fn partition_key(&self) -> Option<&PartitionKey> {
        self.partition_key.as_ref()
    }

    /// The content type, if one was set.
    pub fn content_type(&self) -> Option<&str> {
        self.content_type.as_deref()
    }

    /// The message id, if one was set.
    pub fn message_id(&self) -> Option<&str> {
        self.message_id.as_deref()
    }

    /// The correlation id, if one was set.
    pub fn correlation_id(&self) -> Option<&str> {
        self.correlation_id.as_deref()
    }

    /// Where a reply goes, if one was asked for (a requester sets it: see
    /// [`Broker::request`](crate::Broker::request)).
    pub fn reply_to(&self) -> Option<&str> {
        self.reply_to.as_deref()
    }

    /// The delivery delay, if one was set.
    pub fn delay(&self) -> Option<Duration> {
        self.delay
    }

    /// A received message rebuilt from its payload and headers, the properties taken
    /// back out of the headers they travel in ([`MessageParts::property_headers`]): how a
    /// transport hands a requester its reply.
    ///
    /// ```
    /// use conveyor::{Headers, Message, CORRELATION_ID_HEADER};
    ///
    /// let mut headers = Headers::new();
    /// headers.insert(CORRELATION_ID_HEADER, "c-1");
    /// headers.insert("x-tenant", "acme");
    /// let reply = Message::received("42".into(), headers);
    /// assert_eq!(reply.correlation_id(), Some("c-1"));
    /// assert_eq!(reply.headers().get_str("x-tenant"), Some("acme"));
    /// assert!(!reply.headers().contains(CORRELATION_ID_HEADER));
    /// ```
    pub fn received(payload: Bytes, mut headers: Headers) -> Message {
        let mut take = |name: &str| {
            headers
                .remove(name)
                .and_then(|value| String::from_utf8(value.to_vec()).ok())
        };
        let content_type = take(CONTENT_TYPE_HEADER).map(Cow::Owned);
        let message_id = take(MESSAGE_ID_HEADER);
        let correlation_id = take(CORRELATION_ID_HEADER);
        let reply_to = take(REPLY_TO_HEADER);
        Message {
            payload,
            headers,
            partition_key: None,
            content_type,
            message_id,
            correlation_id,
            reply_to,
            delay: None,
        }
    }

    /// Sets the correlation id.
    pub fn set_correlation_id(&mut self, id: impl Into<String>) {
        self.correlation_id = Some(id.into());
    }

    /// Sets where a reply goes.
    pub fn set_reply_to(&mut self, destination: impl Into<String>) {
        self.reply_to = Some(destination.into());
    }

    /// Takes `key` and `correlation_id` where the message has none of its own: an output
    /// keeps its input's order and correlation.
    pub(crate) fn inherit(&mut self, key: Option<&PartitionKey>, correlation_id: Option<&str>) {
        if self.partition_key.is_none() {
            self.partition_key = key.cloned();
        }
        if self.correlation_id.is_none() {
            self.correlation_id = correlation_id.map(str::to_string);
        }
    }

    /// Takes the message apart, for a transport to map onto its wire format.
    pub fn into_parts(self) -> MessageParts {
        MessageParts {
            payload: self.payload,
            headers: self.headers,
            partition_key: self.partition_key,
            content_type: self.content_type,
            message_id: self.message_id,
            correlation_id: self.correlation_id,
            reply_to: self.reply_to,
            delay: self.delay,
        }
    }
}

/// Builds a [`Message`]: headers and properties first, then the payload, which makes
/// the message ([`payload`](Self::payload) or [`json`](Self::json)).
///
/// ```
/// use std::time::Duration;
/// use conveyor::Message;
///
/// let message = Message::builder()
///     .partition_key("alice")
///     .message_id("order-7")
///     .delay(Duration::from_secs(5))
///     .payload("hello");
/// assert_eq!(message.message_id(), Some("order-7"));
/// assert_eq!(message.delay(), Some(Duration::from_secs(5)));
/// ```
#[derive(Clone, Debug, Default)]
#[must_use = "a builder makes a message only when given its payload"]
pub struct MessageBuilder {
    message: Message,
}

impl MessageBuilder {
    /// Sets a header, replacing any of the same name (names are case-insensitive).
    pub fn header(mut self, name: impl Into<HeaderName>, value: impl Into<Bytes>) -> Self {
        self.message.headers.insert(name, value);
        self
    }

    /// Sets the partition key. Each transport writes it where it belongs: the FIFO message
    /// group on SQS, the `amqp-partition-key` header on RabbitMQ, the
    /// [`memory::PARTITION_KEY_HEADER`](crate::memory::PARTITION_KEY_HEADER) in process.
    pub fn partition_key(mut self, key: impl Into<PartitionKey>) -> Self {
        self.message.partition_key = Some(key.into());
        self
    }

    /// Sets the content type ([`json`](Self::json) sets `application/json`).
    pub fn content_type(mut self, content_type: impl Into<Cow<'static, str>>) -> Self {
        self.message.content_type = Some(content_type.into());
        self
    }

    /// Sets the message id (SQS deduplication falls back to it; AMQP `message-id`).
    pub fn message_id(mut self, id: impl Into<String>) -> Self {
        self.message.message_id = Some(id.into());
        self
    }

    /// Sets the correlation id.
    pub fn correlation_id(mut self, id: impl Into<String>) -> Self {
        self.message.correlation_id = Some(id.into());
        self
    }

    /// Sets where a reply goes (the transport's reply address; a requester sets it).
    pub fn reply_to(mut self, destination: impl Into<String>) -> Self {
        self.message.reply_to = Some(destination.into());
        self
    }

    /// Delays delivery: the message becomes visible to consumers only after `delay`.
    pub fn delay(mut self, delay: Duration) -> Self {
        self.message.delay = Some(delay);
        self
    }

    /// The message, with these payload bytes.
    pub fn payload(mut self, payload: impl Into<Bytes>) -> Message {
        self.message.payload = payload.into();
        self.message
    }

    /// The message, with `value` as JSON for its payload and content type
    /// `application/json` (unless one was set).
    ///
    /// # Errors
    ///
    /// [`Error::Encode`] when `value` cannot be serialized as JSON.
    pub fn json<T: Serialize + ?Sized>(self, value: &T) -> Result<Message, Error> {
        let payload = serde_json::to_vec(value).map_err(|e| Error::Encode {
            format: "json",
            source: e.into(),
        })?;
        Ok(self.encoded(payload, JSON_CONTENT_TYPE))
    }

    /// The message, with `value` as MessagePack (structs as maps) for its payload and
    /// content type `application/msgpack` (unless one was set). Feature `msgpack`.
    ///
    /// # Errors
    ///
    /// [`Error::Encode`] when `value` cannot be serialized as MessagePack.
    #[cfg(feature = "msgpack")]
    pub fn msgpack<T: Serialize + ?Sized>(self, value: &T) -> Result<Message, Error> {
        let payload = crate::encode::to_msgpack(value)?;
        Ok(self.encoded(payload, crate::encode::MSGPACK_CONTENT_TYPE))
    }

    /// The message, with `value` as CBOR for its payload and content type
    /// `application/cbor` (unless one was set). Feature `cbor`.
    ///
    /// # Errors
    ///
    /// [`Error::Encode`] when `value` cannot be serialized as CBOR.
    #[cfg(feature = "cbor")]
    pub fn cbor<T: Serialize + ?Sized>(self, value: &T) -> Result<Message, Error> {
        let payload = crate::encode::to_cbor(value)?;
        Ok(self.encoded(payload, crate::encode::CBOR_CONTENT_TYPE))
    }

    /// The message with an encoded payload, labelled `content_type` unless a content
    /// type was set.
    fn encoded(mut self, payload: Vec<u8>, content_type: &'static str) -> Message {
        if self.message.content_type.is_none() {
            self.message.content_type = Some(Cow::Borrowed(content_type));
        }
        self.payload(payload)
    }
}

/// The content type [`MessageBuilder::json`] sets.
pub(crate) const JSON_CONTENT_TYPE: &str = "application/json";

/// The header a delivery carries its message's content type in, on every transport.
pub const CONTENT_TYPE_HEADER: &str = "content-type";
/// The header a delivery carries its message's id in, on every transport.
pub const MESSAGE_ID_HEADER: &str = "message-id";
/// The header a delivery carries its message's correlation id in, on every transport.
pub const CORRELATION_ID_HEADER: &str = "correlation-id";
/// The header a delivery carries where its reply goes in, on every transport (AMQP's
/// `reply-to` property on RabbitMQ).
pub const REPLY_TO_HEADER: &str = "reply-to";

impl MessageParts {
    /// The message's properties that travel as headers, each with the header a delivery
    /// gets it back in ([`CONTENT_TYPE_HEADER`], [`MESSAGE_ID_HEADER`],
    /// [`CORRELATION_ID_HEADER`], [`REPLY_TO_HEADER`]): one mapping for every transport, so a handler finds
    /// them under the same names whatever the broker.
    ///
    /// ```
    /// use conveyor::{Message, MESSAGE_ID_HEADER};
    ///
    /// let parts = Message::builder().message_id("m-1").payload("x").into_parts();
    /// assert_eq!(parts.property_headers().collect::<Vec<_>>(), [(MESSAGE_ID_HEADER, "m-1")]);
    /// ```
    pub fn property_headers(&self) -> impl Iterator<Item = (&'static str, &str)> {
        [
            (CONTENT_TYPE_HEADER, self.content_type.as_deref()),
            (MESSAGE_ID_HEADER, self.message_id.as_deref()),
            (CORRELATION_ID_HEADER, self.correlation_id.as_deref()),
            (REPLY_TO_HEADER, self.reply_to.as_deref()),
        ]
        .into_iter()
        .filter_map(|(name, value)| Some((name, value?)))
    }
}

/// A [`Message`] taken apart by [`Message::into_parts`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct MessageParts {
    /// The payload bytes.
    pub payload: Bytes,
    /// The headers.
    pub headers: Headers,
    /// The partition key.
    pub partition_key: Option<PartitionKey>,
    /// The content type.
    pub content_type: Option<Cow<'static, str>>,
    /// The message id.
    pub message_id: Option<String>,
    /// The correlation id.
    pub correlation_id: Option<String>,
    /// Where a reply goes.
    pub reply_to: Option<String>,
    /// The delivery delay.
    pub delay: Option<Duration>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_builder_sets_every_property_and_the_getters_read_them() {
        let message = Message::builder()
            .partition_key("alice")
            .header("X-Tenant", "acme")
            .content_type("text/plain")
            .message_id("m-1")
            .correlation_id("c-1")
            .delay(Duration::from_secs(3))
            .payload("hi");
        assert_eq!(message.payload().as_ref(), b"hi");
        assert_eq!(
            message.partition_key().map(PartitionKey::as_str),
            Some("alice")
        );
        assert_eq!(message.headers().get_str("x-tenant"), Some("acme"));
        assert_eq!(message.content_type(), Some("text/plain"));
        assert_eq!(message.message_id(), Some("m-1"));
        assert_eq!(message.correlation_id(), Some("c-1"));
        assert_eq!(message.delay(), Some(Duration::from_secs(3)));
    }

    #[test]
    fn json_sets_its_content_type_unless_one_was_given() {
        assert_eq!(
            Message::json(&1).unwrap().content_type(),
            Some("application/json")
        );
        let custom = Message::builder()
            .content_type("application/vnd.order+json")
            .json(&1)
            .unwrap();
        assert_eq!(custom.content_type(), Some("application/vnd.order+json"));
        assert_eq!(Message::new("x").content_type(), None);
    }
}
