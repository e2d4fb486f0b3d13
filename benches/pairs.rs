//! What the broker benches that set Conveyor beside a raw client loop share (`nats`,
//! `redis`, and `rabbitmq` for its orders and Conveyor's run): the orders they fill a queue with, Conveyor's timed run, and the rounds of
//! the four modes with their medians. Each bench brings its raw loop and what it reads
//! ahead; this module is included by path (`#[path = "pairs.rs"] mod pairs;`), apart
//! from `lib.rs`, whose code the `dispatch --observe` counts depend on.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use conveyor::{App, Broker, Dispatch, Json, Message, QueueSpec, Source, State};
use tokio::sync::Notify;

/// The lanes mode: `workers(4).by_key()`.
pub const LANES: usize = 4;

/// The modes of a round, in the order it runs them: each raw loop just before the
/// Conveyor mode it is the baseline of.
pub const MODES: [Mode; 4] = [
    Mode {
        name: "raw-sequential",
        raw: true,
        lanes: false,
    },
    Mode {
        name: "sequential",
        raw: false,
        lanes: false,
    },
    Mode {
        name: "raw-lanes",
        raw: true,
        lanes: true,
    },
    Mode {
        name: "lanes",
        raw: false,
        lanes: true,
    },
];

/// One mode of a round.
#[derive(Clone, Copy, Debug)]
pub struct Mode {
    /// As `<PREFIX>_BENCH_MODES` lists it.
    pub name: &'static str,
    /// The raw client's loop, not Conveyor.
    pub raw: bool,
    /// Conveyor's lanes mode, or the raw loop reading ahead as much as it.
    pub lanes: bool,
}

#[derive(serde::Serialize, serde::Deserialize)]
pub struct Order {
    id: u64,
    item: String,
    quantity: u32,
    /// Fills each message to about 512 bytes of JSON.
    note: String,
}

/// Declares `queue` and publishes `n` orders to it (64 partition keys), each batch
/// acknowledged by the broker, before any run starts its clock.
pub async fn fill<B: Broker>(broker: &B, queue: &str, n: u64) {
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

/// Conveyor on `source` until its handler has seen `n` messages. The clock runs from
/// `App::start` (which opens the subscription) to the handler's `n`th call; the
/// shutdown after it is not counted.
pub async fn conveyor_run(source: impl Source, n: u64, lanes: bool) -> Duration {
    let counter = Counter {
        done: Arc::default(),
        target: n,
        all: Arc::default(),
    };
    let dispatch = if lanes {
        Dispatch::Lanes(LANES)
    } else {
        Dispatch::Sequential
    };
    let start = Instant::now();
    let running = App::new("bench")
        .with_state(counter.clone())
        .mount(source, handle, move |m| m.with_dispatch(dispatch))
        .start()
        .await
        .expect("start");
    counter.all.notified().await;
    let elapsed = start.elapsed();
    running.shutdown().await.expect("shutdown");
    elapsed
}

/// Runs `rounds` rounds of the modes `<prefix>_BENCH_MODES` lists (all four by default),
/// each on a fresh queue of `n` orders, and returns each mode's median rate (msg/s), in
/// the order of [`MODES`]. `run` times one mode on its queue. Every run, the raw loop
/// included, runs in a task spawned on the runtime's worker threads, as the framework's
/// dispatch does, never on the thread that blocks on the runtime, which would handicap
/// the baseline.
pub async fn rounds<B, F, R>(
    broker: &B,
    prefix: &str,
    n: u64,
    rounds: u64,
    run: F,
) -> [Option<f64>; 4]
where
    B: Broker,
    F: Fn(B, String, Mode) -> R,
    R: Future<Output = Duration> + Send + 'static,
{
    let modes = std::env::var(format!("{prefix}_BENCH_MODES"))
        .unwrap_or_else(|_| "raw-sequential,sequential,raw-lanes,lanes".to_string());
    let wanted = |mode: &str| modes.split(',').any(|m| m.trim() == mode);
    let mut rates: [Vec<f64>; 4] = Default::default();
    for round in 0..rounds {
        for (index, mode) in MODES.into_iter().enumerate() {
            if !wanted(mode.name) {
                continue;
            }
            let queue = format!(
                "conveyor-bench.{}.{round}.{}",
                std::process::id(),
                mode.name
            );
            fill(broker, &queue, n).await;
            let elapsed = tokio::spawn(run(broker.clone(), queue.clone(), mode))
                .await
                .expect("the run");
            let rate = n as f64 / elapsed.as_secs_f64();
            println!(
                "round {round} {:>14}: {n} messages in {elapsed:?} = {rate:.0} msg/s",
                mode.name
            );
            rates[index].push(rate);
            let _ = broker.delete_queue(&queue).await;
        }
    }
    rates.map(median)
}

/// The median of `rates`; `None` for none.
pub fn median(mut rates: Vec<f64>) -> Option<f64> {
    rates.sort_by(f64::total_cmp);
    rates.get(rates.len() / 2).copied()
}

/// Prints the medians, each Conveyor mode against its raw loop: `raw` names the loop
/// and how far it reads ahead (`"raw async-nats loop, fetch"`), `ahead` is that for the
/// sequential and the lanes mode.
pub fn report(medians: [Option<f64>; 4], raw: &str, ahead: [usize; 2]) {
    for (pair, (raw_index, ours_index), ahead) in [
        ("sequential", (0, 1), ahead[0]),
        ("workers(4).by_key()", (2, 3), ahead[1]),
    ] {
        match (medians[raw_index], medians[ours_index]) {
            (Some(raw_rate), ours) => {
                println!("median {raw} {ahead:>3}: {raw_rate:.0} msg/s");
                if let Some(ours) = ours {
                    println!(
                        "median conveyor {pair:<20}: {ours:.0} msg/s ({:.2}x raw)",
                        ours / raw_rate
                    );
                }
            }
            (None, Some(ours)) => println!("median conveyor {pair:<20}: {ours:.0} msg/s"),
            (None, None) => {}
        }
    }
}
