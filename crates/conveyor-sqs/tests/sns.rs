//! SNS fan-out on the emulator (the `sns` feature): a FIFO topic feeds two FIFO queues,
//! whose lanes see every group in order; a filter policy keeps a message out of a queue;
//! a queue subscribed without raw delivery gets the same body and headers.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use conveyor::{
    App, Broker, Bytes, Headers, Json, Message, PartitionKey, Publisher, QueueSpec, State,
};
use conveyor_sqs::{SqsBroker, TopicSubscription};

const DEADLINE: Duration = Duration::from_secs(60);

/// What a queue's mount saw: (queue, key, step) in the order handled.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<(String, String, u32)>>>);

#[derive(Clone)]
struct Queue(String);

async fn record(
    Json(step): Json<u32>,
    key: PartitionKey,
    State(seen): State<Seen>,
    State(queue): State<Queue>,
) {
    seen.0
        .lock()
        .unwrap()
        .push((queue.0, key.to_string(), step));
}

async fn declare_fifo(broker: &SqsBroker, name: &str) -> String {
    common::declare(broker, QueueSpec::new(common::unique(name, true))).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_publish_to_a_fifo_topic_reaches_two_fifo_queues_each_group_in_order() {
    let broker = common::broker().await;
    let sns = broker.sns().unwrap();
    let topic = sns
        .declare_topic(&common::unique("orders", true))
        .await
        .unwrap();
    let (billing, shipping) = (
        declare_fifo(&broker, "billing").await,
        declare_fifo(&broker, "shipping").await,
    );
    for queue in [&billing, &shipping] {
        broker
            .subscribe_to_topic(&sns, &topic, queue, TopicSubscription::raw())
            .await
            .unwrap();
    }
    for step in 0..10u32 {
        for customer in ["alice", "bob", "carol"] {
            let message = Message::builder()
                .partition_key(customer)
                .json(&step)
                .unwrap();
            sns.publish(&topic, message).await.unwrap();
        }
    }

    let seen = Seen::default();
    let mut apps = Vec::new();
    for queue in [&billing, &shipping] {
        let app = App::new("fan-out")
            .with_state(seen.clone())
            .with_state(Queue(queue.clone()))
            .mount(broker.queue(queue.as_str()), record, |m| {
                m.workers(3).by_key()
            })
            .start()
            .await
            .unwrap();
        apps.push(app);
    }
    common::eventually("every step on both queues", DEADLINE, || async {
        seen.0.lock().unwrap().len() >= 60
    })
    .await;
    for app in apps {
        app.shutdown().await.unwrap();
    }

    let mut by_queue_and_key: BTreeMap<(String, String), Vec<u32>> = BTreeMap::new();
    for (queue, key, step) in seen.0.lock().unwrap().iter() {
        by_queue_and_key
            .entry((queue.clone(), key.clone()))
            .or_default()
            .push(*step);
    }
    assert_eq!(
        by_queue_and_key.len(),
        6,
        "three groups on each of two queues"
    );
    for ((queue, key), steps) in by_queue_and_key {
        assert_eq!(
            steps,
            (0..10).collect::<Vec<_>>(),
            "{queue}: {key} in order, once each"
        );
    }
    common::delete(&broker, &[&billing, &shipping]).await;
}

/// What is ready in `queue`, taken until `count` have come.
async fn take(broker: &SqsBroker, queue: &str, count: usize) -> Vec<conveyor::DeadLetter> {
    let taken = Mutex::new(Vec::new());
    common::eventually(
        &format!("{count} messages in {queue}"),
        DEADLINE,
        || async {
            let more = broker.take_dead_letters(queue, 10).await.unwrap();
            let mut taken = taken.lock().unwrap();
            taken.extend(more);
            taken.len() >= count
        },
    )
    .await;
    taken.into_inner().unwrap()
}

#[tokio::test]
async fn a_filter_policy_on_a_header_keeps_a_message_out_of_one_queue() {
    let broker = common::broker().await;
    let sns = broker.sns().unwrap();
    let topic = sns
        .declare_topic(&common::unique("events", false))
        .await
        .unwrap();
    let everything = common::declare(&broker, QueueSpec::new(common::unique("all", false))).await;
    let kept = common::declare(&broker, QueueSpec::new(common::unique("kept", false))).await;
    broker
        .subscribe_to_topic(&sns, &topic, &everything, TopicSubscription::raw())
        .await
        .unwrap();
    broker
        .subscribe_to_topic(
            &sns,
            &topic,
            &kept,
            TopicSubscription::raw().filter("kind", ["keep"]),
        )
        .await
        .unwrap();
    for kind in ["keep", "drop"] {
        let message = Message::builder().header("kind", kind).payload(kind);
        sns.publish(&topic, message).await.unwrap();
    }

    let all = take(&broker, &everything, 2).await;
    assert_eq!(all.len(), 2);
    let only = take(&broker, &kept, 1).await;
    assert_eq!(only.len(), 1);
    assert_eq!(&only[0].payload[..], b"keep");
    // Nothing else comes: the second message was published before the first was taken.
    assert!(
        broker
            .take_dead_letters(&kept, 10)
            .await
            .unwrap()
            .is_empty()
    );
    common::delete(&broker, &[&everything, &kept]).await;
}

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<(Bytes, Headers)>>>);

async fn capture(payload: Bytes, headers: Headers, State(seen): State<Captured>) {
    seen.0.lock().unwrap().push((payload, headers));
}

#[tokio::test]
async fn a_queue_without_raw_delivery_gets_the_same_body_and_headers_unwrapped() {
    let broker = common::broker().await;
    let sns = broker.sns().unwrap();
    let topic = sns
        .declare_topic(&common::unique("wrapped", false))
        .await
        .unwrap();
    let queue = common::declare(&broker, QueueSpec::new(common::unique("envelopes", false))).await;
    broker
        .subscribe_to_topic(&sns, &topic, &queue, TopicSubscription::envelope())
        .await
        .unwrap();
    let binary = Bytes::from_static(&[0, 159, 146, 150, 255]);
    let message = Message::builder()
        .header("x-trace", "abc-123")
        .header("x-binary", binary.clone())
        .message_id("m-1")
        .payload(Bytes::from_static(&[1, 2, 3, 255]));
    sns.publish(&topic, message).await.unwrap();

    let seen = Captured::default();
    let app = App::new("envelopes")
        .with_state(seen.clone())
        .mount(broker.queue(queue.as_str()), capture, |m| m)
        .start()
        .await
        .unwrap();
    common::eventually("the message", DEADLINE, || async {
        !seen.0.lock().unwrap().is_empty()
    })
    .await;
    app.shutdown().await.unwrap();
    let (payload, headers) = seen.0.lock().unwrap()[0].clone();
    assert_eq!(
        &payload[..],
        &[1, 2, 3, 255],
        "the body, base64 in the envelope, decoded"
    );
    assert_eq!(headers.get_str("x-trace"), Some("abc-123"));
    assert_eq!(headers.get("x-binary"), Some(&binary));
    assert_eq!(headers.get_str(conveyor::MESSAGE_ID_HEADER), Some("m-1"));
    assert!(!headers.contains("TopicArn") && !headers.contains("Type"));
    common::delete(&broker, &[&queue]).await;
}

/// A message a FIFO topic cannot take (no partition key, so no message group) is refused
/// before any call, as on a queue: `Error::Refused`, which code that retries publishes
/// (the outbox relay) can tell from a broker failure. (It was an `Error::Publish`.)
#[tokio::test]
async fn a_message_a_fifo_topic_cannot_take_is_refused_before_any_call() {
    let broker = common::broker().await;
    let sns = broker.sns().unwrap();
    let topic = sns
        .declare_topic(&common::unique("keyless", true))
        .await
        .unwrap();
    let refused = sns.publish(&topic, Message::new("x")).await.unwrap_err();
    assert!(
        matches!(&refused, conveyor::Error::Refused { .. }),
        "{refused:?}"
    );
    assert!(
        conveyor::Report(&refused)
            .to_string()
            .contains("message group"),
        "{refused}"
    );
}

/// `publish_typed` gives a header its SNS data type (`Number`, for a filter policy's
/// numeric conditions), and a subscribed queue's delivery has it back, with raw delivery
/// (as an SQS attribute) and without (in SNS's envelope).
#[tokio::test]
async fn a_typed_publish_reaches_raw_and_enveloped_queues_with_its_types() {
    use conveyor::{Settlement, Source, SubscribeSettings, Subscriber};
    use conveyor_sqs::AttributeTypes;

    let broker = common::broker().await;
    let sns = broker.sns().unwrap();
    let topic = sns
        .declare_topic(&common::unique("typed", false))
        .await
        .unwrap();
    let raw = common::declare(&broker, QueueSpec::new(common::unique("typed-raw", false))).await;
    let wrapped = common::declare(
        &broker,
        QueueSpec::new(common::unique("typed-wrapped", false)),
    )
    .await;
    broker
        .subscribe_to_topic(&sns, &topic, &raw, TopicSubscription::raw())
        .await
        .unwrap();
    broker
        .subscribe_to_topic(&sns, &topic, &wrapped, TopicSubscription::envelope())
        .await
        .unwrap();
    let types = AttributeTypes::new().with("amount", "Number");
    let message = Message::builder()
        .header("amount", "120")
        .header("kind", "order")
        .payload("{}");
    sns.publish_typed(&topic, message, &types).await.unwrap();

    for queue in [&raw, &wrapped] {
        let mut subscriber = broker
            .queue(queue.as_str())
            .subscribe(SubscribeSettings::new(1))
            .await
            .unwrap();
        let delivery = tokio::time::timeout(DEADLINE, subscriber.recv())
            .await
            .expect("the message")
            .unwrap()
            .unwrap();
        assert_eq!(
            conveyor_sqs::attribute_types(&delivery),
            Some(types.clone()),
            "{queue}: {:?}",
            delivery.headers()
        );
        assert_eq!(delivery.headers().get_str("amount"), Some("120"));
        delivery.settle(Settlement::Ack);
        subscriber.close().await;
    }
    common::delete(&broker, &[&raw, &wrapped]).await;
}
