//! SNS fan-out (the `sns` feature): publish to a topic, and subscribe SQS queues to it.
//!
//! [`SnsPublisher`] is a [`Publisher`] whose destinations are topics (a name, which it
//! creates or finds, or an ARN). A message maps onto SNS as onto SQS: headers and
//! properties as message attributes (ten at most, since a queue subscribed with raw
//! delivery gets them as its own), a body SNS cannot carry as text in base64 (an empty
//! one as a marked placeholder, since SNS and SQS take no empty body), headers with an
//! empty value by name in one attribute (SNS and SQS take no empty value); on a FIFO
//! topic (a name ending in `.fifo`) the partition key is the `MessageGroupId` and the
//! message id, else a fresh one, the deduplication id.
//!
//! [`SqsBroker::subscribe_to_topic`] subscribes a queue with raw delivery (the consumer
//! sees the original body and attributes, not SNS's envelope), allows the topic to send
//! to the queue in the queue's policy, and can filter on a header. A queue subscribed
//! without raw delivery gets envelopes, which the consumer unwraps: body and headers come
//! out the same.
//!
//! ```no_run
//! use conveyor::{Message, Publisher};
//! use conveyor_sqs::{SqsBroker, TopicSubscription};
//!
//! # async fn demo() -> Result<(), conveyor::Error> {
//! let broker = SqsBroker::builder().region("eu-west-1").build().await?;
//! let sns = broker.sns()?;
//! let topic = sns.declare_topic("orders.fifo").await?;
//! broker.subscribe_to_topic(&sns, &topic, "billing.fifo", TopicSubscription::raw()).await?;
//! broker
//!     .subscribe_to_topic(&sns, &topic, "shipping.fifo", TopicSubscription::raw().filter("kind", ["physical"]))
//!     .await?;
//! let order = Message::builder().partition_key("alice").header("kind", "physical").payload("tea");
//! sns.publish(&topic, order).await?; // both queues get it, alice's group in order
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use aws_sdk_sns::Client;
use aws_sdk_sns::primitives::Blob;
use aws_sdk_sns::types::MessageAttributeValue;
use conveyor::{Error, Message, Publisher};
use tracing::Instrument;

use crate::attributes;
use crate::broker::{SqsBroker, transport};
use crate::data_types::AttributeTypes;
use crate::error::SqsError;
use crate::publisher::unique_id;

/// Publishes to SNS topics. Cloning gives another handle to the same client.
#[derive(Clone, Debug)]
pub struct SnsPublisher {
    client: Client,
    /// Topic ARNs by the name they were asked for.
    topics: Arc<Mutex<HashMap<String, Arc<str>>>>,
}

/// How [`SqsBroker::subscribe_to_topic`] subscribes a queue.
#[derive(Clone, Debug)]
#[must_use]
pub struct TopicSubscription {
    raw: bool,
    filter: Option<(String, Vec<String>)>,
}

impl TopicSubscription {
    /// Raw delivery: the queue gets the message's own body and attributes.
    pub fn raw() -> Self {
        TopicSubscription {
            raw: true,
            filter: None,
        }
    }

    /// SNS's JSON envelope around each message (which the consumer unwraps).
    pub fn envelope() -> Self {
        TopicSubscription {
            raw: false,
            filter: None,
        }
    }

    /// Only messages whose header `name` holds one of `values` reach the queue (an SNS
    /// filter policy on that message attribute).
    pub fn filter<V: Into<String>>(
        mut self,
        name: impl Into<String>,
        values: impl IntoIterator<Item = V>,
    ) -> Self {
        self.filter = Some((name.into(), values.into_iter().map(Into::into).collect()));
        self
    }
}

impl SnsPublisher {
    /// A publisher over a client you configured yourself.
    pub fn from_client(client: Client) -> Self {
        SnsPublisher {
            client,
            topics: Arc::default(),
        }
    }

    /// The SDK client, for calls Conveyor does not make.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Creates the topic `name` (FIFO if it ends in `.fifo`), or finds it if it exists;
    /// returns its ARN.
    ///
    /// # Errors
    ///
    /// SNS's error when it refuses the name or the call.
    pub async fn declare_topic(&self, name: &str) -> Result<String, Error> {
        self.arn(name)
            .await
            .map(|arn| arn.to_string())
            .map_err(transport)
    }

    /// The ARN of `topic`: itself if it is one, else the topic of that name, created if
    /// missing (`CreateTopic` is idempotent) and cached.
    async fn arn(&self, topic: &str) -> Result<Arc<str>, SqsError> {
        if topic.starts_with("arn:") {
            return Ok(topic.into());
        }
        if let Some(arn) = conveyor::kit::lock(&self.topics).get(topic) {
            return Ok(arn.clone());
        }
        let mut create = self.client.create_topic().name(topic);
        if topic.ends_with(".fifo") {
            create = create.attributes("FifoTopic", "true");
        }
        let created = create
            .send()
            .await
            .map_err(|e| SqsError::sns_call("CreateTopic", topic, e))?;
        let arn: Arc<str> = created
            .topic_arn()
            .ok_or_else(|| SqsError::Unexpected {
                call: "CreateTopic",
                queue: topic.to_string(),
                detail: "no TopicArn".into(),
            })?
            .into();
        conveyor::kit::lock(&self.topics).insert(topic.to_string(), arn.clone());
        Ok(arn)
    }

    async fn send(
        &self,
        topic: &str,
        message: Message,
        types: &AttributeTypes,
    ) -> Result<(), SqsError> {
        let arn = self.arn(topic).await?;
        let fifo = arn.ends_with(".fifo");
        let parts = message.into_parts();
        let outgoing = attributes::encode(topic, fifo, &parts, types)?;
        let (group, deduplication) = if fifo {
            let group = parts
                .partition_key
                .as_ref()
                .ok_or_else(|| SqsError::InvalidMessage {
                    queue: topic.to_string(),
                    reason: "a FIFO topic needs a message group: set the message's partition_key"
                        .into(),
                })?;
            let id = parts.message_id.clone().unwrap_or_else(unique_id);
            (Some(group.as_str().to_string()), Some(id))
        } else {
            (None, None)
        };
        let message_attributes = outgoing
            .attributes
            .into_iter()
            .map(|(name, value)| Ok((name, sns_attribute(&value)?)))
            .collect::<Result<HashMap<_, _>, SqsError>>()?;
        self.client
            .publish()
            .topic_arn(&*arn)
            .message(outgoing.body)
            .set_message_attributes(Some(message_attributes).filter(|a| !a.is_empty()))
            .set_message_group_id(group)
            .set_message_deduplication_id(deduplication)
            .send()
            .await
            .map_err(|e| SqsError::sns_call("Publish", topic, e))?;
        Ok(())
    }
}

/// An SQS message attribute as SNS's.
fn sns_attribute(
    value: &aws_sdk_sqs::types::MessageAttributeValue,
) -> Result<MessageAttributeValue, SqsError> {
    MessageAttributeValue::builder()
        .data_type(value.data_type())
        .set_string_value(value.string_value().map(str::to_string))
        .set_binary_value(value.binary_value().map(|b| Blob::new(b.as_ref())))
        .build()
        .map_err(|e| SqsError::Unexpected {
            call: "Publish",
            queue: String::new(),
            detail: e.to_string(),
        })
}

/// Publishes to the topic `destination` (a name or an ARN) with SNS's `Publish`; a batch
/// is published one message after another, in order.
impl Publisher for SnsPublisher {
    async fn publish(&self, destination: &str, message: Message) -> Result<(), Error> {
        self.publish_typed(destination, message, &AttributeTypes::new())
            .await
    }
}

impl SnsPublisher {
    /// [`Publisher::publish`] with data types for some of the message's headers, as
    /// [`SqsBroker::publish_typed`] sends them: `Number` for a header a subscription's
    /// filter policy compares as a number, say (SNS matches numeric conditions only on
    /// `Number` attributes). SNS takes `String`, `String.Array`, `Number` and `Binary`.
    ///
    /// ```no_run
    /// # async fn f(sns: conveyor_sqs::SnsPublisher) -> Result<(), conveyor::Error> {
    /// use conveyor::Message;
    /// use conveyor_sqs::AttributeTypes;
    ///
    /// let message = Message::builder().header("amount", "120").json(&"order")?;
    /// let types = AttributeTypes::new().with("amount", "Number");
    /// sns.publish_typed("orders", message, &types).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Refused`] for a message SNS would refuse, before any call, else SNS's
    /// error.
    pub async fn publish_typed(
        &self,
        destination: &str,
        mut message: Message,
        types: &AttributeTypes,
    ) -> Result<(), Error> {
        let span = conveyor::trace::publish_span("aws_sns", destination);
        conveyor::trace::inject_context(&span, message.headers_mut());
        let sent = self
            .send(destination, message, types)
            .instrument(span)
            .await;
        let error = sent.as_ref().err().map(|error| match error {
            SqsError::InvalidMessage { .. } => "invalid",
            _ => "error",
        });
        conveyor::telemetry::record_sent("aws_sns", destination, 1, error);
        // Named whole: a topic's name or ARN can be longer than any queue's.
        sent.map_err(|error| error.into_publish(destination.to_string()))
    }
}

impl SqsBroker {
    /// An SNS publisher from the same configuration chain as this broker (region,
    /// credentials, endpoint, HTTP client). A broker made with
    /// [`SqsBroker::from_client`] has no chain to share: that is [`Error::Config`]; make
    /// one with [`SnsPublisher::from_client`].
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for a broker made with [`SqsBroker::from_client`].
    pub fn sns(&self) -> Result<SnsPublisher, Error> {
        let config = self.sdk_config().ok_or_else(|| {
            Error::config(
                "this SQS broker was made from a client; make the SNS publisher with SnsPublisher::from_client",
            )
        })?;
        Ok(SnsPublisher::from_client(Client::new(config)))
    }

    /// Subscribes `queue` (a name or URL; it must exist) to `topic` (a name or ARN),
    /// as `subscription` says, after adding to the queue's policy a statement that lets
    /// the topic send to it (kept with any the policy had). Subscribing again with the
    /// same settings changes nothing. Returns the subscription's ARN. The policy is read,
    /// changed and written back: subscribe one queue to several topics one after
    /// another, not at once, or a statement may be lost.
    ///
    /// # Errors
    ///
    /// SQS's or SNS's error: a missing queue or topic, a refused policy or subscription.
    pub async fn subscribe_to_topic(
        &self,
        sns: &SnsPublisher,
        topic: &str,
        queue: &str,
        subscription: TopicSubscription,
    ) -> Result<String, Error> {
        let topic_arn = sns.arn(topic).await.map_err(transport)?;
        let info = self.resolve(queue).await.map_err(transport)?;
        let queue_arn = info.arn.clone().ok_or_else(|| {
            transport(SqsError::Unexpected {
                call: "GetQueueAttributes",
                queue: crate::error::redacted(queue).into_owned(),
                detail: "no QueueArn".into(),
            })
        })?;
        self.allow_topic(&info.url, queue, &queue_arn, &topic_arn)
            .await
            .map_err(transport)?;
        let mut subscribe = sns
            .client
            .subscribe()
            .topic_arn(&*topic_arn)
            .protocol("sqs")
            .endpoint(&queue_arn)
            .return_subscription_arn(true)
            .attributes(
                "RawMessageDelivery",
                if subscription.raw { "true" } else { "false" },
            );
        if let Some((name, values)) = &subscription.filter {
            let policy = serde_json::json!({ name.as_str(): values });
            subscribe = subscribe.attributes("FilterPolicy", policy.to_string());
        }
        let subscribed = subscribe
            .send()
            .await
            .map_err(|e| transport(SqsError::sns_call("Subscribe", topic, e)))?;
        Ok(subscribed
            .subscription_arn()
            .unwrap_or_default()
            .to_string())
    }

    /// Adds to the queue's policy a statement that lets `topic_arn` send to it, unless
    /// one is there.
    async fn allow_topic(
        &self,
        url: &str,
        queue: &str,
        queue_arn: &str,
        topic_arn: &str,
    ) -> Result<(), SqsError> {
        use aws_sdk_sqs::types::QueueAttributeName;
        let current = self
            .client()
            .get_queue_attributes()
            .queue_url(url)
            .attribute_names(QueueAttributeName::Policy)
            .send()
            .await
            .map_err(|e| SqsError::call("GetQueueAttributes", queue, e))?;
        let mut policy: serde_json::Value = current
            .attributes()
            .and_then(|a| a.get(&QueueAttributeName::Policy))
            .and_then(|text| serde_json::from_str(text).ok())
            .unwrap_or_else(|| serde_json::json!({ "Version": "2012-10-17", "Statement": [] }));
        // Named after the whole ARN (region and account included), letters and digits.
        let sid = format!("ConveyorSns{:016x}", fnv1a(topic_arn.as_bytes()));
        // The grammar allows one statement as an object, or none: make it a list, keeping
        // what is there.
        let statements = match policy.get_mut("Statement").map(serde_json::Value::take) {
            Some(serde_json::Value::Array(statements)) => statements,
            Some(serde_json::Value::Null) | None => Vec::new(),
            Some(one) => vec![one],
        };
        policy["Statement"] = serde_json::Value::Array(statements);
        let Some(serde_json::Value::Array(statements)) = policy.get_mut("Statement") else {
            return Ok(());
        };
        if statements
            .iter()
            .any(|s| s.get("Sid").and_then(|v| v.as_str()) == Some(&sid))
        {
            return Ok(());
        }
        statements.push(serde_json::json!({
            "Sid": sid,
            "Effect": "Allow",
            "Principal": { "Service": "sns.amazonaws.com" },
            "Action": "sqs:SendMessage",
            "Resource": queue_arn,
            "Condition": { "ArnEquals": { "aws:SourceArn": topic_arn } },
        }));
        self.client()
            .set_queue_attributes()
            .queue_url(url)
            .attributes(QueueAttributeName::Policy, policy.to_string())
            .send()
            .await
            .map_err(|e| SqsError::call("SetQueueAttributes", queue, e))?;
        Ok(())
    }
}

/// 64-bit FNV-1a, for a statement id that names a topic ARN in letters and digits.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}
