//! What spans and metrics cost per delivery with no Conveyor at all: the calls into
//! `tracing` and `metrics` that one sequential delivery makes when they are on, against
//! the same subscriber and recorder as `dispatch --observe`, in a plain loop. It is the
//! floor under the observed cost of every dispatch mode, and tells how much of that cost
//! is Conveyor's own. Instructions per iteration: `OBSERVE=1 scripts/bench-core.sh`.
//!
//! One iteration (`--calls both`): a root span with the ten fields of a delivery's span,
//! entered, left and closed; the consumed counter and the in-flight gauge raised; the
//! clock read before and after; the process-duration histogram recorded; the ack counter
//! raised; the gauge lowered. `span` and `metrics` make only those calls.
//!
//! The modes that make further calls per delivery have their own floor, `both` plus:
//!
//! - `lanes`: the clock read as the dispatcher takes the delivery in, its lane's
//!   `conveyor.lane.waiting` gauge raised, then lowered and `conveyor.lane.in_flight` set
//!   to 1 as the lane starts it, the wait histogram (`conveyor.wait.duration`) recorded
//!   from the run's start, and the lane's in-flight gauge set to 0 at its end;
//! - `any-worker`: the clock read as the dispatcher takes the delivery in, and the wait
//!   histogram recorded;
//! - `end-to-end`: the publish's span (`conveyor.publish`, five fields, a contextual
//!   parent), entered, left and closed, and the sent counter raised.
//!
//! Usage: `cargo bench -p conveyor-benches --features observe --bench observe_floor --
//! [--calls span|metrics|both|lanes|any-worker|end-to-end] [--iterations N] [--warmup N]`

use std::error::Error;
use std::hint::black_box;
use std::time::Instant;

const USAGE: &str = "usage: observe_floor [--calls span|metrics|both|lanes|any-worker|end-to-end] \
[--iterations N] [--warmup N]";

/// Which of the two kinds of calls an iteration makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Calls {
    Span,
    Metrics,
    Both,
    Lanes,
    AnyWorker,
    EndToEnd,
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
                    "lanes" => Calls::Lanes,
                    "any-worker" => Calls::AnyWorker,
                    "end-to-end" => Calls::EndToEnd,
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
    let wait = metrics::histogram!("conveyor.wait.duration", &labels);
    let sent = metrics::counter!(
        "messaging.client.sent.messages",
        "messaging.system" => "conveyor_in_process",
        "messaging.destination.name" => "orders"
    );
    let lane_labels = [
        ("messaging.system", "conveyor-memory"),
        ("messaging.destination.name", "orders"),
        ("conveyor.dispatch", "lanes"),
        ("conveyor.lane", "0"),
    ];
    let lane_running = metrics::gauge!("conveyor.lane.in_flight", &lane_labels);
    let lane_waiting = metrics::gauge!("conveyor.lane.waiting", &lane_labels);
    let queue: &str = black_box("orders");
    let (span_on, metrics_on) = (calls != Calls::Metrics, calls != Calls::Span);

    let started = Instant::now();
    if matches!(calls, Calls::Span | Calls::Metrics | Calls::Both) {
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
    } else {
        // Apart, so that the loop above stays the one measured before these were added.
        let (lane, publishes) = (calls == Calls::Lanes, calls == Calls::EndToEnd);
        for i in 0..warmup.saturating_add(iterations) {
            if i == warmup {
                window_open();
            }
            if publishes {
                let span = tracing::info_span!(
                    target: "conveyor::trace",
                    "conveyor.publish",
                    otel.name = %format_args!("send {queue}"),
                    otel.kind = "producer",
                    messaging.system = "conveyor_in_process",
                    messaging.destination.name = queue,
                    messaging.operation.type = "send",
                );
                let entered = span.enter();
                black_box(i);
                sent.increment(1);
                drop(entered);
                drop(span);
            }
            let arrived = (!publishes).then(Instant::now);
            if lane {
                lane_waiting.increment(1.0);
                lane_waiting.decrement(1.0);
                lane_running.set(1.0);
            }
            let span = delivery_span(queue);
            let entered = span.enter();
            consumed.increment(1);
            in_flight.increment(1.0);
            let run = Instant::now();
            if let Some(arrived) = arrived {
                wait.record(run.saturating_duration_since(arrived).as_secs_f64());
            }
            black_box(i);
            duration.record(run.elapsed().as_secs_f64());
            acked.increment(1);
            in_flight.decrement(1.0);
            drop(entered);
            drop(span);
            if lane {
                lane_running.set(0.0);
            }
        }
    }
    window_close();
    let elapsed = started.elapsed();
    println!(
        "calls={calls:?} iterations={iterations} ns/iteration={:.1} (warm-up included)",
        elapsed.as_nanos() as f64 / warmup.saturating_add(iterations) as f64
    );
    Ok(())
}

/// A delivery's span, with the ten fields `conveyor` gives it (as in the loop of `both`).
#[inline(always)]
fn delivery_span(queue: &str) -> tracing::Span {
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
}
