//! The connection to RabbitMQ: opened from a URL, recovered by itself after loss.
//!
//! One connection serves every subscription (a channel each), the publishers (a channel
//! each) and the broker-level declarations (one topology channel). Recovery is the
//! client's: when the connection drops, lapin reconnects with exponential backoff and
//! replays each channel's declarations, QoS, confirm mode and consumers on the new
//! connection, then subscriptions resume. Deliveries that were in flight on the dead
//! channel cannot be acked any more (their acks become no-ops), so the broker delivers
//! them again.

use std::sync::Arc;
use std::time::Duration;

use lapin::tcp::AMQPUriTcpExt;
use lapin::uri::AMQPScheme;
use lapin::{Channel, Connection, ConnectionProperties};
use tokio::sync::Mutex;

use crate::error::LapinError;
use crate::publisher::LapinPublisher;
use crate::source::LapinSource;
use crate::tls::{TlsSettings, is_tls_failure};
use crate::topology::{Binding, ExchangeSpec, QueueSpec};
use crate::url::redact_url;

/// How long a publisher waits for the broker's confirm by default.
pub const DEFAULT_CONFIRM_TIMEOUT: Duration = Duration::from_secs(30);

/// The slowest the reconnect backoff gets.
const RECONNECT_MAX_DELAY: Duration = Duration::from_secs(30);
/// The first reconnect delay.
const RECONNECT_MIN_DELAY: Duration = Duration::from_millis(100);

/// Settings for a [`LapinBroker`], built from a URL.
///
/// ```no_run
/// use conveyor_lapin::LapinBroker;
///
/// # async fn f() -> Result<(), conveyor_lapin::LapinError> {
/// let broker = LapinBroker::builder("amqp://guest:guest@127.0.0.1:5672/%2f")
///     .prefetch(64)
///     .connection_name("orders")
///     .connect()
///     .await?;
/// # Ok(()) }
/// ```
///
/// `amqps://` URLs connect through rustls and trust the webpki root certificates. A
/// broker whose certificate comes from a private CA needs that CA:
///
/// ```no_run
/// use conveyor_lapin::LapinBroker;
///
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// let ca = std::fs::read_to_string("/etc/rabbitmq/conveyor-tls/ca_certificate.pem")?;
/// let broker = LapinBroker::builder("amqps://app:s3cret@rabbit.internal:5671/%2f")
///     .tls_ca_certificate(ca)
///     .connect()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LapinBrokerBuilder {
    url: String,
    prefetch: Option<u16>,
    connection_name: Option<String>,
    confirm_timeout: Duration,
    first_connect_timeout: Duration,
    tls: TlsSettings,
}

/// How long [`LapinBrokerBuilder::connect`] waits for a first connection by default.
pub const DEFAULT_FIRST_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// The URL's password is redacted and key material left out.
impl std::fmt::Debug for LapinBrokerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LapinBrokerBuilder")
            .field("url", &redact_url(&self.url))
            .field("prefetch", &self.prefetch)
            .field("connection_name", &self.connection_name)
            .field("confirm_timeout", &self.confirm_timeout)
            .field("first_connect_timeout", &self.first_connect_timeout)
            .field("tls", &self.tls)
            .finish()
    }
}

impl LapinBrokerBuilder {
    /// The default prefetch window (basic.qos) of every subscription on this broker.
    /// A mount's own `prefetch(..)` wins over it; without either, the window covers
    /// what the mount can hold.
    pub fn prefetch(mut self, window: u16) -> Self {
        self.prefetch = Some(window);
        self
    }

    /// The connection name shown by `rabbitmqctl list_connections` and the management UI.
    pub fn connection_name(mut self, name: impl Into<String>) -> Self {
        self.connection_name = Some(name.into());
        self
    }

    /// How long a publish waits for the broker's confirm before failing (default 30 s).
    pub fn confirm_timeout(mut self, timeout: Duration) -> Self {
        self.confirm_timeout = timeout;
        self
    }

    /// How long [`connect`](Self::connect) keeps trying to reach a broker that does not
    /// answer before it fails with [`LapinError::ConnectTimeout`] (default 30 s), so a
    /// service started without its broker says so instead of waiting silently. Once
    /// connected, a lost connection is retried for as long as it takes.
    pub fn first_connect_timeout(mut self, timeout: Duration) -> Self {
        self.first_connect_timeout = timeout;
        self
    }

    /// Trusts the CA certificate(s) in `pem` (PEM text, one or more
    /// `-----BEGIN CERTIFICATE-----` blocks) for `amqps://`, besides the webpki roots:
    /// for brokers whose certificate a private CA signed. Call it again to trust more.
    /// The broker's certificate must still name the URL's host (a DNS name or IP
    /// address in its subjectAltName). Ignored, with a warning, for `amqp://`.
    ///
    /// `connect` fails with [`LapinError::Invalid`] if `pem` holds no certificate.
    pub fn tls_ca_certificate(mut self, pem: impl Into<String>) -> Self {
        self.tls.add_ca_certificate(pem.into());
        self
    }

    /// Presents a client certificate during the `amqps://` handshake, for brokers that
    /// verify their peers (`ssl_options.verify = verify_peer`, or certificate login with
    /// `rabbitmq_auth_mechanism_ssl`): `certificate_chain` is PEM (the client's
    /// certificate first, then any intermediates), `private_key` its PEM key (PKCS#8,
    /// PKCS#1 or SEC1, unencrypted). Ignored, with a warning, for `amqp://`.
    pub fn tls_client_identity(
        mut self,
        certificate_chain: impl Into<String>,
        private_key: impl Into<String>,
    ) -> Self {
        self.tls
            .set_identity(certificate_chain.into(), private_key.into());
        self
    }

    /// Connects. `amqps://` URLs use TLS through rustls (see
    /// [`tls_ca_certificate`](Self::tls_ca_certificate)); the same TLS settings serve
    /// every reconnect.
    ///
    /// A first `amqps://` connection whose TLS handshake fails (an untrusted or
    /// misnamed server certificate, say) is an error right away, since trying again
    /// would not help; a broker that cannot be reached yet is retried with backoff, as
    /// a lost connection is.
    pub async fn connect(self) -> Result<LapinBroker, LapinError> {
        let redacted = redact_url(&self.url);
        let uri: lapin::uri::AMQPUri =
            self.url
                .parse()
                .map_err(|reason: String| LapinError::InvalidUrl {
                    url: redacted.clone(),
                    reason: reason.replace(&self.url, &redacted),
                })?;
        let mut properties = ConnectionProperties::default()
            .enable_auto_recover()
            .configure_backoff(|backoff| {
                backoff
                    .with_min_delay(RECONNECT_MIN_DELAY)
                    .with_max_delay(RECONNECT_MAX_DELAY)
                    .with_jitter()
                    .without_max_times()
            });
        if let Some(name) = &self.connection_name {
            properties = properties.with_connection_name(name.as_str().into());
        }
        let tls = self.tls.to_lapin()?;
        let runtime = lapin::runtime::default_runtime().map_err(|source| LapinError::Connect {
            url: redacted.clone(),
            source,
        })?;
        // The first TLS connection is made here, so that a handshake failure is
        // reported instead of retried forever; lapin gets the stream, and makes every
        // later connection itself with the same settings.
        let mut first = None;
        if uri.scheme == AMQPScheme::AMQPS {
            match uri.connect_with_config_async(tls.as_ref(), &runtime).await {
                Ok(stream) => first = Some(stream),
                Err(error) if is_tls_failure(&error) => {
                    return Err(LapinError::Connect {
                        url: redacted,
                        source: error.into(),
                    });
                }
                Err(error) => {
                    tracing::warn!(url = %redacted, %error, "cannot reach RabbitMQ yet; retrying");
                }
            }
        } else if self.tls.is_configured() {
            tracing::warn!(url = %redacted, "TLS settings are ignored for an amqp:// URL");
        }
        let first = std::sync::Mutex::new(first);
        let connecting = Connection::connector(
            uri,
            runtime,
            async move |uri, runtime| {
                let ready = first.lock().ok().and_then(|mut slot| slot.take());
                match ready {
                    Some(stream) => Ok(stream),
                    None => uri
                        .connect_with_config_async(tls.as_ref(), &runtime)
                        .await
                        .map_err(lapin::Error::from),
                }
            },
            properties,
        );
        let connection = tokio::time::timeout(self.first_connect_timeout, connecting)
            .await
            .map_err(|_| LapinError::ConnectTimeout {
                url: redacted.clone(),
                after: self.first_connect_timeout,
            })?
            .map_err(|source| LapinError::Connect {
                url: redacted.clone(),
                source,
            })?;
        tracing::info!(url = %redacted, "connected to RabbitMQ");
        tokio::spawn(log_events(connection.events_listener(), redacted.clone()));
        Ok(LapinBroker {
            inner: Arc::new(BrokerInner {
                connection,
                url: redacted,
                prefetch: self.prefetch,
                confirm_timeout: self.confirm_timeout,
                topology: Mutex::new(None),
            }),
        })
    }
}

/// A connection to RabbitMQ: the factory for sources (queues to mount handlers on),
/// publishers and declarations. Cloning gives another handle to the same connection.
///
/// ```no_run
/// use conveyor::App;
/// use conveyor_lapin::{LapinBroker, QueueSpec};
///
/// async fn handle(conveyor::Json(n): conveyor::Json<u64>) {}
///
/// # async fn f() -> Result<(), conveyor::Error> {
/// let broker = LapinBroker::connect("amqp://guest:guest@127.0.0.1:5672").await?;
/// App::new("numbers")
///     .mount(broker.queue(QueueSpec::new("numbers").quorum()), handle, |m| m.workers(4).by_key())
///     .run()
///     .await
/// # }
/// ```
#[derive(Clone)]
pub struct LapinBroker {
    pub(crate) inner: Arc<BrokerInner>,
}

pub(crate) struct BrokerInner {
    pub(crate) connection: Connection,
    pub(crate) url: String,
    pub(crate) prefetch: Option<u16>,
    pub(crate) confirm_timeout: Duration,
    /// The channel broker-level declarations are made on (and replayed from).
    topology: Mutex<Option<Channel>>,
}

impl std::fmt::Debug for LapinBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LapinBroker")
            .field("url", &self.inner.url)
            .field("prefetch", &self.inner.prefetch)
            .finish_non_exhaustive()
    }
}

impl LapinBroker {
    /// Connects to `url` with the default settings.
    pub async fn connect(url: &str) -> Result<LapinBroker, LapinError> {
        Self::builder(url).connect().await
    }

    /// Settings for a connection to `url` (`amqp://user:pass@host:port/vhost`, or
    /// `amqps://` for TLS).
    pub fn builder(url: impl Into<String>) -> LapinBrokerBuilder {
        LapinBrokerBuilder {
            url: url.into(),
            prefetch: None,
            connection_name: None,
            confirm_timeout: DEFAULT_CONFIRM_TIMEOUT,
            first_connect_timeout: DEFAULT_FIRST_CONNECT_TIMEOUT,
            tls: TlsSettings::default(),
        }
    }

    /// The broker URL, password redacted.
    pub fn url(&self) -> &str {
        &self.inner.url
    }

    /// Closes the connection. Subscriptions still open end, and their unacked
    /// deliveries go back to their queues.
    pub async fn close(&self) -> Result<(), LapinError> {
        self.inner
            .connection
            .close(200, "closed by the application".into())
            .await
            .map_err(|source| LapinError::Channel {
                purpose: "connection".to_string(),
                source,
            })
    }

    /// A queue to mount a handler on: a name (a durable queue with no arguments) or a
    /// [`QueueSpec`]. The queue is declared (or, passive, checked) when the subscription
    /// starts.
    pub fn queue(&self, queue: impl Into<QueueSpec>) -> LapinSource {
        LapinSource::new(self.clone(), queue.into())
    }

    /// A publisher on its own channel, with publisher confirms.
    pub async fn publisher(&self) -> Result<LapinPublisher, LapinError> {
        LapinPublisher::open(self.clone()).await
    }

    /// Declares a queue now (or checks it, if passive).
    pub async fn declare_queue(&self, queue: &QueueSpec) -> Result<(), LapinError> {
        self.on_topology_channel(|channel| async move { queue.declare(&channel).await.map(drop) })
            .await
    }

    /// Declares an exchange now (or checks it, if passive).
    pub async fn declare_exchange(&self, exchange: &ExchangeSpec) -> Result<(), LapinError> {
        self.on_topology_channel(|channel| async move { exchange.declare(&channel).await })
            .await
    }

    /// Binds a queue to an exchange.
    pub async fn bind(&self, binding: &Binding) -> Result<(), LapinError> {
        self.on_topology_channel(|channel| async move { binding.declare(&channel).await })
            .await
    }

    /// Deletes a queue and the messages in it (for tests and tooling).
    pub async fn delete_queue(&self, queue: &str) -> Result<(), LapinError> {
        let name = crate::error::short("queue name", queue)?;
        self.on_topology_channel(|channel| async move {
            channel
                .queue_delete(name, lapin::options::QueueDeleteOptions::default())
                .await
                .map(drop)
                .map_err(|source| LapinError::Declare {
                    what: "queue deletion of",
                    name: queue.to_string(),
                    source,
                })
        })
        .await
    }

    /// Deletes an exchange (for tests and tooling).
    pub async fn delete_exchange(&self, exchange: &str) -> Result<(), LapinError> {
        let name = crate::error::short("exchange name", exchange)?;
        self.on_topology_channel(|channel| async move {
            channel
                .exchange_delete(name, lapin::options::ExchangeDeleteOptions::default())
                .await
                .map_err(|source| LapinError::Declare {
                    what: "exchange deletion of",
                    name: exchange.to_string(),
                    source,
                })
        })
        .await
    }

    /// How many messages are ready in `queue` (not counting those delivered and unacked).
    pub async fn ready_count(&self, queue: &str) -> Result<u32, LapinError> {
        let channel = self.open_channel(queue).await?;
        let result = QueueSpec::new(queue).passive().declare(&channel).await;
        let _ = channel.close(200, "done".into()).await;
        result
    }

    /// Opens a channel for `purpose` (named in errors).
    pub(crate) async fn open_channel(&self, purpose: &str) -> Result<Channel, LapinError> {
        self.inner
            .connection
            .create_channel()
            .await
            .map_err(|source| LapinError::Channel {
                purpose: purpose.to_string(),
                source,
            })
    }

    /// Runs `f` on the topology channel, opening it first if need be. A failed
    /// declaration closes the channel on the broker's side, so the next call opens a new
    /// one.
    async fn on_topology_channel<F, Fut, T>(&self, f: F) -> Result<T, LapinError>
    where
        F: FnOnce(Channel) -> Fut,
        Fut: Future<Output = Result<T, LapinError>>,
    {
        let mut slot = self.inner.topology.lock().await;
        let channel = match slot.as_ref() {
            Some(channel) if channel.status().connected() => channel.clone(),
            _ => {
                let channel = self.open_channel("topology").await?;
                *slot = Some(channel.clone());
                channel
            }
        };
        f(channel).await
    }
}

/// Logs what lapin reports about the connection: errors it does not recover from, and
/// the broker's flow control. (Recovery itself is silent here: lapin logs the loss, and
/// subscriptions and publishers simply carry on once it has reconnected.)
async fn log_events(events: impl futures_util::Stream<Item = lapin::Event>, url: String) {
    use futures_util::StreamExt;
    let mut events = std::pin::pin!(events);
    while let Some(event) = events.next().await {
        match event {
            lapin::Event::Error(error) => {
                tracing::warn!(url = %url, %error, "RabbitMQ connection error");
            }
            lapin::Event::ConnectionBlocked(reason) => {
                tracing::warn!(url = %url, reason, "RabbitMQ blocked the connection");
            }
            lapin::Event::ConnectionUnblocked => {
                tracing::info!(url = %url, "RabbitMQ unblocked the connection");
            }
            lapin::Event::Connected => {
                tracing::info!(url = %url, "RabbitMQ connection (re)established");
            }
            _ => {}
        }
    }
}

/// An app given this broker with `App::broker` closes its connection at the end of
/// shutdown, after every mount has settled its deliveries.
impl conveyor::Broker for LapinBroker {
    async fn close(&self) -> Result<(), conveyor::Error> {
        LapinBroker::close(self)
            .await
            .map_err(conveyor::Error::from)
    }
}
