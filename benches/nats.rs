//! Consume throughput on a live NATS server with JetStream (127.0.0.1:4222): Conveyor's
//! subscriber and dispatch against a raw async-nats loop doing the same work (512-byte
//! JSON messages decoded, one ack per message), on the same server, the same client
//! connection and the same durable consumer, in the same run.
//!
//! A queue is a work-queue stream read through the durable pull consumer `conveyor`, as
//! conveyor-nats makes them. Conveyor fetches up to what the mount can hold; the raw loop
//! fetches batches of that same size, found before the timed rounds by watching the pull
//! requests a short Conveyor run of each mode sends
//! (`$JS.API.CONSUMER.MSG.NEXT.<stream>.conveyor`, their `batch`), so that neither side
//! reads further ahead than the other. Both ack as conveyor-nats does: a plain publish to
//! the message's reply subject (async-nats's `Message::ack`), flushed once per fetched
//! batch.
//!
//! Every measured run, the raw loop included, runs in a task spawned on the runtime's
//! worker threads, as the framework's dispatch does, never on the thread that blocks on
//! the runtime, which would handicap the baseline.
//!
//! Run: `scripts/services/nats.sh && cargo bench -p conveyor-benches --bench nats`
//! (`NATS_BENCH_MESSAGES` and `NATS_BENCH_ROUNDS` change the size; `NATS_BENCH_MODES=lanes`,
//! say, runs only the modes listed, comma-separated, of `raw-sequential`, `sequential`,
//! `raw-lanes` and `lanes`; `NATS_BENCH_LINGER_US` sets the broker's settle linger, to
//! see what it costs).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer::AckPolicy, consumer::PullConsumer, consumer::pull};
use conveyor::{App, Broker, Dispatch, Json, Message, Publisher, QueueSpec, State};
use conveyor_nats::{DEFAULT_CONSUMER, NatsBroker};
use futures_util::StreamExt;
use tokio::sync::Notify;

const URL: &str = "nats://127.0.0.1:4222";
/// NatsBroker's defaults, which the raw loop's consumer and fetches take too.
const ACK_WAIT: Duration = Duration::from_secs(30);
const FETCH_WAIT: Duration = Duration::from_secs(5);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The lanes mode: `workers(4).by_key()`.
const LANES: usize = 4;

#[derive(serde::Serialize, serde::Deserialize)]
struct Order {
    id: u64,
    item: String,
    quantity: u32,
    /// Fills each message to about 512 bytes of JSON.
    note: String,
}

/// The stream of queue `name`, as conveyor-nats names it.
fn stream_name(queue: &str) -> String {
    queue.replace('.', "~")
}

/// The durable consumer as conveyor-nats declares it (`admin::consumer_config`).
fn consumer_config() -> pull::Config {
    pull::Config {
        durable_name: Some(DEFAULT_CONSUMER.to_string()),
        ack_policy: AckPolicy::Explicit,
        ack_wait: ACK_WAIT,
        max_deliver: -1,
        max_ack_pending: -1,
        ..Default::default()
    }
}

/// Declares `queue` (its stream and durable consumer) and publishes `n` orders to it,
/// each acknowledged by JetStream, before any run starts its clock.
async fn fill(broker: &NatsBroker, queue: &str, n: u64) {
    broker
        .declare_queue(&QueueSpec::new(queue))
        .await
        .expect("declare");
    let mut id = 0;
    while id < n {
        let chunk = (id..(id + 1000).min(n))
            .map(|i| {
                Message::builder()
                    .partition_key(format!("customer-{}", i % 64))
                    .json(&Order {
                        id: i,
                        item: "tea".into(),
                        quantity: 3,
                        note: "n".repeat(460),
                    })
                    .expect("json")
            })
            .collect();
        broker.publish_batch(queue, chunk).await.expect("publish");
        id = (id + 1000).min(n);
    }
}

/// A hand-written consumer on the broker's own client: fetches of `fetch` messages, each
/// decoded and acked with a plain publish to its reply subject, the acks flushed once
/// per batch. The clock runs from opening the consumer to the last message's ack.
async fn raw_loop(broker: &NatsBroker, queue: &str, n: u64, fetch: usize) -> Duration {
    let client = broker.client().clone();
    let jetstream = jetstream::ContextBuilder::new()
        .timeout(REQUEST_TIMEOUT)
        .build(client.clone());
    let start = Instant::now();
    let consumer: PullConsumer = jetstream
        .get_stream(stream_name(queue))
        .await
        .expect("stream")
        .get_or_create_consumer(DEFAULT_CONSUMER, consumer_config())
        .await
        .expect("consumer");
    let mut done = 0;
    loop {
        let mut batch = consumer
            .fetch()
            .max_messages(fetch)
            .expires(FETCH_WAIT)
            .messages()
            .await
            .expect("fetch");
        while let Some(message) = batch.next().await {
            let message = message.expect("message");
            let order: Order = serde_json::from_slice(&message.payload).expect("decode");
            std::hint::black_box(order);
            // A plain publish of an empty body to the reply subject, as conveyor-nats's
            // `+ACK`; not the awaited `double_ack`.
            message.ack().await.expect("ack");
            done += 1;
        }
        if done >= n {
            let elapsed = start.elapsed();
            client.flush().await.expect("flush");
            return elapsed;
        }
        client.flush().await.expect("flush");
    }
}

#[derive(Clone)]
struct Counter {
    done: Arc<AtomicU64>,
    target: u64,
    all: Arc<Notify>,
}

async fn handle(Json(order): Json<Order>, State(counter): State<Counter>) {
    std::hint::black_box(order);
    if counter.done.fetch_add(1, Ordering::Relaxed) + 1 == counter.target {
        counter.all.notify_one();
    }
}

fn dispatch(lanes: bool) -> Dispatch {
    if lanes {
        Dispatch::Lanes(LANES)
    } else {
        Dispatch::Sequential
    }
}

/// Conveyor on `queue` until its handler has seen `n` messages. The clock runs from
/// `App::start` (which opens the subscription: stream and consumer looked up or made)
/// to the handler's `n`th call; the shutdown after it is not counted.
async fn conveyor_run(broker: &NatsBroker, queue: &str, n: u64, lanes: bool) -> Duration {
    let counter = Counter {
        done: Arc::default(),
        target: n,
        all: Arc::default(),
    };
    let start = Instant::now();
    let running = App::new("bench")
        .with_state(counter.clone())
        .mount(broker.queue(queue), handle, move |m| {
            m.with_dispatch(dispatch(lanes))
        })
        .start()
        .await
        .expect("start");
    counter.all.notified().await;
    let elapsed = start.elapsed();
    running.shutdown().await.expect("shutdown");
    elapsed
}

/// The largest fetch a Conveyor mount of this mode asks for: a short run of it (untimed)
/// on a queue of its own, its pull requests read off the wire by a second connection.
/// It is the raw loop's fetch size for that mode.
async fn conveyor_fetch_size(broker: &NatsBroker, lanes: bool) -> usize {
    let queue = format!(
        "conveyor-bench.{}.fetch-size.{}",
        std::process::id(),
        if lanes { "lanes" } else { "sequential" }
    );
    fill(broker, &queue, 200).await;
    let watcher = async_nats::connect(URL).await.expect("second connection");
    let mut requests = watcher
        .subscribe(format!(
            "$JS.API.CONSUMER.MSG.NEXT.{}.{DEFAULT_CONSUMER}",
            stream_name(&queue)
        ))
        .await
        .expect("subscribe");
    watcher.flush().await.expect("flush");
    let run = {
        let (broker, queue) = (broker.clone(), queue.clone());
        async move { conveyor_run(&broker, &queue, 200, lanes).await }
    };
    tokio::spawn(run).await.expect("the run");
    // Every pull request went out before the run's last delivery; each is a message to
    // the watcher, so the subscription holds them all once a flush has made the round
    // trip. Read what is there, with a deadline for each.
    watcher.flush().await.expect("flush");
    let mut largest = 0;
    while let Ok(Some(request)) =
        tokio::time::timeout(Duration::from_millis(200), requests.next()).await
    {
        let body: serde_json::Value =
            serde_json::from_slice(&request.payload).expect("a pull request's JSON");
        let batch = body["batch"].as_u64().expect("a pull request's batch");
        largest = largest.max(usize::try_from(batch).expect("a batch size"));
    }
    let _ = broker.delete_queue(&queue).await;
    assert!(largest > 0, "no pull request seen on {queue}");
    largest
}

fn rate(n: u64, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n = conveyor_benches::env_or("NATS_BENCH_MESSAGES", 20_000);
    let rounds = conveyor_benches::env_or("NATS_BENCH_ROUNDS", 3);
    let modes = std::env::var("NATS_BENCH_MODES")
        .unwrap_or_else(|_| "raw-sequential,sequential,raw-lanes,lanes".to_string());
    let wanted = |mode: &str| modes.split(',').any(|m| m.trim() == mode);
    let mut builder = NatsBroker::builder().url(URL);
    // A diagnostic: how long Conveyor's settlements wait to share a flush (the broker's
    // default, 5 ms, unless set).
    if let Ok(micros) = std::env::var("NATS_BENCH_LINGER_US") {
        let micros = micros.parse().expect("NATS_BENCH_LINGER_US: microseconds");
        builder = builder.settle_linger(Duration::from_micros(micros));
        println!("settle linger: {micros} µs");
    }
    let broker = builder
        .build()
        .await
        .expect("NATS with JetStream on 127.0.0.1:4222");
    let sequential_fetch = conveyor_fetch_size(&broker, false).await;
    let lanes_fetch = conveyor_fetch_size(&broker, true).await;
    println!(
        "fetch size (Conveyor's, the raw loop's too): sequential {sequential_fetch}, \
         workers({LANES}).by_key() {lanes_fetch}"
    );
    let all = ["raw-sequential", "sequential", "raw-lanes", "lanes"];
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); all.len()];
    for round in 0..rounds {
        for (index, mode) in all.into_iter().enumerate() {
            if !wanted(mode) {
                continue;
            }
            let queue = format!("conveyor-bench.{}.{round}.{mode}", std::process::id());
            fill(&broker, &queue, n).await;
            let run = {
                let (broker, queue) = (broker.clone(), queue.clone());
                async move {
                    match mode {
                        "raw-sequential" => raw_loop(&broker, &queue, n, sequential_fetch).await,
                        "sequential" => conveyor_run(&broker, &queue, n, false).await,
                        "raw-lanes" => raw_loop(&broker, &queue, n, lanes_fetch).await,
                        _ => conveyor_run(&broker, &queue, n, true).await,
                    }
                }
            };
            let elapsed = tokio::spawn(run).await.expect("the run");
            let r = rate(n, elapsed);
            println!("round {round} {mode:>14}: {n} messages in {elapsed:?} = {r:.0} msg/s");
            rates[index].push(r);
            let _ = broker.delete_queue(&queue).await;
        }
    }
    let medians: Vec<Option<f64>> = rates
        .into_iter()
        .map(|v| (!v.is_empty()).then(|| median(v)))
        .collect();
    for (pair, (raw, ours)) in [("sequential", (0, 1)), ("workers(4).by_key()", (2, 3))] {
        let fetch = if raw == 0 {
            sequential_fetch
        } else {
            lanes_fetch
        };
        if let Some(raw) = medians[raw] {
            println!("median raw async-nats loop, fetch {fetch:>3}: {raw:.0} msg/s");
            if let Some(ours) = medians[ours] {
                println!(
                    "median conveyor {pair:<20}: {ours:.0} msg/s ({:.2}x raw)",
                    ours / raw
                );
            }
        } else if let Some(ours) = medians[ours] {
            println!("median conveyor {pair:<20}: {ours:.0} msg/s");
        }
    }
}
