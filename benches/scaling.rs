//! Scaling past the hash (issue 9's P4): a handler that awaits 10 ms of I/O, 64 partition
//! keys drawn at random, and how many times the sequential mount's throughput each keyed
//! mode reaches with 16 workers: lanes (`workers(16).by_key()`, a key's lane fixed by a
//! hash) and any-worker (`workers(16).by_key().any_worker()`, a key on whichever worker is
//! free). Every run checks that each key's messages were handled in the order published,
//! one at a time, and fails loudly if not.
//!
//! Run: `scripts/services/rabbitmq.sh && cargo bench -p conveyor-benches --bench scaling`
//! (`SCALING_BENCH_TRANSPORTS=memory` runs only the in-process transport;
//! `SCALING_BENCH_MESSAGES` (default 4,000) sizes the keyed runs and
//! `SCALING_BENCH_SEQUENTIAL` (default 200) the sequential one; `SCALING_BENCH_ROUNDS`
//! (default 3) interleaves the modes that many times and reports medians;
//! `SCALING_BENCH_KEYS=round-robin` publishes the keys in turn instead of at random, the
//! pattern under which each lane gets exactly its keys' share).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use conveyor::{
    App, Broker, Dispatch, Identity, Json, MemoryBroker, Message, MountOptions, QueueSpec, State,
    mode,
};
use conveyor_lapin::LapinBroker;
use tokio::sync::Notify;

const URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
const KEYS: u64 = 64;
const WORKERS: usize = 16;
const IO: Duration = Duration::from_millis(10);

#[derive(serde::Serialize, serde::Deserialize)]
struct Step {
    key: u64,
    /// This message's place among its key's messages.
    seq: u64,
}

/// What the handler saw: how many ran, and whether any key ran out of order or twice at
/// once.
#[derive(Clone)]
struct Tally {
    done: Arc<AtomicU64>,
    target: u64,
    all: Arc<Notify>,
    /// Per key: the next `seq` expected, and whether one of its messages is running.
    keys: Arc<Mutex<HashMap<u64, (u64, bool)>>>,
    broken: Arc<AtomicU64>,
}

impl Tally {
    fn new(target: u64) -> Self {
        Tally {
            done: Arc::default(),
            target,
            all: Arc::default(),
            keys: Arc::default(),
            broken: Arc::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, (u64, bool)>> {
        self.keys
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

async fn handle(Json(step): Json<Step>, State(tally): State<Tally>) {
    {
        let mut keys = tally.lock();
        let (next, running) = keys.entry(step.key).or_insert((0, false));
        if *running || *next != step.seq {
            tally.broken.fetch_add(1, Ordering::Relaxed);
        }
        *running = true;
    }
    tokio::time::sleep(IO).await;
    {
        let mut keys = tally.lock();
        let (next, running) = keys.entry(step.key).or_insert((0, false));
        *next = step.seq + 1;
        *running = false;
    }
    if tally.done.fetch_add(1, Ordering::Relaxed) + 1 == tally.target {
        tally.all.notify_one();
    }
}

/// A small deterministic generator: every run publishes the same keys in the same order.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

async fn fill<B: Broker>(broker: &B, queue: &str, n: u64) {
    broker
        .declare_queue(&QueueSpec::new(queue))
        .await
        .expect("declare");
    let round_robin = std::env::var("SCALING_BENCH_KEYS").is_ok_and(|keys| keys == "round-robin");
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    let mut next = [0u64; KEYS as usize];
    let messages: Vec<Message> = (0..n)
        .map(|i| {
            let key = if round_robin {
                i % KEYS
            } else {
                rng.next() % KEYS
            };
            let seq = next[key as usize];
            next[key as usize] += 1;
            Message::builder()
                .partition_key(format!("customer-{key}"))
                .json(&Step { key, seq })
                .expect("json")
        })
        .collect();
    for chunk in messages.chunks(500) {
        broker
            .publish_batch(queue, chunk.to_vec())
            .await
            .expect("publish");
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Sequential,
    Lanes,
    AnyWorker,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Sequential => "sequential",
            Mode::Lanes => "workers(16).by_key()",
            Mode::AnyWorker => "workers(16).by_key().any_worker()",
        }
    }

    fn configure(self, m: MountOptions) -> MountOptions<Identity, mode::Chosen> {
        m.with_dispatch(match self {
            Mode::Sequential => Dispatch::Sequential,
            Mode::Lanes => Dispatch::Lanes(WORKERS),
            Mode::AnyWorker => Dispatch::AnyWorker {
                workers: WORKERS,
                read_ahead: WORKERS * conveyor::dispatch::DEFAULT_READ_AHEAD_PER_WORKER,
            },
        })
    }
}

/// Publishes `n` messages, then runs the mode until every one is handled: msg/s.
async fn run<B: Broker>(broker: &B, queue: &str, mode: Mode, n: u64) -> f64 {
    fill(broker, queue, n).await;
    let tally = Tally::new(n);
    let start = Instant::now();
    let running = App::new("scaling")
        .with_state(tally.clone())
        .mount(broker.queue(queue), handle, move |m| mode.configure(m))
        .start()
        .await
        .expect("start");
    tally.all.notified().await;
    let elapsed = start.elapsed();
    running.shutdown().await.expect("shutdown");
    let broken = tally.broken.load(Ordering::Relaxed);
    assert_eq!(
        broken,
        0,
        "{}: {broken} messages out of key order",
        mode.name()
    );
    n as f64 / elapsed.as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

async fn bench<B: Broker>(transport: &str, broker: B) {
    let n = conveyor_benches::env_or("SCALING_BENCH_MESSAGES", 4_000);
    let n_sequential = conveyor_benches::env_or("SCALING_BENCH_SEQUENTIAL", 200);
    let rounds = conveyor_benches::env_or("SCALING_BENCH_ROUNDS", 3);
    let modes = [Mode::Sequential, Mode::Lanes, Mode::AnyWorker];
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); modes.len()];
    for round in 0..rounds {
        for (i, &mode) in modes.iter().enumerate() {
            let queue = format!("conveyor-bench.scaling.{}.{round}.{i}", std::process::id());
            let count = if mode == Mode::Sequential {
                n_sequential
            } else {
                n
            };
            let rate = run(&broker, &queue, mode, count).await;
            println!(
                "{transport} round {round} {:<34}: {count} messages, {rate:.0} msg/s",
                mode.name()
            );
            rates[i].push(rate);
            let _ = broker.delete_queue(&queue).await;
        }
    }
    let medians: Vec<f64> = rates.into_iter().map(median).collect();
    for (mode, rate) in modes.iter().zip(&medians) {
        println!(
            "{transport} median {:<34}: {rate:.0} msg/s, {:.1}x sequential",
            mode.name(),
            rate / medians[0]
        );
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let transports =
        std::env::var("SCALING_BENCH_TRANSPORTS").unwrap_or_else(|_| "memory,rabbitmq".to_string());
    for transport in transports.split(',').map(str::trim) {
        match transport {
            "memory" => bench(transport, MemoryBroker::new()).await,
            "rabbitmq" => {
                let broker = LapinBroker::connect(URL)
                    .await
                    .expect("RabbitMQ on 127.0.0.1:5672");
                bench(transport, broker).await;
            }
            other => panic!("unknown transport {other}: memory or rabbitmq"),
        }
    }
}
