//! A mount's metrics reach whatever recorder the `metrics` facade has: consumed
//! deliveries, handler durations, outcomes by kind, decode failures and panics, with the
//! mount's labels and never a partition key.
//!
//! One test in this binary: it installs the process-wide recorder.

use std::collections::HashMap;

use conveyor::testing::TestApp;
use conveyor::{App, Json, MemoryBroker, Message};
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
    recorder
        .install()
        .expect("the only recorder of this test binary");

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
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        let labels: HashMap<&str, &str> = key.labels().map(|l| (l.key(), l.value())).collect();
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
}
