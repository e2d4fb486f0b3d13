//! What spans and metrics cost per delivery with no Conveyor at all: the calls into
//! `tracing` and `metrics` that one sequential delivery makes when they are on, against
//! the same subscriber and recorder as `dispatch --observe`, in a plain loop. It is the
//! floor under the observed cost of every dispatch mode, and tells how much of that cost
//! is Conveyor's own. Instructions per iteration: `OBSERVE=1 scripts/bench-core.sh`.
//!
//! One iteration: a root span with the ten fields of a delivery's span, entered, left
//! and closed; the consumed counter and the in-flight gauge raised; the clock read before
//! and after; the process-duration histogram recorded; the ack counter raised; the gauge
//! lowered.
//!
//! Usage: `cargo bench -p conveyor-benches --features observe --bench observe_floor --
//! [--calls span|metrics|both] [--iterations N] [--warmup N]`

use std::error::Error;
use std::hint::black_box;
use std::time::Instant;

const USAGE: &str =
    "usage: observe_floor [--calls span|metrics|both] [--iterations N] [--warmup N]";

/// Which of the two kinds of calls an iteration makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Calls {
    Span,
    Metrics,
    Both,
}

/// Opens the window. Never inlined: callgrind's `--zero-before` names it.
#[inline(never)]
fn window_open() {
    black_box(1u8);
}

/// Closes the window. Never inlined: callgrind's `--dump-before` names it.
#[inline(never)]
fn window_close() {
    black_box(2u16);
}

fn main() -> Result<(), Box<dyn Error>> {
    let bench = std::env::args().any(|word| word == "--bench");
    let (mut calls, mut iterations, mut warmup) = (Calls::Both, 1_000u64, 1_000u64);
    if bench {
        iterations = 1_000_000;
        warmup = 10_000;
    }
    let mut words = std::env::args().skip(1);
    while let Some(word) = words.next() {
        let mut value = || words.next().ok_or(USAGE);
        match word.as_str() {
            "--calls" => {
                calls = match value()?.as_str() {
                    "span" => Calls::Span,
                    "metrics" => Calls::Metrics,
                    "both" => Calls::Both,
                    _ => return Err(USAGE.into()),
                }
            }
            "--iterations" => iterations = value()?.parse()?,
            "--warmup" => warmup = value()?.parse()?,
            "--bench" => {}
            _ => return Err(USAGE.into()),
        }
    }
    conveyor_benches::observe()?;

    // The handles a mount makes once, with a mount's labels.
    let labels = [
        ("messaging.system", "conveyor-memory"),
        ("messaging.destination.name", "orders"),
        ("conveyor.dispatch", "sequential"),
    ];
    let consumed = metrics::counter!("messaging.client.consumed.messages", &labels);
    let in_flight = metrics::gauge!("conveyor.in_flight", &labels);
    let duration = metrics::histogram!("messaging.process.duration", &labels);
    let acked = metrics::counter!("conveyor.outcomes", &labels);
    let queue: &str = black_box("orders");
    let (span_on, metrics_on) = (calls != Calls::Metrics, calls != Calls::Span);

    let started = Instant::now();
    for i in 0..warmup.saturating_add(iterations) {
        if i == warmup {
            window_open();
        }
        let span = span_on.then(|| {
            tracing::info_span!(
                target: "conveyor::dispatch::settle",
                parent: None,
                "conveyor.process",
                otel.name = "process orders",
                otel.kind = "consumer",
                messaging.system = "conveyor-memory",
                messaging.destination.name = queue,
                messaging.operation.type = "process",
                messaging.message.id = black_box(Some("m-1")),
                messaging.conveyor.attempt = black_box(1u32),
                messaging.conveyor.lane = black_box(None::<usize>),
                messaging.conveyor.dispatch = "sequential",
            )
        });
        let entered = span.as_ref().map(tracing::Span::enter);
        if metrics_on {
            consumed.increment(1);
            in_flight.increment(1.0);
            let run = Instant::now();
            black_box(i);
            duration.record(run.elapsed().as_secs_f64());
            acked.increment(1);
            in_flight.decrement(1.0);
        } else {
            black_box(i);
        }
        drop(entered);
        drop(span);
    }
    window_close();
    let elapsed = started.elapsed();
    println!(
        "calls={calls:?} iterations={iterations} ns/iteration={:.1} (warm-up included)",
        elapsed.as_nanos() as f64 / warmup.saturating_add(iterations) as f64
    );
    Ok(())
}
