//! Publishing and receiving one message keeps its payload, headers, key and properties.

mod common;

use conveyor::{App, DeliveryInfo, Headers, Json, Message, PartitionKey, QueueSpec, State};
use conveyor_lapin::{LapinError, PublishOptions, RabbitQueueSpec};

use common::{Seen, broker, cleanup, ready, unique, wait_until};

#[derive(serde::Serialize, serde::Deserialize, Clone, Debug, PartialEq)]
struct Order {
    id: u64,
    item: String,
}

type Record = (Order, Headers, PartitionKey, DeliveryInfo);

async fn record(
    Json(order): Json<Order>,
    headers: Headers,
    key: PartitionKey,
    info: DeliveryInfo,
    State(seen): State<Seen<Record>>,
) {
    seen.push((order, headers, key, info));
}

#[tokio::test]
async fn round_trip_keeps_payload_headers_key_and_properties() {
    let broker = broker().await;
    let queue = unique("round-trip");
    broker
        .declare_queue(&QueueSpec::new(queue.as_str()).max_priority(10))
        .await
        .unwrap();
    let seen = Seen::<Record>::default();
    let running = App::new("round-trip")
        .with_state(seen.clone())
        .mount(broker.queue(&queue), record, |m| m)
        .start()
        .await
        .unwrap();

    let publisher = broker.publisher().await.unwrap();
    let order = Order {
        id: 7,
        item: "tea".into(),
    };
    let message = Message::builder()
        .partition_key("alice")
        .header("x-tenant", "acme")
        .message_id("m-1")
        .correlation_id("c-1")
        .json(&order)
        .unwrap();
    publisher
        .publish_to("", &queue, message, PublishOptions::default().priority(5))
        .await
        .unwrap();

    wait_until("the message to be handled", || seen.len() == 1).await;
    let (got, headers, key, info) = seen.all().remove(0);
    assert_eq!(got, order);
    assert_eq!(key, "alice");
    assert_eq!(headers.get_str("x-tenant"), Some("acme"));
    assert_eq!(headers.get_str("amqp-partition-key"), Some("alice"));
    assert_eq!(headers.get_str("content-type"), Some("application/json"));
    assert_eq!(headers.get_str("message-id"), Some("m-1"));
    assert_eq!(headers.get_str("correlation-id"), Some("c-1"));
    assert_eq!(headers.get_str("priority"), Some("5"));
    assert_eq!(&*info.queue, queue.as_str());
    assert_eq!(info.attempt, 1);
    assert!(!info.redelivered);

    running.shutdown().await.unwrap();
    assert_eq!(ready(&broker, &queue).await, 0);
    cleanup(&broker, &[&queue], &[]).await;
}

#[tokio::test]
async fn an_unroutable_mandatory_publish_is_an_error() {
    let broker = broker().await;
    let publisher = broker.publisher().await.unwrap();
    let error = publisher
        .publish_to(
            "",
            &unique("nowhere"),
            Message::new("x"),
            PublishOptions::default(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(error, LapinError::Returned { code: 312, .. }),
        "{error}"
    );
}

/// Publishes on one channel each get their own return. RabbitMQ returns an unroutable
/// message at once and confirms it with the others, often in one `multiple` ack; lapin
/// gave the oldest waiting return to whichever publish that ack completed first (a
/// `HashMap`'s order), so a routed publish could fail as returned (and be sent again)
/// while the returned one succeeded (and was lost). A correct pairing never fails this
/// test; without it, it failed at its first rounds.
#[tokio::test]
async fn publishes_sharing_a_channel_each_get_their_own_return() {
    let broker = broker().await;
    let queue = unique("routed");
    broker
        .declare_queue(&QueueSpec::new(queue.as_str()))
        .await
        .unwrap();
    let nowhere = unique("nowhere");
    let publisher = broker.publisher().await.unwrap();
    each_gets_its_own_return(|_, unroutable| {
        let to = if unroutable { &nowhere } else { &queue };
        publisher.publish_to("", to, Message::new("x"), PublishOptions::default())
    })
    .await;
    cleanup(&broker, &[&queue], &[]).await;
}

/// 50 rounds of 64 concurrent publishes on one channel, `publish(i, unroutable)` each,
/// every sixteenth unroutable: each of those fails as returned, every other succeeds.
async fn each_gets_its_own_return<F, Fut>(publish: F)
where
    F: Fn(usize, bool) -> Fut,
    Fut: Future<Output = Result<(), LapinError>>,
{
    let unroutable = |i: usize| i % 16 == 7;
    for round in 0..50 {
        let publishes = (0..64).map(|i| publish(i, unroutable(i)));
        let results = futures_util::future::join_all(publishes).await;
        for (i, result) in results.into_iter().enumerate() {
            if unroutable(i) {
                assert!(
                    matches!(result, Err(LapinError::Returned { code: 312, .. })),
                    "round {round}: the unroutable publish: {result:?}"
                );
            } else {
                assert!(result.is_ok(), "round {round}, publish {i}: {result:?}");
            }
        }
    }
}

/// A publish without a message id never takes the return of one with an id, through
/// one exchange and routing key: a headers exchange routes those without an id (they
/// carry the header the binding asks for) and returns those with one, many under one
/// `multiple` confirm. When a publish without an id took any id's return, a routed one
/// failed as returned (and would be sent again) and a returned one was reported
/// confirmed (and lost).
#[tokio::test]
async fn a_publish_without_a_message_id_never_takes_the_return_of_one_with_an_id() {
    use conveyor_lapin::{Binding, ExchangeSpec, ExchangeType};

    let broker = broker().await;
    let (queue, exchange) = (unique("by-header"), unique("headers"));
    broker
        .declare_queue(&QueueSpec::new(queue.as_str()))
        .await
        .unwrap();
    broker
        .declare_exchange(&ExchangeSpec::new(exchange.as_str(), ExchangeType::Headers))
        .await
        .unwrap();
    let binding = Binding::new(queue.as_str(), exchange.as_str(), "")
        .argument("x-match", "all")
        .argument("route", "yes");
    broker.bind(&binding).await.unwrap();
    let publisher = broker.publisher().await.unwrap();
    each_gets_its_own_return(|i, unroutable| {
        let message = if unroutable {
            Message::builder()
                .message_id(format!("x-{i}"))
                .payload("returned")
        } else {
            Message::builder().header("route", "yes").payload("routed")
        };
        publisher.publish_to(&exchange, "", message, PublishOptions::default())
    })
    .await;
    cleanup(&broker, &[&queue], &[&exchange]).await;
}

#[tokio::test]
async fn a_passive_queue_names_the_missing_queue() {
    let broker = broker().await;
    let queue = unique("missing");
    async fn ignore(_: conveyor::Bytes) {}
    let error = App::new("passive")
        .mount(broker.queue(&queue).passive(), ignore, |m| m)
        .start()
        .await
        .unwrap_err();
    let text = format!("{error}: {}", std::error::Error::source(&error).unwrap());
    assert!(text.contains(&queue), "{text}");
    assert!(text.contains("does not exist"), "{text}");
}

#[tokio::test]
async fn a_bad_password_never_shows_in_the_error() {
    let error = conveyor_lapin::LapinBroker::connect("amqp://guest:hunter2@127.0.0.1:5672/%2f")
        .await
        .unwrap_err();
    let text = format!("{error} {error:?}");
    assert!(!text.contains("hunter2"), "{text}");
    assert!(text.contains("***"), "{text}");
}

#[tokio::test]
async fn an_invalid_url_is_reported_without_its_password() {
    let error = conveyor_lapin::LapinBroker::connect("amqp://guest:hunter2@127.0.0.1:notaport/")
        .await
        .unwrap_err();
    let text = format!("{error} {error:?}");
    assert!(matches!(error, LapinError::InvalidUrl { .. }), "{text}");
    assert!(!text.contains("hunter2"), "{text}");
}
