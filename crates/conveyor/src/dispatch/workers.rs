//! `workers(n)`: up to `n` handlers at once, finishing in any order.
//!
//! `n` long-lived worker tasks share one hand-over queue. The dispatcher takes a permit
//! before it receives, and a worker returns it once the delivery is settled, so at most
//! `n` deliveries are ever out of the queue: while `n` are in flight, nothing more is
//! read.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

use super::{
    End, Received, Retries, Run, finish, hand_over_lost, handle_one, join_tasks, receive,
    task_died, task_error,
};
use crate::delivery::Delivery;
use crate::error::Error;
use crate::handler::CallOne;
use crate::support;
use crate::transport::Subscriber;

type Job = (Delivery, OwnedSemaphorePermit);

/// Deliveries handed to the workers. Unbounded as a queue, bounded by the permits: the
/// dispatcher holds one for each delivery it puts here. (A plain queue and a `Notify`:
/// sharing one receiver of a channel among the workers would take an async lock, held
/// across the wait, for every delivery.) What is left in it when it is dropped, at
/// shutdown, is released.
#[derive(Default)]
struct HandOver {
    jobs: Mutex<VecDeque<Job>>,
    added: Notify,
}

impl HandOver {
    fn push(&self, job: Job) {
        support::lock(&self.jobs).push_back(job);
        self.added.notify_one();
    }

    async fn next(&self) -> Job {
        support::wait_for(&self.added, || support::lock(&self.jobs).pop_front()).await
    }
}

pub(super) async fn drive<H: CallOne, S: Subscriber>(
    handler: Arc<H>,
    mut subscriber: S,
    mut run: Run,
    n: usize,
) -> Result<(), Error> {
    let permits = Arc::new(Semaphore::new(n));
    let hand_over = Arc::new(HandOver::default());
    // Dropping the set aborts the workers, so an aborted mount leaves none behind.
    let mut workers = JoinSet::new();
    for _ in 0..n {
        workers.spawn(work(handler.clone(), hand_over.clone(), run.clone()));
    }

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
        // Room is guaranteed by the permit. Once every worker has left (each holds the
        // queue until it ends: at shutdown, or dead) nobody would take the delivery: it is
        // released, and the mount ends with the workers' fate.
        if Arc::strong_count(&hand_over) == 1 {
            drop(delivery);
            break hand_over_lost(&mut workers, &run).await;
        }
        hand_over.push((delivery, permit));
    };
    drop(hand_over);
    subscriber.stop_receiving().await;
    let joined = join_tasks(workers, &run).await;
    finish(subscriber, &run, end).await.and(joined)
}

/// One worker: takes the next delivery, runs it, returns the permit. At shutdown it takes
/// no new delivery; those left in the channel are released when it is dropped.
async fn work<H: CallOne>(handler: Arc<H>, jobs: Arc<HandOver>, mut run: Run) {
    loop {
        let (delivery, permit) = tokio::select! {
            biased;
            () = run.shutdown.requested() => return,
            job = jobs.next() => job,
        };
        handle_one(&*handler, delivery, &run, Retries::ToBroker).await;
        drop(permit);
    }
}
