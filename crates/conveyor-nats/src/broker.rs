//! `NatsBroker`: one connection to a NATS server with JetStream, its builder, and
//! publishing.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::context::PublishErrorKind;
use async_nats::{Client, jetstream};
use conveyor::{
    ConnectionHealth, ConnectionState, DeadLetter, Error, Message, Publisher, QueueDepth,
    QueueSpec, Report,
};
use futures_util::future::try_join_all;

use crate::admin;
use crate::error::NatsError;
use crate::headers;
use crate::names::{self, is_inbox};
use crate::queue::NatsQueue;

/// The durable consumer every subscription reads a queue through, unless
/// [`NatsQueue::consumer`] names another.
pub const DEFAULT_CONSUMER: &str = "conveyor";

/// How a broker's subscriptions and calls run; see the builder's methods.
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    pub(crate) visibility_timeout: Duration,
    pub(crate) receive_wait: Duration,
    pub(crate) settle_linger: Duration,
    pub(crate) request_timeout: Duration,
}

/// Builds a [`NatsBroker`].
///
/// ```no_run
/// # async fn run() -> Result<(), conveyor::Error> {
/// use std::time::Duration;
/// use conveyor_nats::NatsBroker;
///
/// let broker = NatsBroker::builder()
///     .url("nats://127.0.0.1:4222")
///     .visibility_timeout(Duration::from_secs(60))
///     .build()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
#[must_use = "a builder connects only when built"]
pub struct NatsBrokerBuilder {
    url: String,
    settings: Settings,
    connect_timeout: Duration,
}

impl fmt::Debug for NatsBrokerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsBrokerBuilder")
            .field("url", &shown_url(&self.url))
            .field("settings", &self.settings)
            .finish()
    }
}

impl NatsBrokerBuilder {
    /// The server, as `nats://[user:password@]host:port` (default
    /// `nats://127.0.0.1:4222`). The password never shows in a log or an error.
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.url = url.into();
        self
    }

    /// How long a received message stays hidden from other subscriptions before
    /// JetStream hands it out again, unless renewed (default 30 s, at least 1 s): the ack
    /// wait of the consumers this broker creates. A handler may run longer: the
    /// subscription renews it (`in_progress`) while it runs. A queue declared with a
    /// [`visibility_timeout`](QueueSpec::visibility_timeout) takes that instead.
    pub fn visibility_timeout(mut self, timeout: Duration) -> Self {
        self.settings.visibility_timeout = timeout;
        self
    }

    /// How long one receive (a pull request) waits on an empty queue for a first message
    /// before it asks again (default 5 s). It answers as soon as any message is there.
    pub fn receive_wait(mut self, wait: Duration) -> Self {
        self.settings.receive_wait = wait;
        self
    }

    /// How long a settlement waits for others to share its flush (default none:
    /// settlements that arrive while one is under way share the next). A subscription
    /// receives again only once what it holds, settlements not yet sent included, is
    /// under its read-ahead, so a linger here holds every receive up by as much.
    pub fn settle_linger(mut self, linger: Duration) -> Self {
        self.settings.settle_linger = linger;
        self
    }

    /// How long a JetStream call (a publish's acknowledgement, a stream's info) may take
    /// (default 10 s).
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.settings.request_timeout = timeout;
        self
    }

    /// How long connecting may take (default 10 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Connects. The client reconnects by itself after that, for as long as it takes.
    ///
    /// # Errors
    ///
    /// [`Error::Transport`] when the server cannot be reached or refuses the connection;
    /// [`Error::Config`] for a visibility timeout under a second.
    pub async fn build(self) -> Result<NatsBroker, Error> {
        if self.settings.visibility_timeout < Duration::from_secs(1) {
            return Err(Error::config(
                "visibility_timeout must be at least a second: the lease is renewed a third of it ahead",
            ));
        }
        let shown = shown_url(&self.url);
        let failed = |reason: String| Error::Transport {
            transport: "nats",
            source: Box::new(NatsError::Connect {
                url: shown.clone(),
                // The client's errors may quote the URL it was given.
                reason: without_credentials(&reason, &self.url),
            }),
        };
        let client = async_nats::ConnectOptions::new()
            .connection_timeout(self.connect_timeout)
            .request_timeout(Some(self.settings.request_timeout))
            .name("conveyor")
            .connect(self.url.as_str())
            .await
            .map_err(|e| failed(Report(&e).to_string()))?;
        let jetstream = jetstream::ContextBuilder::new()
            .timeout(self.settings.request_timeout)
            .build(client.clone());
        Ok(NatsBroker {
            inner: Arc::new(Inner {
                client,
                jetstream,
                settings: self.settings,
                label: shown,
                requests: conveyor::request::Requests::default(),
            }),
        })
    }
}

/// A connection to a NATS server with JetStream: a [`Publisher`] and a
/// [`Broker`](conveyor::Broker).
///
/// A queue is a JetStream stream of that name taking the subject of that name (work-queue
/// retention: a message is gone once acknowledged), read through one durable pull
/// consumer that every subscription to it shares. Cloning is cheap and shares the
/// connection.
///
/// ```no_run
/// # async fn run() -> Result<(), conveyor::Error> {
/// use conveyor::{Broker, Publisher, QueueSpec};
/// use conveyor_nats::NatsBroker;
///
/// let broker = NatsBroker::connect("nats://127.0.0.1:4222").await?;
/// broker.declare_queue(&QueueSpec::new("orders")).await?;
/// broker.publish_json("orders", &7u64).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct NatsBroker {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    jetstream: jetstream::Context,
    settings: Settings,
    /// The URL, its password hidden.
    label: String,
    /// The reply inbox, opened at the first request.
    requests: conveyor::request::Requests,
}

impl fmt::Debug for NatsBroker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsBroker")
            .field("url", &self.inner.label)
            .finish_non_exhaustive()
    }
}

impl NatsBroker {
    /// A builder, with every default.
    pub fn builder() -> NatsBrokerBuilder {
        NatsBrokerBuilder {
            url: "nats://127.0.0.1:4222".to_string(),
            settings: Settings {
                visibility_timeout: Duration::from_secs(30),
                receive_wait: Duration::from_secs(5),
                settle_linger: Duration::ZERO,
                request_timeout: Duration::from_secs(10),
            },
            connect_timeout: Duration::from_secs(10),
        }
    }

    /// Connects to `url` with every default.
    ///
    /// # Errors
    ///
    /// As [`NatsBrokerBuilder::build`].
    pub async fn connect(url: impl Into<String>) -> Result<NatsBroker, Error> {
        Self::builder().url(url).build().await
    }

    /// The queue `name` to mount a handler on; its stream and consumer are made at
    /// subscription if missing.
    pub fn queue(&self, name: impl Into<String>) -> NatsQueue {
        NatsQueue::new(self.clone(), name.into())
    }

    /// The client, for what Conveyor does not cover.
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    pub(crate) fn jetstream(&self) -> &jetstream::Context {
        &self.inner.jetstream
    }

    pub(crate) fn settings(&self) -> &Settings {
        &self.inner.settings
    }

    /// Sends one message to `destination` and answers once it is stored there: a plain
    /// NATS publish to a reply inbox; otherwise a JetStream publish, its stream made
    /// plainly first if no stream takes the subject.
    async fn send(&self, destination: &str, message: Message) -> Result<(), Error> {
        let (headers, payload) = outgoing(destination, message)?;
        if is_inbox(destination) {
            return self.reply(destination, headers, payload).await;
        }
        self.store(destination, headers, payload).await
    }

    /// One JetStream publish, acknowledged; the stream is made plainly first if no
    /// stream takes the subject.
    async fn store(
        &self,
        destination: &str,
        headers: async_nats::HeaderMap,
        payload: conveyor::Bytes,
    ) -> Result<(), Error> {
        let failed = |e: &(dyn std::error::Error + 'static)| publish_error(destination, e);
        let jetstream = self.jetstream();
        let publish = || async {
            let sent = jetstream
                .publish_with_headers(destination.to_string(), headers.clone(), payload.clone())
                .await?;
            sent.await
        };
        match publish().await {
            Err(e) if e.kind() == PublishErrorKind::StreamNotFound => {
                admin::make_plain(self, destination).await?;
                publish().await.map(drop).map_err(|e| failed(&e))
            }
            done => done.map(drop).map_err(|e| failed(&e)),
        }
    }

    /// A plain NATS publish, flushed: what a reply to a request is.
    async fn reply(
        &self,
        inbox: &str,
        headers: async_nats::HeaderMap,
        payload: conveyor::Bytes,
    ) -> Result<(), Error> {
        let client = self.client();
        client
            .publish_with_headers(inbox.to_string(), headers, payload)
            .await
            .map_err(|e| publish_error(inbox, &e))?;
        client.flush().await.map_err(|e| publish_error(inbox, &e))
    }
}

/// The credentials of a `nats://` URL: `user:password`, or a token alone.
fn credentials(url: &str) -> Option<&str> {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split(['/', '?']).next().unwrap_or(rest);
    authority
        .rsplit_once('@')
        .map(|(credentials, _)| credentials)
}

/// `url` with its credentials (a password or a token) shown as `***`.
fn shown_url(url: &str) -> String {
    match credentials(url) {
        Some(secret) if !secret.is_empty() => url.replacen(secret, "***", 1),
        _ => url.to_string(),
    }
}

/// `text` with `url`'s password or token, wherever it appears, shown as `***`.
fn without_credentials(text: &str, url: &str) -> String {
    let secret = match credentials(url) {
        Some(credentials) => credentials
            .split_once(':')
            .map_or(credentials, |(_, password)| password),
        None => return text.to_string(),
    };
    if secret.is_empty() {
        text.to_string()
    } else {
        text.replace(secret, "***")
    }
}

/// A message's NATS headers and payload; a message NATS cannot carry is refused.
fn outgoing(
    destination: &str,
    message: Message,
) -> Result<(async_nats::HeaderMap, conveyor::Bytes), Error> {
    let refused = |why: String| Error::Refused {
        destination: conveyor::kit::bounded(destination, 256).into_owned(),
        source: why.into(),
    };
    if !is_inbox(destination) {
        names::check(destination).map_err(|e| refused(e.to_string()))?;
    }
    let parts = message.into_parts();
    if let Some(key) = &parts.partition_key {
        headers::check_key(key).map_err(|why| refused(why.to_string()))?;
    }
    let headers = headers::outgoing(&parts).map_err(|e| refused(e.to_string()))?;
    Ok((headers, parts.payload))
}

fn publish_error(destination: &str, error: &(dyn std::error::Error + 'static)) -> Error {
    Error::Publish {
        destination: conveyor::kit::bounded(destination, 256).into_owned(),
        source: Report(error).to_string().into(),
    }
}

impl Publisher for NatsBroker {
    /// Publishes and waits for JetStream's acknowledgement (the message is stored).
    async fn publish(&self, destination: &str, message: Message) -> Result<(), Error> {
        self.send(destination, message).await
    }

    /// Checks every message first (none is sent if one is refused), then sends them all
    /// before waiting for their acknowledgements, so the batch costs about one round
    /// trip.
    async fn publish_batch(&self, destination: &str, messages: Vec<Message>) -> Result<(), Error> {
        if is_inbox(destination) {
            for message in messages {
                self.send(destination, message).await?;
            }
            return Ok(());
        }
        let outgoing: Vec<_> = messages
            .into_iter()
            .map(|message| outgoing(destination, message))
            .collect::<Result<_, _>>()?;
        let mut outgoing = outgoing.into_iter();
        let Some((headers, payload)) = outgoing.next() else {
            return Ok(());
        };
        // The first alone, so that a missing stream is made before the rest go.
        self.store(destination, headers, payload).await?;
        let jetstream = self.jetstream();
        let mut acks = Vec::with_capacity(outgoing.len());
        for (headers, payload) in outgoing {
            let sent = jetstream
                .publish_with_headers(destination.to_string(), headers, payload)
                .await
                .map_err(|e| publish_error(destination, &e))?;
            acks.push(sent.into_future());
        }
        try_join_all(acks)
            .await
            .map(drop)
            .map_err(|e| publish_error(destination, &e))
    }
}

impl conveyor::Broker for NatsBroker {
    type Queue = NatsQueue;

    fn queue(&self, name: &str) -> NatsQueue {
        NatsBroker::queue(self, name)
    }

    /// Makes (or updates) the queue's stream and its durable consumer. The dead-letter
    /// policy is kept in the stream's description, where every subscriber reads it; the
    /// visibility timeout is the consumer's ack wait.
    async fn declare_queue(&self, spec: &QueueSpec) -> Result<(), Error> {
        admin::declare(self, spec).await
    }

    async fn delete_queue(&self, name: &str) -> Result<(), Error> {
        admin::delete(self, name).await
    }

    /// `ready`: messages never delivered yet; `in_flight`: delivered and not yet
    /// acknowledged, which on JetStream includes those released or retried and waiting
    /// to be delivered again (its consumer info does not tell them apart).
    async fn queue_depth(&self, name: &str) -> Result<QueueDepth, Error> {
        admin::depth(self, name).await
    }

    async fn take_dead_letters(
        &self,
        dead_letter_queue: &str,
        max: usize,
    ) -> Result<Vec<DeadLetter>, Error> {
        admin::take(self, dead_letter_queue, max).await
    }

    async fn request(
        &self,
        destination: &str,
        message: Message,
        timeout: Duration,
    ) -> Result<Message, Error> {
        let open = || crate::request::open(self);
        (self.inner.requests)
            .request(self, destination, message, timeout, open)
            .await
    }

    /// Flushes what is buffered; the connection closes when the last clone is dropped.
    async fn close(&self) -> Result<(), Error> {
        self.client().flush().await.map_err(|e| Error::Transport {
            transport: "nats",
            source: Report(&e).to_string().into(),
        })
    }

    fn connections(&self) -> Vec<ConnectionHealth> {
        let state = match self.client().connection_state() {
            async_nats::connection::State::Connected => ConnectionState::Connected,
            _ => ConnectionState::Reconnecting,
        };
        vec![ConnectionHealth::new("nats", state)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_or_a_token_never_shows() {
        assert_eq!(
            shown_url("nats://app:s3cret@host:4222"),
            "nats://***@host:4222"
        );
        assert_eq!(shown_url("nats://t0ken@host:4222"), "nats://***@host:4222");
        assert_eq!(shown_url("nats://host:4222"), "nats://host:4222");
        let error = "cannot reach nats://t0ken@host:4222";
        assert_eq!(
            without_credentials(error, "nats://t0ken@host:4222"),
            "cannot reach nats://***@host:4222"
        );
        let error = "auth for app:s3cret failed";
        assert_eq!(
            without_credentials(error, "nats://app:s3cret@host"),
            "auth for app:*** failed"
        );
    }
}
