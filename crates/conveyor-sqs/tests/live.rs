//! The SQS transport against the moto emulator on 127.0.0.1:4566
//! (`scripts/services/sqs.sh` starts it). Every test makes its own queues and deletes them.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::proxy::Proxy;
use common::{ENDPOINT, broker, broker_at, declare, delete, eventually, queue_url, unique};
use conveyor::{
    App, Backoff, Batch, Broker, Bytes, DeliveryInfo, Error, Headers, Json, Message, Outcome,
    PartitionKey, Publisher, QueueSpec, REJECT_REASON_HEADER, State,
};
use conveyor_sqs::{SqsBroker, SqsQueueSpec};
use tokio::time::Instant;

/// Everything a handler saw, shared with the test.
type Seen<T> = Arc<Mutex<Vec<T>>>;

fn count<T>(seen: &Seen<T>) -> usize {
    seen.lock().unwrap().len()
}

async fn publish_numbers(
    broker: &SqsBroker,
    queue: &str,
    numbers: impl Iterator<Item = u64>,
    key: impl Fn(u64) -> Option<String>,
) {
    let messages: Vec<Message> = numbers
        .map(|n| {
            let message = match key(n) {
                Some(key) => Message::builder().partition_key(key),
                None => Message::builder(),
            };
            message.json(&n).unwrap()
        })
        .collect();
    broker.publish_batch(queue, messages).await.unwrap();
}

/// Waits for the first message in `seen` (within 20 s), then shuts `running` down.
async fn shut_down_after_one<T>(running: conveyor::RunningApp, seen: &Seen<T>) {
    eventually("the message", Duration::from_secs(20), || async {
        count(seen) == 1
    })
    .await;
    running.shutdown().await.unwrap();
}

async fn record_all(
    Json(n): Json<u64>,
    headers: Headers,
    info: DeliveryInfo,
    State(seen): State<Seen<(u64, Headers, DeliveryInfo)>>,
) {
    seen.lock().unwrap().push((n, headers, info));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_round_trips_with_its_headers_as_attributes() {
    let broker = broker().await;
    let queue = declare(&broker, QueueSpec::new(unique("round-trip", false))).await;
    let message = Message::builder()
        .header("x-tenant", "acme")
        .header("x-bytes", vec![0u8, 159, 255])
        .correlation_id("order-7")
        .json(&7u64)
        .unwrap();
    broker.publish(&queue, message).await.unwrap();

    let seen: Seen<(u64, Headers, DeliveryInfo)> = Seen::default();
    let running = App::new("round-trip")
        .with_state(seen.clone())
        .mount(broker.queue(&queue), record_all, |m| m)
        .start()
        .await
        .unwrap();
    shut_down_after_one(running, &seen).await;

    let (n, headers, info) = seen.lock().unwrap()[0].clone();
    assert_eq!(n, 7);
    assert_eq!(headers.get_str("x-tenant"), Some("acme"));
    assert_eq!(
        headers.get("x-bytes").map(|v| v.to_vec()),
        Some(vec![0u8, 159, 255])
    );
    assert_eq!(headers.get_str("content-type"), Some("application/json"));
    assert_eq!(headers.get_str("correlation-id"), Some("order-7"));
    assert_eq!(info.receive_count, Some(1));
    assert_eq!(&*info.queue, queue.as_str());
    delete(&broker, &[&queue]).await;
}

async fn record_payload(payload: Bytes, State(seen): State<Seen<Bytes>>) {
    seen.lock().unwrap().push(payload);
}

/// SQS refuses an empty body (the emulator takes one): an empty payload is stored as a
/// body of its own, and a delivery of it is empty again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_payload_is_stored_with_a_body_and_delivered_empty() {
    let broker = broker().await;
    let queue = declare(&broker, QueueSpec::new(unique("empty-body", false))).await;
    broker
        .publish(&queue, Message::new(Vec::<u8>::new()))
        .await
        .unwrap();

    // What SQS stores, seen without the transport (and left visible for it).
    let url = broker.queue_url(&queue).await.unwrap();
    let stored = broker
        .client()
        .receive_message()
        .queue_url(&url)
        .wait_time_seconds(5)
        .visibility_timeout(0)
        .send()
        .await
        .unwrap();
    let bodies: Vec<&str> = stored
        .messages()
        .iter()
        .map(|m| m.body().unwrap_or_default())
        .collect();
    assert!(
        bodies.len() == 1 && !bodies[0].is_empty(),
        "stored bodies: {bodies:?}"
    );

    let seen: Seen<Bytes> = Seen::default();
    let running = App::new("empty-body")
        .with_state(seen.clone())
        .mount(broker.queue(&queue), record_payload, |m| m)
        .start()
        .await
        .unwrap();
    shut_down_after_one(running, &seen).await;
    assert_eq!(seen.lock().unwrap()[0], Bytes::new());
    delete(&broker, &[&queue]).await;
}

/// Headers named like SQS's own message fields, through the emulator: each comes back as
/// it was sent, or the publish is refused with the reason; none is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_named_like_sqs_system_attributes_come_back_or_are_refused() {
    let broker = broker().await;
    let standard = declare(&broker, QueueSpec::new(unique("system-names", false))).await;
    let fifo = declare(&broker, QueueSpec::new(unique("system-names", true))).await;
    // A standard queue has no groups: both headers are ordinary attributes.
    let message = Message::builder()
        .partition_key("alice")
        .header("MessageGroupId", "tenant-a")
        .header("MessageDeduplicationId", "d-1")
        .json(&1u64)
        .unwrap();
    broker.publish(&standard, message).await.unwrap();
    // On a FIFO queue the group header is the partition key's own; deduplication comes
    // from the message id, so that header is an ordinary attribute.
    let message = Message::builder()
        .partition_key("alice")
        .message_id("m-2")
        .header("MessageGroupId", "alice")
        .header("MessageDeduplicationId", "d-2")
        .json(&2u64)
        .unwrap();
    broker.publish(&fifo, message).await.unwrap();
    // A group header that is not the partition key would be lost on receipt: refused.
    let refused = broker
        .publish(
            &fifo,
            Message::builder()
                .partition_key("alice")
                .header("MessageGroupId", "bob")
                .json(&3u64)
                .unwrap(),
        )
        .await
        .expect_err("a group header other than the partition key");
    assert!(
        matches!(&refused, Error::Refused { destination, .. } if *destination == fifo),
        "{refused:?}"
    );
    assert!(
        conveyor::Report(&refused)
            .to_string()
            .contains("header `MessageGroupId` is not the partition key"),
        "{refused}"
    );

    let seen: Seen<(u64, Headers, DeliveryInfo)> = Seen::default();
    let running = App::new("system-names")
        .with_state(seen.clone())
        .mount(broker.queue(&standard), record_all, |m| m)
        .mount(broker.queue(&fifo), record_all, |m| m)
        .start()
        .await
        .unwrap();
    eventually("both messages", Duration::from_secs(20), || async {
        count(&seen) == 2
    })
    .await;
    running.shutdown().await.unwrap();
    let seen: HashMap<u64, Headers> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|(n, headers, _)| (*n, headers.clone()))
        .collect();
    assert_eq!(seen[&1].get_str("MessageGroupId"), Some("tenant-a"));
    assert_eq!(seen[&1].get_str("MessageDeduplicationId"), Some("d-1"));
    assert_eq!(seen[&2].get_str("MessageGroupId"), Some("alice"));
    assert_eq!(seen[&2].get_str("MessageDeduplicationId"), Some("d-2"));
    delete(&broker, &[&standard, &fifo]).await;
}

type Handled = Seen<(usize, Option<String>, u64)>;

async fn by_lane(
    Json(n): Json<u64>,
    key: Option<PartitionKey>,
    info: DeliveryInfo,
    State(seen): State<Handled>,
) {
    // Different work per message, so lanes finish out of step.
    tokio::time::sleep(Duration::from_millis(n % 7)).await;
    seen.lock().unwrap().push((
        info.lane.unwrap_or(usize::MAX),
        key.map(|k| k.to_string()),
        n,
    ));
}

/// Publishes `per_group` messages to each group of a FIFO queue, handles them on
/// `workers(2).by_key()`, and checks each group stayed in order on one lane.
async fn fifo_groups_keep_their_order(groups: &[String], per_group: u64) {
    let broker = broker().await;
    let queue = declare(
        &broker,
        QueueSpec::new(unique("groups", true)).content_based_deduplication(),
    )
    .await;
    let total = groups.len() as u64 * per_group;
    let numbered = (0..total).map(|i| (groups[(i % groups.len() as u64) as usize].clone(), i));
    let messages: Vec<Message> = numbered
        .map(|(group, i)| Message::builder().partition_key(group).json(&i).unwrap())
        .collect();
    broker.publish_batch(&queue, messages).await.unwrap();

    let seen = Handled::default();
    let running = App::new("groups")
        .with_state(seen.clone())
        .mount(broker.queue(&queue), by_lane, |m| m.workers(2).by_key())
        .start()
        .await
        .unwrap();
    eventually("every message", Duration::from_secs(60), || async {
        count(&seen) as u64 >= total
    })
    .await;
    running.shutdown().await.unwrap();

    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len() as u64, total, "no message twice");
    let mut last: HashMap<String, (usize, u64)> = HashMap::new();
    for (lane, key, n) in seen {
        let key = key.expect("FIFO deliveries carry their group");
        if let Some((first_lane, previous)) = last.get(&key) {
            assert_eq!(*first_lane, lane, "group {key} changed lanes");
            assert!(n > *previous, "group {key}: {n} after {previous}");
        }
        last.insert(key, (lane, n));
    }
    assert_eq!(last.len(), groups.len());
    delete(&broker, &[&queue]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_groups_alice_bob_and_carol_keep_their_order_on_lanes() {
    let groups: Vec<String> = ["alice", "bob", "carol"].map(String::from).to_vec();
    fifo_groups_keep_their_order(&groups, 20).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_fifo_groups_keep_their_order_on_lanes() {
    let groups: Vec<String> = (0..50).map(|g| format!("group-{g}")).collect();
    fifo_groups_keep_their_order(&groups, 4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standard_queue_deliveries_have_no_key_and_rotate_over_the_lanes() {
    let broker = broker().await;
    let queue = declare(&broker, QueueSpec::new(unique("keyless", false))).await;
    publish_numbers(&broker, &queue, 0..9, |n| Some(format!("ignored-{n}"))).await;
    let seen = Handled::default();
    let running = App::new("keyless")
        .with_state(seen.clone())
        .mount(broker.queue(&queue), by_lane, |m| m.workers(3).by_key())
        .start()
        .await
        .unwrap();
    eventually("every message", Duration::from_secs(30), || async {
        count(&seen) == 9
    })
    .await;
    running.shutdown().await.unwrap();
    let mut per_lane = [0; 3];
    for (lane, key, _) in seen.lock().unwrap().iter() {
        assert_eq!(*key, None, "a standard queue has no groups");
        per_lane[*lane] += 1;
    }
    assert_eq!(per_lane, [3, 3, 3]);
    delete(&broker, &[&queue]).await;
}

async fn slow_first(Json(n): Json<u64>, State(seen): State<Seen<(&'static str, u64)>>) {
    // Three times the 2 s visibility timeout.
    tokio::time::sleep(Duration::from_secs(6)).await;
    seen.lock().unwrap().push(("slow", n));
}

async fn competitor(Json(n): Json<u64>, State(seen): State<Seen<(&'static str, u64)>>) {
    seen.lock().unwrap().push(("competitor", n));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_running_three_visibility_timeouts_is_the_only_one_to_see_its_message() {
    let short = broker_at(ENDPOINT, Duration::from_secs(2)).await;
    let queue = declare(&short, QueueSpec::new(unique("long-handler", false))).await;
    let seen: Seen<(&'static str, u64)> = Seen::default();
    let slow = App::new("slow")
        .with_state(seen.clone())
        .mount(short.queue(&queue), slow_first, |m| m)
        .start()
        .await
        .unwrap();
    short.publish_json(&queue, &1u64).await.unwrap();
    // Wait until the slow app holds it, then let a competitor poll the same queue.
    eventually(
        "the slow handler to take it",
        Duration::from_secs(10),
        || async { hidden(&short, &queue).await == Some(1) },
    )
    .await;
    let other = broker_at(ENDPOINT, Duration::from_secs(2)).await;
    let competing = App::new("competitor")
        .with_state(seen.clone())
        .mount(other.queue(&queue), competitor, |m| m)
        .start()
        .await
        .unwrap();
    eventually(
        "the slow handler to finish",
        Duration::from_secs(30),
        || async { count(&seen) >= 1 },
    )
    .await;
    slow.shutdown().await.unwrap();
    competing.shutdown().await.unwrap();
    assert_eq!(
        *seen.lock().unwrap(),
        vec![("slow", 1)],
        "handled once, by the slow app"
    );
    delete(&short, &[&queue]).await;
}

/// How many of the queue's messages are received and not yet deleted.
async fn hidden(broker: &SqsBroker, queue: &str) -> Option<u64> {
    depth(broker, queue).await.map(|(_, hidden)| hidden)
}

/// How many of the queue's messages are visible, and how many received and not deleted.
async fn depth(broker: &SqsBroker, queue: &str) -> Option<(u64, u64)> {
    let depth = broker.queue_depth(queue).await.ok()?;
    Some((depth.ready, depth.in_flight?))
}

/// Who handled which message, and when.
type Tagged = Seen<(&'static str, u64, Instant)>;

async fn tagged_a(Json(n): Json<u64>, State(seen): State<Tagged>) {
    seen.lock().unwrap().push(("a", n, Instant::now()));
}

async fn tagged_b(Json(n): Json<u64>, State(seen): State<Tagged>) {
    seen.lock().unwrap().push(("b", n, Instant::now()));
}

/// Two subscriptions share the queue's messages, and the transport itself never makes a
/// message visible again before it is settled.
///
/// moto (5.x, `receive_message` in `moto/sqs/models.py`) checks and marks a message
/// received without a lock, so two long polls that run at the same moment can both get
/// it. Real standard queues may also deliver a message twice, rarely. Such a duplicate
/// arrives at once; one the transport caused (a visibility that lapsed, a delete that
/// failed) would arrive a visibility timeout (10 s) later. So the test allows the first
/// kind and fails on the second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_subscriptions_compete_and_each_message_is_handled_once() {
    let broker = broker().await;
    let queue = declare(&broker, QueueSpec::new(unique("compete", false))).await;
    publish_numbers(&broker, &queue, 0..100, |_| None).await;
    let seen = Tagged::default();
    let running = App::new("competing")
        .with_state(seen.clone())
        .mount(broker.queue(&queue), tagged_a, |m| m.workers(5))
        .mount(broker.queue(&queue), tagged_b, |m| m.workers(5))
        .start()
        .await
        .unwrap();
    eventually("every message", Duration::from_secs(60), || async {
        seen.lock()
            .unwrap()
            .iter()
            .map(|(_, n, _)| *n)
            .collect::<HashSet<_>>()
            .len()
            == 100
    })
    .await;
    running.shutdown().await.unwrap();
    let seen = seen.lock().unwrap().clone();
    let mut first_seen: HashMap<u64, Instant> = HashMap::new();
    for (_, n, at) in &seen {
        match first_seen.get(n) {
            None => {
                first_seen.insert(*n, *at);
            }
            Some(first) => assert!(
                at.duration_since(*first) < Duration::from_secs(5),
                "message {n} came back {:?} later: the transport let it become visible",
                at.duration_since(*first)
            ),
        }
    }
    assert!(
        seen.iter().any(|(who, _, _)| *who == "a") && seen.iter().any(|(who, _, _)| *who == "b")
    );
    delete(&broker, &[&queue]).await;
}

async fn sizes(batch: Batch<Json<u64>>, State(seen): State<Seen<usize>>) {
    seen.lock().unwrap().push(batch.len());
}

async fn batch_sizes(size: usize) -> Vec<usize> {
    let broker = broker().await;
    let queue = declare(&broker, QueueSpec::new(unique("batches", false))).await;
    publish_numbers(&broker, &queue, 0..40, |_| None).await;
    let seen: Seen<usize> = Seen::default();
    let running = App::new("batches")
        .with_state(seen.clone())
        .mount(broker.queue(&queue), sizes, move |m| m.batch(size))
        .start()
        .await
        .unwrap();
    eventually("every message", Duration::from_secs(60), || async {
        seen.lock().unwrap().iter().sum::<usize>() >= 40
    })
    .await;
    running.shutdown().await.unwrap();
    delete(&broker, &[&queue]).await;
    let sizes = seen.lock().unwrap().clone();
    assert_eq!(sizes.iter().sum::<usize>(), 40);
    sizes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_hold_one_receive_up_to_the_mount_size() {
    let sizes = batch_sizes(4).await;
    assert!(sizes.iter().all(|s| (1..=4).contains(s)), "{sizes:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_never_exceed_ten_messages() {
    let sizes = batch_sizes(25).await;
    assert!(sizes.iter().all(|s| (1..=10).contains(s)), "{sizes:?}");
    assert!(
        sizes.iter().any(|s| *s > 1),
        "receives of several messages: {sizes:?}"
    );
}

/// The attempt, SQS's receive count and when: `attempt` is the core's count, which a
/// retry in place raises too; the receive count rises only when SQS hands it out again.
type Attempts = Seen<(u32, Option<u32>, Instant)>;

async fn fail_first(
    Json(_n): Json<u64>,
    info: DeliveryInfo,
    State(seen): State<Attempts>,
) -> Result<(), String> {
    seen.lock()
        .unwrap()
        .push((info.attempt, info.receive_count, Instant::now()));
    if info.attempt == 1 {
        Err("first attempt fails".into())
    } else {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_hides_the_message_for_the_delay() {
    let broker = broker().await;
    let queue = declare(&broker, QueueSpec::new(unique("retry-after", false))).await;
    broker.publish_json(&queue, &1u64).await.unwrap();
    let seen = Attempts::default();
    // `workers` hands retries back to SQS (sequential and lane mounts retry in place,
    // and SQS would never see the delay).
    let running = App::new("retry-after")
        .with_state(seen.clone())
        .mount(broker.queue(&queue), fail_first, |m| {
            m.workers(2)
                .retry_after(Backoff::fixed(Duration::from_secs(2)))
        })
        .start()
        .await
        .unwrap();
    eventually("the second attempt", Duration::from_secs(30), || async {
        count(&seen) >= 2
    })
    .await;
    running.shutdown().await.unwrap();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen.iter()
            .map(|(attempt, received, _)| (*attempt, *received))
            .collect::<Vec<_>>(),
        vec![(1, Some(1)), (2, Some(2))],
        "attempts and SQS's receive counts: the retry went back to SQS"
    );
    assert!(
        seen[1].2 - seen[0].2 >= Duration::from_secs(2),
        "{:?}",
        seen[1].2 - seen[0].2
    );
    delete(&broker, &[&queue]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_rounds_a_sub_second_delay_up_to_whole_seconds() {
    let broker = broker().await;
    let queue = declare(&broker, QueueSpec::new(unique("retry-after-ms", false))).await;
    broker.publish_json(&queue, &1u64).await.unwrap();
    let seen = Attempts::default();
    // `workers` hands retries back to SQS (sequential and lane mounts retry in place).
    let running = App::new("retry-after-ms")
        .with_state(seen.clone())
        .mount(broker.queue(&queue), fail_first, |m| {
            m.workers(2)
                .retry_after(Backoff::fixed(Duration::from_millis(1500)))
        })
        .start()
        .await
        .unwrap();
    eventually("the second attempt", Duration::from_secs(30), || async {
        count(&seen) >= 2
    })
    .await;
    running.shutdown().await.unwrap();
    let seen = seen.lock().unwrap().clone();
    // 1.5 s hides the message for 2 s; truncated, it would come back after 1 s.
    assert!(
        seen[1].2 - seen[0].2 >= Duration::from_millis(1500),
        "came back after {:?}",
        seen[1].2 - seen[0].2
    );
    delete(&broker, &[&queue]).await;
}

async fn reject(Json(_n): Json<u64>, State(seen): State<Seen<u32>>, info: DeliveryInfo) -> Outcome {
    seen.lock().unwrap().push(info.attempt);
    Outcome::Reject
}

/// The dead-letter queue's messages: body, headers (message attributes) and group.
async fn dead_letters(
    broker: &SqsBroker,
    queue: &str,
) -> Vec<(String, HashMap<String, String>, Option<String>)> {
    let url = queue_url(broker, queue).await;
    let received = broker
        .client()
        .receive_message()
        .queue_url(url)
        .max_number_of_messages(10)
        .wait_time_seconds(1)
        .message_attribute_names("All")
        .message_system_attribute_names(
            aws_sdk_sqs::types::MessageSystemAttributeName::MessageGroupId,
        )
        .send()
        .await
        .unwrap();
    received
        .messages()
        .iter()
        .map(|m| {
            let attributes = m
                .message_attributes()
                .into_iter()
                .flatten()
                .filter_map(|(name, value)| Some((name.clone(), value.string_value()?.to_string())))
                .collect();
            let group = m
                .attributes()
                .and_then(|a| {
                    a.get(&aws_sdk_sqs::types::MessageSystemAttributeName::MessageGroupId)
                })
                .cloned();
            (m.body().unwrap_or_default().to_string(), attributes, group)
        })
        .collect()
}

/// Rejects one message on a queue whose redrive policy allows five receives: it is in the
/// dead-letter queue at once, with its reason, payload and headers, and was handled once.
async fn a_reject_goes_to_the_dead_letter_queue_at_once(fifo: bool) {
    let broker = broker().await;
    let dlq = declare(&broker, QueueSpec::new(unique("dead", fifo))).await;
    let mut spec = QueueSpec::new(unique("reject", fifo)).dead_letter_queue(&dlq, 5);
    if fifo {
        spec = spec.content_based_deduplication();
    }
    let queue = declare(&broker, spec).await;
    let mut message = Message::builder().header("x-tenant", "acme");
    if fifo {
        message = message.partition_key("alice");
    }
    broker
        .publish(&queue, message.json(&5u64).unwrap())
        .await
        .unwrap();
    let attempts: Seen<u32> = Seen::default();
    let running = App::new("reject")
        .with_state(attempts.clone())
        .mount(broker.queue(&queue), reject, |m| m.max_attempts(5))
        .start()
        .await
        .unwrap();
    let dead = Arc::new(Mutex::new(Vec::new()));
    eventually(
        "the message in the dead-letter queue",
        Duration::from_secs(30),
        || async {
            let found = dead_letters(&broker, &dlq).await;
            let mut dead = dead.lock().unwrap();
            dead.extend(found);
            !dead.is_empty()
        },
    )
    .await;
    // Gone from the queue for good: deleted, not waiting to be received again.
    eventually("the queue empty", Duration::from_secs(30), || async {
        depth(&broker, &queue).await == Some((0, 0))
    })
    .await;
    running.shutdown().await.unwrap();
    assert_eq!(*attempts.lock().unwrap(), vec![1], "handled exactly once");
    let dead = dead.lock().unwrap().clone();
    assert_eq!(dead.len(), 1);
    let (body, attributes, group) = &dead[0];
    assert_eq!(body, "5");
    assert_eq!(
        attributes.get(REJECT_REASON_HEADER).map(String::as_str),
        Some("rejected by the handler")
    );
    assert_eq!(attributes.get("x-tenant").map(String::as_str), Some("acme"));
    assert_eq!(
        attributes.get("content-type").map(String::as_str),
        Some("application/json")
    );
    if fifo {
        assert_eq!(group.as_deref(), Some("alice"), "the group travels");
    }
    delete(&broker, &[&queue, &dlq]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reject_goes_to_the_dead_letter_queue_at_once_with_its_reason() {
    a_reject_goes_to_the_dead_letter_queue_at_once(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_reject_goes_to_the_fifo_dead_letter_queue_with_its_group() {
    a_reject_goes_to_the_dead_letter_queue_at_once(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reject_without_a_dead_letter_queue_deletes_the_message() {
    let broker = broker().await;
    let queue = declare(&broker, QueueSpec::new(unique("reject-no-dlq", false))).await;
    broker.publish_json(&queue, &5u64).await.unwrap();
    let attempts: Seen<u32> = Seen::default();
    let running = App::new("reject-no-dlq")
        .with_state(attempts.clone())
        .mount(broker.queue(&queue), reject, |m| m)
        .start()
        .await
        .unwrap();
    eventually("the queue empty", Duration::from_secs(30), || async {
        count(&attempts) == 1 && depth(&broker, &queue).await == Some((0, 0))
    })
    .await;
    running.shutdown().await.unwrap();
    assert_eq!(*attempts.lock().unwrap(), vec![1]);
    delete(&broker, &[&queue]).await;
}

async fn gated(
    Json(n): Json<u64>,
    State(gate): State<Arc<tokio::sync::Semaphore>>,
    State(seen): State<Seen<u64>>,
) {
    seen.lock().unwrap().push(n);
    gate.acquire().await.unwrap().forget();
}

/// Every message the queue still has, received (and left to become visible again).
async fn remaining(broker: &SqsBroker, queue: &str, expected: usize) -> HashSet<String> {
    let url = queue_url(broker, queue).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut left = HashSet::new();
    while left.len() < expected && Instant::now() < deadline {
        let received = broker
            .client()
            .receive_message()
            .queue_url(&url)
            .max_number_of_messages(10)
            .wait_time_seconds(1)
            .send()
            .await
            .unwrap();
        for message in received.messages() {
            left.insert(message.body().unwrap_or_default().to_string());
        }
    }
    left
}

fn gated_app(
    name: &str,
    broker: &SqsBroker,
    queue: &str,
    gate: &Arc<tokio::sync::Semaphore>,
    started: &Seen<u64>,
    workers: usize,
) -> App {
    App::new(name)
        .with_state(gate.clone())
        .with_state(started.clone())
        .mount(broker.queue(queue), gated, move |m| m.workers(workers))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_receiving_releases_waiting_messages_while_handlers_still_run() {
    // A 30 s visibility timeout: a message not released would stay hidden past the test.
    let broker = broker_at(ENDPOINT, Duration::from_secs(30)).await;
    let queue = declare(&broker, QueueSpec::new(unique("release", false))).await;
    publish_numbers(&broker, &queue, 0..6, |_| None).await;
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let started: Seen<u64> = Seen::default();
    let running = gated_app("release", &broker, &queue, &gate, &started, 2)
        .start()
        .await
        .unwrap();
    // One receive takes all six: two handlers block, four wait hidden in the hand-over.
    eventually(
        "two handlers running, six received",
        Duration::from_secs(20),
        || async { count(&started) == 2 && depth(&broker, &queue).await == Some((0, 6)) },
    )
    .await;
    running.stop_receiving();
    // While the two handlers still run, everything else is visible again.
    eventually(
        "the four waiting messages visible again, two still hidden",
        Duration::from_secs(10),
        || async { depth(&broker, &queue).await == Some((4, 2)) },
    )
    .await;
    assert_eq!(count(&started), 2, "the handlers are still blocked");
    gate.add_permits(10);
    running.shutdown().await.unwrap();
    assert_eq!(count(&started), 2, "nothing new started while draining");
    // Nothing lost: the two handled are deleted, the four others are still there.
    eventually(
        "the two handled deleted",
        Duration::from_secs(10),
        || async { depth(&broker, &queue).await == Some((4, 0)) },
    )
    .await;
    let handled: HashSet<String> = started
        .lock()
        .unwrap()
        .iter()
        .map(|n| n.to_string())
        .collect();
    let left = remaining(&broker, &queue, 4).await;
    assert_eq!(left.len(), 4);
    assert!(left.is_disjoint(&handled));
    delete(&broker, &[&queue]).await;
}

/// A broker on `endpoint` whose receives long-poll for `wait`.
async fn polling_for(endpoint: &str, wait: Duration) -> SqsBroker {
    SqsBroker::builder()
        .endpoint(endpoint)
        .region("us-east-1")
        .static_credentials("test", "test")
        .receive_wait(wait)
        .visibility_timeout(Duration::from_secs(30))
        .build()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receive_under_way_when_receiving_stops_completes_and_its_messages_go_back() {
    let broker = polling_for(ENDPOINT, Duration::from_secs(10)).await;
    let queue = declare(&broker, QueueSpec::new(unique("stop-mid-poll", false))).await;
    publish_numbers(&broker, &queue, 0..1, |_| None).await;
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let started: Seen<u64> = Seen::default();
    let running = gated_app("stop-mid-poll", &broker, &queue, &gate, &started, 2)
        .start()
        .await
        .unwrap();
    eventually("the handler running", Duration::from_secs(20), || async {
        count(&started) == 1
    })
    .await;
    // A second worker is free: the pump long-polls the empty queue for 10 s.
    running.stop_receiving();
    publish_numbers(&broker, &queue, 1..4, |_| None).await;
    // Whether the poll under way took them or no poll was under way, they are visible
    // while the handler is still blocked; a poll cut short would leave them hidden 30 s.
    eventually(
        "the three published after the stop visible",
        Duration::from_secs(20),
        || async { depth(&broker, &queue).await == Some((3, 1)) },
    )
    .await;
    assert_eq!(count(&started), 1);
    gate.add_permits(10);
    running.shutdown().await.unwrap();
    assert_eq!(remaining(&broker, &queue, 3).await.len(), 3, "nothing lost");
    delete(&broker, &[&queue]).await;
}

async fn ack(Json(_n): Json<u64>) {}

/// A receive cut short by the client goes on in the emulator (as in SQS) until its long
/// poll ends, and takes whatever arrives meanwhile, hidden for the visibility timeout:
/// closing must wait for it instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_leaves_no_receive_under_way_behind() {
    // The app talks to the emulator through a proxy that shows its receives.
    let proxy = Proxy::start(ENDPOINT.trim_start_matches("http://")).await;
    let broker = polling_for(&proxy.endpoint(), Duration::from_secs(10)).await;
    let queue = declare(&broker, QueueSpec::new(unique("close-mid-poll", false))).await;
    let running = App::new("close-mid-poll")
        .mount(broker.queue(&queue), ack, |m| m)
        .start()
        .await
        .unwrap();
    // The pump long-polls the empty queue for 10 s at a time: shut down while one of its
    // receives is at the emulator, unanswered.
    tokio::time::timeout(Duration::from_secs(20), proxy.receive_under_way())
        .await
        .expect("a receive under way");
    running.shutdown().await.unwrap();
    publish_numbers(&broker, &queue, 0..3, |_| None).await;
    eventually("the three visible", Duration::from_secs(20), || async {
        depth(&broker, &queue).await == Some((3, 0))
    })
    .await;
    delete(&broker, &[&queue]).await;
}

/// One receive brings ten; the nine that wait behind the running one stay hidden, renewed
/// like it, over two and a half visibility timeouts of 6 s (each renewal goes out with
/// a second and more to spare, for a busy machine's emulator).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sequential_mount_receives_ten_at_a_time_and_keeps_them_hidden() {
    let broker = broker_at(ENDPOINT, Duration::from_secs(6)).await;
    let queue = declare(&broker, QueueSpec::new(unique("sequential-ten", false))).await;
    publish_numbers(&broker, &queue, 0..10, |_| None).await;
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let started: Seen<u64> = Seen::default();
    let running = App::new("sequential-ten")
        .with_state(gate.clone())
        .with_state(started.clone())
        .mount(broker.queue(&queue), gated, |m| m)
        .start()
        .await
        .unwrap();
    // One handler runs; the other nine of its receive wait, hidden.
    eventually("all ten received", Duration::from_secs(20), || async {
        count(&started) == 1 && depth(&broker, &queue).await == Some((0, 10))
    })
    .await;
    let held_since = Instant::now();
    while held_since.elapsed() < Duration::from_secs(15) {
        assert_eq!(
            depth(&broker, &queue).await,
            Some((0, 10)),
            "{:?} after all ten were received",
            held_since.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(count(&started), 1, "the one handler still runs");
    gate.add_permits(100);
    eventually("all ten handled", Duration::from_secs(30), || async {
        count(&started) == 10
    })
    .await;
    running.shutdown().await.unwrap();
    delete(&broker, &[&queue]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receive_batch_lowers_how_many_one_receive_takes() {
    let broker = broker_at(ENDPOINT, Duration::from_secs(30)).await;
    let queue = declare(&broker, QueueSpec::new(unique("receive-three", false))).await;
    publish_numbers(&broker, &queue, 0..10, |_| None).await;
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let started: Seen<u64> = Seen::default();
    let running = App::new("receive-three")
        .with_state(gate.clone())
        .with_state(started.clone())
        .mount(broker.queue(&queue).receive_batch(3), gated, |m| m)
        .start()
        .await
        .unwrap();
    // One receive of three: one runs, two wait, and the pump waits for them.
    eventually("one receive of three", Duration::from_secs(20), || async {
        count(&started) == 1 && depth(&broker, &queue).await == Some((7, 3))
    })
    .await;
    gate.add_permits(100);
    eventually("all ten handled", Duration::from_secs(30), || async {
        count(&started) == 10
    })
    .await;
    running.shutdown().await.unwrap();
    delete(&broker, &[&queue]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receive_batch_outside_one_to_ten_fails_the_start() {
    let broker = broker().await;
    for bad in [0, 11] {
        let started = App::new("bad-receive-batch")
            .mount(
                broker.queue("never-resolved").receive_batch(bad),
                ack,
                |m| m,
            )
            .start()
            .await;
        match started {
            Err(Error::Config(message)) => {
                assert!(message.contains("receive_batch"), "{message}");
            }
            Err(other) => panic!("receive_batch({bad}): {other}"),
            Ok(_) => panic!("receive_batch({bad}) should not start"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_queue_ends_the_app_with_an_error_naming_it() {
    let broker = broker().await;
    let queue = declare(&broker, QueueSpec::new(unique("deleted", false))).await;
    publish_numbers(&broker, &queue, 0..1, |_| None).await;
    let seen: Seen<(u64, Headers, DeliveryInfo)> = Seen::default();
    let app =
        App::new("deleted")
            .with_state(seen.clone())
            .mount(broker.queue(&queue), record_all, |m| m);
    let running = tokio::spawn(app.run_until(std::future::pending()));
    eventually("the app receiving", Duration::from_secs(20), || async {
        count(&seen) == 1
    })
    .await;
    broker.delete_queue(&queue).await.unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(60), running)
        .await
        .expect("the app stops by itself")
        .unwrap();
    let error = ended.expect_err("a deleted queue is an error");
    assert!(
        matches!(&error, Error::Subscribe { queue: q, .. } if *q == queue),
        "{error:?}"
    );
    let chain = format!("{error}: {:?}", std::error::Error::source(&error));
    assert!(
        chain.contains("NonExistentQueue") || chain.contains("QueueDoesNotExist"),
        "{chain}"
    );
}

/// The core allows a mount of any size (`batch(usize::MAX)`, `read_ahead(usize::MAX)`):
/// such a subscription still receives. Its pump's limit, the mount's size plus one
/// receive, overflowed (a panic in a debug build; in release, a limit below one receive,
/// so nothing was ever received).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_of_any_size_receives() {
    use conveyor::{Settlement, Source, SubscribeSettings, Subscriber};

    let broker = broker().await;
    let queue = declare(&broker, QueueSpec::new(unique("any-size", false))).await;
    broker.publish_json(&queue, &1u64).await.unwrap();
    let mut subscriber = broker
        .queue(queue.as_str())
        .subscribe(SubscribeSettings::new(usize::MAX))
        .await
        .unwrap();
    let delivery = tokio::time::timeout(Duration::from_secs(60), subscriber.recv())
        .await
        .expect("a delivery")
        .unwrap()
        .unwrap();
    assert_eq!(delivery.payload().as_ref(), b"1");
    delivery.settle(Settlement::Ack);
    subscriber.close().await;
    delete(&broker, &[&queue]).await;
}
