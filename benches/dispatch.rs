//! Per-delivery cost of Conveyor's core on the in-process transport (`MemoryBroker`).
//!
//! Each run publishes `warmup + messages` messages before the app starts, so publishing
//! is not measured, except in the `end-to-end` mode, which publishes each message while
//! the app runs and so counts encoding and publishing too. The handler counts what it has handled: once the warm-up messages
//! are done (hash maps, queues and channel blocks have grown) it opens the measurement
//! window, and after `messages` more it closes it. The window counts heap allocations
//! (a counting global allocator), wall-clock time, and, under callgrind, instructions:
//! `window_open` and `window_close` are the functions to give to `--zero-before` and
//! `--dump-before` (see `scripts/bench-core.sh`).
//!
//! ```text
//! cargo bench -p conveyor-benches --bench dispatch            # the table, every mode
//! cargo bench -p conveyor-benches --bench dispatch -- --mode lanes --messages 20000 \
//!     --runtime current --trace 3                              # one run, 3 backtraces
//! ```
//!
//! Without `--bench` (as `cargo test --all-targets` runs it) the defaults shrink to a
//! quick smoke run of every mode.

use std::error::Error;
use std::hint::black_box;
use std::str::FromStr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use conveyor::{App, Batch, Bytes, Json, MemoryBroker, Message, PartitionKey, Publisher};
use conveyor_benches::{Allocations, CountingAlloc, start_counting, stop_counting};
use serde::{Deserialize, Serialize};
use tokio::runtime::{Builder, Runtime};
use tokio::sync::Notify;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

const USAGE: &str = "usage: dispatch [--mode sequential|bytes|keyed|workers|lanes|any-worker|batch|end-to-end] \
[--messages N] [--warmup N] [--runtime current|multi] [--repeat N] [--trace N] [--observe]";

/// A small payload whose decoded form allocates nothing.
#[derive(Serialize, Deserialize)]
struct Order {
    id: u64,
    qty: u32,
    price_cents: u64,
}

/// What is measured: a handler and its mount settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Sequential dispatch, `Json<Order>`.
    Sequential,
    /// Sequential dispatch, raw `Bytes`, no codec.
    Bytes,
    /// Sequential dispatch, `Json<Order>`, the 64 partition keys the keyed modes read:
    /// what lanes and any-worker are compared with.
    Keyed,
    /// `workers(4)`, `Json<Order>`.
    Workers,
    /// `workers(4).by_key()`, `Json<Order>`, 64 partition keys.
    Lanes,
    /// `workers(4).by_key().any_worker()`, `Json<Order>`, 64 partition keys.
    AnyWorker,
    /// `batch(10)`, `Batch<Json<Order>>`.
    Batch,
    /// Sequential `Json<Order>`, with publishing in the window: each message is encoded
    /// and published while the app runs, then consumed, decoded and acked. Read it on the
    /// current-thread runtime: on the multi-thread one the publisher runs ahead, and much
    /// of its work falls before the window opens.
    EndToEnd,
}

impl Mode {
    const ALL: [Mode; 8] = [
        Mode::Sequential,
        Mode::Bytes,
        Mode::Keyed,
        Mode::Workers,
        Mode::Lanes,
        Mode::AnyWorker,
        Mode::Batch,
        Mode::EndToEnd,
    ];

    fn name(self) -> &'static str {
        match self {
            Mode::Sequential => "sequential",
            Mode::Bytes => "bytes",
            Mode::Keyed => "keyed",
            Mode::Workers => "workers",
            Mode::Lanes => "lanes",
            Mode::AnyWorker => "any-worker",
            Mode::Batch => "batch",
            Mode::EndToEnd => "end-to-end",
        }
    }
}

impl FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Mode::ALL
            .into_iter()
            .find(|mode| mode.name() == s)
            .ok_or_else(|| format!("unknown mode `{s}`"))
    }
}

/// Which tokio runtime runs the app.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flavor {
    /// One thread: deterministic, for allocation and instruction counts.
    Current,
    /// Tokio's default multi-thread runtime (one worker per core).
    Multi,
}

impl FromStr for Flavor {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "current" => Ok(Flavor::Current),
            "multi" => Ok(Flavor::Multi),
            _ => Err(format!("unknown runtime `{s}`")),
        }
    }
}

/// The command line.
struct Args {
    mode: Option<Mode>,
    messages: u64,
    warmup: u64,
    flavor: Flavor,
    repeat: u32,
    traces: u32,
    /// Spans and metrics on: a tracing subscriber that records Conveyor's spans, and a
    /// Prometheus recorder (needs the `observe` feature).
    observe: bool,
}

impl Args {
    fn parse() -> Result<Args, String> {
        // `cargo bench` passes `--bench`; without it (`cargo test --all-targets`, or the
        // binary run by hand) the defaults make a quick smoke run.
        let bench = std::env::args().any(|word| word == "--bench");
        let mut args = Args {
            mode: None,
            messages: if bench { 100_000 } else { 1_000 },
            warmup: if bench { 20_000 } else { 1_000 },
            flavor: Flavor::Current,
            repeat: if bench { 5 } else { 1 },
            traces: 0,
            observe: false,
        };
        let mut words = std::env::args().skip(1);
        while let Some(word) = words.next() {
            let mut value = || words.next().ok_or(format!("{word} needs a value"));
            let number = |text: String| {
                text.parse::<u64>()
                    .map_err(|e| format!("{word} {text}: {e}"))
            };
            match word.as_str() {
                "--mode" => args.mode = Some(value()?.parse()?),
                "--messages" => args.messages = number(value()?)?,
                "--warmup" => args.warmup = number(value()?)?,
                "--runtime" => args.flavor = value()?.parse()?,
                "--repeat" => args.repeat = number(value()?)?.try_into().map_err(|_| USAGE)?,
                "--trace" => args.traces = number(value()?)?.try_into().map_err(|_| USAGE)?,
                "--observe" => args.observe = true,
                "--bench" => {} // passed by `cargo bench`
                _ => return Err(format!("unknown argument `{word}`\n{USAGE}")),
            }
        }
        if args.messages == 0 || args.warmup == 0 || args.repeat == 0 {
            return Err(format!(
                "--messages, --warmup and --repeat must be > 0\n{USAGE}"
            ));
        }
        Ok(args)
    }
}

/// Messages handled so far in this run.
static HANDLED: AtomicU64 = AtomicU64::new(0);
/// The handled count at which the window opens: the end of the warm-up.
static OPEN_AT: AtomicU64 = AtomicU64::new(u64::MAX);
/// The handled count at which the window closes.
static CLOSE_AT: AtomicU64 = AtomicU64::new(u64::MAX);
/// How many allocations in the window print a backtrace.
static TRACES: AtomicU32 = AtomicU32::new(0);
/// When the window opened.
static OPENED: Mutex<Option<Instant>> = Mutex::new(None);
/// What the window measured, once closed.
static MEASURED: Mutex<Option<Measured>> = Mutex::new(None);
/// Wakes the bench once the window has closed.
static CLOSED: Notify = Notify::const_new();

/// What one window measured.
#[derive(Clone, Copy, Debug)]
struct Measured {
    allocations: Allocations,
    elapsed: Duration,
}

/// Called by the handlers with how many messages they just handled.
fn handled(n: u64) {
    let before = HANDLED.fetch_add(n, Ordering::Relaxed);
    let after = before + n;
    let open_at = OPEN_AT.load(Ordering::Relaxed);
    let close_at = CLOSE_AT.load(Ordering::Relaxed);
    if before < open_at && after >= open_at {
        window_open();
    }
    if before < close_at && after >= close_at {
        window_close();
    }
}

/// Opens the window. Never inlined: callgrind's `--zero-before` names it.
#[inline(never)]
fn window_open() {
    *OPENED.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
    start_counting(TRACES.load(Ordering::Relaxed));
}

/// Closes the window. Never inlined: callgrind's `--dump-before` names it.
#[inline(never)]
fn window_close() {
    let allocations = stop_counting();
    let opened = OPENED.lock().unwrap_or_else(PoisonError::into_inner).take();
    let elapsed = opened.map_or(Duration::ZERO, |at| at.elapsed());
    *MEASURED.lock().unwrap_or_else(PoisonError::into_inner) = Some(Measured {
        allocations,
        elapsed,
    });
    CLOSED.notify_one();
}

async fn order(Json(order): Json<Order>) {
    black_box(order);
    handled(1);
}

async fn raw(payload: Bytes) {
    black_box(payload);
    handled(1);
}

async fn orders(batch: Batch<Json<Order>>) {
    let n = batch.len() as u64;
    black_box(batch);
    handled(n);
}

/// One run: publish, start the app, wait for the window to close, shut down.
fn run(mode: Mode, flavor: Flavor, warmup: u64, messages: u64, traces: u32) -> Measured {
    HANDLED.store(0, Ordering::Relaxed);
    OPEN_AT.store(warmup, Ordering::Relaxed);
    CLOSE_AT.store(warmup + messages, Ordering::Relaxed);
    TRACES.store(traces, Ordering::Relaxed);
    *MEASURED.lock().unwrap_or_else(PoisonError::into_inner) = None;

    runtime(flavor).block_on(async {
        let broker = MemoryBroker::new();
        let keys: Vec<PartitionKey> = (0..64).map(|k| format!("k-{k}").into()).collect();
        let publish = |id: u64| {
            let payload = Order {
                id,
                qty: (id % 7) as u32 + 1,
                price_cents: 1999,
            };
            let mut message = Message::builder();
            if matches!(mode, Mode::Keyed | Mode::Lanes | Mode::AnyWorker) {
                message = message.partition_key(keys[(id % 64) as usize].clone());
            }
            let message = message.json(&payload).expect("an Order always encodes");
            broker.publish("bench", message)
        };
        if mode != Mode::EndToEnd {
            for id in 0..warmup + messages {
                publish(id)
                    .await
                    .expect("the in-process broker always takes a message");
            }
        }

        let queue = broker.queue("bench");
        let app = App::new("bench");
        let app = match mode {
            Mode::Sequential => app.mount(queue, order, |m| m),
            Mode::Bytes => app.mount(queue, raw, |m| m),
            Mode::Keyed => app.mount(queue, order, |m| m),
            Mode::Workers => app.mount(queue, order, |m| m.workers(4)),
            Mode::Lanes => app.mount(queue, order, |m| m.workers(4).by_key()),
            Mode::AnyWorker => app.mount(queue, order, |m| m.workers(4).by_key().any_worker()),
            Mode::Batch => app.mount(queue, orders, |m| m.batch(10)),
            Mode::EndToEnd => app.mount(queue, order, |m| m),
        };
        let running = app.start().await.expect("the bench app starts");
        if mode == Mode::EndToEnd {
            // One at a time, each handed to the app before the next is made: the steady
            // state of a service that publishes what it consumes.
            for id in 0..warmup + messages {
                publish(id)
                    .await
                    .expect("the in-process broker always takes a message");
                tokio::task::yield_now().await;
            }
        }
        CLOSED.notified().await;
        broker.wait_idle().await;
        running.shutdown().await.expect("the bench app shuts down");
    });
    MEASURED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take()
        .expect("the window closes before the app goes idle")
}

fn runtime(flavor: Flavor) -> Runtime {
    let mut builder = match flavor {
        Flavor::Current => Builder::new_current_thread(),
        Flavor::Multi => Builder::new_multi_thread(),
    };
    builder.enable_time().build().expect("a tokio runtime")
}

/// The best of `repeat` runs: highest throughput, and the most allocations seen.
fn best(mode: Mode, flavor: Flavor, args: &Args) -> (Allocations, f64) {
    let mut allocations = Allocations::default();
    let mut rate: f64 = 0.0;
    for _ in 0..args.repeat {
        let measured = run(mode, flavor, args.warmup, args.messages, args.traces);
        allocations.count = allocations.count.max(measured.allocations.count);
        allocations.bytes = allocations.bytes.max(measured.allocations.bytes);
        rate = rate.max(args.messages as f64 / measured.elapsed.as_secs_f64());
    }
    (allocations, rate)
}

fn main() -> Result<(), Box<dyn Error>> {
    let args = Args::parse()?;
    if args.observe {
        observe()?;
    }
    let per = |n: u64| n as f64 / args.messages as f64;
    if let Some(mode) = args.mode {
        let measured = run(mode, args.flavor, args.warmup, args.messages, args.traces);
        println!(
            "mode={} runtime={:?} messages={} allocations/delivery={:.3} bytes/delivery={:.1} msg/s={:.0}",
            mode.name(),
            args.flavor,
            args.messages,
            per(measured.allocations.count),
            per(measured.allocations.bytes),
            args.messages as f64 / measured.elapsed.as_secs_f64(),
        );
        return Ok(());
    }

    println!(
        "{} messages after {} warm-up, best of {} runs",
        args.messages, args.warmup, args.repeat
    );
    println!(
        "{:<11} {:>11} {:>10} {:>14} {:>17} {:>12}",
        "mode", "allocs/msg", "bytes/msg", "msg/s current", "allocs/msg multi", "msg/s multi"
    );
    for mode in Mode::ALL {
        let (current, current_rate) = best(mode, Flavor::Current, &args);
        let (multi, multi_rate) = best(mode, Flavor::Multi, &args);
        println!(
            "{:<11} {:>11.3} {:>10.1} {:>14.0} {:>17.3} {:>12.0}",
            mode.name(),
            per(current.count),
            per(current.bytes),
            current_rate,
            per(multi.count),
            multi_rate,
        );
    }
    Ok(())
}

#[cfg(feature = "observe")]
fn observe() -> Result<(), Box<dyn Error>> {
    conveyor_benches::observe()
}

#[cfg(not(feature = "observe"))]
fn observe() -> Result<(), Box<dyn Error>> {
    Err("--observe needs the bench built with `--features observe`".into())
}
