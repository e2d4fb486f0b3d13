//! The portable broker calls on JetStream: declaring a queue (its stream and durable
//! consumer), deleting it, its depth, and taking its dead letters.
//!
//! JetStream 2.9 keeps no metadata on a stream, so a queue's dead-letter policy lives in
//! its stream's description, as JSON (`{"conveyor":{"dead_letter_queue":"d",
//! "max_receive_count":10}}`), where every subscriber reads it.

use std::time::Duration;

use async_nats::jetstream::consumer::{AckPolicy, pull};
use async_nats::jetstream::stream::{self, RetentionPolicy};
use async_nats::jetstream::{self, ErrorCode};
use conveyor::kit::{QueuePolicy, drain_dead_letters};
use conveyor::{DeadLetter, DeadLetterPolicy, Error, QueueDepth, QueueSpec, Report};
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};

use crate::broker::{DEFAULT_CONSUMER, NatsBroker};
use crate::error::NatsError;
use crate::headers;
use crate::names;

/// What a stream's description keeps for Conveyor.
#[derive(Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
struct Description {
    conveyor: QueuePolicy,
}

/// The policy a stream's description holds; none for a description that is not
/// Conveyor's.
pub(crate) fn read_policy(description: Option<&str>) -> QueuePolicy {
    description
        .and_then(|text| serde_json::from_str::<Description>(text).ok())
        .map(|description| description.conveyor)
        .unwrap_or_default()
}

/// The description that keeps `policy`: none without a dead-letter queue.
fn describe(policy: &QueuePolicy) -> Option<String> {
    policy.dead_letter_queue.as_ref()?;
    serde_json::to_string(&Description {
        conveyor: policy.clone(),
    })
    .ok()
}

fn failed(call: &'static str, queue: &str, error: impl std::fmt::Display) -> Error {
    Error::Transport {
        transport: "nats",
        source: Box::new(NatsError::call(call, queue, error)),
    }
}

fn checked(name: &str) -> Result<(), Error> {
    names::check(name).map_err(|e| Error::config(e.to_string()))
}

/// The stream of queue `name`, with `policy` in its description.
fn stream_config(name: &str, policy: &QueuePolicy) -> stream::Config {
    stream::Config {
        name: names::stream(name),
        subjects: vec![name.to_string()],
        retention: RetentionPolicy::WorkQueue,
        description: describe(policy),
        ..Default::default()
    }
}

/// The durable consumer every subscription to a queue shares.
pub(crate) fn consumer_config(name: &str, ack_wait: Duration) -> pull::Config {
    pull::Config {
        durable_name: Some(name.to_string()),
        ack_policy: AckPolicy::Explicit,
        ack_wait,
        // Conveyor counts attempts and dead-letters itself; JetStream's own limit would
        // leave a message in the stream, never delivered again.
        max_deliver: -1,
        // The subscriptions fetch only what they have room for.
        max_ack_pending: -1,
        ..Default::default()
    }
}

/// Declares a queue: its stream (made, or updated to this description) and its
/// consumer (made, or updated to this ack wait).
pub(crate) async fn declare(broker: &NatsBroker, spec: &QueueSpec) -> Result<(), Error> {
    let name = spec.name();
    checked(name)?;
    if spec.delivery_delay().is_some() {
        return Err(Error::config(format!(
            "queue `{name}`: JetStream delays no queue as a whole; delay each message (`Message::builder().delay`)"
        )));
    }
    if let Some(DeadLetterPolicy { queue, .. }) = spec.dead_letter() {
        checked(queue)?;
    }
    let policy = QueuePolicy::of(spec);
    let jetstream = broker.jetstream();
    jetstream
        .create_or_update_stream(stream_config(name, &policy))
        .await
        .map_err(|e| failed("declare stream", name, Report(&e)))?;
    let ack_wait = spec
        .visibility()
        .unwrap_or(broker.settings().visibility_timeout);
    jetstream
        .create_consumer_on_stream(
            consumer_config(DEFAULT_CONSUMER, ack_wait),
            names::stream(name),
        )
        .await
        .map_err(|e| failed("declare consumer", name, Report(&e)))?;
    Ok(())
}

/// Makes the stream of queue `name` with no policy, unless it exists: for a publish or
/// subscription to a queue no one declared.
pub(crate) async fn make_plain(broker: &NatsBroker, name: &str) -> Result<stream::Stream, Error> {
    checked(name)?;
    let stream = broker
        .jetstream()
        .get_or_create_stream(stream_config(name, &QueuePolicy::default()))
        .await
        .map_err(|e| failed("create stream", name, Report(&e)))?;
    Ok(stream)
}

pub(crate) async fn delete(broker: &NatsBroker, name: &str) -> Result<(), Error> {
    checked(name)?;
    match broker.jetstream().delete_stream(names::stream(name)).await {
        Ok(_) => Ok(()),
        Err(e) if stream_missing(&e) => Ok(()),
        Err(e) => Err(failed("delete stream", name, Report(&e))),
    }
}

fn stream_missing(error: &jetstream::context::GetStreamError) -> bool {
    matches!(error.kind(), jetstream::context::GetStreamErrorKind::JetStream(e)
        if e.error_code() == ErrorCode::STREAM_NOT_FOUND)
}

pub(crate) async fn depth(broker: &NatsBroker, name: &str) -> Result<QueueDepth, Error> {
    checked(name)?;
    let mut stream = broker
        .jetstream()
        .get_stream(names::stream(name))
        .await
        .map_err(|e| failed("stream info", name, Report(&e)))?;
    let stored = stream
        .info()
        .await
        .map_err(|e| failed("stream info", name, Report(&e)))?
        .state
        .messages;
    match stream.consumer_info(DEFAULT_CONSUMER).await {
        Ok(info) => Ok(QueueDepth::new(info.num_pending).in_flight(info.num_ack_pending as u64)),
        // No one has subscribed yet: everything stored is ready.
        Err(e) if e.to_string().contains("not found") => Ok(QueueDepth::new(stored).in_flight(0)),
        Err(e) => Err(failed("consumer info", name, Report(&e))),
    }
}

/// Takes up to `max` dead letters out of queue `name`, oldest first.
pub(crate) async fn take(
    broker: &NatsBroker,
    name: &str,
    max: usize,
) -> Result<Vec<DeadLetter>, Error> {
    checked(name)?;
    let stream = make_plain(broker, name).await?;
    let consumer: jetstream::consumer::PullConsumer = stream
        .get_or_create_consumer(
            DEFAULT_CONSUMER,
            consumer_config(DEFAULT_CONSUMER, broker.settings().visibility_timeout),
        )
        .await
        .map_err(|e| failed("declare consumer", name, Report(&e)))?;
    drain_dead_letters(max, |wanted| {
        let consumer = &consumer;
        async move {
            let mut batch = consumer
                .fetch()
                .max_messages(wanted)
                .messages()
                .await
                .map_err(|e| failed("fetch", name, Report(&e)))?;
            let (mut took, mut letters) = (0, Vec::new());
            while let Some(message) = batch.next().await {
                let message = message.map_err(|e| failed("fetch", name, Report(&*e)))?;
                took += 1;
                let incoming = headers::incoming(message.headers.as_ref());
                message
                    .double_ack()
                    .await
                    .map_err(|e| failed("ack", name, Report(&*e)))?;
                letters.push(DeadLetter::new(
                    message.payload.clone(),
                    incoming.headers,
                    incoming.key,
                ));
            }
            Ok((took, letters))
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_letter_policy_round_trips_through_the_stream_description() {
        let policy = QueuePolicy {
            dead_letter_queue: Some("orders-dead".into()),
            max_receive_count: 10,
            visibility_timeout: None,
        };
        let description = describe(&policy);
        assert_eq!(read_policy(description.as_deref()), policy);
    }

    #[test]
    fn a_description_that_is_not_conveyors_holds_no_policy() {
        assert_eq!(
            read_policy(Some("orders of the EU shop")),
            QueuePolicy::default()
        );
        assert_eq!(read_policy(None), QueuePolicy::default());
        assert_eq!(describe(&QueuePolicy::default()), None);
    }
}
