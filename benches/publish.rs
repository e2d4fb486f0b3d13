//! Publish throughput on a live RabbitMQ (127.0.0.1:5672), persistent messages with
//! publisher confirms: Conveyor's `Publisher::publish` shared by 64 tasks, and
//! `publish_batch`, against raw lapin doing the same on one confirm-mode channel with the
//! same number of confirms outstanding, in the same run; and the 64 tasks once more with
//! messages that are not mandatory, for what the mandatory flag costs.
//!
//! Run: `scripts/services/rabbitmq.sh && cargo bench -p conveyor-benches --bench publish`
//! (`PUBLISH_BENCH_MESSAGES` and `PUBLISH_BENCH_ROUNDS` change the size).
//!
//! Every measured run is a task spawned on the runtime's worker threads, as in
//! `benches/rabbitmq.rs`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use conveyor::{Message, Publisher, QueueSpec};
use conveyor_lapin::{LapinBroker, PublishOptions};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::{BasicProperties, Confirmation, PublisherConfirm};

const URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
/// Tasks publishing at once on one publisher: confirms outstanding.
const TASKS: u64 = 64;
/// Messages per batch publish: confirms outstanding.
const BATCH: usize = 256;

fn payload(i: u64) -> Vec<u8> {
    let mut body = format!(r#"{{"id":{i},"item":"tea","quantity":3,"note":""#).into_bytes();
    body.resize(500, b'n');
    body.extend_from_slice(br#""}"#);
    body
}

/// A raw lapin connection and a confirm-mode channel on it.
async fn raw_channel() -> (lapin::Connection, lapin::Channel) {
    let connection = lapin::Connection::connect(URL, lapin::ConnectionProperties::default())
        .await
        .expect("connect");
    let channel = connection.create_channel().await.expect("channel");
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirms");
    (connection, channel)
}

/// Raw lapin: message `i`, persistent and mandatory, as Conveyor sends it; the confirm is
/// to come.
async fn raw_publish(channel: &lapin::Channel, queue: &str, i: u64) -> PublisherConfirm {
    channel
        .basic_publish(
            "".into(),
            queue.into(),
            BasicPublishOptions {
                mandatory: true,
                immediate: false,
            },
            &payload(i),
            BasicProperties::default()
                .with_delivery_mode(2)
                .with_content_type("application/json".into()),
        )
        .await
        .expect("publish")
}

/// Raw lapin: `TASKS` tasks share one confirm-mode channel, each publishing and awaiting
/// its confirm, as `Publisher::publish` does.
async fn raw_tasks(queue: &str, n: u64) -> Duration {
    let (connection, channel) = raw_channel().await;
    let next = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let (channel, next, queue) = (channel.clone(), next.clone(), queue.to_string());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    return;
                }
                let confirm = raw_publish(&channel, &queue, i).await;
                assert!(matches!(
                    confirm.await.expect("confirm"),
                    Confirmation::Ack(None)
                ));
            }
        }));
    }
    for task in tasks {
        task.await.expect("task");
    }
    let elapsed = start.elapsed();
    let _ = connection.close(200, "done".into()).await;
    elapsed
}

/// Raw lapin: one task sends `BATCH` messages, then awaits their confirms, and again.
async fn raw_batches(queue: &str, n: u64) -> Duration {
    let (connection, channel) = raw_channel().await;
    let start = Instant::now();
    let mut i = 0;
    while i < n {
        let mut confirms = Vec::with_capacity(BATCH);
        for _ in 0..BATCH.min((n - i) as usize) {
            confirms.push(raw_publish(&channel, queue, i).await);
            i += 1;
        }
        for confirm in confirms {
            assert!(matches!(
                confirm.await.expect("confirm"),
                Confirmation::Ack(None)
            ));
        }
    }
    let elapsed = start.elapsed();
    let _ = connection.close(200, "done".into()).await;
    elapsed
}

fn message(i: u64) -> Message {
    Message::builder()
        .content_type("application/json")
        .payload(payload(i))
}

/// Conveyor: `TASKS` tasks share one publisher: the broker itself, or a `LapinPublisher`
/// of its own.
async fn conveyor_tasks<P>(publisher: P, queue: &str, n: u64) -> Duration
where
    P: Publisher + Clone + Send + Sync + 'static,
{
    let next = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let (publisher, next, queue) = (publisher.clone(), next.clone(), queue.to_string());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    return;
                }
                publisher
                    .publish(&queue, message(i))
                    .await
                    .expect("publish");
            }
        }));
    }
    for task in tasks {
        task.await.expect("task");
    }
    start.elapsed()
}

/// Conveyor: `TASKS` tasks share one `LapinPublisher` whose messages are not mandatory
/// (an unroutable one is dropped instead of returned): what the mandatory flag costs.
async fn conveyor_tasks_not_mandatory(broker: &LapinBroker, queue: &str, n: u64) -> Duration {
    let publisher = broker
        .publisher()
        .await
        .expect("publisher")
        .with_defaults(PublishOptions::default().mandatory(false));
    conveyor_tasks(publisher, queue, n).await
}

/// Conveyor: `publish_batch` of `BATCH` messages at a time.
async fn conveyor_batches(broker: &LapinBroker, queue: &str, n: u64) -> Duration {
    let start = Instant::now();
    let mut i = 0;
    while i < n {
        let batch: Vec<Message> = (i..(i + BATCH as u64).min(n)).map(message).collect();
        i += batch.len() as u64;
        broker.publish_batch(queue, batch).await.expect("publish");
    }
    start.elapsed()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

const MODES: [&str; 5] = [
    "raw 64 tasks",
    "conveyor 64 tasks",
    "raw batches",
    "conveyor batches",
    "conveyor 64 tasks, not mandatory",
];

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n = conveyor_benches::env_or("PUBLISH_BENCH_MESSAGES", 20_000);
    let rounds = conveyor_benches::env_or("PUBLISH_BENCH_ROUNDS", 3);
    let broker = LapinBroker::connect(URL)
        .await
        .expect("RabbitMQ on 127.0.0.1:5672");
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); MODES.len()];
    for round in 0..rounds {
        for (m, mode) in MODES.iter().enumerate() {
            let queue = format!("conveyor-bench-publish.{}.{round}.{m}", std::process::id());
            broker
                .declare_queue(&QueueSpec::new(queue.as_str()))
                .await
                .expect("declare");
            let run = {
                let (broker, queue) = (broker.clone(), queue.clone());
                async move {
                    match m {
                        0 => raw_tasks(&queue, n).await,
                        1 => conveyor_tasks(broker.clone(), &queue, n).await,
                        2 => raw_batches(&queue, n).await,
                        3 => conveyor_batches(&broker, &queue, n).await,
                        _ => conveyor_tasks_not_mandatory(&broker, &queue, n).await,
                    }
                }
            };
            let elapsed = tokio::spawn(run).await.expect("the run");
            let rate = n as f64 / elapsed.as_secs_f64();
            println!("round {round} {mode:>32}: {n} in {elapsed:?} = {rate:.0} msg/s");
            rates[m].push(rate);
            let _ = broker.delete_queue(&queue).await;
        }
    }
    let medians: Vec<f64> = rates.into_iter().map(median).collect();
    println!(
        "median 64 tasks on one publisher: raw {:.0}, conveyor {:.0} msg/s ({:+.1}% vs raw)",
        medians[0],
        medians[1],
        (medians[1] / medians[0] - 1.0) * 100.0
    );
    println!(
        "median batches of {BATCH}: raw {:.0}, conveyor {:.0} msg/s ({:+.1}% vs raw)",
        medians[2],
        medians[3],
        (medians[3] / medians[2] - 1.0) * 100.0
    );
    println!(
        "median 64 tasks, conveyor not mandatory: {:.0} msg/s ({:+.1}% vs mandatory)",
        medians[4],
        (medians[4] / medians[1] - 1.0) * 100.0
    );
}
