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
use crate::publisher::LapinPublisher;
use crate::queue::LapinQueue;
use crate::redeclare::{Declared, Record};
use crate::request::Requester;
use crate::spec::{Declaration, check, delay_queue_of};
use crate::tls::{TlsSettings, is_tls_failure};
use crate::topology::{Binding, ExchangeSpec};
use crate::url::redact_url;

/// How long a publisher waits for the broker's confirm by default.
pub const DEFAULT_CONFIRM_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a failed first connect waits for lapin's thread to give the connection up,
/// at most (it takes moments: see [`LAPIN_RETRIES`]).
const STOP_GRACE: Duration = Duration::from_secs(5);

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
    reconnect_handshake_timeout: Duration,
    tls: TlsSettings,
}

/// How long [`LapinBrokerBuilder::connect`] waits for a first connection by default.
pub const DEFAULT_FIRST_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a reconnect's AMQP handshake waits for the broker by default: RabbitMQ's own
/// `handshake_timeout`, and the Java client's.
pub const DEFAULT_RECONNECT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The URL's password is redacted and key material left out.
impl std::fmt::Debug for LapinBrokerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LapinBrokerBuilder")
            .field("url", &redact_url(&self.url))
            .field("prefetch", &self.prefetch)
            .field("connection_name", &self.connection_name)
            .field("confirm_timeout", &self.confirm_timeout)
            .field("first_connect_timeout", &self.first_connect_timeout)
            .field(
                "reconnect_handshake_timeout",
                &self.reconnect_handshake_timeout,
            )
            .field("tls", &self.tls)
            .finish()
    }
}

impl LapinBrokerBuilder {
    /// The default prefetch window (basic.qos) of every subscription on this broker.
    /// A queue's own prefetch (`broker.queue(q).prefetch(n)`) wins over it; without
    /// either, the window covers what the mount can hold. At least 1: `connect` refuses
    /// 0, which AMQP takes for no limit at all.
    pub fn prefetch(mut self, window: u16) -> Self {
        self.prefetch = Some(window);
        self
    }

    /// The connection name shown by `rabbitmqctl list_connections` and the management UI.
    pub fn connection_name(mut self, name: impl Into<String>) -> Self {
        self.connection_name = Some(name.into());
        self
    }

    /// How long a publish waits for the broker's confirm before failing (default 30 s),
    /// and, after a connection loss, for the connection to recover before it is sent.
    pub fn confirm_timeout(mut self, timeout: Duration) -> Self {
        self.confirm_timeout = timeout;
        self
    }

    /// How long [`connect`](Self::connect) keeps trying to reach the broker (default
    /// 30 s), so that a service started without its broker says so instead of waiting
    /// silently. It then fails with the last attempt's cause: [`LapinError::Connect`]
    /// when the broker refused (`connection refused`, a TLS failure, the connection
    /// closed during the handshake), [`LapinError::ConnectTimeout`] when an attempt was
    /// still waiting for an answer. Once connected, a lost connection is retried for as
    /// long as it takes (but see the crate docs on 500 failed handshakes in a row).
    pub fn first_connect_timeout(mut self, timeout: Duration) -> Self {
        self.first_connect_timeout = timeout;
        self
    }

    /// How long a reconnect's AMQP handshake may wait for the broker once its connection
    /// is open (default 10 s, [`DEFAULT_RECONNECT_HANDSHAKE_TIMEOUT`]) before it is cut and
    /// tried again: a load balancer may accept the connection with no broker answering
    /// behind it. Raise it with the broker's own `handshake_timeout` where logging in
    /// is slow (an LDAP backend, say). Must not be zero.
    pub fn reconnect_handshake_timeout(mut self, timeout: Duration) -> Self {
        self.reconnect_handshake_timeout = timeout;
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
    /// A broker that cannot be reached yet is retried with backoff, from 100 ms up to
    /// 30 s, until [`first_connect_timeout`](Self::first_connect_timeout); a TLS
    /// handshake that fails (an untrusted or misnamed server certificate, say) and a
    /// refused login are errors right away, since trying again would not help. A failed
    /// first connect leaves nothing behind: when it returns, the attempts have stopped,
    /// a connection it had opened is closed, and lapin's connection thread has ended.
    pub async fn connect(self) -> Result<LapinBroker, LapinError> {
        let redacted = redact_url(&self.url);
        if self.prefetch == Some(0) {
            return Err(zero_prefetch());
        }
        if self.reconnect_handshake_timeout.is_zero() {
            // Every reconnect would be cut before the broker could answer.
            return Err(LapinError::Invalid {
                what: "reconnect handshake timeout",
                reason: "it must be longer than zero".into(),
            });
        }
        // Two connections: RabbitMQ blocks a connection that publishes during a resource
        // alarm, and lapin then writes nothing on it, acks included. Consuming on one
        // and publishing on the other keeps the acks flowing while publishes wait.
        let publishing_name = self
            .connection_name
            .as_ref()
            .map(|name| format!("{name} (publishing)"));
        let unblocked = Arc::new(tokio::sync::Notify::new());
        let (consuming, publishing) = tokio::join!(
            self.dial(
                &redacted,
                self.connection_name.clone(),
                "consuming",
                unblocked.clone()
            ),
            self.dial(&redacted, publishing_name, "publishing", unblocked.clone())
        );
        let ((consuming, consuming_dialer), (publishing, publishing_dialer)) =
            match (consuming, publishing) {
                (Ok(consuming), Ok(publishing)) => (consuming, publishing),
                (Ok((opened, dialer)), Err(error)) | (Err(error), Ok((opened, dialer))) => {
                    // Nothing is left behind: the one that opened is closed again.
                    let _ = close(&opened, &dialer, "the other connection failed").await;
                    return Err(error);
                }
                (Err(error), Err(_)) => return Err(error),
            };
        tracing::info!(url = %redacted, "connected to RabbitMQ");
        Ok(LapinBroker {
            inner: Arc::new(BrokerInner {
                connection: consuming,
                publishing,
                dialers: [consuming_dialer, publishing_dialer],
                unblocked,
                url: redacted,
                prefetch: self.prefetch,
                confirm_timeout: self.confirm_timeout,
                topology: Mutex::new(None),
                publisher: std::sync::Mutex::new(None),
                opening_publisher: Mutex::new(()),
                requester: Mutex::new(None),
                declared: std::sync::Mutex::default(),
                topology_record: std::sync::Mutex::default(),
                delay_queues: std::sync::Mutex::default(),
                missing_delay_queues: std::sync::Mutex::default(),
            }),
        })
    }

    /// Opens one connection, named `name` on the broker, and has its events logged;
    /// `purpose` names it where it has no name.
    async fn dial(
        &self,
        redacted: &str,
        name: Option<String>,
        purpose: &'static str,
        unblocked: Arc<tokio::sync::Notify>,
    ) -> Result<(Connection, Arc<Dialer>), LapinError> {
        let shown_as = name.clone().unwrap_or_else(|| purpose.to_string());
        let redacted = redacted.to_string();
        let uri = crate::url::parse(&self.url).map_err(|reason| LapinError::InvalidUrl {
            url: redacted.clone(),
            reason,
        })?;
        let mut properties = ConnectionProperties::default()
            .enable_auto_recover()
            // Bounded and without delay: the dialer paces the attempts and keeps trying
            // for as long as it is to, and this lets lapin's thread end soon after a first
            // connect failed (see `dialer`).
            .configure_backoff(|backoff| {
                backoff
                    .with_min_delay(Duration::ZERO)
                    .with_max_delay(Duration::ZERO)
                    .with_max_times(LAPIN_RETRIES)
            });
        if let Some(name) = name {
            properties = properties.with_connection_name(name.into());
        }
        let tls = self.tls.to_lapin()?;
        let amqps = uri.scheme == AMQPScheme::AMQPS;
        if !amqps && self.tls.is_configured() {
            tracing::warn!(url = %redacted, "TLS settings are ignored for an amqp:// URL");
        }
        let runtime = lapin::runtime::default_runtime().map_err(|source| LapinError::Connect {
            url: redacted.clone(),
            source,
        })?;
        let deadline = conveyor::kit::due_after(self.first_connect_timeout);
        let dialer = Arc::new(Dialer::new(
            redacted.clone(),
            deadline,
            self.reconnect_handshake_timeout,
        ));
        let handle = dialer::Handle(dialer.clone());
        // lapin calls this for every stream of the connection: the first connect's, and
        // each reconnect's, with the same TLS settings.
        let connecting = Connection::connector(
            uri,
            runtime,
            async move |uri, runtime| {
                let dialer = &handle.0;
                loop {
                    let budget = dialer.next_attempt().await?;
                    let attempt = uri.connect_with_config_async(tls.as_ref(), &runtime);
                    match tokio::time::timeout(budget, attempt).await {
                        Ok(Ok(stream)) => {
                            let socket = match &stream {
                                AsyncTcpStream::Plain(plain) => Some(plain.get_ref()),
                                AsyncTcpStream::Rustls(tls) => Some(tls.get_ref().0.get_ref()),
                                _ => None,
                            };
                            if dialer.opened(socket) {
                                return Ok(stream);
                            }
                        }
                        // A TLS handshake that failed (an untrusted or misnamed server
                        // certificate, say) would fail again: the first connect ends there.
                        Ok(Err(error)) => {
                            let fatal = amqps && is_tls_failure(&error);
                            dialer.failed(error, fatal);
                        }
                        Err(_) => dialer.timed_out(),
                    }
                }
            },
            properties,
        );
        tokio::pin!(connecting);
        let outcome = tokio::select! {
            outcome = &mut connecting => Some(outcome),
            () = tokio::time::sleep_until(deadline) => None,
        };
        let connection = match outcome {
            Some(Ok(connection)) => {
                let status = connection.status().clone();
                dialer.follow(move || status.connected());
                // The first connect: no recovery to count.
                let _ = dialer.connected();
                connection
            }
            failed => {
                let (failure, refused_lapin) = dialer.give_up();
                // The dialer fails lapin's calls from now on, and a handshake under way
                // is cut: lapin's thread gives the connection up within moments. Waiting
                // for that means nothing this call started goes on once it has returned.
                if tokio::time::timeout(STOP_GRACE, dialer.stopped())
                    .await
                    .is_err()
                {
                    tracing::debug!(url = %redacted, "lapin is slow to stop connecting");
                }
                // lapin's own error, unless the dialer caused it: the broker refused the
                // handshake (credentials, vhost, ...).
                let handshake_error = match failed {
                    Some(Err(error)) if !refused_lapin => Some(error),
                    _ => None,
                };
                return Err(match (handshake_error, failure) {
                    (Some(source), _) => LapinError::Connect {
                        url: redacted,
                        source,
                    },
                    (None, Some(Failure::Failed(error))) => LapinError::Connect {
                        url: redacted,
                        source: error.into(),
                    },
                    (None, Some(Failure::TimedOut(stage))) => LapinError::ConnectTimeout {
                        url: redacted,
                        after: self.first_connect_timeout,
                        waiting_for: stage.waiting_for(),
                    },
                    (None, None) => LapinError::ConnectTimeout {
                        url: redacted,
                        after: self.first_connect_timeout,
                        waiting_for: Stage::Connection.waiting_for(),
                    },
                });
            }
        };
        tokio::spawn(log_events(
            connection.events_listener(),
            Watched {
                url: redacted,
                name: shown_as,
            },
            dialer.clone(),
            unblocked,
        ));
        Ok((connection, dialer))
    }
}

/// The error for a prefetch window of 0, which AMQP's `basic.qos` takes for no limit:
/// the broker would push the whole queue to one consumer.
pub(crate) fn zero_prefetch() -> LapinError {
    LapinError::Invalid {
        what: "prefetch",
        reason: "it must be at least 1 (AMQP takes 0 for no limit at all)".into(),
    }
}

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
            reconnect_handshake_timeout: DEFAULT_RECONNECT_HANDSHAKE_TIMEOUT,
            tls: TlsSettings::default(),
        }
    }

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
    pub async fn publisher(&self) -> Result<LapinPublisher, LapinError> {
        self.publishing_connected().await;
        LapinPublisher::open(self.clone()).await
    }

    /// Declares the queue `spec` describes, with its RabbitMQ settings
    /// ([`RabbitQueueSpec`](crate::RabbitQueueSpec), which also says how the portable
    /// ones map). Declaring a queue that exists with the same settings succeeds; with
    /// others, RabbitMQ refuses (PRECONDITION_FAILED), since it cannot change them.
    ///
    /// Settings RabbitMQ cannot take, and a dead-letter queue that does not exist, are
    /// [`conveyor::Error::Config`]; a broker failure is [`conveyor::Error::Transport`]
    /// with the [`LapinError`] as its source.
    pub async fn declare_queue(&self, spec: &QueueSpec) -> Result<(), conveyor::Error> {
        let declaration = Declaration::from_spec(spec)?;
        if let Some(policy) = spec.dead_letter()
            && self.ready_in(&policy.queue).await?.is_none()
        {
            return Err(conveyor::Error::config(format!(
                "the dead-letter queue `{}` of queue `{}` does not exist; declare it first",
                policy.queue,
                spec.name()
            )));
        }
        let declaration = Arc::new(declaration);
        let declared = &declaration;
        self.on_topology_channel(|channel| async move {
            declared.declare(&channel).await?;
            self.record(Declared::Queue(declared.clone()));
            Ok(())
        })
        .await?;
        conveyor::kit::lock(&self.inner.declared).insert(spec.name().to_string(), declaration);
        Ok(())
    }

    /// Deletes the queue `name`, the messages in it, and its delay queue (the one its
    /// subscriptions on this broker used, else `<name>.delay`) with the messages
    /// waiting there. Deleting a queue that does not exist succeeds.
    pub async fn delete_queue(&self, name: &str) -> Result<(), conveyor::Error> {
        short("queue name", name)?;
        let delay_queue = self
            .remembered_delay_queue(name)
            .unwrap_or_else(|| delay_queue_of(name));
        // The delay queue dead-letters into its queue: deleted first, it cannot move a
        // message into the queue about to go.
        for queue in [delay_queue.as_str(), name] {
            // A name that is too long for AMQP is no queue's name: nothing to delete.
            let Ok(amqp_name) = short("queue name", queue) else {
                continue;
            };
            // On the topology channel, so that it forgets a declaration of the queue it
            // would otherwise replay after a lost connection.
            self.on_topology_channel(|channel| async move {
                match channel
                    .queue_delete(amqp_name, lapin::options::QueueDeleteOptions::default())
                    .await
                {
                    Ok(_) => {}
                    Err(e) if is_not_found(&e) => {}
                    Err(source) => {
                        return Err(LapinError::Declare {
                            what: "queue deletion of",
                            name: queue.to_string(),
                            source,
                        });
                    }
                }
                conveyor::kit::lock(&self.inner.topology_record).queue_deleted(queue);
                Ok(())
            })
            .await?;
        }
        conveyor::kit::lock(&self.inner.declared).remove(name);
        conveyor::kit::lock(&self.inner.delay_queues).remove(name);
        Ok(())
    }

    /// How many messages the queue `name` holds: `ready` from a passive declare (which
    /// leaves the queue alone), `delayed` from its delay queue (the one a subscription of
    /// this broker declared, else `<name>.delay` where it exists, as another process's
    /// subscriptions declare it; found missing, it is looked for again after a minute),
    /// and `in_flight` unknown (`None`: AMQP does not tell how
    /// many are delivered and unacked). A missing queue is an error
    /// ([`LapinError::MissingQueue`] as the source).
    pub async fn queue_depth(&self, name: &str) -> Result<QueueDepth, conveyor::Error> {
        let remembered = self.remembered_delay_queue(name);
        let guessed = remembered.is_none();
        let delay_queue =
            remembered.or_else(|| (!self.delay_queue_missing(name)).then(|| delay_queue_of(name)));
        let channel = self.open_channel(name).await?;
        let ready = check(&channel, name).await;
        // The delay queue on the same channel: if it is missing, the failed check closes
        // the channel, which is done with anyway.
        let delayed = match (&ready, &delay_queue) {
            (Ok(_), Some(delay_queue)) => check(&channel, delay_queue).await.ok(),
            _ => None,
        };
        if guessed && ready.is_ok() && delayed.is_none() {
            conveyor::kit::lock(&self.inner.missing_delay_queues)
                .insert(name.to_string(), std::time::Instant::now());
        }
        close_quietly(channel).await;
        let mut depth = QueueDepth::new(ready?.into());
        if let Some(delayed) = delayed {
            depth = depth.delayed(delayed.into());
        }
        Ok(depth)
    }

    /// Takes up to `max` messages ready in `dead_letter_queue` out of it (`basic.get`),
    /// in queue order, without waiting for more. Each becomes a [`DeadLetter`] with its
    /// headers read as a subscription reads them, its partition key, and the reason
    /// Conveyor rejected it with (none where RabbitMQ dead-lettered it by itself: a
    /// delivery limit, an expiry, a nack; its `x-death` header is an array, left out of
    /// the headers). They are acked all at once at the end, so on an error none is taken.
    pub async fn take_dead_letters(
        &self,
        dead_letter_queue: &str,
        max: usize,
    ) -> Result<Vec<DeadLetter>, conveyor::Error> {
        let queue = short("queue name", dead_letter_queue)?;
        if max == 0 {
            return Ok(Vec::new());
        }
        let channel = self.open_channel(dead_letter_queue).await?;
        let taken = take(&channel, queue, dead_letter_queue, max).await;
        close_quietly(channel).await;
        Ok(taken?)
    }

    /// Closes the connections. Subscriptions still open end, and their unacked
    /// deliveries go back to their queues.
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

    /// Declares an exchange now (or checks it, if passive).
    pub async fn declare_exchange(&self, exchange: &ExchangeSpec) -> Result<(), conveyor::Error> {
        if exchange.is_passive() {
            // On a channel of its own: the topology channel would check it again after
            // a lost connection, and one deleted since would fail that channel's recovery.
            let channel = self.open_channel("exchange check").await?;
            let checked = exchange.declare(&channel).await;
            close_quietly(channel).await;
            return checked.map_err(conveyor::Error::from);
        }
        self.on_topology_channel(|channel| async move {
            exchange.declare(&channel).await?;
            self.record(Declared::Exchange(exchange.clone()));
            Ok(())
        })
        .await
        .map_err(conveyor::Error::from)
    }

    /// Binds a queue to an exchange.
    pub async fn bind(&self, binding: &Binding) -> Result<(), conveyor::Error> {
        self.on_topology_channel(|channel| async move {
            binding.declare(&channel).await?;
            self.record(Declared::Binding(binding.clone()));
            Ok(())
        })
        .await
        .map_err(conveyor::Error::from)
    }

    /// Notes a declaration that succeeded, under the topology channel's lock: a record
    /// made again on a new channel, and a deletion, are then never between the two.
    fn record(&self, declared: Declared) {
        conveyor::kit::lock(&self.inner.topology_record).declared(declared);
    }

    /// Deletes an exchange. Deleting one that does not exist succeeds.
    pub async fn delete_exchange(&self, exchange: &str) -> Result<(), conveyor::Error> {
        let name = short("exchange name", exchange)?;
        self.on_topology_channel(|channel| async move {
            match channel
                .exchange_delete(name, lapin::options::ExchangeDeleteOptions::default())
                .await
            {
                Ok(()) => {}
                Err(e) if is_not_found(&e) => {}
                Err(source) => {
                    return Err(LapinError::Declare {
                        what: "exchange deletion of",
                        name: exchange.to_string(),
                        source,
                    });
                }
            }
            conveyor::kit::lock(&self.inner.topology_record).exchange_deleted(exchange);
            Ok(())
        })
        .await
        .map_err(conveyor::Error::from)
    }

    /// How many messages are ready in `queue`, or `None` when it does not exist: a
    /// passive declare on a channel of its own, since a missing queue closes it.
    pub(crate) async fn ready_in(&self, queue: &str) -> Result<Option<u32>, LapinError> {
        // Named by its role: the error of a subscription or a declaration this check is
        // part of names the queue.
        let channel = self.open_channel("queue check").await?;
        let result = check(&channel, queue).await;
        close_quietly(channel).await;
        match result {
            Ok(ready) => Ok(Some(ready)),
            Err(LapinError::MissingQueue { .. }) => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// The declaration this broker made of `queue`, if it declared it.
    pub(crate) fn declaration(&self, queue: &str) -> Option<Arc<Declaration>> {
        conveyor::kit::lock(&self.inner.declared)
            .get(queue)
            .cloned()
    }

    /// Whether `queue_depth` found `queue`'s default delay queue missing lately.
    fn delay_queue_missing(&self, queue: &str) -> bool {
        conveyor::kit::lock(&self.inner.missing_delay_queues)
            .get(queue)
            .is_some_and(|since| since.elapsed() < MISSING_DELAY_QUEUE_RECHECK)
    }

    /// The delay queue a subscription of this broker declared for `queue`, if any.
    fn remembered_delay_queue(&self, queue: &str) -> Option<String> {
        conveyor::kit::lock(&self.inner.delay_queues)
            .get(queue)
            .cloned()
    }

    /// Remembers that a subscription declared `delay_queue` for `queue`.
    pub(crate) fn remember_delay_queue(&self, queue: &str, delay_queue: &str) {
        conveyor::kit::lock(&self.inner.delay_queues)
            .insert(queue.to_string(), delay_queue.to_string());
    }

    /// The publisher behind [`Publisher`] on the broker: the one opened before, unless
    /// its channel has closed (a channel error, or the connection closed for good), in
    /// which case a new one. A channel waiting for the connection to recover is kept:
    /// the publish waits for the recovery.
    ///
    /// Publishing takes a plain lock and a reference count; only opening a publisher
    /// waits on an async lock.
    async fn confirm_publisher(&self) -> Result<Arc<LapinPublisher>, LapinError> {
        let current = || {
            conveyor::kit::lock(&self.inner.publisher)
                .as_ref()
                .filter(|publisher| publisher.is_open())
                .cloned()
        };
        if let Some(publisher) = current() {
            return Ok(publisher);
        }
        self.publishing_connected().await;
        let _opening = self.inner.opening_publisher.lock().await;
        // Another task may have opened one while this one waited.
        if let Some(publisher) = current() {
            return Ok(publisher);
        }
        let publisher = Arc::new(LapinPublisher::open(self.clone()).await?);
        *conveyor::kit::lock(&self.inner.publisher) = Some(publisher.clone());
        Ok(publisher)
    }

    /// The requester, opened by the first request (and again once its channel closed).
    async fn requester(&self) -> Result<Arc<Requester>, LapinError> {
        self.publishing_connected().await;
        let mut requester = self.inner.requester.lock().await;
        if let Some(open) = requester.as_ref().filter(|r| r.is_open()) {
            return Ok(open.clone());
        }
        if let Some(closed) = requester.take() {
            closed.close().await;
        }
        let opened = Arc::new(Requester::open(self).await?);
        *requester = Some(opened.clone());
        Ok(opened)
    }

    /// Opens a channel for `purpose` (named in errors) on the consuming connection.
    pub(crate) async fn open_channel(&self, purpose: &str) -> Result<Channel, LapinError> {
        on(&self.inner.connection, purpose).await
    }

    /// Opens a confirm-mode channel for `purpose` (named in errors) on the publishing
    /// connection, within the confirm timeout. A connection a resource alarm blocks
    /// writes nothing, a channel's opening included: unbounded, the opening would wait
    /// for the alarm's end, and every publish waiting on the lock it is opened under with
    /// it. [`LapinError::Blocked`] when the connection is blocked at the timeout.
    pub(crate) async fn open_publishing_channel(
        &self,
        purpose: &str,
    ) -> Result<Channel, LapinError> {
        let failed = |source| LapinError::Channel {
            purpose: purpose.to_string(),
            source,
        };
        let opening = async {
            self.publishing_unblocked().await;
            let channel = on(&self.inner.publishing, purpose).await?;
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await
                .map_err(failed)?;
            Ok(channel)
        };
        let after = self.inner.confirm_timeout;
        match tokio::time::timeout(after, opening).await {
            Ok(opened) => opened,
            Err(_) => {
                let destination = purpose.to_string();
                Err(if self.inner.publishing.status().blocked() {
                    LapinError::Blocked { destination, after }
                } else {
                    LapinError::ConfirmTimeout { destination, after }
                })
            }
        }
    }

    /// Resolves once the publishing connection is not being recovered, or the confirm
    /// timeout has passed. lapin opens no channel on a connection it is recovering: a
    /// publish about to open one waits for the recovery as a publish on an open channel
    /// does (then the open fails, saying why). A connection closed for good (by
    /// [`close`](Self::close)) is not waited for. Waited for before any lock a channel is
    /// opened under, so that publishes waiting on that lock do not each wait the timeout
    /// in turn.
    pub(crate) async fn publishing_connected(&self) {
        let status = self.inner.publishing.status();
        let recovered = conveyor::kit::wait_for(&self.inner.unblocked, || {
            (!status.connecting() && !status.reconnecting()).then_some(())
        });
        let _ = tokio::time::timeout(self.inner.confirm_timeout, recovered).await;
    }

    /// Resolves once the publishing connection is not blocked by a resource alarm (at
    /// once, mostly).
    pub(crate) async fn publishing_unblocked(&self) {
        self.publishing_block().over().await;
    }

    /// The publishing connection's block by a resource alarm, to wait for its end.
    pub(crate) fn publishing_block(&self) -> Block {
        Block {
            status: self.inner.publishing.status().clone(),
            unblocked: self.inner.unblocked.clone(),
        }
    }

    /// The publishing connection's negotiated settings, for its frame limit.
    pub(crate) fn publishing_settings(&self) -> lapin::Configuration {
        self.inner.publishing.configuration().clone()
    }

    /// The publishing connection's frame limit (frame_max), read without a copy of its
    /// settings.
    pub(crate) fn publishing_frame_max(&self) -> u32 {
        self.inner.publishing.configuration().frame_max()
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
            None => slot.insert(self.open_channel("topology").await?).clone(),
            Some(_) => slot.insert(self.next_topology_channel().await?).clone(),
        };
        let done = f(channel.clone()).await;
        // A refusal closed the channel: the next one takes over its declarations now,
        // before the connection can be lost (else only at the next declaration).
        let status = channel.status();
        if done.is_err() && !status.connected() && !status.reconnecting() {
            match self.next_topology_channel().await {
                Ok(next) => *slot = Some(next),
                Err(error) => tracing::warn!(
                    error = %conveyor::Report(&error),
                    "cannot open a topology channel; trying again at the next declaration"
                ),
            }
        }
        done
    }

    /// A topology channel to replace one the broker closed, with the declarations made
    /// on the ones before it.
    async fn next_topology_channel(&self) -> Result<Channel, LapinError> {
        let channel = self.open_channel("topology").await?;
        self.declare_again(channel).await
    }

    /// Declares on `channel`, a new topology channel, what was declared on the ones
    /// before it, so that it declares them again after a lost connection (see
    /// [`crate::redeclare`]). One the broker refuses now (declared otherwise since, or a
    /// binding whose exchange is gone) is dropped from the record with a warning; the
    /// refusal closed the channel, and lapin re-declares only what a channel itself
    /// declared, so the whole record goes again on a new one. A connection lost meanwhile
    /// ends it with the error, the record kept whole.
    async fn declare_again(&self, mut channel: Channel) -> Result<Channel, LapinError> {
        'channel: loop {
            let declared = conveyor::kit::lock(&self.inner.topology_record).all();
            for declaration in declared {
                let Err(error) = declaration.declare(&channel).await else {
                    continue;
                };
                let status = channel.status();
                if status.connected()
                    || status.reconnecting()
                    || !self.inner.connection.status().connected()
                {
                    return Err(error);
                }
                tracing::warn!(
                    error = %conveyor::Report(&error),
                    "a declaration made earlier cannot be made again; it will not come back after a lost connection"
                );
                conveyor::kit::lock(&self.inner.topology_record).forget(&declaration);
                channel = self.open_channel("topology").await?;
                continue 'channel;
            }
            return Ok(channel);
        }
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

/// Takes up to `max` messages from `queue` on `channel` (named `name` in errors), then
/// acks them all with one `basic.ack` (multiple).
async fn take(
    channel: &Channel,
    queue: ShortString,
    name: &str,
    max: usize,
) -> Result<Vec<DeadLetter>, LapinError> {
    let failed = |source: lapin::Error| {
        if is_not_found(&source) {
            LapinError::MissingQueue {
                queue: name.to_string(),
            }
        } else {
            LapinError::Receive {
                queue: name.to_string(),
                source,
            }
        }
    };
    let mut taken = Vec::new();
    let mut last = None;
    while taken.len() < max {
        let Some(message) = channel
            .basic_get(queue.clone(), BasicGetOptions { no_ack: false })
            .await
            .map_err(failed)?
        else {
            break;
        };
        let delivery = message.delivery;
        let headers = headers::received(&delivery.properties);
        let key = delivery
            .properties
            .headers()
            .as_ref()
            .and_then(headers::partition_key);
        taken.push(DeadLetter::new(Bytes::from(delivery.data), headers, key));
        last = Some(delivery.acker);
    }
    if let Some(acker) = last {
        let acked = acker
            .ack(BasicAckOptions { multiple: true })
            .await
            .map_err(failed)?;
        // Not sent: the channel failed (or was recovered) since the gets, and the broker
        // put the messages back. Taken they are not.
        if !acked {
            let state = lapin::ChannelState::Reconnecting;
            return Err(failed(
                lapin::ErrorKind::InvalidChannelState(state, "basic.ack").into(),
            ));
        }
    }
    Ok(taken)
}

/// Whether RabbitMQ blocks a connection (a resource alarm), and the notice of its end.
#[derive(Clone)]
pub(crate) struct Block {
    status: lapin::ConnectionStatus,
    unblocked: Arc<tokio::sync::Notify>,
}

impl Block {
    /// Resolves once the connection is not blocked (at once, mostly).
    pub(crate) async fn over(&self) {
        conveyor::kit::wait_for(&self.unblocked, || (!self.status.blocked()).then_some(())).await;
    }
}

/// The connection whose events [`log_events`] follows: its URL (redacted) and its name.
struct Watched {
    url: String,
    name: String,
}

/// Logs what lapin reports about the connection: errors it does not recover from, and
/// the broker's flow control; counts each recovery in the `conveyor.connection.reconnects`
/// metric. (Subscriptions and publishers simply carry on once it has reconnected.)
async fn log_events(
    events: impl futures_util::Stream<Item = lapin::Event>,
    watched: Watched,
    dialer: Arc<Dialer>,
    unblocked: Arc<tokio::sync::Notify>,
) {
    let Watched { url, name } = watched;
    use futures_util::StreamExt;
    let mut events = std::pin::pin!(events);
    while let Some(event) = events.next().await {
        match event {
            // A missing queue or exchange closes only its channel, and the call that met
            // it returns the error (a passive check's answer, most of the time): nothing
            // for the connection's log to warn about.
            lapin::Event::Error(error) if crate::error::is_not_found(&error) => {
                tracing::debug!(url = %url, %error, "RabbitMQ closed a channel: not found");
            }
            lapin::Event::Error(error) => {
                tracing::warn!(url = %url, %error, "RabbitMQ connection error");
            }
            lapin::Event::ConnectionBlocked(reason) => {
                tracing::warn!(url = %url, reason, "RabbitMQ blocked the connection");
            }
            lapin::Event::ConnectionUnblocked => {
                tracing::info!(url = %url, "RabbitMQ unblocked the connection");
                unblocked.notify_waiters();
            }
            lapin::Event::Connected => {
                if dialer.connected() {
                    conveyor::telemetry::record_reconnect("rabbitmq", &name);
                }
                unblocked.notify_waiters();
                tracing::info!(url = %url, "RabbitMQ connection (re)established");
            }
            _ => {}
        }
    }
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
