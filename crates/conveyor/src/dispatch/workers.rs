//! `workers(n)`: up to `n` handlers at once, finishing in any order.
//!
//! `n` long-lived worker tasks share one hand-over channel. The dispatcher takes a permit
//! before it receives, and a worker returns it once the delivery is settled, so at most
//! `n` deliveries are ever out of the queue: while `n` are in flight, nothing more is
//! read.

use std::sync::Arc;

use tokio::sync::{Mutex, OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::task::JoinSet;

use super::{Received, Run, finish, handle_one, receive};
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

    let ended = loop {
        let permit = tokio::select! {
            biased;
            () = run.shutdown.requested() => break false,
            permit = permits.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break false, // never closed; stop rather than spin
            },
        };
        match receive(&mut subscriber, &mut run).await {
            Received::Delivery(delivery) => {
                // Room is guaranteed: the channel holds `n` and we hold one of `n` permits.
                if hand_over.send((delivery, permit)).await.is_err() {
                    break false;
                }
            }
            Received::Stop => break false,
            Received::Ended => break true,
        }
    };
    drop(hand_over);
    while workers.join_next().await.is_some() {}
    finish(subscriber, &run, ended).await
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
        handle_one(&*handler, delivery, &run).await;
        drop(permit);
    }
}
