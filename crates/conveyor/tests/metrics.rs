//! A mount's metrics reach whatever recorder the `metrics` facade has: consumed
//! deliveries, handler durations, outcomes by kind, decode failures and panics, with the
//! mount's labels and never a partition key; per-lane series, the wait before each
//! handler, deliveries released at shutdown, reconnects, and published messages.
//!
//! Each test runs on a current-thread runtime with its own recorder set for the thread,
//! so every task of its app records there. The debugging recorder's snapshot drains what
//! it shows (counters and gauges go back to zero, histograms are emptied), so each test
//! waits on conditions through other means and takes as few snapshots as it can.

use std::collections::HashMap;

use conveyor::testing::TestApp;
use conveyor::{App, Json, MemoryBroker, Message, Publisher};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

async fn judge(Json(n): Json<i64>) -> Result<(), String> {
    match n {
        0 => Err("zero".to_string()),
        n if n < 0 => panic!("negative"),
        _ => Ok(()),
    }
}

#[tokio::test]
async fn a_mount_counts_what_it_consumes_and_how_each_delivery_ends() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recording = metrics::set_default_local_recorder(&recorder);

    let broker = MemoryBroker::new();
    let app = App::new("metrics").mount(broker.queue("jobs"), judge, |m| {
        m.workers(2).reject_on_error()
    });
    let test = TestApp::start(app, &broker).await.unwrap();
    for n in [1i64, 2, 0, -1] {
        let message = Message::builder()
            .partition_key(format!("customer-{n}"))
            .json(&n)
            .unwrap();
        test.publish("jobs", message).await.unwrap();
    }
    test.publish("jobs", Message::new("not json"))
        .await
        .unwrap();
    test.settled().await.unwrap();
    test.stop().await.unwrap();

    // name and outcome label -> value; every series must carry the mount's labels.
    let mut counters: HashMap<(String, Option<String>), u64> = HashMap::new();
    let mut durations = 0usize;
    let mut waits = 0usize;
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        let labels: HashMap<&str, &str> = key.labels().map(|l| (l.key(), l.value())).collect();
        if key.name() == "messaging.client.sent.messages" {
            assert_eq!(value, DebugValue::Counter(5), "the test's publishes");
            continue;
        }
        assert_eq!(labels.get("messaging.system"), Some(&"conveyor_in_process"));
        assert_eq!(labels.get("messaging.destination.name"), Some(&"jobs"));
        assert_eq!(labels.get("conveyor.dispatch"), Some(&"workers"));
        assert!(
            labels.values().all(|v| !v.starts_with("customer-")),
            "a partition key became a label: {labels:?}"
        );
        match value {
            DebugValue::Counter(n) => {
                let outcome = labels.get("conveyor.outcome").map(|o| o.to_string());
                counters.insert((key.name().to_string(), outcome), n);
            }
            DebugValue::Histogram(samples) if key.name() == "messaging.process.duration" => {
                durations = samples.len();
            }
            DebugValue::Histogram(samples) if key.name() == "conveyor.wait.duration" => {
                waits = samples.len();
            }
            DebugValue::Gauge(level) if key.name() == "conveyor.in_flight" => {
                assert_eq!(level.into_inner(), 0.0, "nothing in flight once settled");
            }
            _ => {}
        }
    }
    let count = |name: &str, outcome: Option<&str>| {
        counters
            .get(&(name.to_string(), outcome.map(str::to_string)))
            .copied()
            .unwrap_or(0)
    };
    assert_eq!(count("messaging.client.consumed.messages", None), 5);
    assert_eq!(count("conveyor.outcomes", Some("ack")), 2);
    assert_eq!(
        count("conveyor.outcomes", Some("reject")),
        3,
        "error, panic, bad payload"
    );
    assert_eq!(count("conveyor.decode_failures", None), 1);
    assert_eq!(count("conveyor.panics", None), 1);
    assert_eq!(durations, 4, "one run per decoded delivery");
    // A worker starts each delivery as it takes it: nothing waits, nothing is recorded.
    assert_eq!(waits, 0);
}

/// Every series of `name`, as (labels, value).
fn series(
    snapshotter: &metrics_util::debugging::Snapshotter,
    name: &str,
) -> Vec<(HashMap<String, String>, DebugValue)> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| key.key().name() == name)
        .map(|(key, _, _, value)| {
            let labels = key
                .key()
                .labels()
                .map(|l| (l.key().to_string(), l.value().to_string()))
                .collect();
            (labels, value)
        })
        .collect()
}

fn gauge(value: &DebugValue) -> f64 {
    match value {
        DebugValue::Gauge(level) => level.into_inner(),
        other => panic!("not a gauge: {other:?}"),
    }
}

/// Holds deliveries of the key `held` until the gate opens.
async fn held_at_gate(
    _payload: conveyor::Bytes,
    key: conveyor::PartitionKey,
    conveyor::State(gate): conveyor::State<std::sync::Arc<tokio::sync::Semaphore>>,
) {
    if key.as_str() == "held" {
        let _ = gate.acquire().await.map(|permit| permit.forget());
    }
}

#[tokio::test]
async fn a_lanes_mount_reports_each_lane_and_the_wait_before_each_handler() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recording = metrics::set_default_local_recorder(&recorder);

    let broker = MemoryBroker::new();
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let app =
        App::new("lanes")
            .with_state(gate.clone())
            .mount(broker.queue("jobs"), held_at_gate, |m| {
                m.workers(2).by_key()
            });
    let test = TestApp::start(app, &broker).await.unwrap();
    for _ in 0..3 {
        let message = Message::builder().partition_key("held").payload("x");
        test.publish("jobs", message).await.unwrap();
    }
    let held_lane = conveyor::dispatch::lane_for_key("held", 2);
    // The first runs, the second waits in the lane, the third in the dispatcher's hand.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    while test.lanes()[0].lanes[held_lane].waiting != 2 {
        assert!(tokio::time::Instant::now() < deadline, "{:?}", test.lanes());
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let held = snapshotter.snapshot().into_vec();
    let lane_gauge = |name: &str, lane: usize| -> Vec<f64> {
        held.iter()
            .filter(|(key, ..)| key.key().name() == name)
            .filter(|(key, ..)| {
                key.key()
                    .labels()
                    .any(|l| l.key() == "conveyor.lane" && l.value() == lane.to_string())
            })
            .map(|(.., value)| gauge(value))
            .collect()
    };
    assert_eq!(lane_gauge("conveyor.lane.waiting", held_lane), [2.0]);
    assert_eq!(lane_gauge("conveyor.lane.in_flight", held_lane), [1.0]);
    assert_eq!(lane_gauge("conveyor.lane.in_flight", 1 - held_lane), [0.0]);
    let waited_before = held
        .iter()
        .filter(|(key, ..)| key.key().name() == "conveyor.wait.duration")
        .map(|(.., value)| match value {
            DebugValue::Histogram(samples) => samples.len(),
            _ => 0,
        })
        .sum::<usize>();

    gate.add_permits(3);
    test.settled().await.unwrap();
    test.stop().await.unwrap();
    let waits = series(&snapshotter, "conveyor.wait.duration");
    let [(labels, DebugValue::Histogram(samples))] = &waits[..] else {
        panic!("{waits:?}");
    };
    assert_eq!(labels["conveyor.dispatch"], "lanes");
    assert_eq!(waited_before + samples.len(), 3, "one wait per delivery");
    // The last two waited for the first, held at the gate until the test let go.
    assert!(samples.iter().all(|wait| wait.into_inner() > 0.0));
}

/// Under any-worker, a delivery whose key is busy waits on the dispatcher's board: its
/// wait runs from when the dispatcher took it in to its handler's start.
#[tokio::test]
async fn an_any_worker_mount_reports_the_wait_of_deliveries_held_behind_a_busy_key() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recording = metrics::set_default_local_recorder(&recorder);

    let broker = MemoryBroker::new();
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let app =
        App::new("any")
            .with_state(gate.clone())
            .mount(broker.queue("jobs"), held_at_gate, |m| {
                m.workers(2).by_key().any_worker()
            });
    let test = TestApp::start(app, &broker).await.unwrap();
    for _ in 0..3 {
        let message = Message::builder().partition_key("held").payload("x");
        test.publish("jobs", message).await.unwrap();
    }
    // All three taken in: the first runs, held at the gate; the others wait for its key.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    while broker.stats("jobs").in_flight != 3 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{:?}",
            broker.stats("jobs")
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    // Held for 20 ms at least, on the real clock the metric reads.
    let held = std::time::Instant::now();
    while held.elapsed() < std::time::Duration::from_millis(20) {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    gate.add_permits(3);
    test.settled().await.unwrap();
    test.stop().await.unwrap();

    let waits = series(&snapshotter, "conveyor.wait.duration");
    let [(labels, DebugValue::Histogram(samples))] = &waits[..] else {
        panic!("{waits:?}");
    };
    assert_eq!(labels["conveyor.dispatch"], "any_worker");
    let mut samples: Vec<f64> = samples.iter().map(|wait| wait.into_inner()).collect();
    samples.sort_by(f64::total_cmp);
    assert_eq!(samples.len(), 3, "one wait per delivery: {samples:?}");
    // The two behind the first waited for it: 20 ms, less 1% for the clock's calibration.
    assert!(samples[1] >= 0.0198, "{samples:?}");
}

async fn forever(_payload: conveyor::Bytes) {
    std::future::pending::<()>().await;
}

async fn forever_batch(_batch: conveyor::Batch<conveyor::Bytes>) {
    std::future::pending::<()>().await;
}

/// Publishes `count` messages, mounts `handler` on them with `mount`, waits until all are
/// received, shuts down at once past a 50 ms timeout, and checks that all went back to
/// the queue counted as released.
async fn released_at_the_shutdown_timeout<T, H>(
    count: usize,
    handler: H,
    mount: impl FnOnce(conveyor::MountOptions) -> conveyor::MountOptions,
) where
    H: conveyor::Handler<T>,
{
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recording = metrics::set_default_local_recorder(&recorder);

    let broker = MemoryBroker::new();
    for _ in 0..count {
        broker.publish("jobs", Message::new("x")).await.unwrap();
    }
    let app = App::new("stuck")
        .shutdown_timeout(std::time::Duration::from_millis(50))
        .mount(broker.queue("jobs"), handler, mount)
        .start()
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    while broker.stats("jobs").in_flight < count {
        assert!(tokio::time::Instant::now() < deadline, "never received");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    app.shutdown().await.unwrap();
    let released: Vec<_> = series(&snapshotter, "conveyor.outcomes")
        .into_iter()
        .filter(|(labels, _)| labels["conveyor.outcome"] == "released")
        .map(|(_, value)| value)
        .collect();
    assert_eq!(released, [DebugValue::Counter(count as u64)]);
    assert_eq!(broker.stats("jobs").ready, count, "back on the queue");
}

#[tokio::test]
async fn a_delivery_handed_back_at_the_shutdown_timeout_counts_as_released() {
    released_at_the_shutdown_timeout(1, forever, |m| m).await;
}

/// A batch cancelled at the shutdown timeout counts each of its deliveries as released.
/// (It counted none: they had left the list the count was read from.)
#[tokio::test]
async fn a_batch_handed_back_at_the_shutdown_timeout_counts_each_delivery_as_released() {
    released_at_the_shutdown_timeout(3, forever_batch, |m| m.batch(10)).await;
}

#[tokio::test]
async fn publishing_counts_sent_messages_by_destination() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recording = metrics::set_default_local_recorder(&recorder);

    let broker = MemoryBroker::new();
    for destination in ["a", "a", "b"] {
        broker
            .publish(destination, Message::new("x"))
            .await
            .unwrap();
    }
    let mut sent: Vec<(String, String, DebugValue)> =
        series(&snapshotter, "messaging.client.sent.messages")
            .into_iter()
            .map(|(labels, value)| {
                (
                    labels["messaging.system"].clone(),
                    labels["messaging.destination.name"].clone(),
                    value,
                )
            })
            .collect();
    sent.sort_by(|a, b| a.1.cmp(&b.1));
    assert_eq!(
        sent,
        [
            (
                "conveyor_in_process".into(),
                "a".into(),
                DebugValue::Counter(2)
            ),
            (
                "conveyor_in_process".into(),
                "b".into(),
                DebugValue::Counter(1)
            ),
        ]
    );
}

#[tokio::test]
async fn a_reject_moved_to_the_dead_letter_queue_is_counted_where_it_came_from() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recording = metrics::set_default_local_recorder(&recorder);

    let broker = MemoryBroker::new();
    conveyor::Broker::declare_queue(
        &broker,
        &conveyor::QueueSpec::new("jobs").dead_letter_queue("jobs-dead", 3),
    )
    .await
    .unwrap();
    let app = App::new("dead").mount(broker.queue("jobs"), judge, |m| m.reject_on_error());
    let test = TestApp::start(app, &broker).await.unwrap();
    for n in [0i64, 1, 0] {
        test.publish_json("jobs", &n).await.unwrap();
    }
    test.settled().await.unwrap();
    test.stop().await.unwrap();
    let dead: Vec<_> = series(&snapshotter, "conveyor.dead_letters")
        .into_iter()
        .map(|(labels, value)| (labels["messaging.destination.name"].clone(), value))
        .collect();
    assert_eq!(dead, [("jobs".to_string(), DebugValue::Counter(2))]);
}
