//! Running a handler on one delivery and settling it by its outcome or the failure policy.

use std::any::Any;
use std::fmt;
use std::panic::AssertUnwindSafe;

use futures_util::FutureExt;

use super::{Run, error_chain};
use crate::delivery::Delivery;
use crate::error::BoxError;
use crate::handler::CallOne;
use crate::outcome::{IntoOutcome, Settlement};
use crate::policy::Verdict;

/// The reason recorded when a handler itself returns [`Outcome::Reject`](crate::Outcome).
pub(crate) const REJECTED_BY_HANDLER: &str = "rejected by the handler";

/// Runs `handler` on `delivery` and settles it once the handler has finished.
///
/// A delivery the handler cannot take (bad payload, failed extractor) is rejected with one
/// error log. A handler error or panic goes to the mount's failure policy; a panic never
/// escapes, so the mount keeps running. A handler still running when the app's shutdown
/// timeout passes is dropped, and its delivery released to the broker.
pub(crate) async fn handle_one<H: CallOne>(handler: &H, delivery: Delivery, run: &Run) {
    // The handler is polled first: one that finishes at once never polls the other.
    tokio::select! {
        biased;
        () = run_and_settle(handler, delivery, run) => {}
        () = run.shutdown.cancelled() => {}
    }
}

async fn run_and_settle<H: CallOne>(handler: &H, delivery: Delivery, run: &Run) {
    let future = match handler.call(&delivery, &run.cx) {
        Ok(future) => future,
        Err(refusal) => {
            tracing::error!(
                queue = run.cx.queue(),
                error = %refusal,
                "rejecting a message the handler cannot take"
            );
            let reason = refusal.to_string();
            delivery.settle(Settlement::Reject { reason: &reason });
            return;
        }
    };
    match AssertUnwindSafe(future).catch_unwind().await {
        Ok(output) => match output.into_outcome() {
            Ok(outcome) => delivery.settle(outcome.settlement(REJECTED_BY_HANDLER)),
            Err(error) => settle_failed(delivery, &Failure::Error(error), run),
        },
        Err(panic) => settle_failed(delivery, &Failure::Panic(panic), run),
    }
}

/// Why a handler did not produce an outcome.
pub(crate) enum Failure {
    Error(BoxError),
    Panic(Box<dyn Any + Send>),
    Mismatch { outcomes: usize, messages: usize },
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Error(error) => f.write_str(&error_chain(error.as_ref())),
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
        }
    }
}

/// Settles a delivery whose handler failed, as the mount's failure policy says.
pub(crate) fn settle_failed(delivery: Delivery, failure: &Failure, run: &Run) {
    let attempt = delivery.attempt();
    let queue = run.cx.queue();
    match run.options.failure_policy().verdict(attempt) {
        Verdict::Retry => {
            tracing::warn!(queue, attempt, error = %failure, "handler failed; retrying now");
            delivery.settle(Settlement::Retry);
        }
        Verdict::RetryAfter(delay) => {
            tracing::warn!(queue, attempt, ?delay, error = %failure, "handler failed; retrying later");
            delivery.settle(Settlement::RetryAfter(delay));
        }
        Verdict::Reject { attempts_exhausted } => {
            tracing::error!(queue, attempt, error = %failure, "handler failed; rejecting");
            let reason = if attempts_exhausted {
                format!("{failure} (attempt {attempt}, no attempts left)")
            } else {
                failure.to_string()
            };
            delivery.settle(Settlement::Reject { reason: &reason });
        }
    }
}
