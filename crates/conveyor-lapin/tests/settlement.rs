//! Settling on RabbitMQ: retries republished with their attempt count (so classic queues
//! count attempts too), retry later through the delay queue, the quorum delivery count,
//! dead letters that carry the handler's or the policy's reason, acks that do not wait
//! behind a republish's confirm, and acks that go together as one `multiple` ack.

mod common;

use std::sync::Arc;
use std::time::Duration;

use conveyor::{
    App, Backoff, Batch, DeliveryInfo, Json, Message, MountOptions, Outcome, Publisher, QueueSpec,
    REJECT_REASON_HEADER, State,
};
use conveyor_lapin::{ExchangeType, LapinBroker, LapinQueue, PublishOptions, RabbitQueueSpec};
use tokio::sync::watch;
use tokio::time::Instant;

use common::proxy::Proxy;
use common::{
    Seen, Taken, TempUser, broker, broker_named, cleanup, close_connections_named,
    declare_bound_queue, publish_one, ready, take_all, unacked_count, unique, wait_for, wait_until,
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

/// Workers hand a retry back to the broker, which on a classic queue only flags
/// `redelivered`: the transport counts the attempts itself.
#[tokio::test]
async fn a_retry_comes_back_at_once_with_its_attempt_counted() {
    let broker = broker().await;
    let queue = unique("retry");
    let seen = Seen::<Attempt>::default();
    let running = App::new("retry")
        .with_state(seen.clone())
        .mount(broker.queue(queue.as_str()), retry_twice_now, |m| {
            m.workers(1)
        })
        .start()
        .await
        .unwrap();
    publish_one(&broker, &queue, 1).await;
    wait_until("three attempts", || seen.len() >= 3).await;
    running.shutdown().await.unwrap();
    let attempts: Vec<(u32, Option<u32>, bool)> =
        seen.all().iter().map(|a| (a.0, a.1, a.2)).collect();
    assert_eq!(
        attempts,
        vec![(1, None, false), (2, Some(2), true), (3, Some(3), true)]
    );
    assert_eq!(ready(&broker, &queue).await, 0);
    cleanup(&broker, &[&queue], &[]).await;
}

async fn hold_forever(
    _: Json<u32>,
    info: DeliveryInfo,
    State(seen): State<Seen<(u32, Option<u32>)>>,
) {
    seen.push((info.attempt, info.receive_count));
    std::future::pending::<()>().await;
}

/// A quorum queue counts what it hands out again (`x-delivery-count`): a message whose
/// connection died while its handler ran comes back as attempt 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quorum_queue_counts_redeliveries() {
    let name = unique("quorum-connection");
    let broker = broker_named(&name).await;
    let publishing = common::broker().await;
    let queue = unique("quorum");
    broker
        .declare_queue(&QueueSpec::new(queue.as_str()).quorum())
        .await
        .unwrap();
    let seen = Seen::<(u32, Option<u32>)>::default();
    let running = App::new("quorum")
        .with_state(seen.clone())
        .shutdown_timeout(Duration::from_millis(100))
        .mount(broker.queue(&queue), hold_forever, |m| m.workers(2))
        .start()
        .await
        .unwrap();
    publish_one(&publishing, &queue, 1).await;
    wait_until("the first delivery", || seen.len() == 1).await;
    assert_eq!(close_connections_named(&name), 2);
    wait_until("the redelivery after recovery", || seen.len() == 2).await;
    assert_eq!(seen.all(), vec![(1, None), (2, Some(2))]);
    // The handlers never finish: the shutdown timeout cancels them.
    running.shutdown().await.unwrap();
    cleanup(&publishing, &[&queue], &[]).await;
}

async fn record_attempt(
    _: Json<u32>,
    info: DeliveryInfo,
    State(seen): State<Seen<(u32, Option<u32>)>>,
) {
    seen.push((info.attempt, info.receive_count));
}

/// Only a redelivery has a count of earlier deliveries: an `x-delivery-count` header on
/// a first delivery (set by another producer, or copied from a quorum queue) is not the
/// queue's. (It was counted: attempt 11 of a message never handled.)
#[tokio::test]
async fn a_first_delivery_is_attempt_1_whatever_delivery_count_its_headers_claim() {
    let broker = broker().await;
    let queue = unique("claimed-count");
    broker
        .declare_queue(&QueueSpec::new(queue.as_str()))
        .await
        .unwrap();
    let seen = Seen::<(u32, Option<u32>)>::default();
    let running = App::new("claimed-count")
        .with_state(seen.clone())
        .mount(broker.queue(&queue), record_attempt, |m| m)
        .start()
        .await
        .unwrap();
    let message = Message::builder()
        .header("x-delivery-count", "10")
        .json(&1u32)
        .unwrap();
    broker.publish(&queue, message).await.unwrap();
    wait_until("handled", || seen.len() == 1).await;
    running.shutdown().await.unwrap();
    assert_eq!(seen.all(), vec![(1, None)]);
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
        // (Workers hand retries back to the broker; a sequential mount would retry in
        // place.)
        .mount(
            broker.queue(queue.as_str()).prefetch(1),
            retry_twice_later,
            |m| m.workers(1),
        )
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

/// Asserts that `dead` is one dead letter of the message 7 carrying a reason that
/// contains `reason`, and none of RabbitMQ's dead-lettering headers (which would say
/// `expired`, from the delay queue).
fn assert_dead_letter(dead: &[Taken], reason: &str) {
    assert_eq!(dead.len(), 1, "one dead letter");
    assert_eq!(dead[0].number(), 7);
    let carried = dead[0].header(REJECT_REASON_HEADER).unwrap_or_default();
    assert!(
        carried.contains(reason),
        "the dead letter's reason is `{carried}`, expected it to contain `{reason}`"
    );
    let names = dead[0].header_names();
    assert!(
        !names.iter().any(|name| name == "x-death"
            || name.starts_with("x-first-death-")
            || name.starts_with("x-last-death-")),
        "the dead letter carries the broker's death history: {names:?}"
    );
}

/// Declares a dead-letter queue behind a fanout exchange, and the queue `name` (with
/// `spec` applied) whose dead-letter exchange that is; returns the names of the queue,
/// the exchange and the dead-letter queue.
async fn with_dead_letters(
    broker: &LapinBroker,
    name: &str,
    spec: impl FnOnce(QueueSpec) -> QueueSpec,
) -> (String, String, String) {
    let queue = unique(name);
    let dlx = unique(&format!("{name}-dlx"));
    let dlq = unique(&format!("{name}-dead"));
    declare_bound_queue(broker, &dlx, ExchangeType::Fanout, &dlq, "").await;
    let spec = spec(QueueSpec::new(queue.as_str()).dead_letter_exchange(dlx.as_str()));
    broker.declare_queue(&spec).await.unwrap();
    (queue, dlx, dlq)
}

/// Publishes one message to a queue with a dead-letter exchange, mounts `always_fail`
/// with `max_attempts(3)` and the rest of `mount`, and checks that the handler ran
/// exactly three times (attempts 1, 2, 3) and the message reached the dead-letter queue
/// with the handler's error as its reason.
async fn three_attempts_then_the_dead_letter_queue<D>(
    name: &str,
    spec: impl FnOnce(QueueSpec) -> QueueSpec,
    source: impl FnOnce(LapinQueue) -> LapinQueue,
    mount: impl FnOnce(MountOptions) -> MountOptions<conveyor::Identity, D>,
) {
    let broker = broker().await;
    let (queue, dlx, dlq) = with_dead_letters(&broker, name, spec).await;

    let seen = Seen::<u32>::default();
    let running = App::new(name)
        .with_state(seen.clone())
        .mount(source(broker.queue(&queue)), always_fail, |m| {
            mount(m).max_attempts(3)
        })
        .start()
        .await
        .unwrap();
    publish_one(&broker, &queue, 7).await;

    wait_for("the message in the dead-letter queue", || async {
        ready(&broker, &dlq).await == 1
    })
    .await;
    running.shutdown().await.unwrap();
    assert_eq!(seen.all(), vec![1, 2, 3], "three attempts, counted");
    assert_eq!(ready(&broker, &queue).await, 0);
    assert_dead_letter(&take_all(&dlq).await, "cannot handle this");
    cleanup(&broker, &[&queue, &dlq], &[&dlx]).await;
}

#[tokio::test]
async fn max_attempts_ends_in_the_dead_letter_queue_when_workers_retry_on_a_classic_queue() {
    three_attempts_then_the_dead_letter_queue(
        "classic-retry",
        |spec| spec,
        |source| source,
        |m| m.workers(1).retry(),
    )
    .await;
}

#[tokio::test]
async fn max_attempts_ends_in_the_dead_letter_queue_when_workers_retry_later_on_a_classic_queue() {
    three_attempts_then_the_dead_letter_queue(
        "classic-retry-after",
        |spec| spec,
        |source| source,
        |m| {
            m.workers(1)
                .retry_after(Backoff::fixed(Duration::from_millis(50)))
        },
    )
    .await;
}

#[tokio::test]
async fn max_attempts_ends_in_the_dead_letter_queue_on_retry_after_without_a_delay_queue() {
    three_attempts_then_the_dead_letter_queue(
        "classic-no-delay",
        |spec| spec,
        LapinQueue::without_delay_queue,
        |m| {
            m.workers(1)
                .retry_after(Backoff::fixed(Duration::from_millis(50)))
        },
    )
    .await;
}

#[tokio::test]
async fn max_attempts_ends_in_the_dead_letter_queue_when_workers_retry_on_a_quorum_queue() {
    three_attempts_then_the_dead_letter_queue(
        "quorum-retry",
        RabbitQueueSpec::quorum,
        |source| source,
        |m| m.workers(1).retry(),
    )
    .await;
}

#[tokio::test]
async fn max_attempts_ends_in_the_dead_letter_queue_when_a_sequential_mount_retries_in_place() {
    three_attempts_then_the_dead_letter_queue(
        "sequential-retry-after",
        |spec| spec,
        |source| source,
        |m| m.retry_after(Backoff::fixed(Duration::from_millis(50))),
    )
    .await;
}

/// Publishes 7 to `queue` as `user` would, with the `user_id` property RabbitMQ checks
/// against the login.
async fn publish_as(user: &TempUser, queue: &str) {
    let connection = lapin::Connection::connect(&user.url(), Default::default())
        .await
        .unwrap();
    let channel = connection.create_channel().await.unwrap();
    channel.confirm_select(Default::default()).await.unwrap();
    let confirm = channel
        .basic_publish(
            "".into(),
            queue.into(),
            Default::default(),
            b"7",
            lapin::BasicProperties::default()
                .with_user_id(user.name.as_str().into())
                .with_delivery_mode(2),
        )
        .await
        .unwrap();
    assert!(confirm.await.unwrap().is_ack(), "the broker took it");
    let _ = connection.close(200, "done".into()).await;
}

/// RabbitMQ refuses a publish whose `user_id` is not the publishing login's, so a copy of
/// another producer's message leaves the property out: its retries are counted and
/// `max_attempts` ends in the dead-letter queue. (Every copy was refused, every retry
/// requeued uncounted: on a classic queue the attempt stayed at 2, for ever.)
#[tokio::test]
async fn another_users_message_is_retried_with_its_attempts_counted_then_dead_lettered() {
    let producer = TempUser::add("conveyor-producer");
    let broker = broker().await;
    let (queue, dlx, dlq) = with_dead_letters(&broker, "user-id", |spec| spec).await;
    let seen = Seen::<u32>::default();
    let running = App::new("user-id")
        .with_state(seen.clone())
        .mount(broker.queue(&queue), always_fail, |m| {
            m.workers(1).retry().max_attempts(3)
        })
        .start()
        .await
        .unwrap();
    publish_as(&producer, &queue).await;

    wait_for("the message in the dead-letter queue", || async {
        ready(&broker, &dlq).await == 1
    })
    .await;
    running.shutdown().await.unwrap();
    assert_eq!(seen.all(), vec![1, 2, 3], "three attempts, counted");
    assert_dead_letter(&take_all(&dlq).await, "cannot handle this");
    cleanup(&broker, &[&queue, &dlq], &[&dlx]).await;
}

async fn reject_1_fail_others(
    Json(n): Json<u32>,
    info: DeliveryInfo,
    State(seen): State<Seen<(u32, u32)>>,
) -> Result<Outcome, String> {
    seen.push((n, info.attempt));
    match n {
        1 => Ok(Outcome::Reject),
        _ => Err("cannot handle this".into()),
    }
}

/// A copy the broker refuses outright (here a dead letter to an exchange that was
/// deleted) closes the channel copies go out on; the next copy opens another. (The
/// channel stayed closed: every later retry of the subscription was requeued uncounted,
/// and every reject lost its reason.)
#[tokio::test]
async fn a_copy_the_broker_refuses_leaves_later_copies_going_out() {
    let broker = broker().await;
    let (queue, dlx, dlq) = with_dead_letters(&broker, "refused-copy", |spec| spec).await;
    broker.delete_exchange(&dlx).await.unwrap();
    let seen = Seen::<(u32, u32)>::default();
    let running = App::new("refused-copy")
        .with_state(seen.clone())
        .mount(broker.queue(&queue), reject_1_fail_others, |m| {
            m.workers(1).retry().max_attempts(3)
        })
        .start()
        .await
        .unwrap();
    publish_one(&broker, &queue, 1).await;
    wait_until("message 1 handled", || seen.len() == 1).await;
    // Its dead letter was refused (no such exchange): the broker's own dead-lettering
    // then drops it, for the same reason.
    wait_until("message 1 settled", || unacked_count(&queue) == 0).await;

    declare_bound_queue(&broker, &dlx, ExchangeType::Fanout, &dlq, "").await;
    publish_one(&broker, &queue, 7).await;
    wait_for("message 7 in the dead-letter queue", || async {
        ready(&broker, &dlq).await == 1
    })
    .await;
    running.shutdown().await.unwrap();
    assert_eq!(seen.all(), vec![(1, 1), (7, 1), (7, 2), (7, 3)]);
    assert_dead_letter(&take_all(&dlq).await, "cannot handle this");
    cleanup(&broker, &[&queue, &dlq], &[&dlx]).await;
}

async fn reject(_: Json<u32>) -> Outcome {
    Outcome::Reject
}

/// A dead letter keeps no per-message TTL, as with RabbitMQ's own dead-lettering: it
/// must not expire from the dead-letter queue. (It kept the original's.)
#[tokio::test]
async fn a_dead_letter_does_not_keep_the_messages_ttl() {
    let broker = broker().await;
    let queue = unique("dead-ttl");
    let dlq = unique("dead-ttl-dead");
    broker
        .declare_queue(&QueueSpec::new(dlq.as_str()))
        .await
        .unwrap();
    broker
        .declare_queue(&QueueSpec::new(queue.as_str()).dead_letter_queue(dlq.as_str(), 10))
        .await
        .unwrap();
    let running = App::new("dead-ttl")
        .mount(broker.queue(&queue), reject, |m| m)
        .start()
        .await
        .unwrap();
    broker
        .publisher()
        .await
        .unwrap()
        .publish_to(
            "",
            &queue,
            Message::json(&7u32).unwrap(),
            PublishOptions::default().expiration(Duration::from_secs(600)),
        )
        .await
        .unwrap();
    wait_for("the dead letter", || async {
        ready(&broker, &dlq).await == 1
    })
    .await;
    running.shutdown().await.unwrap();
    let dead = take_all(&dlq).await;
    assert_eq!(dead[0].expiration, None);
    assert_eq!(dead[0].number(), 7);
    cleanup(&broker, &[&queue, &dlq], &[]).await;
}

async fn retry_later_then_reject(
    _: Json<u32>,
    info: DeliveryInfo,
    State(seen): State<Seen<u32>>,
) -> Outcome {
    seen.push(info.attempt);
    if info.attempt == 1 {
        Outcome::RetryAfter(Duration::from_millis(50))
    } else {
        Outcome::Reject
    }
}

/// A message that went through the delay queue and is then rejected carries the
/// handler's reason to the dead-letter queue, not the delay queue's `expired`; here the
/// dead-letter queue is the portable one (the default exchange, with a routing key).
#[tokio::test]
async fn a_dead_letter_carries_the_handlers_reason_after_a_retry_after() {
    let broker = broker().await;
    let queue = unique("reject-reason");
    let dlq = unique("reject-reason-dead");
    broker
        .declare_queue(&QueueSpec::new(dlq.as_str()))
        .await
        .unwrap();
    let seen = Seen::<u32>::default();
    broker
        .declare_queue(&QueueSpec::new(queue.as_str()).dead_letter_queue(dlq.as_str(), 10))
        .await
        .unwrap();
    let running = App::new("reject-reason")
        .with_state(seen.clone())
        .mount(broker.queue(&queue), retry_later_then_reject, |m| {
            m.workers(1)
        })
        .start()
        .await
        .unwrap();
    publish_one(&broker, &queue, 7).await;
    wait_for("the message in the dead-letter queue", || async {
        ready(&broker, &dlq).await == 1
    })
    .await;
    running.shutdown().await.unwrap();
    assert_eq!(seen.all(), vec![1, 2]);
    assert_dead_letter(&take_all(&dlq).await, "rejected by the handler");
    assert_eq!(ready(&broker, &queue).await, 0);
    cleanup(&broker, &[&queue, &dlq], &[]).await;
}

async fn retry_the_first_once(
    Json(id): Json<u32>,
    info: DeliveryInfo,
    State(seen): State<Seen<(u32, u32)>>,
) -> Outcome {
    seen.push((id, info.attempt));
    if id == 0 && info.attempt == 1 {
        Outcome::Retry
    } else {
        Outcome::Ack
    }
}

/// A republish waiting for its confirm holds back no other settlement. The proxy holds
/// back the broker's confirm of the retried copy of 0 (and nothing else); meanwhile five
/// prefetch windows' worth of later messages are handled, which the broker allows only
/// if their acks went out. The original of 0 stays unacked until its copy is confirmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_keep_flowing_while_a_retry_waits_for_its_confirm() {
    common::init_tracing();
    let proxy = Proxy::start("127.0.0.1:5672").await;
    let broker = LapinBroker::builder(proxy.url())
        // Longer than the test waits: only the release ends the wait for the confirm.
        .confirm_timeout(Duration::from_secs(3600))
        .connect()
        .await
        .unwrap();
    let publishing = common::broker().await;
    let queue = unique("slow-confirm");
    let seen = Seen::<(u32, u32)>::default();
    let running = App::new("slow-confirm")
        .with_state(seen.clone())
        .mount(
            broker.queue(queue.as_str()).prefetch(4),
            retry_the_first_once,
            |m| m.workers(2),
        )
        .start()
        .await
        .unwrap();
    // The subscription is set up: from now on the only confirms on its connection are
    // those of its republishes.
    proxy.hold_confirms();
    let publisher = publishing.publisher().await.unwrap();
    publisher.publish_json(&queue, &0u32).await.unwrap();
    wait_until("the first attempt of 0", || seen.all().contains(&(0, 1))).await;
    for id in 1..=20u32 {
        publisher.publish_json(&queue, &id).await.unwrap();
    }
    wait_until(
        "1 to 20, and the copy of 0, handled while the copy's confirm is held back",
        || {
            let all = seen.all();
            all.contains(&(0, 2)) && (1..=20).all(|id| all.contains(&(id, 1)))
        },
    )
    .await;
    wait_until("every ack but the original 0's", || {
        unacked_count(&queue) == 1
    })
    .await;
    assert_eq!(ready(&publishing, &queue).await, 0);

    proxy.release_confirms();
    wait_until(
        "the ack of the original 0, after its copy's confirm",
        || unacked_count(&queue) == 0,
    )
    .await;
    running.shutdown().await.unwrap();
    let mut all = seen.all();
    all.sort_unstable();
    let mut expected = vec![(0, 1), (0, 2)];
    expected.extend((1..=20).map(|id| (id, 1)));
    assert_eq!(all, expected, "each handled once, 0 twice");
    assert_eq!(ready(&publishing, &queue).await, 0);
    cleanup(&publishing, &[&queue], &[]).await;
}

/// Holds the first batch until the test opens the gate, then records every batch's size.
async fn gated_batch(
    batch: Batch<Json<u32>>,
    State((gate, sizes)): State<(Arc<watch::Sender<bool>>, Seen<usize>)>,
) {
    let _ = gate.subscribe().wait_for(|open| *open).await;
    sizes.push(batch.into_vec().len());
}

/// Acks that are settled together, with every lower delivery of the channel settled,
/// leave as one `basic.ack` with `multiple` instead of one frame each. The first batch
/// is held until the broker has pushed all 500 messages, so every later batch is full
/// (50 acks settled at once on this current-thread runtime); the proxy counts the frames.
#[tokio::test]
async fn acks_settled_together_leave_as_one_multiple_ack() {
    let proxy = Proxy::start("127.0.0.1:5672").await;
    let broker = LapinBroker::builder(proxy.url()).connect().await.unwrap();
    let publishing = common::broker().await;
    let queue = unique("multiple-acks");
    publishing
        .declare_queue(&queue.as_str().into())
        .await
        .unwrap();
    let messages = (0..500u32).map(|n| Message::json(&n).unwrap()).collect();
    let publisher = publishing.publisher().await.unwrap();
    publisher.publish_batch(&queue, messages).await.unwrap();

    let gate = Arc::new(watch::Sender::new(false));
    let sizes = Seen::<usize>::default();
    let running = App::new("multiple-acks")
        .with_state((gate.clone(), sizes.clone()))
        .mount(
            broker.queue(queue.as_str()).prefetch(500),
            gated_batch,
            |m| m.batch(50),
        )
        .start()
        .await
        .unwrap();
    wait_until("every message pushed to the consumer", || {
        unacked_count(&queue) == 500
    })
    .await;
    gate.send_replace(true);
    wait_until("every message handled", || {
        sizes.all().iter().sum::<usize>() == 500
    })
    .await;
    wait_until("every ack on the broker", || unacked_count(&queue) == 0).await;
    running.shutdown().await.unwrap();

    let (single, multiple) = proxy.acks();
    assert!(multiple >= 1, "no multiple ack: {single} single");
    assert!(
        single + multiple <= 20,
        "{single} single and {multiple} multiple ack frames for 500 messages in batches of {:?}",
        sizes.all()
    );
    assert_eq!(ready(&publishing, &queue).await, 0);
    cleanup(&publishing, &[&queue], &[]).await;
}

/// What becomes of message `n`: 7 in 50 are rejected, 13 in 50 retried once, 21 in 50
/// held a while in their handler; the rest are acked.
async fn mixed_outcomes(
    Json(n): Json<u32>,
    info: DeliveryInfo,
    State(seen): State<Seen<(u32, u32)>>,
) -> Outcome {
    seen.push((n, info.attempt));
    match (n % 50, info.attempt) {
        (7, _) => Outcome::Reject,
        (13, 1) => Outcome::Retry,
        (21, 1) => {
            tokio::time::sleep(Duration::from_millis(50)).await;
            Outcome::Ack
        }
        _ => Outcome::Ack,
    }
}

/// Acks that go together never take along a delivery settled otherwise: one nacked, one
/// whose republish (a retry, a dead letter) waits for its confirm, one still in its
/// handler. Each of 2,000 messages through lanes ends once where its outcome says: had a
/// `multiple` ack covered a delivery it must not, the broker would close the channel
/// (a second ack of a tag) and the messages in flight would come again, or a rejected
/// message would be acked instead of dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_that_go_together_cover_no_delivery_settled_otherwise() {
    let broker = broker().await;
    let (queue, dlx, dlq) = with_dead_letters(&broker, "mixed-settlements", |spec| spec).await;
    let messages = (0..2000u32)
        .map(|n| {
            Message::builder()
                .partition_key((n % 16).to_string())
                .json(&n)
                .unwrap()
        })
        .collect();
    let publisher = broker.publisher().await.unwrap();
    publisher.publish_batch(&queue, messages).await.unwrap();

    let seen = Seen::<(u32, u32)>::default();
    let running = App::new("mixed-settlements")
        .with_state(seen.clone())
        .mount(
            broker.queue(queue.as_str()).prefetch(256),
            mixed_outcomes,
            |m| m.workers(4).by_key(),
        )
        .start()
        .await
        .unwrap();
    let retried = (0..2000u32).filter(|n| n % 50 == 13).count();
    wait_until("every message handled, the retried ones twice", || {
        seen.len() >= 2000 + retried
    })
    .await;
    wait_for("the rejected messages in the dead-letter queue", || async {
        ready(&broker, &dlq).await == 40
    })
    .await;
    wait_until("every ack on the broker", || unacked_count(&queue) == 0).await;
    running.shutdown().await.unwrap();

    let mut all = seen.all();
    all.sort_unstable();
    let mut expected: Vec<(u32, u32)> = (0..2000u32).map(|n| (n, 1)).collect();
    expected.extend((0..2000u32).filter(|n| n % 50 == 13).map(|n| (n, 2)));
    expected.sort_unstable();
    assert_eq!(all.len(), expected.len(), "no message came twice");
    assert_eq!(all, expected);
    assert_eq!(ready(&broker, &queue).await, 0);
    let mut dead: Vec<u32> = take_all(&dlq).await.iter().map(Taken::number).collect();
    dead.sort_unstable();
    let rejected: Vec<u32> = (0..2000u32).filter(|n| n % 50 == 7).collect();
    assert_eq!(dead, rejected);
    cleanup(&broker, &[&queue, &dlq], &[&dlx]).await;
}

async fn retry_soon_timed(_: Json<u32>, State(runs): State<Seen<Instant>>) -> Outcome {
    runs.push(Instant::now());
    Outcome::RetryAfter(Duration::from_millis(10))
}

/// A retry whose copy the broker refuses (here its delay queue was deleted, so the copy
/// comes back unroutable) requeues the original uncounted, so it cannot reach its
/// `max_attempts`: it is held a pause first, doubling from 100 ms with each refusal in a
/// row. (It was requeued at once: the handler ran again and again, as fast as the broker
/// could hand it out.)
#[tokio::test]
async fn a_retry_whose_copy_is_refused_is_requeued_after_a_growing_pause() {
    let broker = broker().await;
    let queue = unique("refused-retry");
    let runs = Seen::<Instant>::default();
    let running = App::new("refused-retry")
        .with_state(runs.clone())
        .mount(broker.queue(queue.as_str()), retry_soon_timed, |m| {
            m.workers(1)
        })
        .start()
        .await
        .unwrap();
    broker
        .delete_queue(&format!("{queue}.delay"))
        .await
        .unwrap();
    publish_one(&broker, &queue, 1).await;
    wait_until("four runs", || runs.len() >= 4).await;
    running.shutdown().await.unwrap();

    let runs = runs.all();
    for (gap, pause) in runs.windows(2).zip([100, 200, 400]) {
        let gap = gap[1] - gap[0];
        assert!(
            gap >= Duration::from_millis(pause),
            "run again after {gap:?}, not after a pause of {pause} ms"
        );
    }
    cleanup(&broker, &[&queue], &[]).await;
}

/// Retries each message once after 100 ms; records `(id, attempt)`.
async fn retry_once_later(
    Json(id): Json<u32>,
    info: DeliveryInfo,
    State(seen): State<Seen<(u32, u32)>>,
) -> Outcome {
    seen.push((id, info.attempt));
    if info.attempt < 2 {
        Outcome::RetryAfter(Duration::from_millis(100))
    } else {
        Outcome::Ack
    }
}

/// Whether `queue` is a quorum queue on the server.
fn is_quorum(queue: &str) -> bool {
    common::queue_arguments(queue).contains("\"x-queue-type\",\"quorum\"")
}

/// A quorum queue's delay queue outlives a node as its queue does, so it is a quorum
/// queue too, under a name of its own (`<queue>.delay.quorum`). A classic `<queue>.delay`
/// an earlier version made (which RabbitMQ would refuse to declare again as a quorum
/// queue) is left alone: the subscription starts, and what waits there still comes back.
#[tokio::test]
async fn a_quorum_queues_delay_queue_is_a_quorum_queue_beside_an_earlier_classic_one() {
    let broker = broker().await;
    let queue = unique("quorum-delay");
    let legacy = format!("{queue}.delay");
    broker
        .declare_queue(&QueueSpec::new(queue.as_str()).quorum())
        .await
        .unwrap();
    // The classic delay queue an earlier version declared, with a message waiting out
    // its delay (the queue's own TTL stands in for the per-message one).
    broker
        .declare_queue(
            &QueueSpec::new(legacy.as_str())
                .dead_letter_exchange("")
                .dead_letter_routing_key(queue.as_str())
                .argument("x-message-ttl", 300),
        )
        .await
        .unwrap();
    publish_one(&broker, &legacy, 1).await;

    let seen = Seen::<(u32, u32)>::default();
    let mounted = broker.queue(&queue);
    assert_eq!(
        mounted.delay_queue_name().as_deref(),
        Some(format!("{queue}.delay.quorum").as_str())
    );
    let running = App::new("quorum-delay")
        .with_state(seen.clone())
        .mount(mounted, retry_once_later, |m| m.workers(1))
        .start()
        .await
        .unwrap();
    publish_one(&broker, &queue, 2).await;
    wait_until("both messages handled twice", || seen.len() == 4).await;
    let mut all = seen.all();
    all.sort_unstable();
    assert_eq!(all, [(1, 1), (1, 2), (2, 1), (2, 2)]);
    assert!(is_quorum(&format!("{queue}.delay.quorum")));
    assert!(
        !is_quorum(&legacy),
        "the earlier classic delay queue is kept"
    );
    running.shutdown().await.unwrap();
    // Deleting the queue deletes both delay queues.
    cleanup(&broker, &[&queue], &[]).await;
    let listing = std::process::Command::new("rabbitmqctl")
        .args(["-q", "-s", "list_queues", "name"])
        .output()
        .unwrap();
    let names = String::from_utf8_lossy(&listing.stdout);
    assert!(
        !names.lines().any(|name| name.starts_with(queue.as_str())),
        "{names}"
    );
}

/// A delay queue the user named keeps its name; for a quorum queue it is declared as a
/// quorum queue, and where it exists already as a classic queue it is used as it is
/// (with a warning) rather than failing the subscription.
#[tokio::test]
async fn a_named_classic_delay_queue_of_a_quorum_queue_is_used_as_it_is() {
    let broker = broker().await;
    let queue = unique("named-delay");
    let named = format!("{queue}.later");
    let fresh = unique("named-delay-fresh");
    let fresh_named = format!("{fresh}.later");
    for name in [&queue, &fresh] {
        broker
            .declare_queue(&QueueSpec::new(name.as_str()).quorum())
            .await
            .unwrap();
    }
    broker
        .declare_queue(
            &QueueSpec::new(named.as_str())
                .dead_letter_exchange("")
                .dead_letter_routing_key(queue.as_str()),
        )
        .await
        .unwrap();

    let seen = Seen::<(u32, u32)>::default();
    let fresh_seen = Seen::<(u32, u32)>::default();
    let running = App::new("named-delay")
        .with_state(seen.clone())
        .mount(
            broker.queue(&queue).delay_queue(named.as_str()),
            retry_once_later,
            |m| m.workers(1),
        )
        .start()
        .await
        .unwrap();
    let fresh_running = App::new("named-delay-fresh")
        .with_state(fresh_seen.clone())
        .mount(
            broker.queue(&fresh).delay_queue(fresh_named.as_str()),
            retry_once_later,
            |m| m.workers(1),
        )
        .start()
        .await
        .unwrap();
    publish_one(&broker, &queue, 1).await;
    publish_one(&broker, &fresh, 2).await;
    wait_until("1 handled twice", || seen.len() == 2).await;
    wait_until("2 handled twice", || fresh_seen.len() == 2).await;
    assert_eq!(seen.all(), [(1, 1), (1, 2)]);
    assert_eq!(fresh_seen.all(), [(2, 1), (2, 2)]);
    assert!(!is_quorum(&named), "the existing classic one is kept");
    assert!(is_quorum(&fresh_named), "a new one is a quorum queue");
    running.shutdown().await.unwrap();
    fresh_running.shutdown().await.unwrap();
    cleanup(&broker, &[&queue, &fresh, &named, &fresh_named], &[]).await;
}
