//! Settling on RabbitMQ: retry now, retry later through the delay queue with attempt
//! counts, the quorum delivery count, and dead-lettering through a DLX.

mod common;

use std::time::Duration;

use conveyor::{App, Backoff, DeliveryInfo, Json, Outcome, Publisher, State};
use conveyor_lapin::{ExchangeType, QueueSpec};
use tokio::time::Instant;

use common::{
    Seen, broker, cleanup, declare_bound_queue, publish_one, unique, wait_for, wait_until,
};

type Attempt = (u32, Option<u32>, bool, Instant);

async fn retry_twice_now(
    _: Json<u32>,
    info: DeliveryInfo,
    State(seen): State<Seen<Attempt>>,
) -> Outcome {
    seen.push((
        info.attempt,
        info.receive_count,
        info.redelivered,
        Instant::now(),
    ));
    if info.attempt < 3 {
        Outcome::Retry
    } else {
        Outcome::Ack
    }
}

#[tokio::test]
async fn retry_redelivers_at_once_flagged_as_redelivered() {
    let broker = broker().await;
    let queue = unique("retry");
    let seen = Seen::<Attempt>::default();
    let running = App::new("retry")
        .with_state(seen.clone())
        .mount(broker.queue(queue.as_str()), retry_twice_now, |m| m)
        .start()
        .await
        .unwrap();
    publish_one(&broker, &queue, 1).await;
    wait_until("a redelivery", || seen.len() >= 2).await;
    let attempts = seen.all();
    assert_eq!((attempts[0].0, attempts[0].2), (1, false));
    assert_eq!((attempts[1].0, attempts[1].2), (2, true));
    running.shutdown().await.unwrap();
    cleanup(&broker, &[&queue], &[]).await;
}

#[tokio::test]
async fn a_quorum_queue_counts_deliveries() {
    let broker = broker().await;
    let queue = unique("quorum");
    let seen = Seen::<Attempt>::default();
    let running = App::new("quorum")
        .with_state(seen.clone())
        .mount(
            broker.queue(QueueSpec::new(queue.as_str()).quorum()),
            retry_twice_now,
            |m| m,
        )
        .start()
        .await
        .unwrap();
    publish_one(&broker, &queue, 1).await;
    wait_until("three deliveries", || seen.len() == 3).await;
    let counts: Vec<(u32, Option<u32>)> = seen.all().iter().map(|a| (a.0, a.1)).collect();
    assert_eq!(counts, vec![(1, None), (2, Some(2)), (3, Some(3))]);
    running.shutdown().await.unwrap();
    cleanup(&broker, &[&queue], &[]).await;
}

async fn retry_twice_later(
    Json(id): Json<u32>,
    info: DeliveryInfo,
    State(seen): State<Seen<(u32, Attempt)>>,
) -> Outcome {
    seen.push((
        id,
        (
            info.attempt,
            info.receive_count,
            info.redelivered,
            Instant::now(),
        ),
    ));
    if id == 1 && info.attempt < 3 {
        Outcome::RetryAfter(Duration::from_millis(300))
    } else {
        Outcome::Ack
    }
}

#[tokio::test]
async fn retry_after_waits_in_the_delay_queue_and_counts_attempts() {
    let broker = broker().await;
    let queue = unique("retry-after");
    let seen = Seen::<(u32, Attempt)>::default();
    let running = App::new("retry-after")
        .with_state(seen.clone())
        // A window of one: a message waiting out its delay must not hold the slot.
        .mount(broker.queue(queue.as_str()), retry_twice_later, |m| {
            m.prefetch(1)
        })
        .start()
        .await
        .unwrap();
    let publisher = broker.publisher().await.unwrap();
    publisher.publish_json(&queue, &1u32).await.unwrap();
    wait_until("the first attempt", || seen.len() == 1).await;
    publisher.publish_json(&queue, &2u32).await.unwrap();
    wait_until("three attempts of 1 and one of 2", || seen.len() == 4).await;

    let all = seen.all();
    let ids: Vec<u32> = all.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids, vec![1, 2, 1, 1], "2 goes while 1 waits out its delay");
    let ones: Vec<&Attempt> = all
        .iter()
        .filter(|(id, _)| *id == 1)
        .map(|(_, a)| a)
        .collect();
    let counts: Vec<(u32, Option<u32>)> = ones.iter().map(|a| (a.0, a.1)).collect();
    assert_eq!(counts, vec![(1, None), (2, Some(2)), (3, Some(3))]);
    for pair in ones.windows(2) {
        assert!(
            pair[1].3 - pair[0].3 >= Duration::from_millis(250),
            "retried too early"
        );
    }
    running.shutdown().await.unwrap();
    cleanup(&broker, &[&queue], &[]).await;
}

async fn always_fail(
    _: Json<u32>,
    info: DeliveryInfo,
    State(seen): State<Seen<u32>>,
) -> Result<(), String> {
    seen.push(info.attempt);
    Err("cannot handle this".into())
}

#[tokio::test]
async fn exhausted_retries_dead_letter_through_the_dlx() {
    let broker = broker().await;
    let queue = unique("dlx-main");
    let dlx = unique("dlx");
    let dlq = unique("dlx-dead");
    declare_bound_queue(&broker, &dlx, ExchangeType::Fanout, &dlq, "").await;

    let seen = Seen::<u32>::default();
    let running = App::new("dlx")
        .with_state(seen.clone())
        .mount(
            broker.queue(QueueSpec::new(queue.as_str()).dead_letter_exchange(dlx.as_str())),
            always_fail,
            |m| {
                m.retry_after(Backoff::fixed(Duration::from_millis(50)))
                    .max_attempts(3)
            },
        )
        .start()
        .await
        .unwrap();
    publish_one(&broker, &queue, 1).await;

    wait_for("the message in the dead-letter queue", || async {
        broker.ready_count(&dlq).await.unwrap() == 1
    })
    .await;
    assert_eq!(seen.all(), vec![1, 2, 3]);
    assert_eq!(broker.ready_count(&queue).await.unwrap(), 0);
    running.shutdown().await.unwrap();
    cleanup(&broker, &[&queue, &dlq], &[&dlx]).await;
}
