//! Running a handler on one delivery and settling it by its outcome or the failure policy.

use std::any::Any;
use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures_util::FutureExt;
use tokio::time::Instant;

use super::unwind::CatchDropPanic;
use super::{Run, settle};
use crate::clock::Tick;
use crate::delivery::Delivery;
use crate::error::{BoxError, Report};
use crate::handler::{CallOne, Refusal};
use crate::outcome::{Outcome, Settlement};
use crate::policy::OnError;
use crate::telemetry::Arrival;

/// The reason recorded when a handler itself returns [`Outcome::Reject`](crate::Outcome).
const REJECTED_BY_HANDLER: &str = "rejected by the handler";

/// Whether a mount keeps each key's order across retries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Retries {
    /// Sequential and lanes: a delivery to retry is run again in place, after its delay,
    /// before anything later of its key. It stays held (unacked, invisible) meanwhile.
    InPlace,
    /// Workers and batches keep no order: a retry goes back to the broker.
    ToBroker,
}

/// Runs `handler` on `delivery` and settles it once the handler has finished.
///
/// A delivery the handler cannot take (bad payload, failed extractor) is rejected with one
/// error log. A handler error or panic, in the handler or while building its arguments,
/// goes to the mount's failure policy; a panic never escapes, so the mount keeps running.
/// A handler still running when the app's shutdown timeout passes is dropped, and its
/// delivery released to the broker. `arrival` is when a dispatcher that held the
/// delivery before its handler (lanes, any-worker) took it in, for the wait metric.
pub(crate) async fn handle_one<H: CallOne>(
    handler: &H,
    delivery: Delivery,
    run: &Run,
    retries: Retries,
    arrival: Arrival,
) {
    let span = delivery_span(&delivery, run);
    run.metrics.consumed(1);
    let started = run.metrics.first_run_started(&delivery, arrival);
    let handled = async {
        // The handler is polled first: one that finishes at once never polls the other.
        tokio::select! {
            biased;
            () = run_and_settle(handler, delivery, run, retries, started) => {}
            // The delivery, dropped unsettled, goes back to the broker.
            () = run.shutdown.cancelled() => run.metrics.released(1),
        }
    };
    crate::trace::InSpan::new(handled, span).await;
    run.metrics.finished(1);
}

/// The span a delivery is handled in, retries in place included, named and attributed
/// after OpenTelemetry's messaging conventions, plus Conveyor's own: the attempt, the lane
/// (the worker, under any-worker) and the dispatch mode. The handler's own spans and
/// events nest under it. Made only when a subscriber wants INFO spans of this crate.
/// With the `otel` feature it continues the trace of the publish that sent the message.
///
/// It is a root: a delivery starts its own trace, or continues its publisher's, never
/// that of whatever span is current where the mount runs (and the subscriber need not
/// look for one).
fn delivery_span(delivery: &Delivery, run: &Run) -> tracing::Span {
    let span = tracing::info_span!(
        parent: None,
        "conveyor.process",
        otel.name = &*run.process_name,
        otel.kind = "consumer",
        messaging.system = run.system,
        messaging.destination.name = run.cx.queue(),
        messaging.operation.type = "process",
        messaging.message.id = delivery.message_id(),
        messaging.conveyor.attempt = delivery.attempt(),
        messaging.conveyor.lane = delivery.lane(),
        messaging.conveyor.dispatch = run.dispatch,
    );
    crate::trace::continue_trace(&span, delivery.headers());
    span
}

/// What one run of the handler decided for its delivery: the core's one internal fate,
/// between the handler's [`Outcome`] (or failure) and the transport's [`Settlement`].
/// A retry here may still run again in place; a reject owns its reason.
enum Fate {
    Ack,
    /// Again: now (`None`) or after the delay.
    Retry(Option<Duration>),
    Reject(Cow<'static, str>),
}

/// The longest a mount holds a delivery to retry it in place, counted from its first
/// failure: well below RabbitMQ's default `consumer_timeout` (30 min), past which the
/// broker closes the channel, and SQS's 12 hours. A retry that would hold it longer goes
/// back to the broker, which keeps the delay but not the key's order. A subscription that
/// can hold a delivery for less ([`Subscriber::max_hold`](crate::Subscriber::max_hold))
/// lowers it to half of that.
pub const MAX_IN_PLACE_HOLD: Duration = Duration::from_secs(15 * 60);

async fn run_and_settle<H: CallOne>(
    handler: &H,
    mut delivery: Delivery,
    run: &Run,
    retries: Retries,
    mut first_started: Option<Tick>,
) {
    // Set at the first retry: the clock is read only on the retry path.
    let mut first_failure: Option<Instant> = None;
    loop {
        let delay = match run_once(handler, &delivery, run, first_started.take()).await {
            Fate::Ack => return settle(delivery, Settlement::Ack, run),
            Fate::Reject(reason) => {
                return settle(delivery, Settlement::Reject { reason: &reason }, run);
            }
            Fate::Retry(delay) => delay,
        };
        let to_broker = |delay: Option<Duration>| match delay {
            Some(delay) => Settlement::RetryAfter(delay),
            None => Settlement::Retry,
        };
        let held = first_failure.get_or_insert_with(Instant::now).elapsed();
        let too_long = held.saturating_add(delay.unwrap_or_default()) > run.max_hold;
        // Draining: hand the delivery back (with its attempt count) rather than keep the
        // shutdown waiting for its retries.
        if retries == Retries::ToBroker || too_long || run.shutdown.is_requested() {
            return settle(delivery, to_broker(delay), run);
        }
        if let Some(delay) = delay {
            let due = Instant::now().checked_add(delay);
            let mut shutdown = run.shutdown.clone();
            tokio::select! {
                biased;
                () = shutdown.requested() => {
                    let left = due.map_or(delay, |due| due.saturating_duration_since(Instant::now()));
                    return settle(delivery, Settlement::RetryAfter(left), run);
                }
                () = tokio::time::sleep(delay) => {}
            }
        } else {
            // A retry now must not spin: let the runtime run timers and other tasks.
            tokio::task::yield_now().await;
        }
        run.metrics.outcome(&to_broker(delay));
        delivery.count_retry();
    }
}

/// Runs the handler once and decides the delivery's fate.
/// `started` is when the first run started, read once with the wait before it.
async fn run_once<H: CallOne>(
    handler: &H,
    delivery: &Delivery,
    run: &Run,
    started: Option<Tick>,
) -> Fate {
    // Decoding and extractors run user code too (`FromPayload`, `FromDelivery`, serde).
    let started = started.or_else(|| run.metrics.run_started());
    let called = std::panic::catch_unwind(AssertUnwindSafe(|| handler.call(delivery, &run.cx)));
    let future = match called {
        Ok(Ok(future)) => CatchDropPanic::new(future),
        Ok(Err(refusal)) => return refused(&refusal, run),
        Err(panic) => {
            run.metrics.panicked();
            return failed(delivery, &Failure::Panic(panic), run);
        }
    };
    let result = within_timeout(AssertUnwindSafe(future).catch_unwind(), run).await;
    run.metrics.run_ended(started);
    let result = match result {
        Ok(result) => result,
        Err(timed_out) => return failed(delivery, &timed_out, run),
    };
    match result {
        Ok(outcome) => match outcome {
            Ok(outcome) => decided(outcome, delivery, run),
            Err(error) => failed(delivery, &Failure::Error(error), run),
        },
        Err(panic) => {
            run.metrics.panicked();
            failed(delivery, &Failure::Panic(panic), run)
        }
    }
}

/// Runs a handler's future to its end, or until the mount's [`timeout`] has passed:
/// then the future is dropped (the handler cancelled) and the run is a failure.
/// Without a timeout, nothing is added to the call.
///
/// [`timeout`]: crate::MountOptions::timeout
pub(crate) async fn within_timeout<F: Future>(call: F, run: &Run) -> Result<F::Output, Failure> {
    match run.options.handler_timeout() {
        None => Ok(call.await),
        Some(limit) => tokio::time::timeout(limit, call)
            .await
            .map_err(|_| Failure::TimedOut(limit)),
    }
}

/// The fate of a delivery whose handler returned `outcome`.
fn decided(outcome: Outcome, delivery: &Delivery, run: &Run) -> Fate {
    match outcome {
        Outcome::Ack => Fate::Ack,
        Outcome::Retry => asked_again(delivery, None, run),
        Outcome::RetryAfter(delay) => asked_again(delivery, Some(delay), run),
        Outcome::Reject => Fate::Reject(Cow::Borrowed(REJECTED_BY_HANDLER)),
    }
}

/// A retry the handler asked for: granted while attempts are left, like a failure's.
fn asked_again(delivery: &Delivery, delay: Option<Duration>, run: &Run) -> Fate {
    let attempt = delivery.attempt();
    if !run.options.failure_policy().attempts_exhausted(attempt) {
        return Fate::Retry(delay);
    }
    tracing::error!(
        queue = run.cx.queue(),
        attempt,
        "the handler asked for a retry with no attempts left; rejecting"
    );
    Fate::Reject(Cow::Owned(format!(
        "the handler asked for a retry on attempt {attempt}, the last allowed"
    )))
}

fn refused(refusal: &Refusal, run: &Run) -> Fate {
    run.metrics.decode_failed();
    let reason = Report(refusal).to_string();
    tracing::error!(
        queue = run.cx.queue(),
        error = reason,
        "rejecting a message the handler cannot take"
    );
    Fate::Reject(Cow::Owned(reason))
}

/// Why a handler did not produce an outcome.
pub(crate) enum Failure {
    Error(BoxError),
    Panic(Box<dyn Any + Send>),
    Mismatch {
        outcomes: usize,
        messages: usize,
    },
    /// The handler ran past the mount's timeout and was cancelled.
    TimedOut(Duration),
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // The error and its causes, each once.
            Failure::Error(error) => Report(error.as_ref()).fmt(f),
            Failure::Panic(panic) => {
                let message = panic
                    .downcast_ref::<&str>()
                    .copied()
                    .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
                    .unwrap_or("a non-string payload");
                write!(f, "handler panicked: {message}")
            }
            Failure::Mismatch { outcomes, messages } => write!(
                f,
                "batch handler returned {outcomes} outcomes for {messages} messages"
            ),
            Failure::TimedOut(limit) => {
                write!(
                    f,
                    "handler still running after its timeout of {limit:?}; cancelled"
                )
            }
        }
    }
}

/// The fate the mount's failure policy gives a delivery whose handler failed, logged:
/// rejected on the last allowed attempt, else as its `on_error` says.
fn failed(delivery: &Delivery, failure: &Failure, run: &Run) -> Fate {
    let attempt = delivery.attempt();
    let queue = run.cx.queue();
    let policy = run.options.failure_policy();
    if policy.attempts_exhausted(attempt) {
        tracing::error!(queue, attempt, error = %failure, "handler failed; rejecting");
        return Fate::Reject(Cow::Owned(format!(
            "{failure} (attempt {attempt}, no attempts left)"
        )));
    }
    match policy.on_error {
        OnError::Retry => {
            tracing::warn!(queue, attempt, error = %failure, "handler failed; retrying now");
            Fate::Retry(None)
        }
        OnError::RetryAfter(backoff) => {
            let delay = backoff.delay(attempt);
            tracing::warn!(queue, attempt, ?delay, error = %failure, "handler failed; retrying later");
            Fate::Retry(Some(delay))
        }
        OnError::Reject => {
            tracing::error!(queue, attempt, error = %failure, "handler failed; rejecting");
            Fate::Reject(Cow::Owned(failure.to_string()))
        }
    }
}

/// Settles a delivery whose handler failed, as the mount's failure policy says; a retry
/// goes back to the broker.
pub(crate) fn settle_failed(delivery: Delivery, failure: &Failure, run: &Run) {
    let fate = failed(&delivery, failure, run);
    settle_as(delivery, fate, run);
}

/// Settles a delivery as the handler's `outcome` for it says (one of a batch's): a retry
/// it asks for is granted while attempts are left, as for a single delivery, and goes
/// back to the broker.
pub(crate) fn settle_outcome(delivery: Delivery, outcome: Outcome, run: &Run) {
    let fate = decided(outcome, &delivery, run);
    settle_as(delivery, fate, run);
}

fn settle_as(delivery: Delivery, fate: Fate, run: &Run) {
    match fate {
        Fate::Ack => settle(delivery, Settlement::Ack, run),
        Fate::Retry(None) => settle(delivery, Settlement::Retry, run),
        Fate::Retry(Some(delay)) => settle(delivery, Settlement::RetryAfter(delay), run),
        Fate::Reject(reason) => settle(delivery, Settlement::Reject { reason: &reason }, run),
    }
}
