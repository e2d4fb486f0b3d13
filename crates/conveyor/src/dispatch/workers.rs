//! `workers(n)`: up to `n` handlers at once, finishing in any order.
//!
//! `n` long-lived worker tasks share one hand-over channel. The dispatcher takes a permit
//! before it receives, and a worker returns it once the delivery is settled, so at most
//! `n` deliveries are ever out of the queue: while `n` are in flight, nothing more is
//! read.

use std::sync::Arc;

use tokio::sync::{Mutex, OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::task::JoinSet;

use super::{
    End, Received, Retries, Run, finish, hand_over_lost, handle_one, join_tasks, receive,
    task_died, task_error,
};
use crate::delivery::Delivery;
use crate::error::Error;
use crate::handler::CallOne;
use crate::transport::Subscriber;

type Job = (Delivery, OwnedSemaphorePermit);

pub(super) async fn drive<H: CallOne, S: Subscriber>(
    handler: Arc<H>,
    mut subscriber: S,
    mut run: Run,
    n: usize,
) -> Result<(), Error> {
    let permits = Arc::new(Semaphore::new(n));
    let (hand_over, jobs) = mpsc::channel::<Job>(n);
    let jobs = Arc::new(Mutex::new(jobs));
    // Dropping the set aborts the workers, so an aborted mount leaves none behind.
    let mut workers = JoinSet::new();
    for _ in 0..n {
        workers.spawn(work(handler.clone(), jobs.clone(), run.clone()));
    }
    drop(jobs);

    let end: End = loop {
        let permit = tokio::select! {
            biased;
            () = run.shutdown.requested() => break End::Stopped,
            permit = permits.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break End::Stopped, // never closed; stop rather than spin
            },
            died = task_died(&mut workers) => break End::Failed(task_error(&died, &run)),
        };
        let received = tokio::select! {
            biased;
            received = receive(&mut subscriber, &mut run) => received,
            died = task_died(&mut workers) => break End::Failed(task_error(&died, &run)),
        };
        let delivery = match received {
            Received::Delivery(delivery) => delivery,
            other => break other.into(),
        };
        // Room is guaranteed: the channel holds `n` and we hold one of `n` permits. The
        // send fails only once every worker has left (at shutdown, or dead); the delivery
        // inside the error is released.
        if hand_over.send((delivery, permit)).await.is_err() {
            break hand_over_lost(&mut workers, &run).await;
        }
    };
    drop(hand_over);
    subscriber.stop_receiving().await;
    let joined = join_tasks(workers, &run).await;
    finish(subscriber, &run, end).await.and(joined)
}

/// One worker: takes the next delivery, runs it, returns the permit. At shutdown it takes
/// no new delivery; those left in the channel are released when it is dropped.
async fn work<H: CallOne>(handler: Arc<H>, jobs: Arc<Mutex<mpsc::Receiver<Job>>>, mut run: Run) {
    loop {
        let job = tokio::select! {
            biased;
            () = run.shutdown.requested() => return,
            job = async { jobs.lock().await.recv().await } => job,
        };
        let Some((delivery, permit)) = job else {
            return;
        };
        handle_one(&*handler, delivery, &run, Retries::ToBroker).await;
        drop(permit);
    }
}
