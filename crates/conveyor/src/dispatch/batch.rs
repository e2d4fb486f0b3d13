//! Batch dispatch: one batch at a time, of what the subscriber already has.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::pin;
use std::sync::Arc;

use futures_util::FutureExt;

use super::settle::{Failure, settle_failed, settle_outcome, within_timeout};
use super::unwind::CatchDropPanic;
use super::{End, PREALLOCATED_MAX, Run, StopOnDrain, finish, pause_after, settle};
use crate::batch::{Batch, BatchOutcome, IntoBatchOutcome, Metadata};
use crate::delivery::Delivery;
use crate::error::{Error, Report};
use crate::handler::CallBatch;
use crate::kit::RetryPause;
use crate::mount::DEFAULT_BATCH_SIZE;
use crate::outcome::Settlement;
use crate::payload::decode;
use crate::transport::Subscriber;

pub(super) async fn drive<H: CallBatch, S: Subscriber>(
    handler: Arc<H>,
    mut subscriber: S,
    mut run: Run,
) -> Result<(), Error> {
    let size = run.options.batch_size().unwrap_or(DEFAULT_BATCH_SIZE);
    let mut gathered = Vec::with_capacity(size.min(PREALLOCATED_MAX));
    let mut pause = RetryPause::new();
    let mut stop = StopOnDrain::new(&run);
    let end = loop {
        let received = tokio::select! {
            biased;
            // Deliveries gathered so far are released when `gathered` is dropped below.
            () = run.shutdown.requested() => break End::Stopped,
            received = subscriber.recv_batch(size, &mut gathered) => received,
        };
        match received {
            None => break End::Ended,
            Some(Ok(())) => {
                pause.reset();
                // Past the shutdown timeout the batch is dropped, its deliveries released.
                let count = gathered.len() as u64;
                let cancelled = {
                    // Pinned where it is made, not copied into `stop.run`'s future.
                    let handled = pin!(async {
                        tokio::select! {
                            biased;
                            () = handle_batch(&*handler, &mut gathered, &run) => false,
                            () = run.shutdown.cancelled() => true,
                        }
                    });
                    stop.run(handled, &mut subscriber).await
                };
                if cancelled {
                    run.metrics.released(gathered.len() as u64);
                    run.metrics.finished(count);
                    gathered.clear();
                }
            }
            Some(Err(error @ Error::Subscribe { .. })) => break End::Failed(error),
            Some(Err(error)) => {
                if !pause_after(&mut pause, &error, &mut run).await {
                    break End::Stopped;
                }
            }
        }
    };
    drop(gathered);
    stop.finish(&mut subscriber).await;
    finish(subscriber, &run, end).await
}

/// Decodes each delivery (rejecting those that fail on their own), runs the handler once
/// on the rest, and settles each by its outcome.
async fn handle_batch<H: CallBatch>(handler: &H, gathered: &mut Vec<Delivery>, run: &Run) {
    let count = gathered.len() as u64;
    run.metrics.consumed(count);
    decode_and_run(handler, gathered, run).await;
    run.metrics.finished(count);
}

async fn decode_and_run<H: CallBatch>(handler: &H, gathered: &mut Vec<Delivery>, run: &Run) {
    let mut payloads = Vec::with_capacity(gathered.len());
    let mut metadata = Vec::with_capacity(gathered.len());
    let mut deliveries = Vec::with_capacity(gathered.len());
    for delivery in gathered.drain(..) {
        // Decoding runs user code (`FromPayload`, serde): a panic there fails this one.
        let decoded = catch_unwind(AssertUnwindSafe(|| {
            decode::<H::Payload>(&delivery, &run.cx)
        }));
        match decoded {
            Ok(Ok(payload)) => {
                payloads.push(payload);
                metadata.push(Metadata::of(&delivery));
                deliveries.push(delivery);
            }
            Ok(Err(error)) => {
                let reason = Report(&error).to_string();
                tracing::error!(
                    queue = run.cx.queue(),
                    error = reason,
                    "rejecting a message the handler cannot take"
                );
                run.metrics.decode_failed();
                settle(delivery, Settlement::Reject { reason: &reason }, run);
            }
            Err(panic) => {
                run.metrics.panicked();
                settle_failed(delivery, &Failure::Panic(panic), run);
            }
        }
    }
    if deliveries.is_empty() {
        return;
    }
    // Back in `gathered` until settled: should the shutdown timeout cancel the handler,
    // the caller counts and releases what is left there.
    std::mem::swap(gathered, &mut deliveries);
    let started = run.metrics.run_started();
    let called = catch_unwind(AssertUnwindSafe(|| {
        handler.call(Batch::new(payloads, metadata), &run.cx)
    }));
    let future = match called {
        Ok(Ok(future)) => CatchDropPanic::new(future),
        Err(panic) => {
            run.metrics.panicked();
            let failure = Failure::Panic(panic);
            for delivery in gathered.drain(..) {
                settle_failed(delivery, &failure, run);
            }
            return;
        }
        Ok(Err(rejection)) => {
            let reason = Report(&rejection).to_string();
            tracing::error!(
                queue = run.cx.queue(),
                error = reason,
                "rejecting a batch the handler cannot take"
            );
            for delivery in gathered.drain(..) {
                settle(delivery, Settlement::Reject { reason: &reason }, run);
            }
            return;
        }
    };
    // Polling the handler's future runs user code: a panic there fails the batch.
    let finished = AssertUnwindSafe(async { future.await.into_batch_outcome() });
    let result = within_timeout(finished.catch_unwind(), run).await;
    run.metrics.run_ended(started);
    let failure = match result {
        Err(timed_out) => timed_out,
        Ok(Ok(outcome)) => match outcome {
            Ok(BatchOutcome::All(outcome)) => {
                for delivery in gathered.drain(..) {
                    settle_outcome(delivery, outcome, run);
                }
                return;
            }
            Ok(BatchOutcome::Each(outcomes)) if outcomes.len() == gathered.len() => {
                for (delivery, outcome) in gathered.drain(..).zip(outcomes) {
                    settle_outcome(delivery, outcome, run);
                }
                return;
            }
            Ok(BatchOutcome::Each(outcomes)) => Failure::Mismatch {
                outcomes: outcomes.len(),
                messages: gathered.len(),
            },
            Err(error) => Failure::Error(error),
        },
        Ok(Err(panic)) => {
            run.metrics.panicked();
            Failure::Panic(panic)
        }
    };
    for delivery in gathered.drain(..) {
        settle_failed(delivery, &failure, run);
    }
}
