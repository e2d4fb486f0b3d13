//! `workers(n).by_key().any_worker()`: each key in order, but on whichever worker is free.
//!
//! Lanes tie a key to one lane by a hash, so the busiest lane caps the mount: with 64
//! keys over 16 lanes, one lane holds 6 keys while another holds 2. Here no key is tied to
//! a worker. The dispatcher reads ahead, up to `read_ahead` deliveries, onto a [`Board`];
//! a free worker takes the oldest delivery on it whose key has nothing running. So a key
//! still runs one delivery at a time, in arrival order, retries included (a worker retries
//! in place, holding the key), while the keys spread over the workers as evenly as their
//! traffic allows. Keyless deliveries run on any worker, in no order.
//!
//! Bounds: the mount holds at most `read_ahead` deliveries, the one in the dispatcher's
//! hand included. One key may hold at most `read_ahead - n` on the board (at least one),
//! so with the dispatcher's hand there is always room for the other `n - 1` workers'
//! keys. When the next delivery belongs to a key at that bound, the dispatcher waits for
//! the key: a queue hands deliveries over in order, and nothing behind it can be taken
//! without holding it. So a key that arrives faster than one worker can run it still
//! slows the mount down to its pace; it just cannot take the whole window. The board
//! keeps state only for the keys it holds: a key's entry goes once its last delivery has
//! run, so memory follows what is held, never the key space.

use std::cmp::Ordering;
use std::collections::hash_map::Entry;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;
use tokio::task::JoinSet;

use super::{
    End, PREALLOCATED_MAX, Received, Retries, Run, finish, handle_one, join_tasks, lanes::key_hash,
    receive, task_died, task_error,
};
use crate::delivery::Delivery;
use crate::error::Error;
use crate::handler::CallOne;
use crate::kit;
use crate::lanes_view::LaneStats;
use crate::telemetry::Arrival;
use crate::transport::Subscriber;

/// The read-ahead of `any_worker()` when the mount sets none: four deliveries per worker,
/// enough that `n` workers nearly always find `n` distinct keys to run.
pub const DEFAULT_READ_AHEAD_PER_WORKER: usize = 4;

/// A key as the board tells keys apart: its hash folded to 32 bits. Two keys whose
/// hashes collide only share their turn, so order holds. Four bytes, with the arrival
/// number's four, keep a ticket within 128 bytes, the most the compiler moves without a
/// call to `memcpy`: the board moves a ticket several times per delivery.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct Key(NonZeroU32);

impl Key {
    fn of(hash: u64) -> Key {
        // The high half into the low; truncating is the point.
        let folded = (hash ^ (hash >> 32)) as u32;
        Key(NonZeroU32::new(folded).unwrap_or(NonZeroU32::MAX))
    }
}

/// A held item and its place in arrival order.
struct Ticket<T> {
    /// Arrival number, wrapping: of two tickets, the older is the one the other is ahead
    /// of by less than half the range (see `Ord`).
    seq: u32,
    key: Option<Key>,
    item: T,
}

/// Orders the ready heap oldest first (`BinaryHeap` is a max-heap). Arrival numbers wrap:
/// compared by their distance, tickets on the board at once order correctly while fewer
/// than 2^31 arrivals separate them. An item held longer than that behind its key (a
/// handler running for days while others run billions) may then start after newer ones
/// of other keys: its own key's order still holds.
impl<T> Ord for Ticket<T> {
    fn cmp(&self, other: &Self) -> Ordering {
        // Reinterpreting the distance as signed is the point.
        (other.seq.wrapping_sub(self.seq) as i32).cmp(&0)
    }
}

impl<T> PartialOrd for Ticket<T> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<T> PartialEq for Ticket<T> {
    fn eq(&self, other: &Self) -> bool {
        self.seq == other.seq
    }
}

impl<T> Eq for Ticket<T> {}

/// What the board holds, under its lock.
struct Held<T> {
    /// Items that may start now: keyless ones, and the oldest held item of each key that
    /// has nothing running.
    ready: BinaryHeap<Ticket<T>>,
    /// For each held key, its items behind the one that is ready or running.
    behind: HashMap<Key, VecDeque<Ticket<T>>>,
    /// Items on the board or running.
    held: usize,
    next_seq: u32,
    /// Once released, the board takes nothing more.
    released: bool,
}

/// The deliveries the dispatcher has read ahead and the workers have not finished.
/// Generic over the item so that its rules can be tested without a broker.
pub(super) struct Board<T> {
    held: Mutex<Held<T>>,
    read_ahead: usize,
    per_key: usize,
    /// An item became ready: a worker may start it.
    ready: Notify,
    /// An item finished: the dispatcher may read another.
    settled: Notify,
}

/// What a worker takes off the board: the item, and the key to give back when done.
pub(super) struct Turn<T> {
    pub(super) item: T,
    key: Option<Key>,
}

impl<T> Board<T> {
    pub(super) fn new(workers: usize, read_ahead: usize) -> Self {
        let read_ahead = read_ahead.max(workers).max(1);
        Board {
            held: Mutex::new(Held {
                ready: BinaryHeap::with_capacity(read_ahead.min(PREALLOCATED_MAX)),
                behind: HashMap::new(),
                held: 0,
                next_seq: 0,
                released: false,
            }),
            read_ahead,
            per_key: read_ahead.saturating_sub(workers).max(1),
            ready: Notify::new(),
            settled: Notify::new(),
        }
    }

    /// Resolves once the board has room for one more item.
    pub(super) async fn room(&self) {
        kit::wait_for(&self.settled, || {
            (kit::lock(&self.held).held < self.read_ahead).then_some(())
        })
        .await;
    }

    /// Resolves once `key` holds fewer items than one key may.
    pub(super) async fn room_for_key(&self, key: u64) {
        kit::wait_for(&self.settled, || self.has_room_for(key).then_some(())).await;
    }

    /// Whether `key` holds fewer items than one key may.
    pub(super) fn has_room_for(&self, key: u64) -> bool {
        let key = Key::of(key);
        let held = kit::lock(&self.held);
        let of_key = held.behind.get(&key).map_or(0, |behind| behind.len() + 1);
        of_key < self.per_key
    }

    /// Puts an item on the board. Call after [`room`](Self::room) and, for a key,
    /// [`room_for_key`](Self::room_for_key). On a released board the item is handed back.
    pub(super) fn add(&self, key: Option<u64>, item: T) -> Result<(), T> {
        let mut held = kit::lock(&self.held);
        if held.released {
            return Err(item);
        }
        let seq = held.next_seq;
        held.next_seq = seq.wrapping_add(1);
        held.held = held.held.saturating_add(1);
        let key = key.map(Key::of);
        let ticket = Ticket { seq, key, item };
        if let Some(key) = key {
            match held.behind.entry(key) {
                // The key has an item ready or running: this one waits behind it.
                Entry::Occupied(mut behind) => {
                    behind.get_mut().push_back(ticket);
                    return Ok(());
                }
                Entry::Vacant(slot) => {
                    slot.insert(VecDeque::new());
                }
            }
        }
        held.ready.push(ticket);
        drop(held);
        self.ready.notify_one();
        Ok(())
    }

    /// Waits for the oldest ready item and takes it; its key runs nothing else until
    /// [`done`](Self::done). `None` once the board is released: the worker leaves.
    pub(super) async fn next(&self) -> Option<Turn<T>> {
        kit::wait_for(&self.ready, || {
            let mut held = kit::lock(&self.held);
            match held.ready.pop() {
                Some(ticket) => Some(Some(Turn {
                    item: ticket.item,
                    key: ticket.key,
                })),
                None if held.released => Some(None),
                None => None,
            }
        })
        .await
    }

    /// A worker finished an item of `key`: the key's next item, if any, becomes ready;
    /// a key with nothing left leaves the board. Once the board is released, the key's
    /// waiting items come back instead, in order, for the caller to let go of: only now
    /// that the item before them is settled, so that the key keeps its order.
    #[must_use = "the items handed back are released when dropped"]
    pub(super) fn done(&self, key: Option<Key>) -> Vec<T> {
        let mut held = kit::lock(&self.held);
        held.held = held.held.saturating_sub(1);
        let mut woke = false;
        let mut handed_back = Vec::new();
        if let Some(key) = key {
            if held.released {
                if let Some(behind) = held.behind.remove(&key) {
                    held.held = held.held.saturating_sub(behind.len());
                    handed_back.extend(behind.into_iter().map(|ticket| ticket.item));
                }
            } else {
                match held.behind.get_mut(&key).map(VecDeque::pop_front) {
                    Some(Some(next)) => {
                        held.ready.push(next);
                        woke = true;
                    }
                    Some(None) => {
                        held.behind.remove(&key);
                    }
                    None => {}
                }
            }
        }
        drop(held);
        if woke {
            self.ready.notify_one();
        }
        self.settled.notify_one();
        handed_back
    }

    /// Closes the board and takes off it, oldest first, every item whose key has nothing
    /// running. The items waiting behind a running one stay until it is
    /// [`done`](Self::done): given back before it settles, another consumer could run them
    /// first.
    pub(super) fn release(&self) -> Vec<T> {
        let mut held = kit::lock(&self.held);
        held.released = true;
        let ready: Vec<Ticket<T>> = held.ready.drain().collect();
        let mut tickets = Vec::with_capacity(ready.len());
        for ticket in ready {
            if let Some(behind) = ticket.key.and_then(|key| held.behind.remove(&key)) {
                tickets.extend(behind);
            }
            tickets.push(ticket);
        }
        held.held = held.held.saturating_sub(tickets.len());
        drop(held);
        // Every waiting worker leaves.
        self.ready.notify_waiters();
        // Oldest first: the greatest first, by `Ticket`'s order.
        tickets.sort_unstable_by(|a, b| b.cmp(a));
        tickets.into_iter().map(|ticket| ticket.item).collect()
    }

    /// How many keys the board keeps state for.
    #[cfg(test)]
    fn keys(&self) -> usize {
        kit::lock(&self.held).behind.len()
    }
}

pub(super) async fn drive<H: CallOne, S: Subscriber>(
    handler: Arc<H>,
    mut subscriber: S,
    mut run: Run,
    n: usize,
    read_ahead: usize,
) -> Result<(), Error> {
    let board = Arc::new(Board::new(n, read_ahead));
    let stats = run.status.lane_stats(n);
    // Dropping the set aborts the workers, so an aborted mount leaves none behind.
    let mut workers = JoinSet::new();
    for index in 0..n {
        let worker = Worker {
            index,
            board: board.clone(),
            stats: stats.clone(),
        };
        workers.spawn(work(handler.clone(), worker, run.clone()));
    }

    // A delivery the dispatcher holds, waiting for its key's room, when the loop ends:
    // it came last of its key, so it goes back after the key's others.
    let mut in_hand = None;
    let end: End = loop {
        // Room first: when there is some, the shutdown's future is never made (`receive`
        // looks at the shutdown before each delivery).
        tokio::select! {
            biased;
            () = board.room() => {}
            () = run.shutdown.requested() => break End::Stopped,
            died = task_died(&mut workers) => break End::Failed(task_error(&died, &run)),
        }
        let received = tokio::select! {
            biased;
            received = receive(&mut subscriber, &mut run) => received,
            died = task_died(&mut workers) => break End::Failed(task_error(&died, &run)),
        };
        let mut delivery = match received {
            Received::Delivery(delivery) => delivery,
            other => break other.into(),
        };
        delivery.note_arrival();
        let key = delivery.partition_key().map(|key| (key, key_hash(key)));
        stats.queued(None, key);
        let key = key.map(|(_, hash)| hash);
        // A key holding all it may: the mount waits for it (the hot-key case).
        if let Some(key) = key.filter(|&key| !board.has_room_for(key)) {
            stats.waited_for_full_lane();
            // The delivery in hand is released if shutdown or a dead worker ends the wait.
            tokio::select! {
                biased;
                () = board.room_for_key(key) => {}
                () = run.shutdown.requested() => {
                    in_hand = Some((key, delivery));
                    break End::Stopped;
                }
                died = task_died(&mut workers) => {
                    in_hand = Some((key, delivery));
                    break End::Failed(task_error(&died, &run));
                }
            }
        }
        if board.add(key, delivery).is_err() {
            break End::Stopped;
        }
    };
    // The delivery in hand joins its key's others on the board, so it keeps its place.
    if let Some((key, delivery)) = in_hand {
        drop(board.add(Some(key), delivery));
    }
    // What has not started goes back at once, oldest first, while running handlers finish;
    // what waits behind a running one goes back as that one ends.
    drop(board.release());
    subscriber.stop_receiving().await;
    let joined = join_tasks(workers, &run).await;
    stats.stopped();
    finish(subscriber, &run, end).await.and(joined)
}

/// One worker's share of the mount.
struct Worker {
    index: usize,
    board: Arc<Board<Delivery>>,
    stats: Arc<LaneStats>,
}

/// One worker: takes the oldest ready delivery, runs it to its end (retries in place
/// included), then gives its key back. At shutdown, or once the mount has released the
/// board (it is ending), it takes no new one.
async fn work<H: CallOne>(handler: Arc<H>, worker: Worker, run: Run) {
    let Worker {
        index,
        board,
        stats,
    } = worker;
    loop {
        // No wait on the shutdown here: the mount's loop sees it and releases the board,
        // which ends this wait (see `run_lane` in `lanes`). A shutdown is looked at once a
        // turn is taken.
        let Some(mut turn) = board.next().await else {
            return;
        };
        // Shutdown came as the turn was taken: it goes back unstarted, then its key's rest.
        if run.shutdown.is_requested() {
            let key = turn.key;
            drop(turn);
            drop(board.done(key));
            return;
        }
        turn.item.set_lane(index);
        stats.started(index, true);
        handle_one(
            &*handler,
            turn.item,
            &run,
            Retries::InPlace,
            Arrival::none(),
        )
        .await;
        stats.finished(index);
        drop(board.done(turn.key));
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Poll};

    use super::*;

    /// Whether `future` is ready at its first poll.
    fn ready_now(future: impl Future<Output = ()>) -> bool {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        pin!(future).poll(&mut cx).is_ready()
    }

    fn key(hash: u64) -> Option<Key> {
        Some(Key::of(hash))
    }

    fn take(board: &Board<u32>) -> Option<(u32, Option<Key>)> {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        match pin!(board.next()).poll(&mut cx) {
            Poll::Ready(Some(turn)) => Some((turn.item, turn.key)),
            Poll::Ready(None) | Poll::Pending => None,
        }
    }

    #[test]
    fn a_key_runs_one_item_at_a_time_in_arrival_order() {
        let board = Board::new(4, 16);
        for (item, key) in [(1, 7), (2, 7), (3, 8), (4, 7)] {
            assert!(board.add(Some(key), item).is_ok());
        }
        // Key 7's first and key 8's first are ready; key 7's others wait behind.
        assert_eq!(take(&board), Some((1, key(7))));
        assert_eq!(take(&board), Some((3, key(8))));
        assert_eq!(take(&board), None, "key 7 is running");
        assert!(board.done(key(7)).is_empty());
        assert_eq!(take(&board), Some((2, key(7))));
        assert!(board.done(key(7)).is_empty());
        assert_eq!(take(&board), Some((4, key(7))));
    }

    #[test]
    fn a_free_worker_takes_the_oldest_ready_item() {
        let board = Board::new(4, 16);
        assert!(board.add(Some(1), 10).is_ok());
        assert!(board.add(Some(1), 11).is_ok());
        assert!(board.add(Some(2), 20).is_ok());
        assert!(board.add(None, 30).is_ok());
        assert_eq!(take(&board), Some((10, key(1))));
        assert!(board.done(key(1)).is_empty());
        // Item 11 arrived before 20 and 30, and its key is free again.
        assert_eq!(take(&board), Some((11, key(1))));
        assert_eq!(take(&board), Some((20, key(2))));
        assert_eq!(take(&board), Some((30, None)));
    }

    #[test]
    fn the_oldest_ready_item_goes_first_across_the_arrival_numbers_wrapping() {
        let board = Board::new(4, 16);
        kit::lock(&board.held).next_seq = u32::MAX - 1;
        for item in 0..4 {
            assert!(board.add(None, item).is_ok());
        }
        for item in 0..4 {
            assert_eq!(take(&board), Some((item, None)));
        }
        // And at release, oldest first too.
        for item in 4..8 {
            assert!(board.add(None, item).is_ok());
        }
        assert_eq!(board.release(), [4, 5, 6, 7]);
    }

    #[test]
    fn keys_whose_hashes_fold_to_the_same_32_bits_share_a_turn() {
        let board = Board::new(4, 16);
        assert!(board.add(Some(7), 1).is_ok());
        // 6 in the low half, 1 in the high: folded, 7.
        assert!(board.add(Some(1 << 32 | 6), 2).is_ok());
        assert!(board.add(Some(8), 3).is_ok());
        assert_eq!(take(&board), Some((1, key(7))));
        assert_eq!(take(&board), Some((3, key(8))), "2 shares 7's turn");
    }

    #[test]
    fn read_ahead_bounds_what_the_board_holds() {
        let board = Board::new(2, 3);
        for item in 0..3 {
            assert!(ready_now(board.room()));
            assert!(board.add(None, item).is_ok());
        }
        assert!(!ready_now(board.room()), "three held of three");
        assert_eq!(take(&board), Some((0, None)));
        assert!(!ready_now(board.room()), "a running item is still held");
        assert!(board.done(None).is_empty());
        assert!(ready_now(board.room()));
    }

    #[test]
    fn a_hot_key_leaves_room_for_a_key_per_other_worker() {
        // 4 workers, 8 held: one key may hold 8 - 4 = 4 on the board.
        let board = Board::new(4, 8);
        for item in 0..4 {
            assert!(ready_now(board.room_for_key(1)));
            assert!(board.add(Some(1), item).is_ok());
        }
        assert!(
            !ready_now(board.room_for_key(1)),
            "the hot key is at its bound"
        );
        assert!(
            ready_now(board.room_for_key(2)),
            "another key still has room"
        );
        assert_eq!(take(&board), Some((0, key(1))));
        assert!(board.done(key(1)).is_empty());
        assert!(ready_now(board.room_for_key(1)));
    }

    #[test]
    fn the_board_keeps_no_state_for_keys_it_no_longer_holds() {
        let board = Board::new(2, 1_000);
        for item in 0..1_000u32 {
            assert!(board.add(Some(u64::from(item % 100)), item).is_ok());
        }
        assert_eq!(board.keys(), 100);
        while let Some((_, key)) = take(&board) {
            assert!(board.done(key).is_empty());
        }
        assert_eq!(board.keys(), 0);
    }

    #[test]
    fn release_hands_back_unstarted_keys_at_once_and_a_running_keys_rest_when_it_ends() {
        let board = Board::new(2, 16);
        for (item, key) in [(1, Some(5)), (2, None), (3, Some(5)), (4, Some(6))] {
            assert!(board.add(key, item).is_ok());
        }
        assert_eq!(take(&board), Some((1, key(5))));
        // Item 3 waits behind the running 1 of its key: it goes back only once 1 is done.
        assert_eq!(board.release(), [2, 4]);
        assert_eq!(board.add(None, 9), Err(9));
        assert_eq!(board.done(key(5)), [3]);
        assert_eq!(take(&board), None);
    }
}
