//! The SQS broker: a client, its settings, and the queues it has resolved.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_config::{BehaviorVersion, Region};
use aws_sdk_sqs::Client;
use aws_sdk_sqs::config::{Credentials, timeout::TimeoutConfig};
use aws_sdk_sqs::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_sqs::operation::create_queue::CreateQueueError;
use aws_sdk_sqs::types::QueueAttributeName;
use conveyor::Error;

use crate::error::SqsError;
use crate::queue::{DeadLetterTarget, QueueInfo};
use crate::request::Requester;
use crate::subscriber::SqsQueue;

/// How the transport polls, hides and settles messages.
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    /// Long-poll wait per receive: whole seconds from 1 s to 20 s (`build` checks).
    pub(crate) receive_wait: Duration,
    /// How long a received message stays hidden before the extender renews it: whole
    /// seconds (`build` refuses a fraction), as SQS counts it.
    pub(crate) visibility_timeout: Duration,
    /// How long a settlement waits for nine more to share its batch call.
    pub(crate) settle_linger: Duration,
    /// How long a call may take beyond the long-poll wait.
    pub(crate) request_timeout: Duration,
}

impl Settings {
    /// What one attempt of a call may take: the request timeout, a receive's long-poll
    /// wait aside (see [`Settings::long_poll`]). A settlement or renewal that gets no
    /// answer fails after this and is tried again, instead of holding the keeper's other
    /// work for a whole long-poll wait more.
    fn call_timeouts(&self) -> TimeoutConfig {
        self.timeouts(self.request_timeout)
    }

    /// The configuration a `ReceiveMessage` is sent with: it long-polls for `receive_wait`,
    /// so each attempt gets that on top of the request timeout, and a broker that stops
    /// answering fails the receive instead of hanging the pump.
    pub(crate) fn long_poll(&self) -> aws_sdk_sqs::config::Builder {
        let attempt = self.receive_wait.saturating_add(self.request_timeout);
        aws_sdk_sqs::config::Builder::default().timeout_config(self.timeouts(attempt))
    }

    /// Connecting may take the request timeout, and each attempt `attempt`.
    fn timeouts(&self, attempt: Duration) -> TimeoutConfig {
        TimeoutConfig::builder()
            .connect_timeout(self.request_timeout)
            .operation_attempt_timeout(attempt)
            .build()
    }
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            receive_wait: Duration::from_secs(20),
            visibility_timeout: Duration::from_secs(30),
            settle_linger: Duration::from_millis(5),
            request_timeout: Duration::from_secs(10),
        }
    }
}

/// A connection to Amazon SQS (or an emulator): a client, the transport's settings, and
/// the queues it has resolved. Cloning gives another handle to the same.
///
/// ```no_run
/// use conveyor::{App, Json};
/// use conveyor_sqs::SqsBroker;
///
/// async fn handle(Json(n): Json<u64>) {}
///
/// # async fn run() -> Result<(), conveyor::Error> {
/// // The standard AWS chain: environment, profile, instance role.
/// let broker = SqsBroker::builder().build().await?;
/// // Or a local emulator:
/// let local = SqsBroker::builder()
///     .endpoint("http://127.0.0.1:4566")
///     .region("us-east-1")
///     .static_credentials("test", "test")
///     .build()
///     .await?;
/// App::new("numbers").mount(broker.queue("numbers"), handle, |m| m.workers(10)).run().await
/// # }
/// ```
#[derive(Clone)]
pub struct SqsBroker {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    settings: Settings,
    queues: Mutex<HashMap<String, Arc<QueueInfo>>>,
    /// The reply queue of [`Broker::request`](conveyor::Broker::request), made by the
    /// first request.
    requester: tokio::sync::Mutex<Option<Arc<Requester>>>,
    /// The configuration chain the client came from (not for `from_client`), for other
    /// AWS clients of the same account (SNS).
    sdk: Option<aws_config::SdkConfig>,
}

/// Builds an [`SqsBroker`]; whatever is not set comes from the standard AWS chain.
#[derive(Default)]
#[must_use]
pub struct SqsBrokerBuilder {
    endpoint: Option<String>,
    region: Option<String>,
    credentials: Option<Credentials>,
    settings: Settings,
}

impl fmt::Debug for SqsBrokerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqsBrokerBuilder")
            // An endpoint may carry user information (a proxy or gateway in front of SQS).
            .field(
                "endpoint",
                &self.endpoint.as_deref().map(conveyor::kit::redact_url),
            )
            .field("region", &self.region)
            .field("static_credentials", &self.credentials.is_some())
            .field("settings", &self.settings)
            .finish()
    }
}

impl SqsBrokerBuilder {
    /// Talks to this endpoint instead of AWS's (an emulator such as moto).
    pub fn endpoint(mut self, url: impl Into<String>) -> Self {
        self.endpoint = Some(url.into());
        self
    }

    /// The AWS region.
    pub fn region(mut self, region: impl Into<String>) -> Self {
        self.region = Some(region.into());
        self
    }

    /// Fixed credentials, for an emulator or a test account.
    pub fn static_credentials(
        mut self,
        access_key_id: impl Into<String>,
        secret: impl Into<String>,
    ) -> Self {
        self.credentials = Some(Credentials::new(
            access_key_id,
            secret,
            None,
            None,
            "conveyor-static",
        ));
        self
    }

    /// How long one receive long-polls: whole seconds from 1 s to 20 s (default 20 s), or
    /// `build` refuses it. SQS takes no fraction, and no short polling (0 s) here: a pump
    /// that short-polls an idle queue would send receives, each billed, without end.
    ///
    /// Closing a subscription waits for the receive under way, so an idle service takes up
    /// to this long to shut down (if SQS stops answering, up to this plus the
    /// [`request_timeout`](Self::request_timeout) plus 1 s: 31 s by default), which can
    /// be longer than the app's `shutdown_timeout`. A shorter wait shortens shutdown, for
    /// more empty receives (each a billed request) on an idle queue.
    pub fn receive_wait(mut self, wait: Duration) -> Self {
        self.settings.receive_wait = wait;
        self
    }

    /// How long a received message stays hidden between renewals (default 30 s), in whole
    /// seconds from 1 s to 12 h: SQS takes whole seconds, so `build` refuses a fraction. The
    /// extender renews it while it is unsettled, so a handler may run longer.
    pub fn visibility_timeout(mut self, timeout: Duration) -> Self {
        self.settings.visibility_timeout = timeout;
        self
    }

    /// How long one call may take, beyond a receive's long-poll wait, before it fails and
    /// is tried again (default 10 s): what bounds the pump's wait on a broker that stops
    /// answering.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.settings.request_timeout = timeout;
        self
    }

    /// How long an ack waits for others to share its `DeleteMessageBatch` (default 5 ms);
    /// at most a sixth of the visibility timeout, or `build` refuses it: a message waiting
    /// longer for its delete could be handed out again.
    pub fn settle_linger(mut self, linger: Duration) -> Self {
        self.settings.settle_linger = linger;
        self
    }

    /// Loads the AWS configuration and makes the client.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for settings SQS cannot take (a wait time of no whole second
    /// from 1 to 20, say).
    pub async fn build(self) -> Result<SqsBroker, Error> {
        let settings = self.settings;
        // SQS long-polls for whole seconds: `as_secs` would make 500 ms a short poll (0 s),
        // and a pump that short-polls an idle queue sends receives, each billed, as fast
        // as SQS answers them.
        if settings.receive_wait < Duration::from_secs(1)
            || settings.receive_wait > Duration::from_secs(20)
            || settings.receive_wait.subsec_nanos() != 0
        {
            return Err(Error::config(format!(
                "receive_wait is a whole number of seconds from 1 s to 20 s (SQS long-polls for whole seconds, and a short poll would spin on an idle queue), not {:?}",
                settings.receive_wait
            )));
        }
        if settings.visibility_timeout < Duration::from_secs(1)
            || settings.visibility_timeout > crate::settle::MAX_VISIBILITY
        {
            return Err(Error::config("visibility_timeout is between 1 s and 12 h"));
        }
        // SQS hides a message for whole seconds. Rounding here would leave the transport
        // believing one timeout and SQS applying another; renewals timed for 1.9 s would
        // reach a message SQS showed again after 1 s, while its handler still runs.
        if settings.visibility_timeout.subsec_nanos() != 0 {
            return Err(Error::config(format!(
                "visibility_timeout is a whole number of seconds (SQS takes no fraction), not {:?}",
                settings.visibility_timeout
            )));
        }
        // A held message is renewed once it is within half the visibility timeout of
        // showing, every third of it: a sixth is what it may have left when it is settled,
        // and a settlement waiting longer would let it be handed out again.
        if settings.settle_linger > settings.visibility_timeout / 6 {
            return Err(Error::config(
                "settle_linger is at most a sixth of visibility_timeout",
            ));
        }
        let mut loader =
            aws_config::defaults(BehaviorVersion::latest()).http_client(https_client());
        if let Some(region) = self.region {
            loader = loader.region(Region::new(region));
        }
        if let Some(endpoint) = self.endpoint {
            loader = loader.endpoint_url(endpoint);
        }
        if let Some(credentials) = self.credentials {
            loader = loader.credentials_provider(credentials);
        }
        let sdk = loader.load().await;
        let mut config =
            aws_sdk_sqs::config::Builder::from(&sdk).timeout_config(settings.call_timeouts());
        if conveyor::telemetry::ENABLED {
            config = config.interceptor(crate::call_metrics::TimeCalls);
        }
        let config = config.build();
        let mut broker = SqsBroker::from_parts(Client::from_conf(config), settings);
        if let Some(inner) = Arc::get_mut(&mut broker.inner) {
            inner.sdk = Some(sdk);
        }
        Ok(broker)
    }
}

/// The SDK's HTTP client (hyper 1) over rustls with ring, the crypto provider the
/// RabbitMQ transport uses too, so that a service built with both compiles one of each.
pub(crate) fn https_client() -> aws_sdk_sqs::config::SharedHttpClient {
    use aws_smithy_http_client::tls::{Provider, rustls_provider::CryptoMode};
    aws_smithy_http_client::Builder::new()
        .tls_provider(Provider::Rustls(CryptoMode::Ring))
        .build_https()
}

impl SqsBroker {
    /// A builder; with nothing set, `build` uses the standard AWS configuration chain.
    pub fn builder() -> SqsBrokerBuilder {
        SqsBrokerBuilder::default()
    }

    /// A broker over a client you configured yourself, with default settings. With the
    /// core's `metrics` feature, its requests are timed like a built broker's.
    pub fn from_client(client: Client) -> Self {
        let client = if conveyor::telemetry::ENABLED {
            let config = client
                .config()
                .to_builder()
                .interceptor(crate::call_metrics::TimeCalls)
                .build();
            Client::from_conf(config)
        } else {
            client
        };
        Self::from_parts(client, Settings::default())
    }

    fn from_parts(client: Client, settings: Settings) -> Self {
        SqsBroker {
            inner: Arc::new(Inner {
                client,
                settings,
                queues: Mutex::new(HashMap::new()),
                requester: tokio::sync::Mutex::new(None),
                sdk: None,
            }),
        }
    }

    /// The SDK client, for calls Conveyor does not make.
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// The configuration chain the broker was built from, if it was.
    #[cfg_attr(not(feature = "sns"), allow(dead_code))]
    pub(crate) fn sdk_config(&self) -> Option<&aws_config::SdkConfig> {
        self.inner.sdk.as_ref()
    }

    /// The requester, with its reply queue, made by the first request, and again once
    /// the reply queue was found gone (deleted by hand, or by an emulator's restart).
    ///
    /// It is made in a task of its own, which keeps it: a request that gives up meanwhile
    /// (its timeout) leaves a reply queue this broker deletes, not one nobody knows of.
    pub(crate) async fn requester(&self) -> Result<Arc<Requester>, SqsError> {
        if let Some(open) = self.open_requester().await {
            return Ok(open);
        }
        let broker = self.clone();
        let opening = tokio::spawn(async move {
            let mut requester = broker.inner.requester.lock().await;
            // Another request may have made one meanwhile.
            if let Some(open) = reading(&requester) {
                return Ok(open);
            }
            let opened = Arc::new(Requester::open(&broker).await?);
            *requester = Some(opened.clone());
            Ok(opened)
        });
        match opening.await {
            Ok(opened) => opened,
            Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
            // Only a runtime shutting down cancels it.
            Err(error) => Err(SqsError::Config(format!(
                "the reply queue was not made: {error}"
            ))),
        }
    }

    /// The requester, if one is open.
    pub(crate) async fn open_requester(&self) -> Option<Arc<Requester>> {
        reading(&*self.inner.requester.lock().await)
    }

    /// Deletes the reply queue, if a request made one.
    pub(crate) async fn close_requester(&self) -> Result<(), SqsError> {
        let requester = self.inner.requester.lock().await.take();
        match requester {
            Some(requester) => requester.close(self).await,
            None => Ok(()),
        }
    }

    pub(crate) fn settings(&self) -> &Settings {
        &self.inner.settings
    }

    /// The queue `name_or_url` as a source to mount a handler on (also
    /// [`Broker::queue`](conveyor::Broker::queue)). It is resolved when the app starts: a
    /// queue named that does not exist is created plainly (FIFO if the name ends in
    /// `.fifo`, every other attribute SQS's default); one given by URL must exist. A queue
    /// that exists keeps its attributes: declare it with
    /// [`Broker::declare_queue`](conveyor::Broker::declare_queue) to set them.
    pub fn queue(&self, name_or_url: impl Into<String>) -> SqsQueue {
        SqsQueue::new(self.clone(), name_or_url.into())
    }

    /// The URL of the queue `name_or_url`, for calls Conveyor does not make: looked up
    /// once (with the attributes the transport reads) and cached.
    ///
    /// ```no_run
    /// # async fn run(broker: conveyor_sqs::SqsBroker) -> Result<(), conveyor::Error> {
    /// let url = broker.queue_url("orders").await?;
    /// broker.client().purge_queue().queue_url(url).send().await.ok();
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// SQS's error when it does not know the queue, or refuses the call.
    pub async fn queue_url(&self, name_or_url: &str) -> Result<String, Error> {
        self.resolve(name_or_url)
            .await
            .map(|queue| queue.url.clone())
            .map_err(transport)
    }

    /// The queue's URL: from the cache, as given, or from `GetQueueUrl` (not cached alone:
    /// [`resolve`](Self::resolve) caches the URL with the attributes).
    pub(crate) async fn url(&self, name_or_url: &str) -> Result<String, SqsError> {
        if let Some(known) = self.cached(name_or_url) {
            return Ok(known.url.clone());
        }
        if is_url(name_or_url) {
            return Ok(name_or_url.to_string());
        }
        let found = self
            .inner
            .client
            .get_queue_url()
            .queue_name(name_or_url)
            .send()
            .await
            .map_err(|e| SqsError::from_sdk("GetQueueUrl", name_or_url, e))?;
        found
            .queue_url()
            .map(str::to_string)
            .ok_or_else(|| SqsError::Unexpected {
                call: "GetQueueUrl",
                queue: crate::error::redacted(name_or_url).into_owned(),
                detail: "no queue URL".into(),
            })
    }

    /// `CreateQueue` for `name` with `attributes`. SQS answers with the queue's URL when it
    /// made it, and when a queue of that name exists whose attributes match those given;
    /// with an error when they do not: that is [`Created::Differs`].
    pub(crate) async fn create(
        &self,
        name: &str,
        attributes: &[(QueueAttributeName, String)],
    ) -> Result<Created, SqsError> {
        let request = self
            .inner
            .client
            .create_queue()
            .queue_name(name)
            .set_attributes(
                Some(attributes.iter().cloned().collect())
                    .filter(|a: &HashMap<_, _>| !a.is_empty()),
            );
        let created = match request.send().await {
            Ok(created) => created,
            Err(e) if already_exists(&e) => return Ok(Created::Differs),
            Err(e) => return Err(SqsError::call("CreateQueue", name, e)),
        };
        match created.queue_url() {
            Some(_) => Ok(Created::Matches),
            None => Err(SqsError::Unexpected {
                call: "CreateQueue",
                queue: name.to_string(),
                detail: "no queue URL".into(),
            }),
        }
    }

    /// Forgets what the cache holds of the queue `name_or_url` (under its name, its URL or
    /// a redrive policy's ARN), so that the next use looks it up again.
    pub(crate) fn forget(&self, name_or_url: &str) {
        conveyor::kit::lock(&self.inner.queues).retain(|key, info| {
            key != name_or_url && info.url != name_or_url && info.name != name_or_url
        });
    }

    fn cached(&self, name_or_url: &str) -> Option<Arc<QueueInfo>> {
        conveyor::kit::lock(&self.inner.queues)
            .get(name_or_url)
            .cloned()
    }

    /// The queue's URL and attributes, looked up once and cached.
    pub(crate) async fn resolve(&self, name_or_url: &str) -> Result<Arc<QueueInfo>, SqsError> {
        if let Some(known) = self.cached(name_or_url) {
            return Ok(known);
        }
        let url = self.url(name_or_url).await?;
        let attributes = self
            .inner
            .client
            .get_queue_attributes()
            .queue_url(&url)
            .attribute_names(QueueAttributeName::All)
            .send()
            .await
            .map_err(|e| SqsError::from_sdk("GetQueueAttributes", name_or_url, e))?;
        let info = Arc::new(QueueInfo::from_attributes(
            url,
            attributes.attributes().unwrap_or(&HashMap::new()),
        ));
        conveyor::kit::lock(&self.inner.queues).insert(name_or_url.to_string(), info.clone());
        Ok(info)
    }

    /// The dead-letter queue a redrive policy names by ARN: its URL from its name and
    /// owning account, then its attributes; cached under the ARN.
    pub(crate) async fn resolve_dead_letter(
        &self,
        target: &DeadLetterTarget,
    ) -> Result<Arc<QueueInfo>, SqsError> {
        if let Some(known) = self.cached(&target.arn) {
            return Ok(known);
        }
        let found = self
            .inner
            .client
            .get_queue_url()
            .queue_name(&target.name)
            .queue_owner_aws_account_id(&target.account)
            .send()
            .await
            .map_err(|e| SqsError::from_sdk("GetQueueUrl", &target.arn, e))?;
        let url = found.queue_url().ok_or_else(|| SqsError::Unexpected {
            call: "GetQueueUrl",
            queue: target.name.clone(),
            detail: "no queue URL".into(),
        })?;
        let info = self.resolve(url).await?;
        conveyor::kit::lock(&self.inner.queues).insert(target.arn.clone(), info.clone());
        Ok(info)
    }
}

/// What [`SqsBroker::create`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Created {
    /// The queue is new, or exists with the attributes given.
    Matches,
    /// A queue of that name exists with other values for the attributes given.
    Differs,
}

/// Whether `CreateQueue` failed because a queue of that name exists with other attributes
/// (`QueueAlreadyExists` in SQS's query-compatible code, `QueueNameExists` in its model).
fn already_exists<R>(error: &SdkError<CreateQueueError, R>) -> bool {
    error.as_service_error().is_some_and(|e| {
        e.is_queue_name_exists()
            || matches!(
                e.code(),
                Some(
                    "QueueAlreadyExists"
                        | "QueueNameExists"
                        | "AWS.SimpleQueueService.QueueNameExists"
                )
            )
    })
}

/// Whether `name_or_url` is a queue URL rather than a name.
pub(crate) fn is_url(name_or_url: &str) -> bool {
    name_or_url.starts_with("http://") || name_or_url.starts_with("https://")
}

pub(crate) fn transport(error: SqsError) -> Error {
    Error::Transport {
        transport: "sqs",
        source: Box::new(error),
    }
}

impl fmt::Debug for SqsBroker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqsBroker")
            .field("settings", &self.inner.settings)
            .finish_non_exhaustive()
    }
}

/// The requester in `slot`, if it still reads its replies (its queue was not found gone).
fn reading(slot: &Option<Arc<Requester>>) -> Option<Arc<Requester>> {
    slot.as_ref().filter(|r| r.reader.is_reading()).cloned()
}

#[cfg(test)]
mod tests {
    use aws_sdk_sqs::config::http::HttpResponse;
    use aws_sdk_sqs::error::DisplayErrorContext;

    use super::*;
    use crate::error::no_such_queue;
    use crate::testing::{answering_once, emulator};

    /// What the SDK makes of a `CreateQueue` that SQS refuses with `headers` and `body`.
    async fn create_answered(
        headers: &str,
        body: &str,
    ) -> SdkError<CreateQueueError, HttpResponse> {
        let (client, server) = answering_once("400 Bad Request", headers, body).await;
        let error = client
            .create_queue()
            .queue_name("q")
            .send()
            .await
            .expect_err("the answer is an error");
        server.await.unwrap();
        error
    }

    #[tokio::test]
    async fn a_settle_linger_over_a_sixth_of_the_visibility_timeout_is_refused() {
        let build = |flush| {
            emulator()
                .visibility_timeout(Duration::from_secs(30))
                .settle_linger(flush)
                .build()
        };
        match build(Duration::from_millis(5_001)).await {
            Err(Error::Config(message)) => {
                assert!(message.contains("settle_linger"), "{message}")
            }
            other => panic!("{:?}", other.map(|_| ())),
        }
        assert!(build(Duration::from_secs(5)).await.is_ok());
    }

    #[tokio::test]
    async fn a_wait_time_of_no_whole_second_from_one_to_twenty_is_refused() {
        let build = |wait| emulator().receive_wait(wait).build();
        for wait in [
            Duration::ZERO,
            Duration::from_millis(500),
            Duration::from_millis(1_500),
            Duration::from_secs(21),
        ] {
            match build(wait).await {
                Err(Error::Config(message)) => {
                    assert!(
                        message.contains("receive_wait") && message.contains("whole"),
                        "{message}"
                    )
                }
                other => panic!("{wait:?}: {:?}", other.map(|_| ())),
            }
        }
        assert!(build(Duration::from_secs(1)).await.is_ok());
        assert!(build(Duration::from_secs(20)).await.is_ok());
    }

    #[tokio::test]
    async fn a_visibility_timeout_with_a_fraction_of_a_second_is_refused() {
        let build = |visibility| emulator().visibility_timeout(visibility).build();
        match build(Duration::from_millis(1900)).await {
            Err(Error::Config(message)) => {
                assert!(
                    message.contains("visibility_timeout") && message.contains("whole"),
                    "{message}"
                )
            }
            other => panic!("{:?}", other.map(|_| ())),
        }
        assert!(build(Duration::from_secs(2)).await.is_ok());
    }

    #[tokio::test]
    async fn a_queue_existing_with_other_attributes_is_told_in_every_spelling() {
        // AWS: the query-compatible code in a header, the model's name in the body.
        let aws = create_answered(
            "x-amzn-query-error: QueueAlreadyExists;Sender\r\n",
            r#"{"__type":"com.amazonaws.sqs#QueueNameExists","message":"exists"}"#,
        )
        .await;
        assert!(already_exists(&aws), "{}", DisplayErrorContext(&aws));
        // An emulator: the body alone, in either name.
        for name in ["QueueNameExists", "QueueAlreadyExists"] {
            let body = format!(r#"{{"__type":"com.amazonaws.sqs#{name}","message":"exists"}}"#);
            let error = create_answered("", &body).await;
            assert!(already_exists(&error), "{}", DisplayErrorContext(&error));
        }
        let other = create_answered(
            "x-amzn-query-error: InvalidAttributeValue;Sender\r\n",
            r#"{"__type":"com.amazonaws.sqs#InvalidAttributeValue","message":"bad"}"#,
        )
        .await;
        assert!(!already_exists(&other));
    }

    #[tokio::test]
    async fn a_missing_queue_is_told_in_every_spelling() {
        for (headers, name) in [
            (
                "x-amzn-query-error: AWS.SimpleQueueService.NonExistentQueue;Sender\r\n",
                "QueueDoesNotExist",
            ),
            ("", "QueueDoesNotExist"),
        ] {
            let body = format!(r#"{{"__type":"com.amazonaws.sqs#{name}","message":"gone"}}"#);
            let (client, server) = answering_once("400 Bad Request", headers, &body).await;
            let error = client
                .get_queue_url()
                .queue_name("q")
                .send()
                .await
                .expect_err("the answer is an error");
            server.await.unwrap();
            assert!(no_such_queue(&error), "{}", DisplayErrorContext(&error));
        }
    }
}
