//! The dispatch engine: drives a subscription through a mounted handler.
//!
//! Every mode shares two steps: `receive` takes the next delivery (or stops at
//! shutdown), and `handle_one` runs the handler and settles the delivery once it has
//! finished. The modes differ only in who runs `handle_one`: the mount's own loop
//! (sequential), `n` long-lived workers (`workers(n)`), or `n` keyed lanes polled by the
//! mount's own loop (`workers(n).by_key()`, see [`lane_for_key`]). No mode spawns a task
//! per delivery.
//!
//! Sequential mounts and keyed modes retry a failed delivery in place, holding it through its
//! backoff, so a key's order holds across retries; workers and batches hand retries back
//! to the broker. When the app starts draining, each mode stops taking deliveries, lets
//! the subscriber hand back what it holds (`Subscriber::stop_receiving`), waits for its
//! running handlers and closes the subscriber.

mod any_worker;
mod batch;
mod lanes;
mod sequential;
mod settle;
mod unwind;
mod workers;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use futures_util::future::Either;
use tokio::sync::watch;
use tokio::task::{JoinError, JoinSet};

use crate::delivery::Delivery;
use crate::error::{Error, Report};
use crate::extract::Context;
use crate::handler::{CallBatch, CallOne};
use crate::kit::RetryPause;
use crate::kit::beside::beside;
use crate::mount::{Dispatch, MountOptions};
use crate::transport::Subscriber;

pub use any_worker::DEFAULT_READ_AHEAD_PER_WORKER;
pub use lanes::lane_for_key;
pub use settle::MAX_IN_PLACE_HOLD;
pub(crate) use settle::{Retries, handle_one};

pub(crate) use run::Run;

/// The most workers (or lanes) a mount may run: more handlers at once than RabbitMQ's
/// largest prefetch window (65,535) hands a consumer. A larger `workers(n)` is a
/// startup error, where it would otherwise make `n` tasks and their state up front.
pub const MAX_WORKERS: usize = 65_536;

/// The most room a mount's buffers take up front: a larger batch or read-ahead grows
/// them only as deliveries come, so a huge setting costs nothing until used.
const PREALLOCATED_MAX: usize = 1024;

/// Public in name, because the sealed `Endpoint` trait mentions it, but in a private
/// module, so no one outside the crate can name it.
mod run {
    use super::{Context, MountOptions, Shutdown};

    /// Everything a running mount needs besides its handler and subscriber.
    #[derive(Clone, Debug)]
    pub struct Run {
        pub(crate) cx: Context,
        pub(crate) options: MountOptions,
        pub(crate) shutdown: Shutdown,
        /// The longest a retry in place may hold a delivery (see `Run::bounded_by`).
        pub(crate) max_hold: std::time::Duration,
        /// The source's `messaging.system`, for the delivery spans.
        pub(crate) system: &'static str,
        /// The dispatch mode's name, for the delivery spans.
        pub(crate) dispatch: &'static str,
        /// The delivery spans' `otel.name`, `process <queue>`, made once per mount.
        pub(crate) process_name: std::sync::Arc<str>,
        /// The mount's metric handles (nothing without the `metrics` feature).
        pub(crate) metrics: crate::telemetry::MountMetrics,
        /// What the running app's health shows of this mount.
        pub(crate) status: crate::health::MountStatus,
    }
}

/// Where the app is in its life, as the mounts see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Phase {
    Running,
    /// Stop receiving; let in-flight handlers finish.
    Draining,
    /// The shutdown timeout passed: drop the handlers still running, releasing their
    /// deliveries.
    Cancelling,
}

/// Tells running mounts that the app is shutting down.
pub(crate) struct Shutdown {
    phase: watch::Receiver<Phase>,
    /// The wait for draining, made on first need and kept between receives: a receive
    /// that finds the queue empty polls it alongside the subscriber, and making a fresh
    /// one each time (registering with the watch again) cost about 400 instructions per
    /// delivery to a mount that keeps up with its queue.
    draining: Option<Pin<Box<dyn Future<Output = ()> + Send + Sync>>>,
    /// Draining was seen: the wait above has finished and is not polled again.
    drained: bool,
}

impl Clone for Shutdown {
    fn clone(&self) -> Self {
        Shutdown {
            phase: self.phase.clone(),
            draining: None,
            drained: self.drained,
        }
    }
}

impl fmt::Debug for Shutdown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Shutdown")
            .field(&*self.phase.borrow())
            .finish()
    }
}

impl Shutdown {
    pub(crate) fn new() -> (watch::Sender<Phase>, Shutdown) {
        let (tx, rx) = watch::channel(Phase::Running);
        let shutdown = Shutdown {
            phase: rx,
            draining: None,
            drained: false,
        };
        (tx, shutdown)
    }

    /// Resolves once shutdown has been requested (or the app is gone).
    pub(crate) async fn requested(&mut self) {
        if self.drained {
            return;
        }
        let phase = &self.phase;
        let draining = self.draining.get_or_insert_with(|| {
            let mut phase = phase.clone();
            Box::pin(async move {
                let _ = phase.wait_for(|phase| *phase >= Phase::Draining).await;
            })
        });
        draining.as_mut().await;
        self.drained = true;
        self.draining = None;
    }

    /// Resolves once the shutdown timeout has passed (or the app is gone). Costs nothing
    /// until first polled, so racing it against a handler that finishes at once is free.
    pub(crate) async fn cancelled(&self) {
        let mut phase = self.phase.clone();
        let _ = phase.wait_for(|phase| *phase == Phase::Cancelling).await;
    }

    pub(crate) fn is_requested(&self) -> bool {
        *self.phase.borrow() >= Phase::Draining
    }
}

/// Runs a single-delivery handler's mount in the dispatch mode its options name, with
/// the subscription's background work, if it has some, on the same task (see
/// [`Subscriber::background`] and [`beside`]).
///
/// Not an `async fn`: a mount without background work is polled through no more frames
/// than its dispatch mode's own (a debug build's handler futures, an AWS SDK call's say,
/// take much of a worker thread's stack already).
pub(crate) fn drive_one<H: CallOne, S: Subscriber>(
    handler: Arc<H>,
    mut subscriber: S,
    run: Run,
) -> impl Future<Output = Result<(), Error>> + Send {
    let run = run.bounded_by(&subscriber);
    match subscriber.background() {
        None => Either::Left(dispatch_one(handler, subscriber, run)),
        Some(background) => Either::Right(beside(
            Box::pin(dispatch_one(handler, subscriber, run)),
            background,
        )),
    }
}

async fn dispatch_one<H: CallOne, S: Subscriber>(
    handler: Arc<H>,
    subscriber: S,
    run: Run,
) -> Result<(), Error> {
    match run.options.dispatch() {
        Dispatch::Sequential => sequential::drive(handler, subscriber, run).await,
        Dispatch::Workers(n) => workers::drive(handler, subscriber, run, n).await,
        Dispatch::Lanes(n) => lanes::drive(handler, subscriber, run, n).await,
        Dispatch::AnyWorker {
            workers,
            read_ahead,
        } => any_worker::drive(handler, subscriber, run, workers, read_ahead).await,
    }
}

impl Run {
    /// Caps the in-place hold by what the subscription can hold: half of it, which leaves
    /// the other half for the handler's own runs.
    fn bounded_by<S: Subscriber>(mut self, subscriber: &S) -> Run {
        if let Some(limit) = subscriber.max_hold() {
            self.max_hold = self.max_hold.min(limit / 2);
        }
        self
    }
}

/// Runs a batch handler's mount, with the subscription's background work as
/// [`drive_one`] runs it.
pub(crate) fn drive_batch<H: CallBatch, S: Subscriber>(
    handler: Arc<H>,
    mut subscriber: S,
    run: Run,
) -> impl Future<Output = Result<(), Error>> + Send {
    match subscriber.background() {
        None => Either::Left(batch::drive(handler, subscriber, run)),
        Some(background) => Either::Right(beside(
            Box::pin(batch::drive(handler, subscriber, run)),
            background,
        )),
    }
}

/// What the receive step produced.
pub(crate) enum Received {
    Delivery(Delivery),
    /// Shutdown was requested: stop receiving.
    Stop,
    /// The subscription ended by itself.
    Ended,
    /// The subscription can never work again.
    Failed(Error),
}

/// How a mount's loop ended.
pub(crate) enum End {
    /// Shutdown was requested.
    Stopped,
    /// The subscription ended by itself.
    Ended,
    /// The subscription or one of the mount's tasks failed for good.
    Failed(Error),
}

impl From<Received> for End {
    fn from(received: Received) -> End {
        match received {
            Received::Ended => End::Ended,
            Received::Failed(error) => End::Failed(error),
            Received::Delivery(_) | Received::Stop => End::Stopped,
        }
    }
}

/// Logs a failed receive and waits out the next `pause`. Returns `false` if shutdown was
/// requested meanwhile.
///
/// The mount shows as reconnecting while it waits (a receive that succeeds, or one that
/// waits without failing, is up again). A reconnect is counted at the first failure of
/// a run, not at each: `pause` counts them until a receive succeeds.
pub(crate) async fn pause_after(pause: &mut RetryPause, error: &Error, run: &mut Run) -> bool {
    run.status.receive_failed();
    if pause.failures() == 0 {
        run.metrics.reconnecting();
    }
    let retry_in = pause.failed();
    tracing::warn!(
        queue = run.cx.queue(),
        error = %Report(error),
        ?retry_in,
        "receive failed"
    );
    let again = tokio::select! {
        biased;
        () = run.shutdown.requested() => false,
        () = tokio::time::sleep(retry_in) => true,
    };
    run.status.received();
    again
}

/// Waits for the next delivery, or for shutdown. A receive error is logged and the
/// receive retried after a growing pause, as the transport is expected to recover; an
/// [`Error::Subscribe`] cannot heal and ends the mount.
pub(crate) async fn receive<S: Subscriber>(subscriber: &mut S, run: &mut Run) -> Received {
    let mut pause = RetryPause::new();
    loop {
        // A plain look first, then the subscriber before the shutdown's future: when a
        // delivery is ready, that future is never made nor polled (it cost about 400
        // instructions per delivery), and a shutdown is still seen before each receive.
        if run.shutdown.is_requested() {
            return Received::Stop;
        }
        let error = tokio::select! {
            biased;
            next = subscriber.recv() => match next {
                Some(Ok(delivery)) => return Received::Delivery(delivery),
                None => return Received::Ended,
                Some(Err(error @ Error::Subscribe { .. })) => return Received::Failed(error),
                Some(Err(error)) => error,
            },
            () = run.shutdown.requested() => return Received::Stop,
        };
        if !pause_after(&mut pause, &error, run).await {
            return Received::Stop;
        }
    }
}

/// Has the subscriber stop receiving as soon as the app starts draining, for mounts
/// whose own loop runs the handler (sequential, batch): so what the transport read ahead
/// goes back at once, while the handler goes on.
pub(crate) struct StopOnDrain {
    draining: Shutdown,
    stopped: bool,
}

impl StopOnDrain {
    pub(crate) fn new(run: &Run) -> Self {
        StopOnDrain {
            draining: run.shutdown.clone(),
            stopped: false,
        }
    }

    /// Runs `work` to its end; if draining starts meanwhile, the subscriber stops
    /// receiving alongside it.
    pub(crate) async fn run<S: Subscriber, T>(
        &mut self,
        work: impl Future<Output = T>,
        subscriber: &mut S,
    ) -> T {
        tokio::pin!(work);
        tokio::select! {
            biased;
            // Polled first: work that finishes at once never polls the shutdown.
            done = &mut work => return done,
            () = self.draining.requested(), if !self.stopped => {}
        }
        self.stopped = true;
        // The work is polled while the subscriber stops: its handler keeps running.
        let (done, ()) = tokio::join!(work, subscriber.stop_receiving());
        done
    }

    /// After the mount's loop: stops receiving, unless that was done already.
    pub(crate) async fn finish<S: Subscriber>(self, subscriber: &mut S) {
        if !self.stopped {
            subscriber.stop_receiving().await;
        }
    }
}

/// Resolves once one of a mount's tasks (a worker) has died. A task that ends
/// normally (at shutdown) is no news.
///
/// Dispatch loops race it last in a biased `select!`: it is polled only when the
/// dispatcher would wait anyway, so a busy mount never pays for polling the tasks.
pub(crate) async fn task_died(tasks: &mut JoinSet<()>) -> JoinError {
    loop {
        match tasks.join_next().await {
            Some(Err(died)) => return died,
            Some(Ok(())) => {}
            None => std::future::pending::<()>().await,
        }
    }
}

/// The error that stops the app when one of a mount's tasks died.
pub(crate) fn task_error(died: &JoinError, run: &Run) -> Error {
    Error::MountTask(format!(
        "a task of the mount on `{}` died: {died}",
        run.cx.queue()
    ))
}

/// Waits for a mount's tasks to end; the first that died is an error.
pub(crate) async fn join_tasks(mut tasks: JoinSet<()>, run: &Run) -> Result<(), Error> {
    let mut result = Ok(());
    while let Some(joined) = tasks.join_next().await {
        if let (Err(died), Ok(())) = (joined, &result) {
            result = Err(task_error(&died, run));
        }
    }
    result
}

/// The end of a mount's loop: close the subscriber, and report a subscription that ended
/// or failed by itself while the app was running.
pub(crate) async fn finish<S: Subscriber>(subscriber: S, run: &Run, end: End) -> Result<(), Error> {
    subscriber.close().await;
    match end {
        End::Failed(error) => Err(error),
        End::Ended if !run.shutdown.is_requested() => Err(Error::SubscriptionEnded {
            queue: run.cx.queue().to_string(),
        }),
        End::Ended | End::Stopped => Ok(()),
    }
}

/// Settles `delivery` as the dispatcher decided, and counts the outcome.
pub(crate) fn settle(delivery: Delivery, settlement: crate::outcome::Settlement<'_>, run: &Run) {
    run.metrics.outcome(&settlement);
    delivery.settle(settlement);
}
