//! A pipeline across the three transports, each stage publishing its handler's result:
//! in process → RabbitMQ → SQS FIFO. Each key's steps reach the end in order, and nothing
//! is lost when the middle stage's connections are cut under load.
//!
//! Needs RabbitMQ on 127.0.0.1:5672 (and `rabbitmqctl`) and the SQS emulator on
//! 127.0.0.1:4566 (`scripts/services/`).

mod common;

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use conveyor::{App, Broker, Error, Json, MemoryBroker, Message, Publisher, QueueSpec, State};
use serde::{Deserialize, Serialize};

const KEYS: u64 = 8;
const STEPS: u64 = 50;
const DEADLINE: Duration = Duration::from_secs(120);

/// Step `seq` of the flow of `key`.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
struct Step {
    key: u64,
    seq: u64,
}

/// Stage 1 (in process): passes each step on to RabbitMQ.
async fn first(Json(step): Json<Step>) -> Result<Message, Error> {
    Message::json(&step)
}

/// Stage 2 (RabbitMQ): passes each step on to SQS, under an id that SQS FIFO
/// deduplicates when a redelivered step is published again.
async fn middle(Json(step): Json<Step>) -> Result<Message, Error> {
    Message::builder()
        .message_id(format!("{}-{}", step.key, step.seq))
        .json(&step)
}

/// What reached the end, in the order each key's steps arrived.
#[derive(Clone, Default)]
struct Arrived(Arc<Mutex<Vec<Step>>>);

impl Arrived {
    fn all(&self) -> Vec<Step> {
        self.0.lock().unwrap().clone()
    }

    fn distinct(&self) -> usize {
        let mut seen: Vec<(u64, u64)> = self.all().iter().map(|s| (s.key, s.seq)).collect();
        seen.sort_unstable();
        seen.dedup();
        seen.len()
    }
}

/// Stage 3 (SQS FIFO): the end of the line.
async fn last(Json(step): Json<Step>, State(arrived): State<Arrived>) {
    arrived.0.lock().unwrap().push(step);
}

fn unique(name: &str) -> String {
    common::unique("pipeline", name)
}

/// Closes, from the server's side, every connection whose client properties mention
/// `name`; returns how many.
fn close_connections_named(name: &str) -> usize {
    let listing = Command::new("rabbitmqctl")
        .args(["-q", "-s", "list_connections", "pid", "client_properties"])
        .output()
        .expect("rabbitmqctl");
    let listing = String::from_utf8_lossy(&listing.stdout);
    let pids: Vec<&str> = listing
        .lines()
        .filter(|line| line.contains(name))
        .filter_map(|line| line.split('\t').next())
        .collect();
    for pid in &pids {
        let closed = Command::new("rabbitmqctl")
            .args(["-q", "close_connection", pid, "cut by the pipeline test"])
            .status()
            .expect("rabbitmqctl");
        assert!(closed.success(), "rabbitmqctl close_connection {pid}");
    }
    pids.len()
}

async fn until(what: &str, mut condition: impl FnMut() -> bool) {
    let waited = tokio::time::timeout(DEADLINE, async {
        while !condition() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(
        waited.is_ok(),
        "timed out after {DEADLINE:?} waiting for {what}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipeline_across_transports_keeps_each_key_in_order_through_a_cut_connection() {
    let memory = MemoryBroker::new();
    // Stage 1 publishes on its own connection: the cut is the middle stage's alone.
    let into_rabbitmq = common::rabbitmq("conveyor-pipeline-first").await;
    let middle_name = unique("middle");
    let middle_broker = common::rabbitmq(&middle_name).await;
    let sqs = common::sqs().await;
    let (orders, shipping, billing) = (
        unique("orders"),
        unique("shipping"),
        format!("{}.fifo", unique("billing")),
    );
    middle_broker
        .declare_queue(&QueueSpec::new(&shipping))
        .await
        .unwrap();
    sqs.declare_queue(&QueueSpec::new(&billing)).await.unwrap();

    let arrived = Arrived::default();
    let app = App::new("pipeline")
        .with_state(arrived.clone())
        .mount(memory.queue(&orders), first, |m| {
            m.workers(4)
                .by_key()
                .publish_to(shipping.as_str())
                .publish_via(into_rabbitmq.clone())
        })
        .mount(middle_broker.queue(&shipping).prefetch(32), middle, |m| {
            m.workers(4)
                .by_key()
                .publish_to(billing.as_str())
                .publish_via(sqs.clone())
        })
        .mount(sqs.queue(&billing), last, |m| m.workers(4).by_key())
        .start()
        .await
        .unwrap();

    for seq in 0..STEPS {
        for key in 0..KEYS {
            let step = Message::builder()
                .partition_key(format!("k{key}"))
                .json(&Step { key, seq })
                .unwrap();
            memory.publish(&orders, step).await.unwrap();
        }
    }
    let total = (KEYS * STEPS) as usize;
    until("a quarter of the steps at the end", || {
        arrived.distinct() >= total / 4
    })
    .await;
    assert!(
        close_connections_named(&middle_name) >= 1,
        "the middle stage's connections were cut"
    );
    until("every step at the end", || arrived.distinct() == total).await;
    app.shutdown().await.unwrap();

    // Per key, steps arrive in order; a step may come again (at least once: a step the
    // cut caught after its output was sent, before its ack), but only one already seen.
    let mut next: BTreeMap<u64, u64> = BTreeMap::new();
    let mut replays = 0;
    for step in arrived.all() {
        let expected = next.entry(step.key).or_default();
        if step.seq == *expected {
            *expected += 1;
        } else {
            assert!(
                step.seq < *expected,
                "key {} skipped ahead to step {} before step {}",
                step.key,
                step.seq,
                expected
            );
            replays += 1;
        }
    }
    assert!(next.values().all(|&n| n == STEPS), "{next:?}");
    println!("{replays} steps came twice after the cut");
    let stats = memory.stats(&orders);
    assert_eq!((stats.ready, stats.in_flight), (0, 0), "stage 1 acked all");
    assert_eq!(
        middle_broker.queue_depth(&shipping).await.unwrap().ready,
        0,
        "stage 2 took all"
    );
    middle_broker.delete_queue(&shipping).await.unwrap();
    sqs.delete_queue(&billing).await.unwrap();
}
