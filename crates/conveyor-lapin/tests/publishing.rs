//! Publishing: exchanges and routing keys, mandatory returns, broker nacks, properties.

mod common;

use std::time::Duration;

use conveyor::{App, Message, Publisher, QueueSpec};
use conveyor_lapin::{ExchangeType, LapinError, PublishOptions, RabbitQueueSpec};

use common::{
    Seen, broker, cleanup, declare_bound_queue, publish_one, ready, record, unique, wait_for,
    wait_until,
};

#[tokio::test]
async fn a_topic_exchange_routes_by_routing_key_and_returns_what_matches_nothing() {
    let broker = broker().await;
    let exchange = unique("topic");
    let queue = unique("topic-orders");
    declare_bound_queue(&broker, &exchange, ExchangeType::Topic, &queue, "orders.*").await;
    let seen = Seen::<u32>::default();
    let running = App::new("topic")
        .with_state(seen.clone())
        .mount(broker.queue(queue.as_str()), record, |m| m)
        .start()
        .await
        .unwrap();

    let publisher = broker.publisher().await.unwrap();
    let options = PublishOptions::default();
    publisher
        .publish_to(
            &exchange,
            "orders.created",
            Message::json(&1u32).unwrap(),
            options,
        )
        .await
        .unwrap();
    let error = publisher
        .publish_to(
            &exchange,
            "payments.made",
            Message::json(&2u32).unwrap(),
            options,
        )
        .await
        .unwrap_err();
    assert!(matches!(error, LapinError::Returned { .. }), "{error}");
    // Not mandatory: the unroutable message is dropped without an error.
    publisher
        .publish_to(
            &exchange,
            "payments.made",
            Message::json(&3u32).unwrap(),
            options.mandatory(false),
        )
        .await
        .unwrap();

    wait_until("the routed message", || seen.len() == 1).await;
    assert_eq!(seen.all(), vec![1]);
    running.shutdown().await.unwrap();
    cleanup(&broker, &[&queue], &[&exchange]).await;
}

#[tokio::test]
async fn a_message_the_broker_refuses_is_a_nack_error() {
    let broker = broker().await;
    let queue = unique("full");
    broker
        .declare_queue(
            &QueueSpec::new(queue.as_str())
                .argument("x-max-length", 1)
                .argument("x-overflow", "reject-publish"),
        )
        .await
        .unwrap();
    broker.publish_json(&queue, &1u32).await.unwrap();
    let error = broker.publish_json(&queue, &2u32).await.unwrap_err();
    let source = std::error::Error::source(&error)
        .and_then(|e| e.downcast_ref::<LapinError>())
        .unwrap();
    assert!(matches!(source, LapinError::Nacked { .. }), "{source}");
    cleanup(&broker, &[&queue], &[]).await;
}

#[tokio::test]
async fn an_expired_message_is_never_delivered() {
    let broker = broker().await;
    let queue = unique("ttl");
    broker
        .declare_queue(&QueueSpec::new(queue.as_str()))
        .await
        .unwrap();
    let publisher = broker.publisher().await.unwrap();
    publisher
        .publish_to(
            "",
            &queue,
            Message::new("stale"),
            PublishOptions::default().expiration(Duration::from_millis(1)),
        )
        .await
        .unwrap();
    wait_for("the message to expire", || async {
        ready(&broker, &queue).await == 0
    })
    .await;
    cleanup(&broker, &[&queue], &[]).await;
}

#[tokio::test]
async fn an_exclusive_auto_delete_queue_can_be_mounted() {
    let broker = broker().await;
    let queue = unique("exclusive");
    broker
        .declare_queue(
            &QueueSpec::new(queue.as_str())
                .durable(false)
                .exclusive()
                .auto_delete(),
        )
        .await
        .unwrap();
    let seen = Seen::<u32>::default();
    let running = App::new("exclusive")
        .with_state(seen.clone())
        .mount(broker.queue(&queue), record, |m| m)
        .start()
        .await
        .unwrap();
    publish_one(&broker, &queue, 5).await;
    wait_until("the message", || seen.len() == 1).await;
    running.shutdown().await.unwrap();
    cleanup(&broker, &[&queue], &[]).await;
}

#[tokio::test]
async fn a_delayed_message_is_refused_with_a_clear_error() {
    let broker = broker().await;
    let publisher = broker.publisher().await.unwrap();
    let error = publisher
        .publish_to(
            "",
            "anything",
            Message::builder()
                .delay(Duration::from_secs(1))
                .payload("x"),
            PublishOptions::default(),
        )
        .await
        .unwrap_err();
    assert!(matches!(error, LapinError::Invalid { .. }), "{error}");
}

/// The AMQP escape hatch: what `publish_amqp` sends, typed header values and properties
/// the portable message has no place for, a subscription's delivery gives back through
/// `amqp_properties`; an expiration the broker would close the channel over is refused
/// before it is sent.
#[tokio::test]
async fn amqp_properties_and_typed_headers_go_out_and_come_back_as_they_are() {
    use conveyor::{Settlement, Source, SubscribeSettings, Subscriber};
    use conveyor_lapin::lapin::BasicProperties;
    use conveyor_lapin::lapin::types::{AMQPValue, FieldArray, FieldTable};

    let broker = broker().await;
    let queue = unique("amqp-properties");
    broker
        .declare_queue(&QueueSpec::new(queue.as_str()))
        .await
        .unwrap();
    let mut table = FieldTable::default();
    table.insert("count".into(), AMQPValue::LongLongInt(7));
    table.insert("flag".into(), AMQPValue::Boolean(true));
    table.insert("list".into(), AMQPValue::FieldArray(FieldArray::default()));
    let properties = BasicProperties::default()
        .with_headers(table.clone())
        .with_type("order.created".into())
        .with_app_id("shop".into())
        .with_timestamp(1_700_000_000);

    let error = broker
        .publish_amqp(
            "",
            &queue,
            "x".into(),
            properties.clone().with_expiration("soon".into()),
        )
        .await
        .unwrap_err();
    let conveyor::Error::Refused { source, .. } = &error else {
        panic!("{error}");
    };
    assert!(
        matches!(
            source.downcast_ref::<LapinError>(),
            Some(LapinError::Invalid {
                what: "expiration",
                ..
            })
        ),
        "{error}"
    );
    broker
        .publish_amqp("", &queue, "{}".into(), properties)
        .await
        .unwrap();

    let mut subscriber = broker
        .queue(queue.as_str())
        .subscribe(SubscribeSettings::new(1))
        .await
        .unwrap();
    let delivery = subscriber.recv().await.unwrap().unwrap();
    let received =
        conveyor_lapin::amqp_properties(&delivery).expect("a RabbitMQ delivery's properties");
    assert_eq!(received.headers().as_ref(), Some(&table));
    assert_eq!(
        received.kind().as_ref().map(|v| v.as_str()),
        Some("order.created")
    );
    assert_eq!(received.app_id().as_ref().map(|v| v.as_str()), Some("shop"));
    assert_eq!(*received.timestamp(), Some(1_700_000_000));
    // The portable view still reads the numbers as text.
    assert_eq!(delivery.headers().get_str("count"), Some("7"));
    assert_eq!(delivery.transport_record::<String>(), None);
    delivery.settle(Settlement::Ack);
    subscriber.close().await;
    cleanup(&broker, &[&queue], &[]).await;
}
