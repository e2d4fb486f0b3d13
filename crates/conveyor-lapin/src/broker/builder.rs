//! Settings for a broker, and dialling its two connections.

use super::events::{Watched, log_events};
use super::*;

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
    /// Other nodes of the same cluster, `host:port`.
    fallback_nodes: Vec<String>,
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
            .field("fallback_nodes", &self.fallback_nodes)
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

    /// Other nodes of the same RabbitMQ cluster to connect to when the URL's node does
    /// not answer, as `host:port` addresses (`"rabbit-2.internal:5672"`); they are
    /// reached with the URL's scheme, credentials, vhost, query and TLS settings, so
    /// they hold no secrets of their own. Replaces any nodes given before.
    ///
    /// Each of the broker's connections dials the nodes in turn: the URL's node first,
    /// then these in the order given, wrapping round. An attempt that fails (refused,
    /// unreachable, timed out, the connection closed during the handshake) moves on to
    /// the next node, and so does a reconnect after a connection was lost: it starts with
    /// the node after the one that was lost, and goes on round the nodes until one
    /// answers. The attempts keep the usual pacing (backoff from 100 ms, doubling up
    /// to 30 s, reset once connected). Queues that are to survive a node's loss should
    /// be quorum queues (`x-queue-type = quorum`).
    ///
    /// `connect` fails with [`LapinError::Invalid`] if an address is not `host:port`.
    ///
    /// ```no_run
    /// use conveyor_lapin::LapinBroker;
    ///
    /// # async fn f() -> Result<(), conveyor_lapin::LapinError> {
    /// let broker = LapinBroker::builder("amqp://app:s3cret@rabbit-1.internal:5672/%2f")
    ///     .fallback_nodes(["rabbit-2.internal:5672", "rabbit-3.internal:5672"])
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn fallback_nodes<I>(mut self, nodes: I) -> Self
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        self.fallback_nodes = nodes.into_iter().map(Into::into).collect();
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
    ///
    /// # Errors
    ///
    /// A [`LapinError`]: an invalid URL or setting, a refused login or TLS handshake, or
    /// no connection within the first connect timeout.
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
        let fallbacks = self
            .fallback_nodes
            .iter()
            .map(|node| crate::nodes::parse_node(node))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|reason| LapinError::Invalid {
                what: "fallback node",
                reason,
            })?;
        let rotation = Arc::new(Rotation::new(&uri, &fallbacks));
        let nodes = rotation.clone();
        // A failed first connect names every node it tried, not the URL's alone.
        let tried = if fallbacks.is_empty() {
            redacted.clone()
        } else {
            format!(
                "{redacted} (and fallback nodes {})",
                rotation.addresses()[1..].join(", ")
            )
        };
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
            async move |_uri, runtime| {
                let dialer = &handle.0;
                loop {
                    let budget = dialer.next_attempt().await?;
                    let (node, address) = rotation.attempt();
                    if rotation.len() > 1 {
                        tracing::debug!(node = %address, "dialing a RabbitMQ node");
                    }
                    let attempt = node.connect_with_config_async(tls.as_ref(), &runtime);
                    match tokio::time::timeout(budget, attempt).await {
                        Ok(Ok(stream)) => {
                            let socket = match &stream {
                                AsyncTcpStream::Plain(plain) => Some(plain.get_ref()),
                                AsyncTcpStream::Rustls(tls) => Some(tls.get_ref().0.get_ref()),
                                _ => None,
                            };
                            if dialer.opened(socket) {
                                rotation.handed_over();
                                if rotation.len() > 1 {
                                    tracing::info!(node = %address, "connecting to RabbitMQ node");
                                }
                                return Ok(stream);
                            }
                        }
                        // A TLS handshake that failed (an untrusted or misnamed server
                        // certificate, say) would fail again: the first connect ends there.
                        Ok(Err(error)) => {
                            let fatal = amqps && is_tls_failure(&error);
                            rotation.failed();
                            dialer.failed(error, fatal);
                        }
                        Err(_) => {
                            rotation.failed();
                            dialer.timed_out();
                        }
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
                    (Some(source), _) => LapinError::Connect { url: tried, source },
                    (None, Some(Failure::Failed(error))) => LapinError::Connect {
                        url: tried,
                        source: error.into(),
                    },
                    (None, Some(Failure::TimedOut(stage))) => LapinError::ConnectTimeout {
                        url: tried,
                        after: self.first_connect_timeout,
                        waiting_for: stage.waiting_for(),
                    },
                    (None, None) => LapinError::ConnectTimeout {
                        url: tried,
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
                nodes,
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

impl LapinBroker {
    /// Connects to `url` with the default settings.
    ///
    /// # Errors
    ///
    /// As [`LapinBrokerBuilder::connect`].
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
            fallback_nodes: Vec::new(),
        }
    }
}
