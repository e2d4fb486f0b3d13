//! SQS's share of the metrics (`metrics` feature): publishes counted by destination,
//! every SQS request timed under its API name, rejects moved to the dead-letter queue,
//! counted by the queue they came from, and the wait of what the pump read ahead.
//!
//! Current-thread runtime, with a recorder set for the thread: every task of the test,
//! the subscription's pump and keeper included, records there. The recorder's snapshot
//! drains it, so it is taken once, at the end.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::{broker, declare, delete, eventually, unique};
use conveyor::{App, Broker, Json, Outcome, Publisher, QueueSpec};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

async fn reject(Json(_): Json<u32>) -> Outcome {
    Outcome::Reject
}

#[tokio::test]
async fn publishes_and_requests_are_counted_and_timed_and_dead_letters_counted() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recording = metrics::set_default_local_recorder(&recorder);

    let broker = broker().await;
    let dead = declare(&broker, QueueSpec::new(unique("metrics-dead", false))).await;
    let queue = declare(
        &broker,
        QueueSpec::new(unique("metrics", false)).dead_letter_queue(&dead, 5),
    )
    .await;
    for n in 0..2u32 {
        broker.publish_json(&queue, &n).await.unwrap();
    }
    let app = App::new("metrics")
        .mount(broker.queue(&queue), reject, |m| m)
        .start()
        .await
        .unwrap();
    eventually(
        "both in the dead-letter queue",
        Duration::from_secs(60),
        || async {
            broker
                .queue_depth(&dead)
                .await
                .is_ok_and(|depth| depth.ready == 2)
        },
    )
    .await;
    app.shutdown().await.unwrap();
    delete(&broker, &[&queue, &dead]).await;

    let mut counters: HashMap<(String, String), u64> = HashMap::new();
    let mut requests: HashMap<String, usize> = HashMap::new();
    let mut waits = 0;
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        let label = |name: &str| {
            key.labels()
                .find(|l| l.key() == name)
                .map(|l| l.value().to_string())
                .unwrap_or_default()
        };
        if label("messaging.system") != "aws_sqs" {
            continue;
        }
        match value {
            DebugValue::Counter(n) => {
                counters.insert(
                    (key.name().to_string(), label("messaging.destination.name")),
                    n,
                );
            }
            DebugValue::Histogram(samples)
                if key.name() == "messaging.client.operation.duration" =>
            {
                *requests
                    .entry(label("messaging.operation.name"))
                    .or_default() += samples.len();
            }
            DebugValue::Histogram(samples) if key.name() == "conveyor.wait.duration" => {
                waits += samples.len();
            }
            _ => {}
        }
    }
    assert_eq!(
        counters.get(&("messaging.client.sent.messages".into(), queue.clone())),
        Some(&2),
        "{counters:?}"
    );
    assert_eq!(
        counters.get(&("conveyor.dead_letters".into(), queue.clone())),
        Some(&2),
        "{counters:?}"
    );
    assert_eq!(requests.get("SendMessage"), Some(&2), "{requests:?}");
    // The pump reads ahead, so even a sequential mount's deliveries can wait: each
    // records its wait, once.
    assert_eq!(waits, 2);
    for api in [
        "ReceiveMessage",
        "SendMessageBatch",
        "DeleteMessageBatch",
        "GetQueueAttributes",
    ] {
        assert!(
            requests.get(api).is_some_and(|&n| n > 0),
            "no {api} in {requests:?}"
        );
    }
}
