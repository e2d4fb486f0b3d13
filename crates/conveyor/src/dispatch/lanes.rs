//! `workers(n).by_key()`: `n` ordered lanes keyed by the partition key.
//!
//! A lane runs its deliveries one at a time, in the order the dispatcher took them. The
//! dispatcher picks the lane by a stable hash of the partition key, so one key never
//! spreads over two lanes; keyless deliveries rotate. When the chosen lane is full the
//! dispatcher waits instead of passing another delivery ahead, so nothing is reordered
//! and read-ahead stays at `n` running, `n` waiting in lanes and one in the dispatcher's
//! hand. A lane retries a failed delivery in place (`Retries::InPlace`), so a key keeps
//! its order across retries.
//!
//! The lanes run on the mount's own task, as futures side by side (see [`LaneSet`]): a
//! delivery starts the moment its lane is free and is polled at once, so a handler that
//! finishes without waiting costs no hand-over to another task and no wake-up of another
//! thread; one that waits is polled again when its own waker fires, and only its lane is.
//! The lanes' handlers wait side by side (for I/O, timers, retries), while the code they
//! run between waits runs on one thread at a time: CPU-heavy work belongs in
//! `tokio::task::spawn_blocking`, as anywhere in async code.
//!
//! At shutdown each lane hands back at once what waits in it, and the delivery the
//! dispatcher held for it, except what waits behind the lane's running delivery of the
//! same key: that goes back, in order, once the running one is settled, so no other
//! consumer can run it first.

use std::any::Any;
use std::collections::VecDeque;
use std::future::{Future, poll_fn};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

use futures_util::task::AtomicWaker;

use super::{End, Received, Retries, Run, finish, handle_one, receive};
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
    let stats = run.status.lane_stats(n);
    // What the lanes' handlers borrow, while each receive borrows `run` itself.
    let lanes_run = run.clone();
    let handler = &*handler;
    let metrics = (0..n).map(|lane| run.metrics.lane(lane)).collect();
    let mut lanes = LaneSet::new(
        |delivery, arrival| handle_one(handler, delivery, &lanes_run, Retries::InPlace, arrival),
        stats.clone(),
        metrics,
        &lanes_run,
    );

    let mut rotation = 0usize;
    // The delivery the dispatcher holds for a full lane when shutdown comes, and its lane.
    let mut in_hand = None;
    let end: End = loop {
        // The lanes woken since the last look are polled first, so a delivery that is
        // ready never waits behind the receive.
        let received = tokio::select! {
            biased;
            died = lanes.run() => break End::Failed(died),
            received = receive(&mut subscriber, &mut run) => received,
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
        let handed = (delivery, hash, arrival);
        // A lane with room takes the delivery at once, without the shutdown's future
        // being made (see `receive`).
        if !lanes.has_room(lane) {
            stats.waited_for_full_lane();
            // The delivery stays in hand while the lane has no room: should shutdown end
            // the wait, it goes to its lane's drain, behind what the lane holds.
            tokio::select! {
                biased;
                room = lanes.room_in(lane) => {
                    if let Err(died) = room {
                        break End::Failed(died);
                    }
                }
                () = run.shutdown.requested() => {
                    in_hand = Some((lane, handed));
                    break End::Stopped;
                }
            }
        }
        lanes.offer(lane, handed);
    };
    // At shutdown the lanes learn it at once, even with handlers running; the delivery
    // in hand goes to its lane, to go back in its key's order.
    let draining = run.shutdown.is_requested();
    if draining {
        lanes.drain(in_hand);
    }
    // What the transport read ahead goes back while the lanes' handlers go on.
    {
        let stopping = subscriber.stop_receiving();
        tokio::pin!(stopping);
        tokio::select! {
            biased;
            () = &mut stopping => {}
            () = lanes.idle() => stopping.await,
        }
    }
    // The mount ended without a shutdown (its subscription ended, a lane died): the lanes
    // run what they hold, unless shutdown comes meanwhile.
    if !draining {
        let mut shutdown = run.shutdown.clone();
        tokio::select! {
            biased;
            () = lanes.idle() => {}
            () = shutdown.requested() => lanes.drain(None),
        }
    }
    lanes.idle().await;
    // A lane that died after the loop ended fails the mount all the same.
    let died = lanes.died.take();
    drop(lanes);
    stats.stopped();
    run.metrics.lanes_stopped();
    let finished = finish(subscriber, &run, end).await;
    match died {
        Some(died) => finished.and(Err(died)),
        None => finished,
    }
}

/// The lanes of one mount, run on the dispatcher's task.
///
/// Each lane has a slot for the delivery it runs (its handler's future, pinned in a box
/// made once, so a delivery costs no allocation) and a short queue of what waits for it.
/// Each lane also has a waker of its own: a wake marks its lane and wakes the dispatcher,
/// which then polls only the lanes marked.
struct LaneSet<'a, F, M> {
    /// Makes a lane's handler future for a delivery.
    start: M,
    running: Vec<Pin<Box<Option<F>>>>,
    /// The running delivery's key hash (`None` while idle or for a keyless delivery), to
    /// tell at drain what waits behind it.
    running_key: Vec<Option<u64>>,
    waiting: Vec<VecDeque<Handed>>,
    /// How many lanes run a delivery.
    busy: usize,
    wakers: Vec<Waker>,
    woken: Arc<Woken>,
    /// The list of lanes to poll, taken from `woken` and kept for its room.
    polling: Vec<usize>,
    stats: Arc<LaneStats>,
    metrics: Vec<LaneMetrics>,
    run: &'a Run,
    /// The mount drains: a lane starts nothing more, and what waits behind its running
    /// delivery goes back once that is settled.
    draining: bool,
    /// A lane's handler panicked outside the guards of `handle_one`; the mount stops.
    died: Option<Error>,
}

impl<'a, F, M> LaneSet<'a, F, M>
where
    F: Future<Output = ()>,
    M: FnMut(Delivery, Arrival) -> F,
{
    fn new(start: M, stats: Arc<LaneStats>, metrics: Vec<LaneMetrics>, run: &'a Run) -> Self {
        let n = metrics.len();
        let woken = Arc::new(Woken {
            flags: (0..n).map(|_| AtomicBool::new(false)).collect(),
            list: Mutex::new(Vec::new()),
            any: AtomicBool::new(false),
            dispatcher: AtomicWaker::new(),
        });
        let wakers = (0..n)
            .map(|lane| {
                Waker::from(Arc::new(LaneWaker {
                    lane,
                    woken: woken.clone(),
                }))
            })
            .collect();
        LaneSet {
            start,
            running: (0..n).map(|_| Box::pin(None)).collect(),
            running_key: vec![None; n],
            waiting: (0..n).map(|_| VecDeque::new()).collect(),
            busy: 0,
            wakers,
            woken,
            polling: Vec::new(),
            stats,
            metrics,
            run,
            draining: false,
            died: None,
        }
    }

    /// Gives `lane`, which has room, a delivery: it starts, and is polled, at once when
    /// the lane is free, else it waits in the lane.
    fn offer(&mut self, lane: usize, handed: Handed) {
        if self.running[lane].is_none() {
            self.begin(lane, handed);
            self.poll_lane(lane);
        } else {
            self.waiting[lane].push_back(handed);
        }
    }

    /// Whether `lane` can take one more delivery: it is free, or has room to queue one.
    fn has_room(&self, lane: usize) -> bool {
        self.running[lane].is_none() || self.waiting[lane].len() < LANE_BUFFER
    }

    fn begin(&mut self, lane: usize, (delivery, key, arrival): Handed) {
        self.stats.started(lane, false);
        self.metrics[lane].started();
        self.running_key[lane] = key;
        self.busy += 1;
        let handling = (self.start)(delivery, arrival);
        self.running[lane].set(Some(handling));
    }

    /// Polls `lane`'s running delivery; once it is done, starts the next that waits.
    fn poll_lane(&mut self, lane: usize) {
        loop {
            let Some(handling) = self.running[lane].as_mut().as_pin_mut() else {
                return;
            };
            let mut cx = Context::from_waker(&self.wakers[lane]);
            match catch_unwind(AssertUnwindSafe(|| handling.poll(&mut cx))) {
                Ok(Poll::Pending) => return,
                Ok(Poll::Ready(())) => self.settled(lane),
                Err(panic) => return self.lane_died(lane, panic.as_ref()),
            }
            if self.waiting[lane].is_empty() {
                return;
            }
            if self.draining || self.run.shutdown.is_requested() {
                // Settled, at shutdown: what waited behind it goes back now, in order.
                self.waiting[lane].clear();
                return;
            }
            if let Some(next) = self.waiting[lane].pop_front() {
                self.begin(lane, next);
            }
        }
    }

    /// `lane`'s delivery has ended: its slot is emptied (if it is not yet) and counted.
    fn settled(&mut self, lane: usize) {
        self.running[lane].set(None);
        self.running_key[lane] = None;
        self.busy -= 1;
        self.metrics[lane].finished();
        self.stats.finished(lane);
    }

    /// A panic escaped the lane's handler future (`handle_one` guards the handler's
    /// own code, so this is a bug elsewhere): its delivery and what waits in the lane go
    /// back, and the mount stops, as a task that died would stop it.
    fn lane_died(&mut self, lane: usize, panic: &(dyn Any + Send)) {
        let slot = &mut self.running[lane];
        // Dropped inside `catch_unwind` too: its state may panic again as it goes (the
        // slot is empty all the same).
        if catch_unwind(AssertUnwindSafe(|| slot.set(None))).is_err() {
            tracing::error!("a lane's future panicked again as it was dropped");
        }
        self.settled(lane);
        self.waiting[lane].clear();
        let message = panic
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
            .unwrap_or("a panic");
        let queue = self.run.cx.queue();
        tracing::error!(queue, lane, panic = message, "a lane died; the mount stops");
        self.died.get_or_insert_with(|| {
            Error::MountTask(format!(
                "lane {lane} of the mount on `{queue}` died: {message}"
            ))
        });
    }

    /// Polls each lane woken since the last look (and only those).
    fn poll_woken(&mut self, cx: &mut Context<'_>) {
        self.woken.dispatcher.register(cx.waker());
        if !self.woken.any.swap(false, Ordering::AcqRel) {
            return;
        }
        let mut polling = std::mem::take(&mut self.polling);
        std::mem::swap(&mut *crate::kit::lock(&self.woken.list), &mut polling);
        for &lane in &polling {
            // Cleared before the poll: a wake from now on marks the lane again. A swap,
            // not a store: a waker that completes the lane's future and then finds the
            // flag still set (so lists nothing) must have its write seen by the poll
            // below. A plain store can wait in the store buffer while the poll reads the
            // future's state, and the wake is lost (a probe of this code lost 146 wakes
            // in 3 million rounds on x86-64; none with the swap). `FuturesUnordered`
            // clears its flag the same way.
            self.woken.flags[lane].swap(false, Ordering::AcqRel);
            self.poll_lane(lane);
        }
        polling.clear();
        self.polling = polling;
    }

    /// Runs the lanes; resolves only if one dies.
    fn run(&mut self) -> impl Future<Output = Error> + '_ {
        poll_fn(|cx| {
            self.poll_woken(cx);
            match self.died.take() {
                Some(died) => Poll::Ready(died),
                None => Poll::Pending,
            }
        })
    }

    /// Runs the lanes until `lane` has room for one more delivery, or one dies.
    fn room_in(&mut self, lane: usize) -> impl Future<Output = Result<(), Error>> + '_ {
        poll_fn(move |cx| {
            self.poll_woken(cx);
            if let Some(died) = self.died.take() {
                Poll::Ready(Err(died))
            } else if self.has_room(lane) {
                Poll::Ready(Ok(()))
            } else {
                Poll::Pending
            }
        })
    }

    /// Runs the lanes until none runs anything.
    fn idle(&mut self) -> impl Future<Output = ()> + '_ {
        poll_fn(|cx| {
            self.poll_woken(cx);
            if self.busy == 0 {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
    }

    /// The mount drains: each lane hands back at once what waits in it, and `in_hand`
    /// (the delivery the dispatcher held for a full lane, the last to arrive), except
    /// what waits behind its running delivery's key: that goes back, in order, once the
    /// running one is settled (see `poll_lane`). Keys whose hashes collide only wait for
    /// each other.
    fn drain(&mut self, mut in_hand: Option<(usize, Handed)>) {
        self.draining = true;
        for lane in 0..self.waiting.len() {
            let mut waiting = std::mem::take(&mut self.waiting[lane]);
            if let Some((_, handed)) = in_hand.take_if(|(held_for, _)| *held_for == lane) {
                waiting.push_back(handed);
            }
            let running = self.running_key[lane];
            for handed in waiting {
                if running.is_some() && handed.1 == running {
                    self.waiting[lane].push_back(handed);
                } else {
                    drop(handed);
                }
            }
        }
    }
}

/// Which lanes were woken, shared with their wakers.
struct Woken {
    /// Per lane: marked since last polled, so that a lane is listed once.
    flags: Box<[AtomicBool]>,
    list: Mutex<Vec<usize>>,
    /// Something is listed.
    any: AtomicBool,
    dispatcher: AtomicWaker,
}

/// One lane's waker: marks the lane and wakes the dispatcher.
struct LaneWaker {
    lane: usize,
    woken: Arc<Woken>,
}

impl Wake for LaneWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let woken = &self.woken;
        if let Some(flag) = woken.flags.get(self.lane)
            && !flag.swap(true, Ordering::AcqRel)
        {
            crate::kit::lock(&woken.list).push(self.lane);
            woken.any.store(true, Ordering::Release);
            woken.dispatcher.wake();
        }
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
