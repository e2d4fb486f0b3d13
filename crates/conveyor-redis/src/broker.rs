//! `RedisBroker`: a connection to Redis, its builder, the keys of a queue, and
//! publishing.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use conveyor::{
    ConnectionHealth, DeadLetter, Error, Message, Publisher, QueueDepth, QueueSpec, Report,
};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::error::{RedisError, failed};
use crate::fields;
use crate::queue::RedisQueue;

/// The consumer group every subscription reads a queue through.
pub const GROUP: &str = "conveyor";

/// The keys of queue `name`: the stream itself, and beside it the delayed messages (a
/// sorted set by due time, each message's fields in a hash) and the queue's policy.
#[derive(Clone, Debug)]
pub(crate) struct Keys {
    pub(crate) stream: String,
    pub(crate) delayed: String,
    pub(crate) delayed_entry: String,
    pub(crate) policy: String,
}

impl Keys {
    pub(crate) fn of(name: &str) -> Keys {
        Keys {
            stream: name.to_string(),
            delayed: format!("{name}:conveyor:delayed"),
            delayed_entry: format!("{name}:conveyor:delayed:"),
            policy: format!("{name}:conveyor:policy"),
        }
    }
}

/// Milliseconds since the Unix epoch, `after` from now.
pub(crate) fn epoch_ms(after: Duration) -> u64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(now.saturating_add(after).as_millis()).unwrap_or(u64::MAX)
}

#[derive(Clone, Debug)]
pub(crate) struct Settings {
    pub(crate) visibility_timeout: Duration,
    pub(crate) receive_wait: Duration,
    pub(crate) settle_linger: Duration,
    pub(crate) response_timeout: Duration,
}

/// Builds a [`RedisBroker`].
#[derive(Clone)]
#[must_use = "a builder connects only when built"]
pub struct RedisBrokerBuilder {
    url: String,
    settings: Settings,
}

impl fmt::Debug for RedisBrokerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBrokerBuilder")
            .field("url", &conveyor::kit::redact_url(&self.url))
            .field("settings", &self.settings)
            .finish()
    }
}

impl RedisBrokerBuilder {
    /// The server, as `redis://[user:password@]host:port[/db]` (default
    /// `redis://127.0.0.1:6379`). The password never shows in a log or an error.
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.url = url.into();
        self
    }

    /// How long a received message stays leased to its subscription before another may
    /// claim it (default 30 s), for queues whose declaration sets none. The subscription
    /// renews the lease while the handler runs.
    pub fn visibility_timeout(mut self, timeout: Duration) -> Self {
        self.settings.visibility_timeout = timeout;
        self
    }

    /// How long one receive (a blocking read) waits on an empty queue for a first message
    /// before it asks again (default 5 s). It answers as soon as any message is there.
    pub fn receive_wait(mut self, wait: Duration) -> Self {
        self.settings.receive_wait = wait;
        self
    }

    /// How long a settlement waits for others to share its round trip (default none:
    /// settlements that arrive while one is under way share the next). A subscription
    /// receives again only once what it holds, settlements not yet sent included, is
    /// under its read-ahead, so a linger here holds every receive up by as much.
    pub fn settle_linger(mut self, linger: Duration) -> Self {
        self.settings.settle_linger = linger;
        self
    }

    /// Connects.
    ///
    /// # Errors
    ///
    /// [`Error::Transport`] when the server cannot be reached; [`Error::Config`] for a
    /// URL Redis cannot take or a visibility timeout under a second.
    pub async fn build(self) -> Result<RedisBroker, Error> {
        if self.settings.visibility_timeout < Duration::from_secs(1) {
            return Err(Error::config(
                "visibility_timeout must be at least a second: the lease is renewed a third of it ahead",
            ));
        }
        let shown = conveyor::kit::redact_url(&self.url);
        let hide = |reason: String| conveyor::kit::without_password(&reason, &self.url);
        let client = redis::Client::open(self.url.as_str())
            .map_err(|e| Error::config(format!("Redis URL {shown}: {}", hide(e.to_string()))))?;
        let connect_error = |e: redis::RedisError| Error::Transport {
            transport: "redis",
            source: Box::new(RedisError::Connect {
                url: shown.clone(),
                reason: hide(Report(&e).to_string()),
            }),
        };
        let commands = connect(&client, self.settings.response_timeout)
            .await
            .map_err(connect_error)?;
        Ok(RedisBroker {
            inner: Arc::new(Inner {
                client,
                commands,
                settings: self.settings,
                label: shown,
                requests: conveyor::request::Requests::default(),
            }),
        })
    }
}

/// A connection that reconnects by itself, answering within `response_timeout`.
pub(crate) async fn connect(
    client: &redis::Client,
    response_timeout: Duration,
) -> redis::RedisResult<ConnectionManager> {
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(10)))
        .set_response_timeout(Some(response_timeout))
        .set_max_delay(Duration::from_secs(2));
    ConnectionManager::new_with_config(client.clone(), config).await
}

/// A connection to Redis: a [`Publisher`] and a [`Broker`](conveyor::Broker).
///
/// A queue is a stream of its name, read through the consumer group [`GROUP`]; each
/// subscription is a consumer of its own in that group. Cloning is cheap and shares the
/// connection.
///
/// ```no_run
/// # async fn run() -> Result<(), conveyor::Error> {
/// use conveyor::{Broker, Publisher, QueueSpec};
/// use conveyor_redis::RedisBroker;
///
/// let broker = RedisBroker::connect("redis://127.0.0.1:6379").await?;
/// broker.declare_queue(&QueueSpec::new("orders")).await?;
/// broker.publish_json("orders", &7u64).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisBroker {
    inner: Arc<Inner>,
}

struct Inner {
    client: redis::Client,
    /// Every command but the blocking reads, which each subscription makes on a
    /// connection of its own.
    commands: ConnectionManager,
    settings: Settings,
    label: String,
    requests: conveyor::request::Requests,
}

impl fmt::Debug for RedisBroker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBroker")
            .field("url", &self.inner.label)
            .finish_non_exhaustive()
    }
}

impl RedisBroker {
    /// A builder, with every default.
    pub fn builder() -> RedisBrokerBuilder {
        RedisBrokerBuilder {
            url: "redis://127.0.0.1:6379".to_string(),
            settings: Settings {
                visibility_timeout: Duration::from_secs(30),
                receive_wait: Duration::from_secs(5),
                settle_linger: Duration::ZERO,
                response_timeout: Duration::from_secs(10),
            },
        }
    }

    /// Connects to `url` with every default.
    ///
    /// # Errors
    ///
    /// As [`RedisBrokerBuilder::build`].
    pub async fn connect(url: impl Into<String>) -> Result<RedisBroker, Error> {
        Self::builder().url(url).build().await
    }

    /// The queue `name` to mount a handler on; its stream and group are made at
    /// subscription if missing.
    pub fn queue(&self, name: impl Into<String>) -> RedisQueue {
        RedisQueue::new(self.clone(), name.into())
    }

    /// Whether queue `name` exists: whether Redis holds a stream of that name (made by a
    /// declaration, a subscription or a publish). [`queue_depth`](conveyor::Broker::queue_depth)
    /// cannot tell: it answers zeros for a queue that does not exist, as for an empty one.
    ///
    /// # Errors
    ///
    /// [`Error::Transport`] when Redis cannot be asked.
    pub async fn queue_exists(&self, name: &str) -> Result<bool, Error> {
        let kind: String = redis::cmd("TYPE")
            .arg(name)
            .query_async(&mut self.commands())
            .await
            .map_err(|e| failed("TYPE", name, Report(&e)))?;
        Ok(kind == "stream")
    }

    pub(crate) fn client(&self) -> &redis::Client {
        &self.inner.client
    }

    pub(crate) fn commands(&self) -> ConnectionManager {
        self.inner.commands.clone()
    }

    pub(crate) fn settings(&self) -> &Settings {
        &self.inner.settings
    }

    /// Adds `messages` to queue `destination` in one round trip: each straight into the
    /// stream, or, if delayed, into the delayed set, due at the end of its delay.
    async fn add(&self, destination: &str, messages: Vec<Message>) -> Result<(), Error> {
        if destination.is_empty() {
            return Err(Error::Refused {
                destination: String::new(),
                source: "a queue needs a name".into(),
            });
        }
        let keys = Keys::of(destination);
        let mut pipe = redis::pipe();
        pipe.atomic();
        for message in messages {
            let parts = message.into_parts();
            let entry = fields::outgoing(&parts);
            match parts.delay.filter(|delay| !delay.is_zero()) {
                None => {
                    pipe.cmd("XADD").arg(&keys.stream).arg("*");
                    for (name, value) in &entry {
                        pipe.arg(name).arg(value);
                    }
                    pipe.ignore();
                }
                Some(delay) => {
                    let id = conveyor::kit::unique_id();
                    pipe.cmd("HSET").arg(format!("{}{id}", keys.delayed_entry));
                    for (name, value) in &entry {
                        pipe.arg(name).arg(value);
                    }
                    pipe.ignore();
                    pipe.cmd("ZADD")
                        .arg(&keys.delayed)
                        .arg(epoch_ms(delay))
                        .arg(&id)
                        .ignore();
                }
            }
        }
        pipe.query_async::<()>(&mut self.commands())
            .await
            .map_err(|e| Error::Publish {
                destination: conveyor::kit::bounded(destination, 256).into_owned(),
                source: Box::new(crate::error::call_error("XADD", destination, Report(&e))),
            })
    }
}

impl Publisher for RedisBroker {
    /// Adds the message to the queue's stream (`XADD`); answers once Redis has it.
    async fn publish(&self, destination: &str, message: Message) -> Result<(), Error> {
        self.add(destination, vec![message]).await
    }

    /// Adds every message in one atomic round trip.
    async fn publish_batch(&self, destination: &str, messages: Vec<Message>) -> Result<(), Error> {
        if messages.is_empty() {
            return Ok(());
        }
        self.add(destination, messages).await
    }
}

impl conveyor::Broker for RedisBroker {
    type Queue = RedisQueue;

    fn queue(&self, name: &str) -> RedisQueue {
        RedisBroker::queue(self, name)
    }

    /// Makes the stream and its group (reading from the stream's start), and keeps the
    /// queue's dead-letter queue, max receive count and visibility timeout in its policy
    /// hash, where every subscriber reads them.
    async fn declare_queue(&self, spec: &QueueSpec) -> Result<(), Error> {
        crate::admin::declare(self, spec).await
    }

    async fn delete_queue(&self, name: &str) -> Result<(), Error> {
        crate::admin::delete(self, name).await
    }

    /// `ready`: entries never delivered, and delivered ones whose lease lapsed or that
    /// were released (another consumer may claim them now); `in_flight`: leased;
    /// `delayed`: waiting out a delay.
    async fn queue_depth(&self, name: &str) -> Result<QueueDepth, Error> {
        crate::admin::depth(self, name).await
    }

    async fn take_dead_letters(
        &self,
        dead_letter_queue: &str,
        max: usize,
    ) -> Result<Vec<DeadLetter>, Error> {
        crate::admin::take(self, dead_letter_queue, max).await
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

    async fn close(&self) -> Result<(), Error> {
        Ok(())
    }

    fn connections(&self) -> Vec<ConnectionHealth> {
        Vec::new()
    }
}

/// Reads a policy value; for the admin module and subscriptions.
pub(crate) async fn policy(
    broker: &RedisBroker,
    keys: &Keys,
) -> Result<conveyor::kit::QueuePolicy, Error> {
    let fields: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
        .arg(&keys.policy)
        .query_async(&mut broker.commands())
        .await
        .map_err(|e| failed("HGETALL", &keys.stream, Report(&e)))?;
    Ok(conveyor::kit::QueuePolicy::from_fields(|name| {
        fields.get(name).map(String::as_str)
    }))
}
