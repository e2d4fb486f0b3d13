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
//! The raw loop fetches with async-nats's `fetch()`, its API for a batch, which makes a
//! fresh inbox for each (a subscribe and an unsubscribe around every pull request);
//! conveyor-nats sends its pull requests on one inbox a subscription keeps. With
//! `NATS_BENCH_RAW_INBOX=1` the raw loop does that too, by hand (the pull request's JSON
//! on the consumer's `$JS.API.CONSUMER.MSG.NEXT` subject): the baseline of a user who
//! writes JetStream's pull protocol themselves.
//!
//! The orders, Conveyor's run and the rounds are the harness it shares with the `redis`
//! bench (`pairs.rs`).
//!
//! Run: `scripts/services/nats.sh && cargo bench -p conveyor-benches --bench nats`
//! (`NATS_BENCH_MESSAGES` and `NATS_BENCH_ROUNDS` change the size; `NATS_BENCH_MODES=lanes`,
//! say, runs only the modes listed, comma-separated, of `raw-sequential`, `sequential`,
//! `raw-lanes` and `lanes`; `NATS_BENCH_LINGER_US` sets the broker's settle linger, to
//! see what it costs; `NATS_BENCH_RAW_INBOX=1`, above).

use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer::AckPolicy, consumer::PullConsumer, consumer::pull};
use conveyor::Broker;
use conveyor_nats::{DEFAULT_CONSUMER, NatsBroker};
use futures_util::StreamExt;

#[path = "pairs.rs"]
mod pairs;
use pairs::{LANES, Order, conveyor_run, fill};

const URL: &str = "nats://127.0.0.1:4222";
/// NatsBroker's defaults, which the raw loop's consumer and fetches take too.
const ACK_WAIT: Duration = Duration::from_secs(30);
const FETCH_WAIT: Duration = Duration::from_secs(5);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
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

/// A raw loop's start: the broker's client, and the queue's durable consumer looked up
/// as conveyor-nats declares it, the clock started before the lookup.
async fn raw_consumer(
    broker: &NatsBroker,
    queue: &str,
) -> (async_nats::Client, PullConsumer, Instant) {
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
    (client, consumer, start)
}

/// A raw loop's end of a batch: its acks flushed; the time to the last ack once all `n`
/// messages are done.
async fn flushed(
    client: &async_nats::Client,
    done: u64,
    n: u64,
    start: Instant,
) -> Option<Duration> {
    let elapsed = (done >= n).then(|| start.elapsed());
    client.flush().await.expect("flush");
    elapsed
}

/// A hand-written consumer on the broker's own client: fetches of `fetch` messages, each
/// decoded and acked with a plain publish to its reply subject, the acks flushed once
/// per batch. The clock runs from opening the consumer to the last message's ack.
async fn raw_loop(broker: &NatsBroker, queue: &str, n: u64, fetch: usize) -> Duration {
    let (client, consumer, start) = raw_consumer(broker, queue).await;
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
        if let Some(elapsed) = flushed(&client, done, n, start).await {
            return elapsed;
        }
    }
}

/// The raw loop with JetStream's pull protocol written by hand: one inbox subscribed for
/// the whole run, a pull request of `fetch` messages (`no_wait`, as `fetch()` sends it)
/// published to it each time, its answer read until `fetch` messages or the status that
/// ends it. Decoding, acks and flushes as [`raw_loop`].
async fn raw_inbox_loop(broker: &NatsBroker, queue: &str, n: u64, fetch: usize) -> Duration {
    let (client, consumer, start) = raw_consumer(broker, queue).await;
    let info = consumer.cached_info();
    let next = format!(
        "$JS.API.CONSUMER.MSG.NEXT.{}.{}",
        info.stream_name, info.name
    );
    let request = serde_json::json!({
        "batch": fetch,
        "expires": u64::try_from(FETCH_WAIT.as_nanos()).expect("nanoseconds"),
        "no_wait": true,
    });
    let request = conveyor::Bytes::from(request.to_string());
    let inbox = client.new_inbox();
    let mut answers = client.subscribe(inbox.clone()).await.expect("subscribe");
    let mut done = 0;
    loop {
        client
            .publish_with_reply(next.clone(), inbox.clone(), request.clone())
            .await
            .expect("pull request");
        for _ in 0..fetch {
            let message = answers.next().await.expect("an answer");
            if message
                .status
                .is_some_and(|status| status != async_nats::StatusCode::OK)
            {
                break;
            }
            let order: Order = serde_json::from_slice(&message.payload).expect("decode");
            std::hint::black_box(order);
            let reply = message.reply.expect("an ack subject");
            client
                .publish(reply, conveyor::Bytes::new())
                .await
                .expect("ack");
            done += 1;
        }
        if let Some(elapsed) = flushed(&client, done, n, start).await {
            return elapsed;
        }
    }
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
        async move { conveyor_run(broker.queue(&queue), 200, lanes).await }
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

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n = conveyor_benches::env_or("NATS_BENCH_MESSAGES", 20_000);
    let rounds = conveyor_benches::env_or("NATS_BENCH_ROUNDS", 3);
    let mut builder = NatsBroker::builder().url(URL);
    // A diagnostic: how long Conveyor's settlements wait to share a flush (the broker's
    // default, none, unless set).
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
    let one_inbox = std::env::var("NATS_BENCH_RAW_INBOX").is_ok_and(|set| set == "1");
    if one_inbox {
        println!("raw loops: pull requests on one inbox, by hand");
    }
    let medians = pairs::rounds(&broker, "NATS", n, rounds, move |broker, queue, mode| {
        let fetch = if mode.lanes {
            lanes_fetch
        } else {
            sequential_fetch
        };
        async move {
            if mode.raw && one_inbox {
                raw_inbox_loop(&broker, &queue, n, fetch).await
            } else if mode.raw {
                raw_loop(&broker, &queue, n, fetch).await
            } else {
                conveyor_run(broker.queue(&queue), n, mode.lanes).await
            }
        }
    })
    .await;
    pairs::report(
        medians,
        if one_inbox {
            "raw async-nats loop, one inbox, pull"
        } else {
            "raw async-nats loop, fetch"
        },
        [sequential_fetch, lanes_fetch],
    );
}
