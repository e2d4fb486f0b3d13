//! `SqsQueue`, a queue to mount on, and `SqsSubscriber`, its open subscription.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_sqs::types::QueueAttributeName;
use conveyor::kit::{PullOptions, PullSubscriber};
use conveyor::{Error, Source, SubscribeSettings};

use crate::broker::{Created, SqsBroker, is_url};
use conveyor::Report;

use crate::error::{SqsError, redacted, shown};
use crate::keeper::SqsKeep;
use crate::pump::SqsReceive;
use crate::queue::{DeadLetter, QueueInfo};
use crate::settle::BATCH_LIMIT;
use crate::spec::check_name;

/// An SQS queue to mount a handler on, from [`SqsBroker::queue`].
///
/// ```
/// # async fn run(broker: conveyor_sqs::SqsBroker) {
/// // Receive at most four messages per call (the default is ten, SQS's maximum).
/// let orders = broker.queue("orders").receive_batch(4);
/// # }
/// ```
#[derive(Clone)]
pub struct SqsQueue {
    broker: SqsBroker,
    /// The name or URL as given, for the calls.
    name: String,
    /// The same with a URL's password hidden: what the app's logs, metrics and this
    /// `Debug` name it by.
    label: String,
    receive_batch: usize,
}

impl fmt::Debug for SqsQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqsQueue")
            .field("broker", &self.broker)
            .field("name", &self.label)
            .field("receive_batch", &self.receive_batch)
            .finish()
    }
}

impl SqsQueue {
    pub(crate) fn new(broker: SqsBroker, name: String) -> Self {
        SqsQueue {
            broker,
            label: redacted(&name).into_owned(),
            name,
            receive_batch: BATCH_LIMIT,
        }
    }

    /// How many messages each `ReceiveMessage` asks for, 1 to 10 (default 10, SQS's
    /// maximum). Fewer costs more requests per message; what one receive brings beyond
    /// what the mount can run waits hidden for its turn, so lower it when a handler runs
    /// so long that holding ten would keep messages from other consumers. A batch mount
    /// asks for its batch size if that is smaller. A value outside 1..=10 fails the app's
    /// start with [`Error::Config`].
    pub fn receive_batch(mut self, messages: usize) -> Self {
        self.receive_batch = messages;
        self
    }
}

impl SqsQueue {
    /// The queue, created plainly if it is named and missing: as the core's `Broker::queue`
    /// promises, so that a service runs on a fresh account as it does in process. Only a
    /// missing queue is created; one that exists keeps its attributes.
    async fn resolve(&self) -> Result<Arc<QueueInfo>, SqsError> {
        match self.broker.resolve(&self.name).await {
            Err(SqsError::NoSuchQueue { .. }) if !is_url(&self.name) => {
                let fifo = self.name.ends_with(".fifo");
                let attributes = if fifo {
                    vec![(QueueAttributeName::FifoQueue, "true".to_string())]
                } else {
                    Vec::new()
                };
                // `Differs`: someone made it meanwhile, with attributes of their own,
                // which it keeps.
                if self.broker.create(&self.name, &attributes).await? == Created::Matches {
                    tracing::info!(
                        queue = self.label,
                        fifo,
                        "the queue did not exist; created it"
                    );
                }
                self.broker.resolve(&self.name).await
            }
            resolved => resolved,
        }
    }
}

impl Source for SqsQueue {
    fn messaging_system(&self) -> &'static str {
        "aws_sqs"
    }

    /// The SQS 0.2.0 bindings; on a FIFO queue, the partition key is the message group.
    fn describe(&self, queue: &str) -> conveyor::asyncapi::QueueDescription {
        let fifo = queue.ends_with(".fifo");
        let described = serde_json::json!({ "name": queue, "fifoQueue": fifo });
        let operation = serde_json::json!({ "queues": [described], "bindingVersion": "0.2.0" });
        conveyor::asyncapi::QueueDescription::new(fifo.then_some(crate::PARTITION_KEY_HEADER))
            .channel_binding(
                "sqs",
                serde_json::json!({ "queue": described, "bindingVersion": "0.2.0" }),
            )
            .receive_binding("sqs", operation.clone())
            .send_binding("sqs", operation)
    }

    /// The broker's own publisher: a handler's outputs go out as its other publishes do.
    fn publisher(&self) -> Option<conveyor::SharedPublisher> {
        Some(conveyor::SharedPublisher::new(self.broker.clone()))
    }

    type Subscriber = SqsSubscriber;

    fn queue_name(&self) -> &str {
        &self.label
    }

    /// Resolves the queue (creating it plainly if it is named and missing) and its
    /// dead-letter queue, then starts its pump and keeper. A name SQS cannot take, or a
    /// `receive_batch` outside 1..=10, is [`Error::Config`] before any call.
    async fn subscribe(self, settings: SubscribeSettings) -> Result<SqsSubscriber, Error> {
        if !(1..=BATCH_LIMIT).contains(&self.receive_batch) {
            return Err(Error::config(format!(
                "receive_batch({}) on SQS queue `{}`: a receive takes 1 to {BATCH_LIMIT} messages",
                self.receive_batch,
                shown(&self.name)
            )));
        }
        if !is_url(&self.name) {
            check_name(&self.name).map_err(|problem| {
                Error::config(format!("SQS queue `{}`: {problem}", shown(&self.name)))
            })?;
        }
        let queue = self.resolve().await.map_err(|e| Error::Subscribe {
            queue: shown(&self.name).into_owned(),
            source: Box::new(e),
        })?;
        let dead_letter_queue = match &queue.dead_letter {
            DeadLetter::None => None,
            DeadLetter::Target(target) => match self.broker.resolve_dead_letter(target).await {
                Ok(resolved) => Some(resolved),
                Err(error) => {
                    tracing::warn!(queue = queue.name, dead_letter_queue = target.arn, error = %Report(&error), "cannot resolve the dead-letter queue; trying again at the first reject");
                    None
                }
            },
            DeadLetter::Unreadable(policy) => {
                tracing::warn!(
                    queue = queue.name,
                    policy,
                    "the redrive policy names no dead-letter queue this transport can read; rejected messages will be made visible again"
                );
                None
            }
        };
        let broker_settings = self.broker.settings().clone();
        let keep = SqsKeep {
            calls: self.broker.clone(),
            queue: queue.clone(),
            visibility: broker_settings.visibility_timeout,
            dead_letter_queue: tokio::sync::OnceCell::new_with(dead_letter_queue),
        };
        let wanted = settings
            .batch_size
            .map_or(self.receive_batch, |size| size.min(self.receive_batch))
            .clamp(1, BATCH_LIMIT);
        let options = PullOptions {
            queue: shown(&queue.name).into_owned(),
            lease: broker_settings.visibility_timeout,
            receive_batch: wanted,
            receive_bound: broker_settings
                .receive_wait
                .saturating_add(broker_settings.request_timeout)
                .saturating_add(PUMP_GRACE),
            settle_linger: broker_settings.settle_linger,
            settle_batch: BATCH_LIMIT,
        };
        let receive = SqsReceive {
            client: self.broker.client().clone(),
            queue,
            wanted,
            settings: broker_settings,
        };
        Ok(PullSubscriber::start(receive, keep, options, &settings))
    }
}

/// How long `close` waits for a receive under way beyond its long poll and request
/// timeout, before it gives up on it.
const PUMP_GRACE: Duration = Duration::from_secs(1);

/// A subscription to an SQS queue: the kit's pulling subscriber, whose pump receives
/// (`ReceiveMessage` long polls) and whose keeper keeps what was received hidden until
/// settled and makes the settlement calls.
///
/// [`stop_receiving`](conveyor::Subscriber::stop_receiving) stops the pump from receiving again and
/// releases (visibility 0) every message received but not handed over; a receive under
/// way is not cut short: it completes and its messages are released at once. Closing
/// waits for that receive, then for the keeper to make every settlement's call. Dropping
/// it without closing does the same in the background: the pump finishes its receive and
/// releases what it brought, and the keeper goes on until every delivery is settled.
pub type SqsSubscriber = PullSubscriber;
