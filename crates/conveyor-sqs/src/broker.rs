//! The SQS broker: a client, its settings, and the queues it has resolved.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_config::{BehaviorVersion, Region};
use aws_sdk_sqs::Client;
use aws_sdk_sqs::config::{Credentials, timeout::TimeoutConfig};
use aws_sdk_sqs::types::QueueAttributeName;
use conveyor::Error;

use crate::error::SqsError;
use crate::queue::{DeadLetterTarget, QueueInfo, QueueSpec};
use crate::subscriber::SqsQueue;

/// How the transport polls, hides and settles messages.
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    /// Long-poll wait per receive (at most 20 s).
    pub(crate) wait_time: Duration,
    /// How long a received message stays hidden before the extender renews it.
    pub(crate) visibility_timeout: Duration,
    /// How long a settlement waits for nine more to share its batch call.
    pub(crate) flush_interval: Duration,
    /// How long a call may take beyond the long-poll wait.
    pub(crate) request_timeout: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            wait_time: Duration::from_secs(20),
            visibility_timeout: Duration::from_secs(30),
            flush_interval: Duration::from_millis(5),
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
            .field("endpoint", &self.endpoint)
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

    /// How long one receive long-polls (default and maximum 20 s).
    ///
    /// Closing a subscription waits for the receive under way, so an idle service takes up
    /// to this long to shut down (if SQS stops answering, up to this plus the
    /// [`request_timeout`](Self::request_timeout) plus 1 s: 31 s by default), which can
    /// be longer than the app's `shutdown_timeout`. A shorter wait shortens shutdown, for
    /// more empty receives (each a billed request) on an idle queue.
    pub fn wait_time(mut self, wait: Duration) -> Self {
        self.settings.wait_time = wait;
        self
    }

    /// How long a received message stays hidden between renewals (default 30 s). The
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

    /// How long an ack waits for others to share its `DeleteMessageBatch` (default 5 ms).
    pub fn settle_flush_interval(mut self, interval: Duration) -> Self {
        self.settings.flush_interval = interval;
        self
    }

    /// Loads the AWS configuration and makes the client.
    pub async fn build(self) -> Result<SqsBroker, Error> {
        let settings = self.settings;
        if settings.wait_time > Duration::from_secs(20) {
            return Err(config("wait_time is at most 20 s"));
        }
        if settings.visibility_timeout < Duration::from_secs(1)
            || settings.visibility_timeout > crate::settle::MAX_VISIBILITY
        {
            return Err(config("visibility_timeout is between 1 s and 12 h"));
        }
        let mut loader = aws_config::defaults(BehaviorVersion::latest());
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
        // A receive long-polls for `wait_time`; give each attempt that and a margin, so a
        // broker that stops answering fails the call instead of hanging the pump.
        let timeouts = TimeoutConfig::builder()
            .connect_timeout(settings.request_timeout)
            .operation_attempt_timeout(settings.wait_time + settings.request_timeout)
            .build();
        let config = aws_sdk_sqs::config::Builder::from(&sdk)
            .timeout_config(timeouts)
            .build();
        Ok(SqsBroker::from_parts(Client::from_conf(config), settings))
    }
}

fn config(message: &str) -> Error {
    transport(SqsError::Config(message.to_string()))
}

impl SqsBroker {
    /// A builder; with nothing set, `build` uses the standard AWS configuration chain.
    pub fn builder() -> SqsBrokerBuilder {
        SqsBrokerBuilder::default()
    }

    /// A broker over a client you configured yourself, with default settings.
    pub fn from_client(client: Client) -> Self {
        Self::from_parts(client, Settings::default())
    }

    fn from_parts(client: Client, settings: Settings) -> Self {
        SqsBroker {
            inner: Arc::new(Inner {
                client,
                settings,
                queues: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// The SDK client, for calls Conveyor does not make.
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    pub(crate) fn settings(&self) -> &Settings {
        &self.inner.settings
    }

    /// The queue `name_or_url` as a source to mount a handler on. It is resolved (and
    /// must exist) when the app starts.
    pub fn queue(&self, name_or_url: impl Into<String>) -> SqsQueue {
        SqsQueue::new(self.clone(), name_or_url.into())
    }

    /// Creates the queue if it does not exist (SQS's `CreateQueue` is idempotent for the
    /// same attributes), with its dead-letter queue and redrive policy; returns its URL.
    pub async fn declare_queue(&self, spec: QueueSpec) -> Result<String, Error> {
        self.create(&spec).await.map_err(transport)
    }

    async fn create(&self, spec: &QueueSpec) -> Result<String, SqsError> {
        let mut request = self.inner.client.create_queue().queue_name(&spec.name);
        if spec.is_fifo() {
            request = request.attributes(QueueAttributeName::FifoQueue, "true");
            if spec.content_based_deduplication {
                request = request.attributes(QueueAttributeName::ContentBasedDeduplication, "true");
            }
        }
        if let Some(timeout) = spec.visibility_timeout {
            request = request.attributes(
                QueueAttributeName::VisibilityTimeout,
                timeout.as_secs().to_string(),
            );
        }
        if let Some((dlq, max_receive_count)) = &spec.dead_letter {
            let dlq_spec = QueueSpec::new(dlq.clone());
            let dlq_url = Box::pin(self.create(&dlq_spec)).await?;
            let arn = self.queue_arn(&dlq_url).await?;
            let policy = format!(
                r#"{{"deadLetterTargetArn":"{arn}","maxReceiveCount":"{max_receive_count}"}}"#
            );
            request = request.attributes(QueueAttributeName::RedrivePolicy, policy);
        }
        for (name, value) in &spec.attributes {
            request = request.attributes(name.clone(), value);
        }
        let created = request
            .send()
            .await
            .map_err(|e| SqsError::call("CreateQueue", &spec.name, e))?;
        let url = created
            .queue_url()
            .ok_or_else(|| SqsError::NoSuchQueue(spec.name.clone()))?
            .to_string();
        self.forget(&spec.name);
        Ok(url)
    }

    async fn queue_arn(&self, url: &str) -> Result<String, SqsError> {
        let attributes = self
            .inner
            .client
            .get_queue_attributes()
            .queue_url(url)
            .attribute_names(QueueAttributeName::QueueArn)
            .send()
            .await
            .map_err(|e| SqsError::call("GetQueueAttributes", url, e))?;
        attributes
            .attributes()
            .and_then(|a| a.get(&QueueAttributeName::QueueArn))
            .cloned()
            .ok_or_else(|| SqsError::NoSuchQueue(url.to_string()))
    }

    /// Deletes the queue `name_or_url` (tests clean up with it).
    pub async fn delete_queue(&self, name_or_url: &str) -> Result<(), Error> {
        let queue = self.resolve(name_or_url).await.map_err(transport)?;
        self.inner
            .client
            .delete_queue()
            .queue_url(&queue.url)
            .send()
            .await
            .map_err(|e| transport(SqsError::call("DeleteQueue", name_or_url, e)))?;
        self.forget(name_or_url);
        Ok(())
    }

    fn forget(&self, name_or_url: &str) {
        self.inner
            .queues
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .remove(name_or_url);
    }

    /// The queue's URL and attributes, looked up once and cached.
    pub(crate) async fn resolve(&self, name_or_url: &str) -> Result<Arc<QueueInfo>, SqsError> {
        if let Some(known) = self
            .inner
            .queues
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(name_or_url)
        {
            return Ok(known.clone());
        }
        let url = if name_or_url.starts_with("http://") || name_or_url.starts_with("https://") {
            name_or_url.to_string()
        } else {
            let found = self
                .inner
                .client
                .get_queue_url()
                .queue_name(name_or_url)
                .send()
                .await
                .map_err(|e| {
                    if e.as_service_error()
                        .is_some_and(|s| s.is_queue_does_not_exist())
                    {
                        SqsError::NoSuchQueue(name_or_url.to_string())
                    } else {
                        SqsError::call("GetQueueUrl", name_or_url, e)
                    }
                })?;
            found
                .queue_url()
                .ok_or_else(|| SqsError::NoSuchQueue(name_or_url.to_string()))?
                .to_string()
        };
        let attributes = self
            .inner
            .client
            .get_queue_attributes()
            .queue_url(&url)
            .attribute_names(QueueAttributeName::All)
            .send()
            .await
            .map_err(|e| SqsError::call("GetQueueAttributes", name_or_url, e))?;
        let info = Arc::new(QueueInfo::from_attributes(
            url,
            attributes.attributes().unwrap_or(&HashMap::new()),
        ));
        self.inner
            .queues
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(name_or_url.to_string(), info.clone());
        Ok(info)
    }

    /// The dead-letter queue a redrive policy names by ARN: its URL from its name and
    /// owning account, then its attributes; cached under the ARN.
    pub(crate) async fn resolve_dead_letter(
        &self,
        target: &DeadLetterTarget,
    ) -> Result<Arc<QueueInfo>, SqsError> {
        if let Some(known) = self
            .inner
            .queues
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(&target.arn)
        {
            return Ok(known.clone());
        }
        let found = self
            .inner
            .client
            .get_queue_url()
            .queue_name(&target.name)
            .queue_owner_aws_account_id(&target.account)
            .send()
            .await
            .map_err(|e| {
                if e.as_service_error()
                    .is_some_and(|s| s.is_queue_does_not_exist())
                {
                    SqsError::NoSuchQueue(target.arn.clone())
                } else {
                    SqsError::call("GetQueueUrl", &target.name, e)
                }
            })?;
        let url = found
            .queue_url()
            .ok_or_else(|| SqsError::NoSuchQueue(target.arn.clone()))?;
        let info = self.resolve(url).await?;
        self.inner
            .queues
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(target.arn.clone(), info.clone());
        Ok(info)
    }
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

/// SQS speaks HTTP: there is no connection to close, so an app that owns this broker
/// (`App::broker`) has nothing to wait for.
impl conveyor::Broker for SqsBroker {
    async fn close(&self) -> Result<(), Error> {
        Ok(())
    }
}
