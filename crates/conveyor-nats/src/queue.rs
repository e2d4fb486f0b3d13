//! `NatsQueue`, a queue to mount on, and its subscription on the kit's pulling
//! subscriber: the pump fetches from the queue's durable consumer, the keeper renews
//! leases with `in_progress` and settles with acks, naks (with delay) and terms.

use std::fmt;
use std::time::Duration;

use async_nats::jetstream::AckKind;
use async_nats::jetstream::consumer::PullConsumer;
use async_nats::{Client, Subject};
use conveyor::kit::{Keep, LeaseTimes, PullOptions, PullSubscriber, Renewed, Taken, Verdict};
use conveyor::{Bytes, Error, Report, Source, SubscribeSettings};
use tokio::time::Instant;

use crate::admin;
use crate::broker::{DEFAULT_CONSUMER, NatsBroker};
use crate::error::NatsError;
use crate::headers;
use crate::receive::{ANSWER_MARGIN, NatsReceive, ReceiveSetup};
use conveyor::Publisher;

/// A NATS queue to mount a handler on, from [`NatsBroker::queue`].
///
/// ```no_run
/// # async fn run(broker: conveyor_nats::NatsBroker) {
/// // Fetch at most 16 messages per call (default: what the mount can hold).
/// let orders = broker.queue("orders").receive_batch(16);
/// # }
/// ```
#[derive(Clone)]
pub struct NatsQueue {
    broker: NatsBroker,
    name: String,
    consumer: String,
    receive_batch: Option<usize>,
}

impl fmt::Debug for NatsQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsQueue")
            .field("name", &self.name)
            .field("consumer", &self.consumer)
            .finish_non_exhaustive()
    }
}

impl NatsQueue {
    pub(crate) fn new(broker: NatsBroker, name: String) -> Self {
        NatsQueue {
            broker,
            name,
            consumer: DEFAULT_CONSUMER.to_string(),
            receive_batch: None,
        }
    }

    /// The durable consumer to read through (default [`DEFAULT_CONSUMER`]): every
    /// subscription through one consumer shares the queue's messages; two consumers
    /// each get every message (a fan-out, on a stream whose retention allows it).
    pub fn consumer(mut self, name: impl Into<String>) -> Self {
        self.consumer = name.into();
        self
    }

    /// The most messages one fetch asks for (default: as many as the mount can hold, its
    /// batch size or else its `max_in_flight`; this only lowers it). Zero fails the app's
    /// start with [`Error::Config`].
    pub fn receive_batch(mut self, messages: usize) -> Self {
        self.receive_batch = Some(messages);
        self
    }
}

impl Source for NatsQueue {
    type Subscriber = PullSubscriber;

    fn queue_name(&self) -> &str {
        &self.name
    }

    fn messaging_system(&self) -> &'static str {
        "nats"
    }

    /// The NATS 0.1.0 operation binding: the durable consumer is the queue group.
    fn describe(&self, _queue: &str) -> conveyor::asyncapi::QueueDescription {
        let operation = serde_json::json!({ "queue": self.consumer, "bindingVersion": "0.1.0" });
        conveyor::asyncapi::QueueDescription::new(Some(headers::PARTITION_KEY_HEADER))
            .receive_binding("nats", operation.clone())
            .send_binding("nats", operation)
    }

    fn publisher(&self) -> Option<conveyor::SharedPublisher> {
        Some(conveyor::SharedPublisher::new(self.broker.clone()))
    }

    /// Makes the queue's stream and consumer if missing, reads its dead-letter policy,
    /// then starts its pump and keeper.
    async fn subscribe(self, settings: SubscribeSettings) -> Result<PullSubscriber, Error> {
        if self.receive_batch == Some(0) {
            return Err(Error::config(format!(
                "receive_batch(0) on NATS queue `{}`: a fetch takes at least one message",
                self.name
            )));
        }
        let subscribe_error = |source: Error| Error::Subscribe {
            queue: self.name.clone(),
            source: Box::new(source),
        };
        let stream = admin::make_plain(&self.broker, &self.name)
            .await
            .map_err(subscribe_error)?;
        let policy = admin::read_policy(stream.cached_info().config.description.as_deref());
        let broker_settings = self.broker.settings().clone();
        let consumer: PullConsumer = stream
            .get_or_create_consumer(
                &self.consumer,
                admin::consumer_config(&self.consumer, broker_settings.visibility_timeout),
            )
            .await
            .map_err(|e| Error::Subscribe {
                queue: self.name.clone(),
                source: Box::new(NatsError::call("declare consumer", &self.name, Report(&e))),
            })?;
        let lease = consumer.cached_info().config.ack_wait;
        let held = settings.max_in_flight.max(1);
        let wanted = settings
            .batch_size
            .map_or(held, |size| size.max(1))
            .min(self.receive_batch.unwrap_or(usize::MAX))
            .max(1);
        let dead_letter_queue = policy.dead_letter_queue.clone();
        let keep = NatsKeep {
            client: self.broker.client().clone(),
            broker: self.broker.clone(),
            queue: self.name.clone(),
            lease,
            dead_letter_queue,
        };
        let options = PullOptions {
            queue: self.name.clone(),
            lease,
            receive_batch: wanted,
            receive_bound: broker_settings
                .receive_wait
                .saturating_add(ANSWER_MARGIN)
                .saturating_add(Duration::from_secs(1)),
            settle_linger: broker_settings.settle_linger,
            settle_batch: 256,
        };
        let info = consumer.cached_info();
        let receive = NatsReceive::new(ReceiveSetup {
            client: self.broker.client().clone(),
            name: self.name.as_str().into(),
            stream: info.stream_name.clone(),
            consumer: info.name.clone(),
            wanted,
            receive_wait: broker_settings.receive_wait,
            lease,
            policy,
        });
        Ok(PullSubscriber::start(receive, keep, options, &settings))
    }
}

/// What the subscription keeps of a message it holds: the subject its acks go to.
pub(crate) struct Held {
    pub(crate) reply: Subject,
}

/// The keeper's calls: each an ack-subject publish, flushed per batch.
struct NatsKeep {
    client: Client,
    broker: NatsBroker,
    queue: String,
    lease: Duration,
    dead_letter_queue: Option<String>,
}

impl NatsKeep {
    /// Publishes each `(subject, body)` and flushes them out.
    async fn send(&self, acks: impl IntoIterator<Item = (Subject, Bytes)>) -> Result<(), String> {
        for (subject, body) in acks {
            self.client
                .publish(subject, body)
                .await
                .map_err(|e| Report(&e).to_string())?;
        }
        self.client
            .flush()
            .await
            .map_err(|e| Report(&e).to_string())
    }
}

impl Keep for NatsKeep {
    type Data = Held;
    type Renewal = Subject;
    type Drawn = Subject;
    type Prepared = Vec<(Subject, Bytes)>;

    fn renewal(&self, _tag: u64, held: &Held, _times: LeaseTimes) -> Option<Subject> {
        Some(held.reply.clone())
    }

    /// `in_progress` for each: JetStream restarts the ack wait from when it takes it.
    /// It answers nothing, so a lease it no longer holds is found out only when its
    /// settlement comes to nothing (the message went to another consumer).
    async fn renew(&self, due: &[&Subject], _retry: bool) -> Result<Vec<Renewed>, String> {
        let sent = Instant::now();
        let progress = Bytes::from(AckKind::Progress);
        let acks: Vec<(Subject, Bytes)> = due
            .iter()
            .map(|subject| ((*subject).clone(), progress.clone()))
            .collect();
        self.send(acks).await?;
        Ok(due
            .iter()
            .map(|_| Renewed::Until(sent + self.lease))
            .collect())
    }

    fn draw(held: &mut Held) -> Subject {
        held.reply.clone()
    }

    /// Sends the rejects' dead letters while their leases are still renewed: one stored
    /// is acknowledged; one that could not be stored is delivered again a second later
    /// (nothing is lost, and the handler's rejection comes again). With no dead-letter
    /// queue a reject is a term: JetStream drops the message.
    async fn prepare(&self, taken: Vec<Taken<Subject>>) -> Vec<(Subject, Bytes)> {
        let mut acks = Vec::with_capacity(taken.len());
        for Taken {
            data: subject,
            verdict,
            ..
        } in taken
        {
            let kind = match verdict {
                Verdict::Ack => AckKind::Ack,
                Verdict::Retry { after } => AckKind::Nak(after),
                Verdict::Reject(rejected) => match &self.dead_letter_queue {
                    None => {
                        tracing::warn!(
                            queue = self.queue,
                            reason = rejected.reason,
                            "rejected a message on a queue with no dead-letter queue: dropped"
                        );
                        AckKind::Term
                    }
                    Some(dead_letter_queue) => {
                        match self
                            .broker
                            .publish(dead_letter_queue, rejected.into_dead_letter())
                            .await
                        {
                            Ok(()) => AckKind::Ack,
                            Err(error) => {
                                tracing::error!(
                                    queue = self.queue,
                                    dead_letter_queue,
                                    error = %Report(&error),
                                    "cannot dead-letter a rejected message; it is delivered again"
                                );
                                AckKind::Nak(Some(Duration::from_secs(1)))
                            }
                        }
                    }
                },
            };
            acks.push((subject, Bytes::from(kind)));
        }
        acks
    }

    /// Sends the acks; ones that fail to go out leave their messages to come back after
    /// the ack wait, so nothing is lost.
    async fn settle(&self, acks: Vec<(Subject, Bytes)>) -> bool {
        let count = acks.len();
        let Err(error) = self.send(acks).await else {
            return true;
        };
        tracing::error!(
            queue = self.queue,
            count,
            error,
            "cannot send settlements; JetStream delivers these messages again after their ack wait"
        );
        false
    }
}
