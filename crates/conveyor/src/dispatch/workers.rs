//! `workers(n)`: up to `n` handlers at once, finishing in any order.
//!
//! `n` long-lived workers take turns at the subscriber: a free worker locks it, receives
//! the next delivery, lets go of it and runs the handler. A worker holds one delivery at
//! a time, so at most `n` are ever out of the queue: while `n` are in flight, nothing
//! more is read. Nothing is handed from task to task: when the next delivery is ready,
//! the worker that asks for it takes the lock uncontended and runs it straight away.
//!
//! The mount's own task watches: at shutdown it has the subscriber stop receiving at
//! once (handing back what it read ahead) while the workers finish their handlers; when
//! a worker dies, the others take nothing more, finish what they run, and the mount
//! fails.

use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::task::Poll;

use tokio::task::JoinSet;

use super::{End, Received, Retries, Run, finish, handle_one, receive, task_error};
use crate::error::Error;
use crate::handler::CallOne;
use crate::telemetry::Arrival;
use crate::transport::Subscriber;

/// What the workers share: the subscriber they take turns at, and how receiving ended.
struct Shared<S> {
    subscriber: tokio::sync::Mutex<S>,
    /// Set by the worker that saw the subscription end or fail: the others leave.
    ended: OnceLock<End>,
    /// Wakes a worker waiting for a delivery when the others are to leave.
    leave: tokio::sync::Notify,
}

impl<S> Shared<S> {
    fn has_ended(&self) -> bool {
        self.ended.get().is_some()
    }

    /// Keeps the first way receiving ended.
    fn end(&self, end: End) {
        let _ = self.ended.set(end);
    }
}

pub(super) async fn drive<H: CallOne, S: Subscriber>(
    handler: Arc<H>,
    subscriber: S,
    mut run: Run,
    n: usize,
) -> Result<(), Error> {
    let shared = Arc::new(Shared {
        subscriber: tokio::sync::Mutex::new(subscriber),
        ended: OnceLock::new(),
        leave: tokio::sync::Notify::new(),
    });
    // Dropping the set aborts the workers, so an aborted mount leaves none behind.
    let mut workers = JoinSet::new();
    for _ in 0..n {
        workers.spawn(work(handler.clone(), shared.clone(), run.clone()));
    }

    let mut died = None;
    let mut stopped = false;
    loop {
        tokio::select! {
            biased;
            joined = workers.join_next() => match joined {
                None => break,
                Some(Ok(())) => {}
                Some(Err(error)) => {
                    // The others take nothing more and finish what they run; the mount
                    // fails.
                    let error = task_error(&error, &run);
                    if died.is_none() {
                        shared.end(End::Stopped);
                        shared.leave.notify_waiters();
                    }
                    died.get_or_insert(error);
                }
            },
            () = run.shutdown.requested(), if !stopped => {
                stopped = true;
                // The worker waiting for a delivery lets go of the subscriber as it sees
                // the shutdown; the others finish their handlers meanwhile.
                shared.subscriber.lock().await.stop_receiving().await;
            }
        }
    }
    let Some(shared) = Arc::into_inner(shared) else {
        return Err(Error::MountTask(format!(
            "the workers of the mount on `{}` ended but still hold its subscriber",
            run.cx.queue()
        )));
    };
    let mut subscriber = shared.subscriber.into_inner();
    if !stopped {
        subscriber.stop_receiving().await;
    }
    let end = match (died, shared.ended.into_inner()) {
        (Some(error), _) => End::Failed(error),
        (None, Some(end)) => end,
        (None, None) => End::Stopped,
    };
    finish(subscriber, &run, end).await
}

/// One worker: takes the subscriber, receives, lets go, runs the handler; again until
/// shutdown, or until receiving has ended.
async fn work<H: CallOne, S: Subscriber>(handler: Arc<H>, shared: Arc<Shared<S>>, mut run: Run) {
    loop {
        let delivery = {
            // No wait for the shutdown beside the lock's: its holder lets go at shutdown
            // (a worker's receive returns, the mount's loop stops the subscriber), and
            // `receive` looks at the shutdown first, which sends each waiting worker
            // away in turn. The lock is fair, so busy workers queue for it and take it
            // in turns: a wait beside it was polled, and registered with the shutdown's
            // watch, at every delivery.
            let mut subscriber = shared.subscriber.lock().await;
            if shared.has_ended() {
                return;
            }
            // Polled once alone: when a delivery is ready, nothing more is made. Only a
            // receive that waits also waits for the call to leave.
            let receiving = receive(&mut *subscriber, &mut run);
            tokio::pin!(receiving);
            let first = std::future::poll_fn(|cx| Poll::Ready(receiving.as_mut().poll(cx))).await;
            let received = match first {
                Poll::Ready(received) => received,
                Poll::Pending => {
                    // Registered before the look, so a call to leave made in between is
                    // not missed.
                    let leave = shared.leave.notified();
                    tokio::pin!(leave);
                    leave.as_mut().enable();
                    if shared.has_ended() {
                        return;
                    }
                    tokio::select! {
                        biased;
                        received = &mut receiving => received,
                        () = leave => return,
                    }
                }
            };
            match received {
                Received::Delivery(delivery) => delivery,
                Received::Stop => return,
                other => return shared.end(other.into()),
            }
        };
        handle_one(
            &*handler,
            delivery,
            &run,
            Retries::ToBroker,
            Arrival::none(),
        )
        .await;
    }
}
