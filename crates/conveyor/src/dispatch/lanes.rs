//! `workers(n).by_key()`: `n` ordered lanes keyed by the partition key.
//!
//! Each lane is one long-lived task that runs its deliveries one at a time, in the order
//! the dispatcher handed them over. The dispatcher picks the lane by a stable hash of the
//! partition key, so one key never spreads over two lanes; keyless deliveries rotate.
//! When the chosen lane is full the dispatcher waits instead of passing another delivery
//! ahead, so nothing is reordered and read-ahead stays at `n` running, `n` waiting in
//! lanes and one in the dispatcher's hand. A lane retries a failed delivery in place
//! (`Retries::InPlace`), so a key keeps its order across retries.

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TrySendError;
use tokio::task::JoinSet;

use super::{
    End, Received, Retries, Run, finish, hand_over_lost, handle_one, join_tasks, receive,
    task_died, task_error,
};
use crate::delivery::Delivery;
use crate::error::Error;
use crate::handler::CallOne;
use crate::lanes_view::LaneStats;
use crate::mount::LANE_BUFFER;
use crate::transport::Subscriber;

/// The lane, out of `lanes`, that a partition key maps to.
///
/// The hash is 64-bit FNV-1a over the key's UTF-8 bytes: the same key maps to the same
/// lane in every process, run and version of Conveyor.
///
/// ```
/// use conveyor::dispatch::lane_for_key;
///
/// assert_eq!(lane_for_key("alice", 4), lane_for_key("alice", 4));
/// assert!(lane_for_key("bob", 4) < 4);
/// ```
pub fn lane_for_key(key: &str, lanes: usize) -> usize {
    lane_for_hash(key_hash(key), lanes)
}

/// The lane, out of `lanes`, of a key whose [`key_hash`] is `hash`.
fn lane_for_hash(hash: u64, lanes: usize) -> usize {
    (hash % lanes.max(1) as u64) as usize
}

/// 64-bit FNV-1a over the key's UTF-8 bytes.
pub(crate) fn key_hash(key: &str) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    key.bytes().fold(OFFSET, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(PRIME)
    })
}

pub(super) async fn drive<H: CallOne, S: Subscriber>(
    handler: Arc<H>,
    mut subscriber: S,
    mut run: Run,
    n: usize,
) -> Result<(), Error> {
    let mut lanes = Vec::with_capacity(n);
    let stats = run.status.lane_stats(n);
    // Dropping the set aborts the lanes, so an aborted mount leaves none behind.
    let mut tasks = JoinSet::new();
    for number in 0..n {
        let (lane, queue) = mpsc::channel::<Delivery>(LANE_BUFFER);
        lanes.push(lane);
        let lane = Lane {
            number,
            queue,
            stats: stats.clone(),
        };
        tasks.spawn(run_lane(handler.clone(), lane, run.clone()));
    }

    let mut rotation = 0usize;
    let end: End = loop {
        let received = tokio::select! {
            biased;
            received = receive(&mut subscriber, &mut run) => received,
            died = task_died(&mut tasks) => break End::Failed(task_error(&died, &run)),
        };
        let mut delivery = match received {
            Received::Delivery(delivery) => delivery,
            other => break other.into(),
        };
        delivery.note_arrival();
        let lane = match delivery.partition_key() {
            Some(key) => {
                let hash = key_hash(key);
                let lane = lane_for_hash(hash, n);
                stats.queued(Some(lane), Some((key, hash)));
                run.metrics.lane_queued(lane);
                lane
            }
            None => {
                rotation = rotation.wrapping_add(1);
                stats.queued(Some(rotation % n), None);
                run.metrics.lane_queued(rotation % n);
                rotation % n
            }
        };
        delivery.set_lane(lane);
        // A lane with room takes the delivery at once, without the shutdown's future
        // being made (see `receive`).
        let delivery = match lanes[lane].try_send(delivery) {
            Ok(()) => continue,
            Err(TrySendError::Full(delivery)) => delivery,
            Err(TrySendError::Closed(_)) => break hand_over_lost(&mut tasks, &run).await,
        };
        stats.waited_for_full_lane();
        // The delivery inside a dropped send is released.
        tokio::select! {
            biased;
            sent = lanes[lane].send(delivery) => if sent.is_err() {
                break hand_over_lost(&mut tasks, &run).await;
            },
            () = run.shutdown.requested() => break End::Stopped,
            died = task_died(&mut tasks) => break End::Failed(task_error(&died, &run)),
        }
    };
    drop(lanes);
    subscriber.stop_receiving().await;
    let joined = join_tasks(tasks, &run).await;
    stats.stopped();
    run.metrics.lanes_stopped();
    finish(subscriber, &run, end).await.and(joined)
}

/// One lane's end of the hand-over.
struct Lane {
    number: usize,
    queue: mpsc::Receiver<Delivery>,
    stats: Arc<LaneStats>,
}

/// One lane: runs its deliveries in order, each to its end, retries included, before the
/// next. At shutdown it starts no new one; those still waiting in it are released when
/// its queue is dropped.
async fn run_lane<H: CallOne>(handler: Arc<H>, lane: Lane, run: Run) {
    let Lane {
        number,
        mut queue,
        stats,
    } = lane;
    loop {
        // No wait on the shutdown here: the mount's loop sees it and drops the lanes'
        // senders, which ends this wait (polling the shutdown beside the queue cost about
        // 300 instructions per delivery). A shutdown is looked at once a delivery is taken.
        let Some(delivery) = queue.recv().await else {
            return;
        };
        // Shutdown came as it was taken: it goes back unstarted (the lane's queue, with
        // the rest of its keys' deliveries, goes back after it).
        if run.shutdown.is_requested() {
            return;
        }
        stats.started(number, false);
        run.metrics.lane_started(number);
        handle_one(&*handler, delivery, &run, Retries::InPlace).await;
        run.metrics.lane_finished(number);
        stats.finished(number);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_is_fnv1a_and_never_changes() {
        // Pinned values: a change here moves keys between lanes across a deploy.
        assert_eq!(
            lane_for_key("", 1_000_003),
            (0xcbf2_9ce4_8422_2325u64 % 1_000_003) as usize
        );
        assert_eq!(
            lane_for_key("a", u64::MAX as usize),
            0xaf63_dc4c_8601_ec8c_u64 as usize
        );
    }

    #[test]
    fn keys_spread_over_every_lane() {
        let mut seen = [0usize; 4];
        for i in 0..100 {
            seen[lane_for_key(&format!("key-{i}"), 4)] += 1;
        }
        assert!(seen.iter().all(|&count| count > 10), "{seen:?}");
    }
}
