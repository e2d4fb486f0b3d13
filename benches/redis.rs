//! Consume throughput on a live Redis (127.0.0.1:6379): Conveyor's subscriber and
//! dispatch against a raw redis-rs loop doing the same work (512-byte JSON messages
//! decoded, each acknowledged and deleted), on the same server, the same client crate
//! and the same consumer group, in the same run.
//!
//! A queue is a stream of its name read through the consumer group `conveyor`, as
//! conveyor-redis makes them, each reader a consumer of its own in it. Conveyor reads up
//! to what the mount can hold; the raw loop reads batches of that same size (the `COUNT`
//! of its `XREADGROUP`), found before the timed rounds from the settings a short
//! Conveyor run of each mode hands conveyor-redis at subscription (its
//! `SubscribeSettings`, recorded by a source that wraps the queue), through
//! conveyor-redis's own rule (`COUNT` = the batch size, else `max_in_flight`), so that
//! neither side reads further ahead than the other. Both settle as conveyor-redis does:
//! `XACK` then `XDEL` of a batch's ids, in one pipelined round trip; the raw loop sends
//! them in the same pipeline as its next `XREADGROUP`, as a hand-written loop would, so
//! that a batch costs it one round trip.
//!
//! The raw loop does only that: no claiming of lapsed entries and no delayed retries,
//! which Conveyor's sweeps check for (a script call and an `XPENDING`, every 100 ms);
//! that is part of what the comparison measures. It takes each reply as redis-rs's
//! `StreamReadReply`, the type its own `xread_options` returns, which copies the reply
//! before parsing it and puts each entry's fields in a map; conveyor-redis decodes the
//! reply in place (`fields.rs`). BENCHMARKS.md counts what that difference is worth.
//!
//! The orders, Conveyor's run and the rounds are the harness it shares with the `nats`
//! bench (`pairs.rs`).
//!
//! Run: `scripts/services/redis.sh && cargo bench -p conveyor-benches --bench redis`
//! (`REDIS_BENCH_MESSAGES` and `REDIS_BENCH_ROUNDS` change the size;
//! `REDIS_BENCH_MODES=lanes`, say, runs only the modes listed, comma-separated, of
//! `raw-sequential`, `sequential`, `raw-lanes` and `lanes`; `REDIS_BENCH_LINGER_US` sets
//! the broker's settle linger, to see what it costs).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use conveyor::asyncapi::QueueDescription;
use conveyor::{Broker, Error, SharedPublisher, Source, SubscribeSettings};
use conveyor_redis::{GROUP, RedisBroker, RedisQueue, RedisSubscriber};
use redis::AsyncConnectionConfig;
use redis::aio::MultiplexedConnection;
use redis::streams::StreamReadReply;

#[path = "pairs.rs"]
mod pairs;
use pairs::{LANES, Order, conveyor_run, fill};

const URL: &str = "redis://127.0.0.1:6379";
/// RedisBroker's defaults, which the raw loop's reads take too: how long a read blocks
/// on an empty stream, and what its connection waits for an answer beyond that.
const FETCH_WAIT: Duration = Duration::from_secs(5);
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(10);
/// Adds `XACK` and `XDEL` of `ids` to `pipe`, as conveyor-redis settles acks.
fn settle(pipe: &mut redis::Pipeline, queue: &str, ids: &[String]) {
    if ids.is_empty() {
        return;
    }
    pipe.cmd("XACK").arg(queue).arg(GROUP).arg(ids).ignore();
    pipe.cmd("XDEL").arg(queue).arg(ids).ignore();
}

/// A hand-written consumer on redis-rs: reads of `count` entries through the group
/// `conveyor`, each payload decoded, a batch's acks (`XACK` and `XDEL`) pipelined with the
/// next read. The clock runs from connecting (and making the group, as a subscription
/// does) to the last message's decoding; the last acks go out after it, as Conveyor's
/// last settlement does after its handler's last call.
async fn raw_loop(queue: &str, n: u64, count: usize) -> Duration {
    let client = redis::Client::open(URL).expect("Redis URL");
    // As conveyor-redis's read connection: answers may take the fetch wait and more.
    let config = AsyncConnectionConfig::new()
        .set_response_timeout(Some(FETCH_WAIT.saturating_add(RESPONSE_TIMEOUT)));
    let start = Instant::now();
    let mut connection: MultiplexedConnection = client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .expect("connect");
    let made: redis::RedisResult<()> = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(queue)
        .arg(GROUP)
        .arg("0")
        .arg("MKSTREAM")
        .query_async(&mut connection)
        .await;
    if let Err(e) = made {
        assert_eq!(e.code(), Some("BUSYGROUP"), "XGROUP CREATE: {e}");
    }
    let consumer = format!("raw-{}", std::process::id());
    let block_ms = u64::try_from(FETCH_WAIT.as_millis()).expect("a fetch wait");
    let mut read_ids: Vec<String> = Vec::with_capacity(count);
    let mut done = 0;
    loop {
        let mut pipe = redis::pipe();
        settle(&mut pipe, queue, &read_ids);
        pipe.cmd("XREADGROUP")
            .arg("GROUP")
            .arg(GROUP)
            .arg(&consumer)
            .arg("COUNT")
            .arg(count)
            .arg("BLOCK")
            .arg(block_ms)
            .arg("STREAMS")
            .arg(queue)
            .arg(">");
        let (read,): (Option<StreamReadReply>,) =
            pipe.query_async(&mut connection).await.expect("XREADGROUP");
        read_ids.clear();
        for entry in read.into_iter().flat_map(|r| r.keys).flat_map(|k| k.ids) {
            let Some(redis::Value::BulkString(payload)) = entry.map.get("payload") else {
                panic!("entry {} has no payload", entry.id);
            };
            let order: Order = serde_json::from_slice(payload).expect("decode");
            std::hint::black_box(order);
            read_ids.push(entry.id);
            done += 1;
        }
        if done >= n {
            let elapsed = start.elapsed();
            let mut pipe = redis::pipe();
            settle(&mut pipe, queue, &read_ids);
            pipe.query_async::<()>(&mut connection)
                .await
                .expect("XACK, XDEL");
            return elapsed;
        }
    }
}

/// A Redis queue that records the settings Conveyor subscribes it with, and is
/// otherwise the queue itself.
struct Watched {
    queue: RedisQueue,
    seen: Arc<Mutex<Option<SubscribeSettings>>>,
}

impl Source for Watched {
    type Subscriber = RedisSubscriber;

    fn queue_name(&self) -> &str {
        self.queue.queue_name()
    }

    fn messaging_system(&self) -> &'static str {
        self.queue.messaging_system()
    }

    fn describe(&self, queue: &str) -> QueueDescription {
        self.queue.describe(queue)
    }

    fn publisher(&self) -> Option<SharedPublisher> {
        self.queue.publisher()
    }

    async fn subscribe(self, settings: SubscribeSettings) -> Result<RedisSubscriber, Error> {
        *self.seen.lock().expect("the settings") = Some(settings.clone());
        self.queue.subscribe(settings).await
    }
}

/// The `COUNT` of every `XREADGROUP` a Conveyor mount of this mode issues: a short run
/// of it (untimed) on a queue of its own records the settings it subscribes with, and
/// conveyor-redis's rule (`RedisQueue::subscribe`: the batch size if any, else
/// `max_in_flight`, at least 1) turns them into its read count. It is the raw loop's
/// read count for that mode.
async fn conveyor_read_count(broker: &RedisBroker, lanes: bool) -> usize {
    let queue = format!(
        "conveyor-bench.{}.read-count.{}",
        std::process::id(),
        if lanes { "lanes" } else { "sequential" }
    );
    fill(broker, &queue, 200).await;
    let seen = Arc::new(Mutex::new(None));
    let source = Watched {
        queue: broker.queue(&queue),
        seen: seen.clone(),
    };
    tokio::spawn(conveyor_run(source, 200, lanes))
        .await
        .expect("the run");
    let _ = broker.delete_queue(&queue).await;
    let settings = seen
        .lock()
        .expect("the settings")
        .take()
        .expect("no subscription seen");
    settings
        .batch_size
        .map_or(settings.max_in_flight.max(1), |size| size.max(1))
        .max(1)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n = conveyor_benches::env_or("REDIS_BENCH_MESSAGES", 20_000);
    let rounds = conveyor_benches::env_or("REDIS_BENCH_ROUNDS", 3);
    let mut builder = RedisBroker::builder().url(URL);
    // A diagnostic: how long Conveyor's settlements wait to share a round trip (the
    // broker's default, none, unless set).
    if let Ok(micros) = std::env::var("REDIS_BENCH_LINGER_US") {
        let micros = micros.parse().expect("REDIS_BENCH_LINGER_US: microseconds");
        builder = builder.settle_linger(Duration::from_micros(micros));
        println!("settle linger: {micros} µs");
    }
    let broker = builder.build().await.expect("Redis on 127.0.0.1:6379");
    let sequential_count = conveyor_read_count(&broker, false).await;
    let lanes_count = conveyor_read_count(&broker, true).await;
    println!(
        "XREADGROUP COUNT (Conveyor's, the raw loop's too): sequential {sequential_count}, \
         workers({LANES}).by_key() {lanes_count}"
    );
    let medians = pairs::rounds(&broker, "REDIS", n, rounds, move |broker, queue, mode| {
        let count = if mode.lanes {
            lanes_count
        } else {
            sequential_count
        };
        async move {
            if mode.raw {
                raw_loop(&queue, n, count).await
            } else {
                conveyor_run(broker.queue(&queue), n, mode.lanes).await
            }
        }
    })
    .await;
    pairs::report(
        medians,
        "raw redis-rs loop, count",
        [sequential_count, lanes_count],
    );
}
