//! SQS data types of message attributes (`Number`, custom types, `Binary` holding text)
//! survive what Conveyor sends again: a dead-lettered message, and a publish given the
//! types a delivery came with. Against the moto emulator on 127.0.0.1:4566.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_sqs::primitives::Blob;
use aws_sdk_sqs::types::MessageAttributeValue;
use common::{broker, declare, delete, eventually, queue_url, unique};
use conveyor::{
    App, Bytes, Error, Message, Outcome, QueueSpec, REJECT_REASON_HEADER, Settlement, Source,
    SubscribeSettings, Subscriber,
};
use conveyor_sqs::{AttributeTypes, SqsBroker, SqsError};

/// An attribute as received: its data type, and its value as text or bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Received {
    data_type: String,
    text: Option<String>,
    bytes: Option<Vec<u8>>,
}

fn text(data_type: &str, value: &str) -> Received {
    Received {
        data_type: data_type.into(),
        text: Some(value.into()),
        bytes: None,
    }
}

fn bytes(data_type: &str, value: &[u8]) -> Received {
    Received {
        data_type: data_type.into(),
        text: None,
        bytes: Some(value.to_vec()),
    }
}

fn attribute(received: &Received) -> MessageAttributeValue {
    let builder = MessageAttributeValue::builder().data_type(&received.data_type);
    let builder = match (&received.text, &received.bytes) {
        (Some(text), _) => builder.string_value(text),
        (None, Some(bytes)) => builder.binary_value(Blob::new(bytes.clone())),
        (None, None) => builder,
    };
    builder.build().unwrap()
}

/// Sends a message with these attributes, as a producer that is not Conveyor would.
async fn send_raw(broker: &SqsBroker, queue: &str, attributes: &[(&str, Received)]) {
    let mut send = broker
        .client()
        .send_message()
        .queue_url(queue_url(broker, queue).await)
        .message_body("{}");
    for (name, received) in attributes {
        send = send.message_attributes(*name, attribute(received));
    }
    send.send().await.unwrap();
}

/// The attributes of the messages on `queue`, as SQS hands them out (removing them).
async fn receive_raw(broker: &SqsBroker, queue: &str) -> Vec<HashMap<String, Received>> {
    let url = queue_url(broker, queue).await;
    let output = broker
        .client()
        .receive_message()
        .queue_url(&url)
        .max_number_of_messages(10)
        .wait_time_seconds(1)
        .message_attribute_names("All")
        .send()
        .await
        .unwrap();
    let mut found = Vec::new();
    for message in output.messages() {
        let attributes = message
            .message_attributes()
            .into_iter()
            .flatten()
            .map(|(name, value)| {
                let received = Received {
                    data_type: value.data_type().to_string(),
                    text: value.string_value().map(str::to_string),
                    bytes: value.binary_value().map(|b| b.as_ref().to_vec()),
                };
                (name.clone(), received)
            })
            .collect();
        found.push(attributes);
        broker
            .client()
            .delete_message()
            .queue_url(&url)
            .receipt_handle(message.receipt_handle().unwrap())
            .send()
            .await
            .unwrap();
    }
    found
}

/// What a producer outside Conveyor sent, typed as Conveyor would not type it on its own.
fn typed_attributes() -> Vec<(&'static str, Received)> {
    vec![
        ("price", text("Number", "12.5")),
        ("meta", text("String.json", r#"{"a":1}"#)),
        ("digest", bytes("Binary", b"looks like text")),
        ("tenant", text("String", "acme")),
    ]
}

async fn reject(_payload: Bytes) -> Outcome {
    Outcome::Reject
}

/// Conveyor moves a rejected message to the dead-letter queue itself (to add its
/// reason): the copy keeps the data type of every attribute, where before `Number` and
/// custom types came out as `String` and a `Binary` holding text as `String` too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_keeps_the_data_types_its_attributes_came_with() {
    let broker = broker().await;
    let dlq = declare(&broker, QueueSpec::new(unique("types-dead", false))).await;
    let queue = declare(
        &broker,
        QueueSpec::new(unique("types", false)).dead_letter_queue(&dlq, 5),
    )
    .await;
    send_raw(&broker, &queue, &typed_attributes()).await;
    let running = App::new("types")
        .mount(broker.queue(&queue), reject, |m| m)
        .start()
        .await
        .unwrap();
    let dead = Arc::new(Mutex::new(Vec::new()));
    eventually("the dead letter", Duration::from_secs(30), || async {
        let found = receive_raw(&broker, &dlq).await;
        let mut dead = dead.lock().unwrap();
        dead.extend(found);
        !dead.is_empty()
    })
    .await;
    running.shutdown().await.unwrap();
    let dead = dead.lock().unwrap().clone();
    assert_eq!(dead.len(), 1);
    let attributes = &dead[0];
    for (name, sent) in typed_attributes() {
        assert_eq!(attributes.get(name), Some(&sent), "attribute `{name}`");
    }
    assert_eq!(
        attributes.get(REJECT_REASON_HEADER),
        Some(&text("String", "rejected by the handler"))
    );
    delete(&broker, &[&queue, &dlq]).await;
}

/// A delivery's types come back through `attribute_types`, and `publish_typed` sends a
/// copy with them; the portable headers still read the values as text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_published_with_a_deliverys_types_keeps_them() {
    let broker = broker().await;
    let queue = declare(&broker, QueueSpec::new(unique("types-in", false))).await;
    let copies = declare(&broker, QueueSpec::new(unique("types-out", false))).await;
    send_raw(&broker, &queue, &typed_attributes()).await;

    let mut subscriber = broker
        .queue(queue.as_str())
        .subscribe(SubscribeSettings::new(1))
        .await
        .unwrap();
    let delivery = subscriber.recv().await.unwrap().unwrap();
    let types = conveyor_sqs::attribute_types(&delivery).expect("an SQS delivery's types");
    assert_eq!(
        types,
        AttributeTypes::new()
            .with("price", "Number")
            .with("meta", "String.json")
            .with("digest", "Binary"),
        "only the types the values alone would not give"
    );
    assert_eq!(delivery.headers().get_str("price"), Some("12.5"));
    let copy = Message::received(delivery.payload().clone(), delivery.headers().clone());
    broker.publish_typed(&copies, copy, &types).await.unwrap();
    delivery.settle(Settlement::Ack);
    subscriber.close().await;

    let copied = receive_raw(&broker, &copies).await;
    assert_eq!(copied.len(), 1);
    for (name, sent) in typed_attributes() {
        assert_eq!(copied[0].get(name), Some(&sent), "attribute `{name}`");
    }
    delete(&broker, &[&queue, &copies]).await;
}

/// A type SQS would refuse, or a value its type cannot carry, is refused before any
/// call, naming the header.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_type_sqs_would_refuse_is_refused_before_the_call() {
    let broker = broker().await;
    let queue = declare(&broker, QueueSpec::new(unique("types-bad", false))).await;
    for (value, data_type, why) in [
        ("twelve", "Number", "carries a number"),
        ("12", "Integer", "is not String, Number or Binary"),
        ("12", "Number.", "custom label"),
    ] {
        let message = Message::builder().header("price", value).payload("{}");
        let types = AttributeTypes::new().with("price", data_type);
        let error = broker
            .publish_typed(&queue, message, &types)
            .await
            .unwrap_err();
        let Error::Refused { source, .. } = &error else {
            panic!("{data_type}: {error}");
        };
        assert!(
            matches!(source.downcast_ref(), Some(SqsError::InvalidMessage { .. })),
            "{error}"
        );
        let text = conveyor::Report(&error).to_string();
        assert!(text.contains("`price`") && text.contains(why), "{text}");
    }
    assert!(
        receive_raw(&broker, &queue).await.is_empty(),
        "nothing sent"
    );
    delete(&broker, &[&queue]).await;
}
