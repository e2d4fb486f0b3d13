//! The in-process transport: FIFO groups, competing subscriptions, dead-letter queues,
//! unsettled deliveries.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use conveyor::testing::TestApp;
use conveyor::{
    App, Broker, Json, MemoryBroker, Message, Outcome, PartitionKey, Publisher, QueueSpec,
    Settlement, Source, State, SubscribeSettings, Subscriber,
};

/// For one group: how many of its messages run right now, the most at once, the order.
type Load = (usize, usize, Vec<u64>);

/// Per group, its load.
#[derive(Clone, Default)]
struct GroupLoad(Arc<Mutex<HashMap<String, Load>>>);

async fn slow_grouped(Json(n): Json<u64>, key: PartitionKey, State(load): State<GroupLoad>) {
    {
        let mut groups = load.0.lock().unwrap();
        let entry = groups.entry(key.to_string()).or_default();
        entry.0 += 1;
        entry.1 = entry.1.max(entry.0);
        entry.2.push(n);
    }
    tokio::time::sleep(Duration::from_millis(5)).await;
    load.0.lock().unwrap().get_mut(key.as_str()).unwrap().0 -= 1;
}

async fn run_grouped(queue: &str) -> HashMap<String, Load> {
    let broker = MemoryBroker::new();
    let load = GroupLoad::default();
    let app =
        App::new("groups")
            .with_state(load.clone())
            .mount(broker.queue(queue), slow_grouped, |m| m.workers(4));
    let test = TestApp::start(app, &broker).await.unwrap();
    for n in 0..10u64 {
        for group in ["a", "b"] {
            test.publish(
                queue,
                Message::builder().partition_key(group).json(&n).unwrap(),
            )
            .await
            .unwrap();
        }
    }
    test.settled().await.unwrap();
    test.stop().await.unwrap();
    load.0.lock().unwrap().clone()
}

#[tokio::test(start_paused = true)]
async fn a_fifo_queue_holds_a_group_while_one_of_its_messages_is_in_flight() {
    let groups = run_grouped("jobs.fifo").await;
    for (group, (_, peak, order)) in groups {
        assert_eq!(peak, 1, "group {group} ran {peak} at once");
        assert_eq!(
            order,
            (0..10).collect::<Vec<_>>(),
            "group {group} out of order"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_standard_queue_does_not_hold_groups() {
    let groups = run_grouped("jobs").await;
    assert!(
        groups.values().any(|(_, peak, _)| *peak > 1),
        "workers overlap a group"
    );
}

#[derive(Clone, Default)]
struct Handled(Arc<Mutex<Vec<(&'static str, u64)>>>);

async fn handled_by_a(Json(n): Json<u64>, State(seen): State<Handled>) {
    tokio::time::sleep(Duration::from_millis(1)).await;
    seen.0.lock().unwrap().push(("a", n));
}

async fn handled_by_b(Json(n): Json<u64>, State(seen): State<Handled>) {
    tokio::time::sleep(Duration::from_millis(1)).await;
    seen.0.lock().unwrap().push(("b", n));
}

#[tokio::test(start_paused = true)]
async fn competing_subscriptions_split_the_work_with_no_duplicates_and_no_loss() {
    let broker = MemoryBroker::new();
    let seen = Handled::default();
    let app = App::new("competing")
        .with_state(seen.clone())
        .mount(broker.queue("work"), handled_by_a, |m| m.workers(2))
        .mount(broker.queue("work"), handled_by_b, |m| m.workers(2));
    let test = TestApp::start(app, &broker).await.unwrap();
    for n in 0..500u64 {
        test.publish_json("work", &n).await.unwrap();
    }
    test.settled().await.unwrap();
    let seen = seen.0.lock().unwrap().clone();
    let numbers: HashSet<u64> = seen.iter().map(|(_, n)| *n).collect();
    assert_eq!(seen.len(), 500, "no message handled twice");
    assert_eq!(numbers.len(), 500, "no message lost");
    let by_a = seen.iter().filter(|(who, _)| *who == "a").count();
    assert!(
        by_a > 0 && by_a < 500,
        "both subscriptions took work: a took {by_a}"
    );
    test.stop().await.unwrap();
}

async fn always_retry(Json(_n): Json<u64>, State(count): State<Arc<AtomicUsize>>) -> Outcome {
    count.fetch_add(1, Ordering::SeqCst);
    Outcome::Retry
}

#[tokio::test]
async fn a_message_received_more_than_the_max_receive_count_is_dead_lettered() {
    let broker = MemoryBroker::new();
    broker
        .declare_queue(&QueueSpec::new("jobs").dead_letter_queue("jobs.dlq", 3))
        .await
        .unwrap();
    let attempts = Arc::new(AtomicUsize::new(0));
    let app = App::new("redrive").with_state(attempts.clone()).mount(
        broker.queue("jobs"),
        always_retry,
        // Workers retry through the queue, whose max receive count then applies.
        |m| m.workers(1).unlimited_attempts(),
    );
    let test = TestApp::start(app, &broker).await.unwrap();
    test.publish_json("jobs", &1u64).await.unwrap();
    test.settled().await.unwrap();
    assert_eq!(attempts.load(Ordering::SeqCst), 3);
    let dead = test.rejected("jobs");
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].dead_letter_queue.as_deref(), Some("jobs.dlq"));
    assert!(
        dead[0].reason.contains("max receive count"),
        "{}",
        dead[0].reason
    );
    assert_eq!(broker.stats("jobs.dlq").ready, 1);
    test.stop().await.unwrap();
}

#[tokio::test]
async fn a_rejected_message_carries_its_reason_into_the_dead_letter_queue() {
    let broker = MemoryBroker::new();
    broker
        .declare_queue(&QueueSpec::new("jobs").dead_letter_queue("jobs.dlq", 10))
        .await
        .unwrap();
    broker.publish("jobs", Message::new("x")).await.unwrap();
    let mut subscriber = broker
        .queue("jobs")
        .subscribe(SubscribeSettings::new(1))
        .await
        .unwrap();
    let delivery = subscriber.recv().await.unwrap().unwrap();
    delivery.settle(Settlement::Reject {
        reason: "bad order",
    });
    let mut dlq = broker
        .queue("jobs.dlq")
        .subscribe(SubscribeSettings::new(1))
        .await
        .unwrap();
    let dead = dlq.recv().await.unwrap().unwrap();
    assert_eq!(
        dead.headers()
            .get_str(conveyor::memory::REJECT_REASON_HEADER),
        Some("bad order")
    );
    assert_eq!(dead.payload().as_ref(), b"x");
}

#[tokio::test]
async fn a_delivery_dropped_unsettled_returns_to_its_queue_uncounted() {
    let broker = MemoryBroker::new();
    broker
        .publish("jobs", Message::builder().partition_key("k").payload("x"))
        .await
        .unwrap();
    let mut subscriber = broker
        .queue("jobs")
        .subscribe(SubscribeSettings::new(1))
        .await
        .unwrap();
    let first = subscriber.recv().await.unwrap().unwrap();
    assert_eq!(first.receive_count(), Some(1));
    assert_eq!(first.partition_key().map(|k| k.as_str()), Some("k"));
    assert_eq!(broker.stats("jobs").in_flight, 1);
    drop(first);
    assert_eq!(broker.stats("jobs").ready, 1);
    let again = subscriber.recv().await.unwrap().unwrap();
    assert_eq!(
        again.receive_count(),
        Some(1),
        "a release is not an attempt"
    );
    again.settle(Settlement::Retry);
    let third = subscriber.recv().await.unwrap().unwrap();
    assert_eq!(third.receive_count(), Some(2));
    assert!(third.redelivered());
}

#[tokio::test]
async fn a_standard_queue_keeps_publish_order() {
    let broker = MemoryBroker::new();
    for n in 0..100u64 {
        broker.publish_json("ordered", &n).await.unwrap();
    }
    let mut subscriber = broker
        .queue("ordered")
        .subscribe(SubscribeSettings::new(1))
        .await
        .unwrap();
    for n in 0..100u64 {
        let delivery = subscriber.recv().await.unwrap().unwrap();
        assert_eq!(delivery.payload().as_ref(), n.to_string().as_bytes());
        delivery.settle(Settlement::Ack);
    }
}

#[tokio::test(start_paused = true)]
async fn a_delayed_publish_becomes_visible_after_its_delay() {
    let broker = MemoryBroker::new();
    broker
        .publish(
            "later",
            Message::builder()
                .delay(Duration::from_secs(30))
                .payload("x"),
        )
        .await
        .unwrap();
    let start = tokio::time::Instant::now();
    let mut subscriber = broker
        .queue("later")
        .subscribe(SubscribeSettings::new(1))
        .await
        .unwrap();
    let delivery = subscriber.recv().await.unwrap().unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(30));
    delivery.settle(Settlement::Ack);
}

/// A delivery's headers, as (name, value) text, sorted.
type HeaderList = Vec<(String, String)>;

/// What each delivery's headers held, after its handler added one of its own.
#[derive(Clone, Default)]
struct SeenHeaders(Arc<Mutex<Vec<HeaderList>>>);

async fn tag_headers(
    Json(n): Json<u64>,
    mut headers: conveyor::Headers,
    State(seen): State<SeenHeaders>,
) {
    headers.insert("x-handled", n.to_string());
    let mut all: HeaderList = headers
        .iter()
        .map(|(name, value)| {
            (
                name.to_string(),
                String::from_utf8_lossy(value).into_owned(),
            )
        })
        .collect();
    all.sort();
    seen.0.lock().unwrap().push(all);
}

/// JSON messages with no header of their own share one stored header list: each still
/// arrives with its content type, and a handler's change to its copy reaches no other.
#[tokio::test]
async fn json_messages_without_headers_each_carry_their_content_type_and_their_own_changes() {
    let broker = MemoryBroker::new();
    let seen = SeenHeaders::default();
    let app = App::new("headers").with_state(seen.clone()).mount(
        broker.queue("plain"),
        tag_headers,
        |m| m,
    );
    let app = TestApp::start(app, &broker).await.unwrap();
    for n in [1u64, 2] {
        app.publish_json("plain", &n).await.unwrap();
    }
    app.settled().await.unwrap();
    app.stop().await.unwrap();
    let expected = |n: &str| {
        vec![
            ("content-type".to_string(), "application/json".to_string()),
            ("x-handled".to_string(), n.to_string()),
        ]
    };
    assert_eq!(*seen.0.lock().unwrap(), vec![expected("1"), expected("2")]);
}
