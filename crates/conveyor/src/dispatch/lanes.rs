//! `workers(n).by_key()`: `n` ordered lanes keyed by the partition key.
//!
//! Each lane is one long-lived task that runs its deliveries one at a time, in the order
//! the dispatcher handed them over. The dispatcher picks the lane by a stable hash of the
//! partition key, so one key never spreads over two lanes; keyless deliveries rotate.
//! When the chosen lane is full the dispatcher waits instead of passing another delivery
//! ahead, so nothing is reordered and read-ahead stays at `n` running, `n` waiting in
//! lanes and one in the dispatcher's hand. A lane retries a failed delivery in place
//! (`Retries::InPlace`), so a key keeps its order across retries.
//!
//! At shutdown each lane hands back at once what waits in it, and the delivery the
//! dispatcher held for it, except what waits behind the lane's running delivery of the
//! same key: that goes back, in order, once the running one is settled, so no other
//! consumer can run it first.

use std::pin::pin;
use std::sync::Arc;

use futures_util::FutureExt;
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{mpsc, oneshot};
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
use crate::telemetry::{Arrival, LaneMetrics};
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

/// What the dispatcher hands a lane: a delivery, its key's [`key_hash`] (`None` for a
/// keyless one), which the lane keeps while it runs the delivery, to tell at shutdown what
/// waits behind it, and when the dispatcher took it in (for the wait metric).
type Handed = (Delivery, Option<u64>, Arrival);

pub(super) async fn drive<H: CallOne, S: Subscriber>(
    handler: Arc<H>,
    mut subscriber: S,
    mut run: Run,
    n: usize,
) -> Result<(), Error> {
    let mut lanes = Vec::with_capacity(n);
    let mut drains = Vec::with_capacity(n);
    let stats = run.status.lane_stats(n);
    // Dropping the set aborts the lanes, so an aborted mount leaves none behind.
    let mut tasks = JoinSet::new();
    for number in 0..n {
        let (lane, queue) = mpsc::channel::<Handed>(LANE_BUFFER);
        let (drain, drained) = oneshot::channel();
        lanes.push(lane);
        drains.push(drain);
        let lane = Lane {
            number,
            queue,
            drain: drained,
            stats: stats.clone(),
            metrics: run.metrics.lane(number),
        };
        tasks.spawn(run_lane(handler.clone(), lane, run.clone()));
    }

    let mut rotation = 0usize;
    // The delivery the dispatcher holds for a full lane when the loop ends, and its lane.
    let mut in_hand = None;
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
        let arrival = Arrival::now();
        let (lane, hash) = match delivery.partition_key() {
            Some(key) => {
                let hash = key_hash(key);
                let lane = lane_for_hash(hash, n);
                stats.queued(Some(lane), Some((key, hash)));
                run.metrics.lane_queued(lane);
                (lane, Some(hash))
            }
            None => {
                rotation = rotation.wrapping_add(1);
                stats.queued(Some(rotation % n), None);
                run.metrics.lane_queued(rotation % n);
                (rotation % n, None)
            }
        };
        delivery.set_lane(lane);
        // A lane with room takes the delivery at once, without the shutdown's future
        // being made (see `receive`).
        let handed = match lanes[lane].try_send((delivery, hash, arrival)) {
            Ok(()) => continue,
            Err(TrySendError::Full(handed)) => handed,
            Err(TrySendError::Closed(_)) => break hand_over_lost(&mut tasks, &run).await,
        };
        stats.waited_for_full_lane();
        // The delivery stays in hand while the lane has no room: should shutdown end the
        // wait, it goes to its lane's drain, behind what the lane holds (see below).
        tokio::select! {
            biased;
            permit = lanes[lane].reserve() => match permit {
                Ok(permit) => permit.send(handed),
                Err(_) => break hand_over_lost(&mut tasks, &run).await,
            },
            () = run.shutdown.requested() => {
                in_hand = Some((lane, handed));
                break End::Stopped;
            }
            died = task_died(&mut tasks) => {
                in_hand = Some((lane, handed));
                break End::Failed(task_error(&died, &run));
            }
        }
    };
    drop(lanes);
    // At shutdown the lanes learn it at once, even with a handler running (see
    // `run_lane`); the delivery in hand goes to its lane, to go back in its key's order.
    let drain = Drain { drains, in_hand };
    let drain = if run.shutdown.is_requested() {
        drain.send();
        None
    } else {
        Some(drain)
    };
    subscriber.stop_receiving().await;
    // The mount ended without a shutdown (its subscription ended, a lane died): the lanes
    // run what they hold, unless shutdown comes meanwhile.
    let joining = join_tasks(tasks, &run);
    tokio::pin!(joining);
    let joined = match drain {
        None => joining.await,
        Some(drain) => {
            let mut shutdown = run.shutdown.clone();
            tokio::select! {
                biased;
                joined = &mut joining => joined,
                () = shutdown.requested() => {
                    drain.send();
                    joining.await
                }
            }
        }
    };
    stats.stopped();
    run.metrics.lanes_stopped();
    finish(subscriber, &run, end).await.and(joined)
}

/// How the mount tells its lanes that it is draining.
struct Drain {
    /// One per lane, in lane order.
    drains: Vec<oneshot::Sender<Option<Handed>>>,
    /// The delivery the dispatcher held for a full lane, and that lane.
    in_hand: Option<(usize, Handed)>,
}

impl Drain {
    /// Tells every lane, handing the delivery in hand to its lane. A lane that has ended
    /// already refuses it: it goes back now, after what that lane held.
    fn send(self) {
        let Drain {
            drains,
            mut in_hand,
        } = self;
        for (number, drain) in drains.into_iter().enumerate() {
            let handed = in_hand
                .take_if(|(lane, _)| *lane == number)
                .map(|(_, handed)| handed);
            drop(drain.send(handed));
        }
    }
}

/// One lane's end of the hand-over.
struct Lane {
    number: usize,
    queue: mpsc::Receiver<Handed>,
    /// Resolves once the mount drains, with the delivery the dispatcher held for this
    /// lane, if any: it came after everything in `queue`.
    drain: oneshot::Receiver<Option<Handed>>,
    stats: Arc<LaneStats>,
    /// The lane's own metric series.
    metrics: LaneMetrics,
}

/// One lane: runs its deliveries in order, each to its end, retries included, before the
/// next. At shutdown it starts no new one. What waits in it then goes back at once, unless
/// it waits behind the running delivery's key: that goes back, in order, once the running
/// one is settled.
async fn run_lane<H: CallOne>(handler: Arc<H>, lane: Lane, run: Run) {
    let Lane {
        number,
        mut queue,
        mut drain,
        stats,
        metrics,
    } = lane;
    loop {
        // No wait on the shutdown here: the mount's loop sees it and drops the lanes'
        // senders, which ends this wait (polling the shutdown beside the queue cost about
        // 300 instructions per delivery). A shutdown is looked at once a delivery is taken.
        let Some((delivery, key, arrival)) = queue.recv().await else {
            break;
        };
        // Shutdown came as it was taken: nothing of this lane's keys runs, so it goes back
        // unstarted, then the rest of the lane's queue and what was held for it (below).
        if run.shutdown.is_requested() {
            drop(delivery);
            break;
        }
        stats.started(number, false);
        metrics.started();
        let mut handling = pin!(handle_one(
            &*handler,
            delivery,
            &run,
            Retries::InPlace,
            arrival
        ));
        // A handler that finishes at its first poll never meets the drain; one that waits
        // is polled again beside it, with the task's waker, and waiting on the drain costs
        // no lock (a oneshot, unlike the shutdown's watch).
        let behind = match (&mut handling).now_or_never() {
            Some(()) => None,
            None => tokio::select! {
                biased;
                () = &mut handling => None,
                held = &mut drain => {
                    let behind = hold_behind(&mut queue, held.ok().flatten(), key);
                    handling.await;
                    Some(behind)
                }
            },
        };
        metrics.finished();
        stats.finished(number);
        if let Some(behind) = behind {
            // The delivery before them is settled: they go back now, in order.
            drop(behind);
            return;
        }
    }
    // In order: what waited in the lane, then what the dispatcher held for it.
    drop(queue);
    drop(drain);
}

/// At drain, with a delivery of key `running` still running: takes what waits in the lane
/// and what the dispatcher held for it (`in_hand`, the last to arrive), releases at once
/// each whose key is not `running`'s, and returns the others, in order, to release once
/// the running one is settled. Keys whose hashes collide only wait for each other.
fn hold_behind(
    queue: &mut mpsc::Receiver<Handed>,
    in_hand: Option<Handed>,
    running: Option<u64>,
) -> Vec<Delivery> {
    let mut behind = Vec::new();
    let waiting = std::iter::from_fn(|| queue.try_recv().ok()).chain(in_hand);
    for (delivery, key, _) in waiting {
        if running.is_some() && key == running {
            behind.push(delivery);
        } else {
            drop(delivery);
        }
    }
    behind
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
