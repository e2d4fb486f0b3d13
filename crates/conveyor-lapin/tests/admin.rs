//! The portable broker API on RabbitMQ: queues declared from the core's `QueueSpec` (with
//! RabbitMQ's extras), mounted by their bare name, counted, emptied of dead letters and
//! deleted, by code that is generic over the broker.

mod common;

use std::time::Duration;

use conveyor::{App, Broker, Json, Message, Outcome, PartitionKey, Publisher, QueueSpec, State};
use conveyor_lapin::{LapinBroker, LapinError, RabbitQueueSpec};

use common::{Seen, broker, cleanup, queue_arguments, ready, unique, wait_for, wait_until};

/// Rejects 7, acks the rest; records each.
async fn reject_seven(Json(n): Json<u32>, State(seen): State<Seen<u32>>) -> Outcome {
    seen.push(n);
    if n == 7 {
        Outcome::Reject
    } else {
        Outcome::Ack
    }
}

/// Waits until `queue` holds `n` ready messages.
async fn wait_ready(broker: &LapinBroker, queue: &str, n: u64) {
    wait_for(&format!("{n} messages ready in {queue}"), || async {
        ready(broker, queue).await == n
    })
    .await;
}

/// The regression this API fixes: a queue declared with arguments used to be declared
/// again without them when mounted, and RabbitMQ refused (PRECONDITION_FAILED).
#[tokio::test]
async fn a_quorum_queue_with_a_dead_letter_queue_is_mounted_by_its_bare_name() {
    let broker = broker().await;
    let queue = unique("bare-quorum");
    let dlq = unique("bare-quorum-dead");
    broker
        .declare_queue(&QueueSpec::new(dlq.as_str()).quorum())
        .await
        .unwrap();
    broker
        .declare_queue(
            &QueueSpec::new(queue.as_str())
                .dead_letter_queue(dlq.as_str(), 5)
                .quorum(),
        )
        .await
        .unwrap();
    let seen = Seen::<u32>::default();
    let running = App::new("bare-quorum")
        .with_state(seen.clone())
        .mount(broker.queue(&queue), reject_seven, |m| m.workers(2))
        .start()
        .await
        .unwrap();
    for n in [1, 7, 2] {
        broker.publish_json(&queue, &n).await.unwrap();
    }
    wait_until("three messages handled", || seen.len() == 3).await;
    wait_ready(&broker, &dlq, 1).await;
    running.shutdown().await.unwrap();

    let dead = broker.take_dead_letters(&dlq, 10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(&dead[0].payload[..], b"7");
    assert_eq!(dead[0].reason.as_deref(), Some("rejected by the handler"));
    assert_eq!(ready(&broker, &queue).await, 0);
    assert!(
        queue_arguments(&queue).contains("quorum"),
        "still a quorum queue"
    );
    cleanup(&broker, &[&queue, &dlq], &[]).await;
}

/// A broker that did not declare the queue knows nothing of its arguments: it checks
/// the queue and leaves it as it is. Not knowing the dead-letter target, it rejects with
/// a nack, and RabbitMQ dead-letters the message by itself, without the reason.
#[tokio::test]
async fn a_queue_declared_by_another_broker_keeps_its_arguments_when_mounted_by_name() {
    let owner = broker().await;
    let queue = unique("elsewhere");
    let dlq = unique("elsewhere-dead");
    owner
        .declare_queue(&QueueSpec::new(dlq.as_str()))
        .await
        .unwrap();
    owner
        .declare_queue(
            &QueueSpec::new(queue.as_str())
                .dead_letter_queue(dlq.as_str(), 5)
                .quorum()
                .single_active_consumer(),
        )
        .await
        .unwrap();

    let broker = broker().await;
    let seen = Seen::<u32>::default();
    let running = App::new("elsewhere")
        .with_state(seen.clone())
        .mount(broker.queue(&queue), reject_seven, |m| m)
        .start()
        .await
        .unwrap();
    broker.publish_json(&queue, &7u32).await.unwrap();
    wait_ready(&broker, &dlq, 1).await;
    running.shutdown().await.unwrap();

    let arguments = queue_arguments(&queue);
    assert!(arguments.contains("quorum"), "{arguments}");
    assert!(
        arguments.contains("x-single-active-consumer"),
        "{arguments}"
    );
    let dead = broker.take_dead_letters(&dlq, 10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].reason, None, "the broker's own dead-lettering");
    cleanup(&owner, &[&queue, &dlq], &[]).await;
}

#[tokio::test]
async fn mounting_a_queue_that_does_not_exist_declares_it_durable_without_arguments() {
    let broker = broker().await;
    let queue = unique("undeclared");
    let seen = Seen::<u32>::default();
    let running = App::new("undeclared")
        .with_state(seen.clone())
        .mount(broker.queue(&queue), common::record, |m| m)
        .start()
        .await
        .unwrap();
    broker.publish_json(&queue, &1u32).await.unwrap();
    wait_until("the message", || seen.len() == 1).await;
    running.shutdown().await.unwrap();
    assert_eq!(queue_arguments(&queue), "[]");
    cleanup(&broker, &[&queue], &[]).await;
}

/// The local broker (3.10) accepts `x-consumer-timeout` on classic and quorum queues
/// alike (3.12 and later enforce it).
#[tokio::test]
async fn the_portable_settings_become_queue_arguments_the_broker_accepts() {
    let broker = broker().await;
    let dlq = unique("mapped-dead");
    broker
        .declare_queue(&QueueSpec::new(dlq.as_str()))
        .await
        .unwrap();
    let portable = |name: &str| {
        QueueSpec::new(name)
            .dead_letter_queue(dlq.as_str(), 4)
            .visibility_timeout(Duration::from_secs(120))
    };
    let classic = format!("{}.fifo", unique("mapped-classic"));
    let quorum = format!("{}.fifo", unique("mapped-quorum"));
    broker.declare_queue(&portable(&classic)).await.unwrap();
    broker
        .declare_queue(&portable(&quorum).quorum())
        .await
        .unwrap();

    for (queue, delivery_limit) in [(&classic, false), (&quorum, true)] {
        let arguments = queue_arguments(queue);
        for expected in [
            "{\"x-dead-letter-exchange\",[]}".to_string(),
            format!("{{\"x-dead-letter-routing-key\",\"{dlq}\"}}"),
            "{\"x-consumer-timeout\",120000}".to_string(),
            "{\"x-single-active-consumer\",true}".to_string(),
        ] {
            assert!(arguments.contains(&expected), "{expected} in {arguments}");
        }
        assert_eq!(
            arguments.contains("{\"x-delivery-limit\",4}"),
            delivery_limit,
            "{arguments}"
        );
    }
    cleanup(&broker, &[&classic, &quorum, &dlq], &[]).await;
}

/// With `x-delivery-limit = 2`, the broker delivers a message three times, then
/// dead-letters it: the portable max receive count, enforced by a quorum queue.
#[tokio::test]
async fn a_quorum_queue_dead_letters_a_message_received_more_often_than_the_max_receive_count() {
    use lapin::options::{BasicGetOptions, BasicNackOptions};

    let broker = broker().await;
    let queue = unique("delivery-limit");
    let dlq = unique("delivery-limit-dead");
    broker
        .declare_queue(&QueueSpec::new(dlq.as_str()))
        .await
        .unwrap();
    broker
        .declare_queue(
            &QueueSpec::new(queue.as_str())
                .dead_letter_queue(dlq.as_str(), 2)
                .quorum(),
        )
        .await
        .unwrap();
    broker.publish_json(&queue, &1u32).await.unwrap();

    let connection =
        lapin::Connection::connect(common::URL, lapin::ConnectionProperties::default())
            .await
            .unwrap();
    let channel = connection.create_channel().await.unwrap();
    let mut deliveries = 0;
    while deliveries < 10 {
        let Some(message) = channel
            .basic_get(queue.as_str().into(), BasicGetOptions::default())
            .await
            .unwrap()
        else {
            break;
        };
        deliveries += 1;
        message
            .delivery
            .acker
            .nack(BasicNackOptions {
                multiple: false,
                requeue: true,
            })
            .await
            .unwrap();
    }
    let _ = connection.close(200, "done".into()).await;
    wait_ready(&broker, &dlq, 1).await;
    assert_eq!(deliveries, 3, "delivered, then redelivered twice");
    cleanup(&broker, &[&queue, &dlq], &[]).await;
}

#[tokio::test]
async fn declaring_a_queue_whose_dead_letter_queue_is_missing_is_a_configuration_error() {
    let broker = broker().await;
    let queue = unique("no-dlq");
    let dlq = unique("no-dlq-dead");
    let error = broker
        .declare_queue(&QueueSpec::new(queue.as_str()).dead_letter_queue(dlq.as_str(), 3))
        .await
        .unwrap_err();
    let conveyor::Error::Config(text) = &error else {
        panic!("expected a configuration error, got {error:?}");
    };
    assert!(
        text.contains(&dlq) && text.contains("declare it first"),
        "{text}"
    );
    assert!(
        broker.queue_depth(&queue).await.is_err(),
        "the queue was not declared"
    );
}

#[tokio::test]
async fn a_queue_level_delay_is_refused_before_anything_is_declared() {
    let broker = broker().await;
    let queue = unique("queue-delay");
    let error = broker
        .declare_queue(&QueueSpec::new(queue.as_str()).delay(Duration::from_secs(5)))
        .await
        .unwrap_err();
    assert!(matches!(error, conveyor::Error::Config(_)), "{error}");
    assert!(broker.queue_depth(&queue).await.is_err());
}

/// RabbitMQ cannot change a queue's arguments: it refuses, and closes the channel the
/// declaration was made on. The broker takes a new one for what comes next.
#[tokio::test]
async fn redeclaring_a_queue_with_other_arguments_is_a_transport_error_and_the_broker_goes_on() {
    let broker = broker().await;
    let queue = unique("redeclared");
    broker
        .declare_queue(&QueueSpec::new(queue.as_str()))
        .await
        .unwrap();
    let error = broker
        .declare_queue(&QueueSpec::new(queue.as_str()).quorum())
        .await
        .unwrap_err();
    let source = std::error::Error::source(&error).and_then(|e| e.downcast_ref::<LapinError>());
    assert!(
        matches!(error, conveyor::Error::Transport { .. })
            && matches!(source, Some(LapinError::Declare { .. })),
        "{error:?}"
    );
    assert!(
        conveyor::Report(&error)
            .to_string()
            .contains("PRECONDITION_FAILED"),
        "{error}"
    );

    let next = unique("after-refusal");
    broker
        .declare_queue(&QueueSpec::new(next.as_str()))
        .await
        .unwrap();
    cleanup(&broker, &[&queue, &next], &[]).await;
}

async fn retry_in_ten_minutes(_: Json<u32>, State(seen): State<Seen<u32>>) -> Outcome {
    seen.push(1);
    Outcome::RetryAfter(Duration::from_secs(600))
}

/// A message waiting out a retry-after counts as delayed (it is in the delay queue), not
/// ready, for this broker and for any other; in flight is unknown on AMQP. Deleting the queue deletes its delay queue too,
/// and deleting it again is fine.
#[tokio::test]
async fn queue_depth_counts_the_delay_queue_and_delete_queue_takes_it_along() {
    let broker = broker().await;
    let queue = unique("depth");
    broker
        .declare_queue(&QueueSpec::new(queue.as_str()))
        .await
        .unwrap();
    broker.publish_json(&queue, &1u32).await.unwrap();
    broker.publish_json(&queue, &2u32).await.unwrap();
    let depth = broker.queue_depth(&queue).await.unwrap();
    assert_eq!(
        (depth.ready, depth.in_flight, depth.delayed),
        (2, None, None)
    );

    let seen = Seen::<u32>::default();
    // Workers hand a retry-after back to the broker, through the delay queue.
    let running = App::new("depth")
        .with_state(seen.clone())
        .mount(broker.queue(&queue), retry_in_ten_minutes, |m| m.workers(1))
        .start()
        .await
        .unwrap();
    wait_for("both messages in the delay queue", || async {
        broker.queue_depth(&queue).await.unwrap().delayed == Some(2)
    })
    .await;
    running.shutdown().await.unwrap();
    let depth = broker.queue_depth(&queue).await.unwrap();
    assert_eq!(
        (depth.ready, depth.in_flight, depth.delayed),
        (0, None, Some(2))
    );
    // Another process (the command line, another replica) finds the delay queue too.
    let fresh = common::broker().await;
    assert_eq!(fresh.queue_depth(&queue).await.unwrap().delayed, Some(2));

    broker.delete_queue(&queue).await.unwrap();
    let other = common::broker().await;
    for gone in [queue.clone(), format!("{queue}.delay")] {
        let error = other.queue_depth(&gone).await.unwrap_err();
        assert!(
            conveyor::Report(&error)
                .to_string()
                .contains("does not exist"),
            "{error}"
        );
    }
    broker.delete_queue(&queue).await.unwrap();
}

#[tokio::test]
async fn take_dead_letters_takes_at_most_max_in_queue_order_with_headers_key_and_reason() {
    let broker = broker().await;
    let dlq = unique("take");
    broker
        .declare_queue(&QueueSpec::new(dlq.as_str()))
        .await
        .unwrap();
    for n in 0..3u32 {
        let message = Message::builder()
            .partition_key(format!("k{n}"))
            .header(conveyor::REJECT_REASON_HEADER, format!("bad {n}"))
            .header("x-tenant", "acme")
            .message_id(format!("m{n}"))
            .json(&n)
            .unwrap();
        broker.publish(&dlq, message).await.unwrap();
    }
    assert!(broker.take_dead_letters(&dlq, 0).await.unwrap().is_empty());

    let first = broker.take_dead_letters(&dlq, 2).await.unwrap();
    assert_eq!(first.len(), 2);
    for (n, dead) in first.iter().enumerate() {
        assert_eq!(dead.payload, n.to_string().as_bytes());
        assert_eq!(
            dead.partition_key,
            Some(PartitionKey::from(format!("k{n}")))
        );
        assert_eq!(dead.reason.as_deref(), Some(format!("bad {n}").as_str()));
        assert_eq!(dead.headers.get_str("x-tenant"), Some("acme"));
        assert_eq!(
            dead.headers.get_str("message-id"),
            Some(format!("m{n}").as_str())
        );
        assert_eq!(
            dead.headers.get_str("content-type"),
            Some("application/json")
        );
    }
    let rest = broker.take_dead_letters(&dlq, usize::MAX).await.unwrap();
    assert_eq!(rest.len(), 1);
    assert_eq!(&rest[0].payload[..], b"2");
    assert!(broker.take_dead_letters(&dlq, 10).await.unwrap().is_empty());
    assert_eq!(ready(&broker, &dlq).await, 0, "taken out, acked");
    cleanup(&broker, &[&dlq], &[]).await;
}

#[tokio::test]
async fn taking_dead_letters_from_a_missing_queue_is_an_error_naming_it() {
    let broker = broker().await;
    let dlq = unique("take-missing");
    let error = broker.take_dead_letters(&dlq, 1).await.unwrap_err();
    let text = conveyor::Report(&error).to_string();
    assert!(
        text.contains(&dlq) && text.contains("does not exist"),
        "{text}"
    );
}

/// Publishes `n` numbers to a queue with a dead-letter queue, mounts a handler that
/// rejects 7, and returns the dead letters: on whichever broker it is given.
async fn reject_seven_on<B: Broker>(
    broker: B,
    queue: &str,
    dlq: &str,
) -> Vec<conveyor::DeadLetter> {
    broker.declare_queue(&QueueSpec::new(dlq)).await.unwrap();
    broker
        .declare_queue(&QueueSpec::new(queue).dead_letter_queue(dlq, 3))
        .await
        .unwrap();
    let messages = [5u32, 7, 9].map(|n| Message::json(&n).unwrap()).to_vec();
    broker.publish_batch(queue, messages).await.unwrap();
    assert_eq!(broker.queue_depth(queue).await.unwrap().ready, 3);
    let seen = Seen::<u32>::default();
    let running = App::new("generic")
        .broker(broker.clone())
        .with_state(seen.clone())
        .mount(broker.queue(queue), reject_seven, |m| m)
        .start()
        .await
        .unwrap();
    wait_until("three messages handled", || seen.len() == 3).await;
    // Taken as they come: what a take returns is gone from the queue.
    let mut dead = Vec::new();
    let deadline = tokio::time::Instant::now() + common::DEADLINE;
    while dead.is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no dead letter came"
        );
        dead.extend(broker.take_dead_letters(dlq, 10).await.unwrap());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    running.shutdown().await.unwrap();
    dead
}

#[tokio::test]
async fn code_generic_over_the_broker_runs_on_rabbitmq_as_in_process() {
    let queue = unique("generic");
    let dlq = unique("generic-dead");
    let on_memory = reject_seven_on(conveyor::MemoryBroker::new(), &queue, &dlq).await;
    let rabbit = broker().await;
    let cleaner = common::broker().await;
    let on_rabbit = reject_seven_on(rabbit, &queue, &dlq).await;
    for dead in [&on_memory, &on_rabbit] {
        assert_eq!(dead.len(), 1);
        assert_eq!(&dead[0].payload[..], b"7");
        assert_eq!(dead[0].reason.as_deref(), Some("rejected by the handler"));
    }
    cleanup(&cleaner, &[&queue, &dlq], &[]).await;
}

/// RabbitMQ closes a channel over a passive check of a missing queue: here the delay queue
/// `queue_depth` looks for. lapin kept that error under the channel's number and handed it
/// to the next channel opened with the number once the numbers (1 to 2,047) wrapped, so a
/// `queue_depth` 2,046 calls later failed with the old `NOT_FOUND` (vendor/lapin's fourth
/// change).
#[tokio::test]
async fn queue_depth_works_past_the_wrap_of_channel_numbers_after_a_channel_the_broker_closed() {
    let broker = broker().await;
    let queue = unique("channel-wrap");
    broker
        .declare_queue(&QueueSpec::new(queue.as_str()))
        .await
        .unwrap();
    // The first call's check of `<queue>.delay` is the closed channel; the others each
    // open and close one more.
    for call in 1..=2_100 {
        if let Err(error) = broker.queue_depth(&queue).await {
            panic!("queue_depth call {call}: {error}");
        }
    }
    cleanup(&broker, &[&queue], &[]).await;
}
