//! RabbitMQ's share of the metrics (`metrics` feature): publishes counted by destination
//! and timed until their confirm, refusals by kind, and rejects moved to the dead-letter
//! queue, counted by the queue they came from.
//!
//! Current-thread runtime, with a recorder set for the thread: every task of the test,
//! the broker's settling included, records there. The recorder's snapshot drains it, so
//! it is taken once, at the end.

mod common;

use std::collections::HashMap;

use conveyor::{App, Json, Outcome, Publisher, QueueSpec};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

use common::{broker, cleanup, ready, unique, wait_for};

async fn reject(Json(_): Json<u32>) -> Outcome {
    Outcome::Reject
}

#[tokio::test]
async fn publishes_are_counted_and_timed_and_dead_letters_counted() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recording = metrics::set_default_local_recorder(&recorder);

    let broker = broker().await;
    let (queue, dead, missing) = (unique("metrics"), unique("metrics-dead"), unique("none"));
    broker
        .declare_queue(&QueueSpec::new(dead.as_str()))
        .await
        .unwrap();
    broker
        .declare_queue(&QueueSpec::new(queue.as_str()).dead_letter_queue(dead.as_str(), 5))
        .await
        .unwrap();
    for n in 0..2u32 {
        broker.publish_json(&queue, &n).await.unwrap();
    }
    // Mandatory, to a queue that does not exist: returned.
    assert!(broker.publish_json(&missing, &9u32).await.is_err());
    let app = App::new("metrics")
        .mount(broker.queue(queue.as_str()), reject, |m| m)
        .start()
        .await
        .unwrap();
    wait_for("both in the dead-letter queue", || async {
        ready(&broker, &dead).await == 2
    })
    .await;
    app.shutdown().await.unwrap();

    let mut counters: HashMap<(String, String, Option<String>), u64> = HashMap::new();
    let mut confirms: HashMap<Option<String>, usize> = HashMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        let label = |name: &str| {
            key.labels()
                .find(|l| l.key() == name)
                .map(|l| l.value().to_string())
        };
        if label("messaging.system").as_deref() != Some("rabbitmq") {
            continue;
        }
        match value {
            DebugValue::Counter(n) => {
                let destination = label("messaging.destination.name").unwrap_or_default();
                counters.insert(
                    (key.name().to_string(), destination, label("error.type")),
                    n,
                );
            }
            DebugValue::Histogram(samples)
                if key.name() == "messaging.client.operation.duration" =>
            {
                assert_eq!(
                    label("messaging.operation.name").as_deref(),
                    Some("publish")
                );
                *confirms.entry(label("error.type")).or_default() += samples.len();
            }
            _ => {}
        }
    }
    let sent = "messaging.client.sent.messages".to_string();
    assert_eq!(
        counters.get(&(sent.clone(), queue.clone(), None)),
        Some(&2),
        "{counters:?}"
    );
    assert_eq!(
        counters.get(&(sent, missing.clone(), Some("returned".into()))),
        Some(&1),
        "{counters:?}"
    );
    assert_eq!(
        counters.get(&("conveyor.dead_letters".into(), queue.clone(), None)),
        Some(&2),
        "{counters:?}"
    );
    assert_eq!(confirms.get(&None), Some(&2), "{confirms:?}");
    assert_eq!(
        confirms.get(&Some("returned".into())),
        Some(&1),
        "{confirms:?}"
    );
    cleanup(&broker, &[&queue, &dead], &[]).await;
    broker.close().await.unwrap();
}
