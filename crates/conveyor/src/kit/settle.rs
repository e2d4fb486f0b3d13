//! The deliveries a subscription has not settled yet, and the queue their settlements
//! wait in for the settle task.

use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Notify;

use super::sync::{lock, wait_for};

/// What a transport keeps of each delivery until it is settled, under the delivery tag
/// it was given: the one table each transport's deliveries are looked up in.
///
/// Tags are handed out by [`insert`](Self::insert) and never reused while their entry
/// lives; a tag whose entry was removed finds nothing (a second settlement of the same
/// delivery is a no-op). Slots are reused, so the table costs no allocation once it has
/// grown to the number of deliveries in flight, and a lookup is an index, not a hash.
///
/// ```
/// use conveyor::kit::TagTable;
///
/// let mut pending = TagTable::new();
/// let tag = pending.insert("receipt-1");
/// assert_eq!(pending.get(tag), Some(&"receipt-1"));
/// assert_eq!(pending.remove(tag), Some("receipt-1"));
/// assert_eq!(pending.remove(tag), None); // settled twice: nothing the second time
/// ```
#[derive(Debug)]
pub struct TagTable<T> {
    slots: Vec<Slot<T>>,
    /// Indexes of empty slots, to fill before growing.
    free: Vec<u32>,
    len: usize,
}

#[derive(Debug)]
struct Slot<T> {
    /// Bumped each time the slot is filled, so that an old tag of the slot finds nothing.
    generation: u32,
    value: Option<T>,
}

impl<T> Default for TagTable<T> {
    fn default() -> Self {
        TagTable {
            slots: Vec::new(),
            free: Vec::new(),
            len: 0,
        }
    }
}

impl<T> TagTable<T> {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Keeps `value`; returns its tag.
    ///
    /// # Panics
    ///
    /// With 2^32 values kept at once (as `Vec` panics on capacity overflow): each slot
    /// takes at least 8 bytes, so memory runs out first.
    pub fn insert(&mut self, value: T) -> u64 {
        let index = match self.free.pop() {
            Some(index) => index,
            None => {
                let index = u32::try_from(self.slots.len())
                    .unwrap_or_else(|_| panic!("a TagTable holds at most 2^32 values"));
                self.slots.push(Slot {
                    generation: 0,
                    value: None,
                });
                index
            }
        };
        let slot = &mut self.slots[index as usize];
        slot.generation = slot.generation.wrapping_add(1);
        slot.value = Some(value);
        self.len += 1;
        (u64::from(slot.generation) << 32) | u64::from(index)
    }

    fn slot(&self, tag: u64) -> Option<&Slot<T>> {
        let slot = self.slots.get((tag & u64::from(u32::MAX)) as usize)?;
        (u64::from(slot.generation) == tag >> 32).then_some(slot)
    }

    /// The value kept under `tag`, if it is still there.
    pub fn get(&self, tag: u64) -> Option<&T> {
        self.slot(tag)?.value.as_ref()
    }

    /// The value kept under `tag`, to change in place.
    pub fn get_mut(&mut self, tag: u64) -> Option<&mut T> {
        let slot = self.slots.get_mut((tag & u64::from(u32::MAX)) as usize)?;
        if u64::from(slot.generation) != tag >> 32 {
            return None;
        }
        slot.value.as_mut()
    }

    /// Takes the value kept under `tag` out of the table.
    pub fn remove(&mut self, tag: u64) -> Option<T> {
        let index = tag & u64::from(u32::MAX);
        let slot = self.slots.get_mut(index as usize)?;
        if u64::from(slot.generation) != tag >> 32 {
            return None;
        }
        let value = slot.value.take()?;
        self.len -= 1;
        // `index` came from a slot that exists, so it fits in u32.
        self.free.push(index as u32);
        Some(value)
    }

    /// Every value kept, with its tag.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &T)> {
        self.slots.iter().enumerate().filter_map(|(index, slot)| {
            let value = slot.value.as_ref()?;
            Some(((u64::from(slot.generation) << 32) | index as u64, value))
        })
    }

    /// How many values are kept.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no value is kept.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// The settlements of one subscription on their way to the task that carries them out
/// (one task per subscription, on every transport): pushed from any thread by the core's
/// synchronous [`Settle`](crate::Settle) calls, taken by the task in batches.
///
/// [`ready`](Self::ready) waits (taking nothing, so it can be raced in a `select!` and
/// cancelled) until a batch is worth taking: one item at least, and `enough` of them or
/// `linger` after the first, whichever comes sooner. [`take`](Self::take) then takes
/// them in order. A transport that batches its broker calls (ten per SQS call) lingers;
/// one that sends each settlement as it comes (an AMQP ack) does not, and still sends
/// together what queued up while it was busy.
///
/// ```
/// use std::time::Duration;
/// use conveyor::kit::SettleQueue;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let queue = SettleQueue::new();
/// queue.push("ack 1");
/// queue.push("ack 2");
/// assert!(queue.ready(1, Duration::ZERO).await);
/// let mut batch = Vec::new();
/// queue.take(10, &mut batch);
/// assert_eq!(batch, ["ack 1", "ack 2"]);
/// queue.close();
/// assert!(!queue.ready(1, Duration::ZERO).await); // closed, and nothing left
/// # }
/// ```
#[derive(Debug)]
pub struct SettleQueue<T> {
    state: Mutex<Queued<T>>,
    /// Wakes the task waiting in `ready` when an item is pushed, or the queue is closed.
    changed: Notify,
}

#[derive(Debug)]
struct Queued<T> {
    items: std::collections::VecDeque<T>,
    closed: bool,
}

impl<T> Default for SettleQueue<T> {
    fn default() -> Self {
        SettleQueue {
            state: Mutex::new(Queued {
                items: std::collections::VecDeque::new(),
                closed: false,
            }),
            changed: Notify::new(),
        }
    }
}

impl<T> SettleQueue<T> {
    /// An empty, open queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// Queues `item` for the task. Items pushed after [`close`](Self::close) are still
    /// queued (the task takes what is left before it ends).
    pub fn push(&self, item: T) {
        lock(&self.state).items.push_back(item);
        self.changed.notify_one();
    }

    /// No more items are coming: once the queue is empty, [`ready`](Self::ready)
    /// returns `false`.
    pub fn close(&self) {
        lock(&self.state).closed = true;
        self.changed.notify_one();
    }

    /// How many items wait.
    pub fn len(&self) -> usize {
        lock(&self.state).items.len()
    }

    /// Whether no item waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits until at least one item waits, then until `enough` do or `linger` has passed
    /// since, whichever is sooner; `true` then, `false` if the queue is closed and empty.
    /// Takes nothing.
    pub async fn ready(&self, enough: usize, linger: Duration) -> bool {
        let first = wait_for(&self.changed, || {
            let state = lock(&self.state);
            match (state.items.is_empty(), state.closed) {
                (false, _) => Some(true),
                (true, true) => Some(false),
                (true, false) => None,
            }
        })
        .await;
        if !first || linger.is_zero() {
            return first;
        }
        let enough = async {
            wait_for(&self.changed, || {
                let state = lock(&self.state);
                (state.items.len() >= enough || state.closed).then_some(())
            })
            .await;
        };
        let _ = tokio::time::timeout(linger, enough).await;
        true
    }

    /// Takes up to `max` waiting items, oldest first, into `into`; returns how many.
    pub fn take(&self, max: usize, into: &mut Vec<T>) -> usize {
        let mut state = lock(&self.state);
        let count = state.items.len().min(max);
        into.extend(state.items.drain(..count));
        count
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tag_finds_its_value_until_removed_and_never_a_later_one_in_its_slot() {
        let mut table = TagTable::new();
        let first = table.insert('a');
        let second = table.insert('b');
        assert_ne!(first, second);
        assert_eq!(table.len(), 2);
        assert_eq!(table.remove(first), Some('a'));
        // The slot is reused, under a new tag: the old one finds nothing.
        let third = table.insert('c');
        assert_ne!(third, first);
        assert_eq!(table.get(first), None);
        assert_eq!(table.remove(first), None);
        assert_eq!(table.get(third), Some(&'c'));
        if let Some(value) = table.get_mut(second) {
            *value = 'B';
        }
        let mut all: Vec<_> = table.iter().map(|(tag, v)| (tag, *v)).collect();
        all.sort();
        let mut expected = vec![(second, 'B'), (third, 'c')];
        expected.sort();
        assert_eq!(all, expected);
        assert_eq!(table.len(), 2);
        // A tag the table never gave out finds nothing.
        assert_eq!(table.get(u64::MAX), None);
        assert_eq!(table.remove(u64::MAX), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_is_ready_when_enough_wait_or_the_linger_has_passed() {
        use std::sync::Arc;

        let queue = Arc::new(SettleQueue::new());
        let linger = Duration::from_millis(5);
        // Nothing waits: not ready, however long.
        let waiting = tokio::time::timeout(Duration::from_secs(60), queue.ready(1, linger));
        assert!(waiting.await.is_err());

        // One waits: ready once the linger has passed, and no sooner.
        queue.push(1);
        let started = tokio::time::Instant::now();
        assert!(queue.ready(3, linger).await);
        assert_eq!(started.elapsed(), linger);

        // Enough wait: ready at once.
        queue.push(2);
        queue.push(3);
        let started = tokio::time::Instant::now();
        assert!(queue.ready(3, linger).await);
        assert_eq!(started.elapsed(), Duration::ZERO);

        let mut batch = Vec::new();
        assert_eq!(queue.take(2, &mut batch), 2);
        assert_eq!(batch, [1, 2]);
        assert_eq!(queue.len(), 1);

        // Pushed from another task while the first waits.
        let (q, mut batch) = (queue.clone(), Vec::new());
        q.take(10, &mut batch);
        let pusher = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            q.push(4);
        });
        assert!(queue.ready(1, Duration::ZERO).await);
        pusher.await.unwrap();
        queue.close();
        assert!(queue.ready(1, linger).await, "closed, but one still waits");
        queue.take(10, &mut batch);
        assert_eq!(batch, [3, 4]);
        assert!(!queue.ready(1, linger).await, "closed and empty");
    }
}
