//! A live view of a keyed mount's lanes (or, under any-worker, its workers): what each
//! runs and holds, and which partition keys are hot.
//! [`RunningApp::lanes`](crate::RunningApp::lanes) takes it.
//!
//! The counters are kept as the lanes run, with relaxed atomics. The hot keys come from a
//! sample of the deliveries (one in 4, spread pseudo-randomly) counted in a fixed table of
//! [`HOT_KEY_SLOTS`] keys (the Space-Saving algorithm): memory stays the same whatever the
//! number of keys, and a key that takes a large share of the traffic is in the table.
//! Counts are halved every 1,024 samples, so the table follows what is hot now rather
//! than since the start.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::kit;
use crate::message::PartitionKey;

/// One in how many keyed deliveries the hot-key table counts.
pub(crate) const SAMPLE_EVERY: u64 = 4;
/// How many keys the hot-key table holds.
pub const HOT_KEY_SLOTS: usize = 16;
/// After how many samples the hot-key counts are halved.
pub(crate) const HALVE_EVERY: u64 = 1024;

/// One keyed mount's lanes now.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MountLanes {
    /// The queue the mount is on.
    pub queue: String,
    /// Every lane, by number.
    pub lanes: Vec<LaneView>,
    /// The partition keys seen most over the recent deliveries, hottest first, at most
    /// [`HOT_KEY_SLOTS`].
    pub hot_keys: Vec<HotKey>,
    /// How many times the dispatcher found a delivery's lane full and waited for it: the
    /// whole mount waited behind one lane's keys. Under any-worker: how many times a
    /// delivery's key held all the read-ahead it may, and the mount waited for that key.
    pub full_lane_waits: u64,
    /// Under any-worker, the deliveries received and not yet started: waiting for their
    /// key's turn or for a free worker, and the one in the dispatcher's hand (0 for lanes,
    /// whose waiting deliveries show per lane).
    pub held: usize,
    /// For a mount on several shard queues ([`crate::shards::Shards`]): the shards this
    /// replica holds now, in order. `None` for a mount on one queue.
    pub shards: Option<Vec<usize>>,
}

/// One lane now (under any-worker, one worker).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LaneView {
    /// The lane's number, as [`DeliveryInfo::lane`](crate::DeliveryInfo) gives it.
    pub lane: usize,
    /// How long the delivery it runs has been running, retries in place included; `None`
    /// when it runs nothing.
    pub running_for: Option<Duration>,
    /// Deliveries waiting for the lane behind the one it runs: in the lane, or in the
    /// dispatcher's hand when the lane is full. Always 0 under any-worker, where a
    /// waiting delivery belongs to no worker (see [`MountLanes::held`]).
    pub waiting: usize,
    /// Deliveries it has finished (settled) since the mount started.
    pub handled: u64,
}

/// A partition key among the hottest of a mount.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct HotKey {
    /// The key.
    pub key: PartitionKey,
    /// The lane it runs on; `None` under any-worker, where any worker runs it.
    pub lane: Option<usize>,
    /// How many of the sampled recent deliveries were its (see the module docs): one in
    /// about 4 deliveries is sampled, and counts are halved every 1,024 samples. It may
    /// count high by as much as the count of the key
    /// whose slot it took; compare keys by it, rather than read it as a number of
    /// messages.
    pub count: u64,
}

/// The live counters of one lane.
#[derive(Debug, Default)]
struct LaneCounters {
    waiting: AtomicUsize,
    handled: AtomicU64,
    /// When the running delivery started, in nanoseconds after `LaneStats::epoch`, plus
    /// one; 0 while the lane runs nothing.
    started: AtomicU64,
}

/// What a lanes mount keeps of its lanes, shared by its dispatcher, its lanes and the
/// running app.
#[derive(Debug)]
pub(crate) struct LaneStats {
    epoch: Instant,
    lanes: Vec<LaneCounters>,
    full_waits: AtomicU64,
    /// Deliveries held on an any-worker mount's board.
    held: AtomicUsize,
    /// Counted by the dispatcher alone; read by the snapshot.
    hot: Mutex<HotKeys>,
    keyed: AtomicU64,
}

impl LaneStats {
    pub(crate) fn new(lanes: usize) -> Self {
        LaneStats {
            epoch: Instant::now(),
            lanes: (0..lanes).map(|_| LaneCounters::default()).collect(),
            full_waits: AtomicU64::new(0),
            held: AtomicUsize::new(0),
            hot: Mutex::new(HotKeys::default()),
            keyed: AtomicU64::new(0),
        }
    }

    /// The dispatcher hands a delivery of `key` (hashed to `hash`) to `lane`, or holds
    /// it for its key's turn (`None`, any-worker); on the lane it runs on, its key counts
    /// as a hot key candidate.
    pub(crate) fn queued(&self, lane: Option<usize>, key: Option<(&PartitionKey, u64)>) {
        match lane {
            Some(lane) => {
                if let Some(counters) = self.lanes.get(lane) {
                    counters.waiting.fetch_add(1, Ordering::Relaxed);
                }
            }
            None => {
                self.held.fetch_add(1, Ordering::Relaxed);
            }
        }
        if let Some((key, hash)) = key {
            // Only the dispatcher counts, so a plain load and store suffice.
            let seen = self.keyed.load(Ordering::Relaxed).wrapping_add(1);
            self.keyed.store(seen, Ordering::Relaxed);
            // One in SAMPLE_EVERY, spread by a multiplicative hash of the count rather
            // than every fourth, which would never see a key that comes every other time.
            if seen.wrapping_mul(0x9e37_79b9_7f4a_7c15) < u64::MAX / SAMPLE_EVERY {
                kit::lock(&self.hot).count(key, hash, lane);
            }
        }
    }

    /// The dispatcher found `lane` full and waits for it.
    pub(crate) fn waited_for_full_lane(&self) {
        self.full_waits.fetch_add(1, Ordering::Relaxed);
    }

    /// `lane` starts running its next delivery: one that waited in it, or one held
    /// for its key's turn (`held`, any-worker).
    pub(crate) fn started(&self, lane: usize, held: bool) {
        if held {
            self.held.fetch_sub(1, Ordering::Relaxed);
        }
        if let Some(counters) = self.lanes.get(lane) {
            if !held {
                counters.waiting.fetch_sub(1, Ordering::Relaxed);
            }
            let nanos = u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX - 1);
            counters.started.store(nanos + 1, Ordering::Relaxed);
        }
    }

    /// `lane` has settled the delivery it ran.
    pub(crate) fn finished(&self, lane: usize) {
        if let Some(counters) = self.lanes.get(lane) {
            counters.started.store(0, Ordering::Relaxed);
            counters.handled.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The mount has stopped: what its lanes held went back to the broker unstarted,
    /// without passing through [`started`](Self::started).
    pub(crate) fn stopped(&self) {
        for counters in &self.lanes {
            counters.waiting.store(0, Ordering::Relaxed);
            counters.started.store(0, Ordering::Relaxed);
        }
        self.held.store(0, Ordering::Relaxed);
    }

    /// The view of the lanes now, for the mount on `queue`.
    pub(crate) fn snapshot(&self, queue: &str) -> MountLanes {
        let now = u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let lanes = self
            .lanes
            .iter()
            .enumerate()
            .map(|(lane, counters)| {
                let started = counters.started.load(Ordering::Relaxed);
                LaneView {
                    lane,
                    running_for: (started > 0)
                        .then(|| Duration::from_nanos(now.saturating_sub(started - 1))),
                    waiting: counters.waiting.load(Ordering::Relaxed),
                    handled: counters.handled.load(Ordering::Relaxed),
                }
            })
            .collect();
        MountLanes {
            queue: queue.to_string(),
            lanes,
            hot_keys: kit::lock(&self.hot).hottest(),
            full_lane_waits: self.full_waits.load(Ordering::Relaxed),
            held: self.held.load(Ordering::Relaxed),
            shards: None,
        }
    }
}

/// The Space-Saving table: at most [`HOT_KEY_SLOTS`] keys and their counts. A key not in
/// a full table takes the place of the least counted one, with that count plus one, so a
/// key's count never falls below its true count since it entered.
#[derive(Debug, Default)]
struct HotKeys {
    slots: Vec<Slot>,
    samples: u64,
}

#[derive(Debug)]
struct Slot {
    hash: u64,
    key: PartitionKey,
    lane: Option<usize>,
    count: u64,
}

impl HotKeys {
    fn count(&mut self, key: &PartitionKey, hash: u64, lane: Option<usize>) {
        self.samples = self.samples.wrapping_add(1);
        if self.samples % HALVE_EVERY == 0 {
            for slot in &mut self.slots {
                slot.count /= 2;
            }
            self.slots.retain(|slot| slot.count > 0);
        }
        if let Some(slot) = self
            .slots
            .iter_mut()
            .find(|slot| slot.hash == hash && slot.key == *key)
        {
            slot.count = slot.count.saturating_add(1);
            return;
        }
        let slot = Slot {
            hash,
            key: key.clone(),
            lane,
            count: 1,
        };
        if self.slots.len() < HOT_KEY_SLOTS {
            self.slots.push(slot);
            return;
        }
        if let Some(least) = self.slots.iter_mut().min_by_key(|slot| slot.count) {
            let count = least.count.saturating_add(1);
            *least = Slot { count, ..slot };
        }
    }

    fn hottest(&self) -> Vec<HotKey> {
        let mut hot: Vec<HotKey> = self
            .slots
            .iter()
            .map(|slot| HotKey {
                key: slot.key.clone(),
                lane: slot.lane,
                count: slot.count,
            })
            .collect();
        hot.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.key.cmp(&b.key)));
        hot
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hashed(key: &str) -> (PartitionKey, u64) {
        (
            PartitionKey::from(key),
            crate::dispatch::lane_for_key(key, usize::MAX) as u64,
        )
    }

    #[test]
    fn a_key_with_a_large_share_stays_on_top_of_many_rare_ones() {
        let mut table = HotKeys::default();
        let (hot, hot_hash) = hashed("hot");
        for i in 0..5_000u64 {
            if i % 3 == 0 {
                table.count(&hot, hot_hash, Some(1));
            } else {
                let (key, hash) = hashed(&format!("rare-{i}"));
                table.count(&key, hash, Some(0));
            }
        }
        let hottest = table.hottest();
        assert!(hottest.len() <= HOT_KEY_SLOTS);
        assert_eq!(hottest[0].key.as_str(), "hot");
        assert_eq!(hottest[0].lane, Some(1));
    }

    #[test]
    fn counts_are_halved_so_a_key_that_cooled_down_drops_out() {
        let mut table = HotKeys::default();
        let (old, old_hash) = hashed("old");
        for _ in 0..HALVE_EVERY - 1 {
            table.count(&old, old_hash, None);
        }
        for i in 0..HALVE_EVERY * 12 {
            let (key, hash) = hashed(&format!("new-{}", i % 4));
            table.count(&key, hash, None);
        }
        assert!(
            table.hottest().iter().all(|hot| hot.key.as_str() != "old"),
            "{:?}",
            table.hottest()
        );
    }
}
