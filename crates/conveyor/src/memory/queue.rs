//! One in-process queue: ready, delayed and in-flight messages, FIFO group holds, and
//! settlement.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::history::{RecordedMessage, Rejected};
use super::{BrokerInner, QueueOptions, QueueStats, REJECT_REASON_HEADER, Settling};
use crate::delivery::{Delivery, Settle, Settled};
use crate::headers::Headers;
use crate::kit;
use crate::kit::{TagTable, due_after};
use crate::message::PartitionKey;
use crate::outcome::Settlement;
use crate::telemetry::SentCounter;

/// A message at rest in a queue.
#[derive(Clone, Debug)]
pub(super) struct Stored {
    pub(super) payload: Bytes,
    pub(super) headers: Headers,
    pub(super) key: Option<PartitionKey>,
    pub(super) receive_count: u32,
    /// Its place in the queue: the order it arrived in. The ready list stays sorted by it,
    /// so a message that goes back goes back to its place.
    pub(super) seq: u64,
}

impl Stored {
    fn record(&self) -> RecordedMessage {
        RecordedMessage {
            payload: self.payload.clone(),
            headers: self.headers.clone(),
            partition_key: self.key.clone(),
            receive_count: self.receive_count,
        }
    }
}

/// A delayed message: a delayed publish, or a retry-after.
#[derive(Debug)]
struct Delayed {
    stored: Stored,
    /// A retry: it goes back to its place when due (a publish arrives then), and on a FIFO
    /// queue holds its group meanwhile.
    retried: bool,
}

#[derive(Debug, Default)]
struct State {
    ready: VecDeque<Stored>,
    delayed: BTreeMap<(Instant, u64), Delayed>,
    in_flight: TagTable<Stored>,
    /// FIFO only: groups with a message in flight (or waiting out a retry delay).
    held_groups: HashMap<PartitionKey, usize>,
    /// The `seq` of the next message to arrive.
    next_seq: u64,
    /// Tells apart delayed messages due at the same instant.
    next_timer: u64,
    consumers: usize,
    options: QueueOptions,
    stats: QueueStats,
}

/// One queue, shared by its publishers, subscribers and deliveries.
pub(super) struct Queue {
    pub(super) name: Arc<str>,
    fifo: bool,
    state: Mutex<State>,
    /// Wakes subscribers waiting for a message.
    pub(super) available: Notify,
    broker: Weak<BrokerInner>,
    /// `messaging.client.sent.messages` for this queue.
    pub(super) sent: SentCounter,
}

/// The outcome of trying to take a message without waiting.
pub(super) enum Take {
    Taken(Delivery),
    /// Nothing available now; something delayed becomes due at this instant.
    WaitUntil(Option<Instant>),
}

impl Queue {
    pub(super) fn new(name: &str, options: QueueOptions, broker: Weak<BrokerInner>) -> Self {
        Queue {
            name: name.into(),
            fifo: name.ends_with(".fifo"),
            state: Mutex::new(State {
                options,
                ..State::default()
            }),
            available: Notify::new(),
            broker,
            sent: SentCounter::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        kit::lock(&self.state)
    }

    pub(super) fn set_options(&self, options: QueueOptions) {
        self.lock().options = options;
    }

    pub(super) fn stats(&self) -> QueueStats {
        let state = self.lock();
        QueueStats {
            ready: state.ready.len(),
            delayed: state.delayed.len(),
            in_flight: state.in_flight.len(),
            consumers: state.consumers,
            ..state.stats.clone()
        }
    }

    pub(super) fn add_consumer(&self, delta: isize) {
        let mut state = self.lock();
        state.consumers = state.consumers.saturating_add_signed(delta);
    }

    /// Whether this queue has nothing left to do now: a consumed queue with nothing
    /// ready or due, and no queue with anything in flight. With `delayed`, messages
    /// waiting for a later time count as work too.
    pub(super) fn is_idle(&self, now: Instant, delayed: bool) -> bool {
        let state = self.lock();
        if !state.in_flight.is_empty() {
            return false;
        }
        if state.consumers == 0 {
            return true;
        }
        let due = state
            .delayed
            .keys()
            .next()
            .is_some_and(|(at, _)| *at <= now);
        let waiting = delayed && !state.delayed.is_empty();
        state.ready.is_empty() && !due && !waiting
    }

    /// Adds a message: ready at once, or after `delay`.
    pub(super) fn push(&self, stored: Stored, delay: Option<std::time::Duration>) {
        {
            let mut state = self.lock();
            state.stats.published += 1;
            // A message's own delay overrides the queue's, as on SQS.
            match delay.or(state.options.delay) {
                Some(delay) if !delay.is_zero() => state.delay(stored, delay, false),
                _ => state.arrive(stored),
            }
        }
        self.changed();
    }

    /// Removes up to `max` ready messages (delayed ones that fell due included), in
    /// queue order, whatever their group.
    pub(super) fn take_ready(&self, max: usize) -> Vec<Stored> {
        let taken: Vec<Stored> = {
            let mut state = self.lock();
            state.promote_due(Instant::now(), self.fifo);
            let n = max.min(state.ready.len());
            state.ready.drain(..n).collect()
        };
        if !taken.is_empty() {
            self.broker_changed();
        }
        taken
    }

    /// Takes the next available message as a delivery, if there is one.
    ///
    /// `taken_groups` lists the groups already taken by the batch being gathered: like an
    /// SQS receive, one batch may hold several messages of a group, in order.
    pub(super) fn try_take(self: &Arc<Self>, taken_groups: &[PartitionKey]) -> Take {
        let mut expired = Vec::new();
        // Counted before expired messages leave the queue, until they are dead-lettered.
        let mut settling = None;
        let taken = {
            let mut state = self.lock();
            state.promote_due(Instant::now(), self.fifo);
            loop {
                let Some(index) = state.next_index(self.fifo, taken_groups) else {
                    break Take::WaitUntil(state.delayed.keys().next().map(|(at, _)| *at));
                };
                let Some(mut stored) = state.ready.remove(index) else {
                    break Take::WaitUntil(None);
                };
                stored.receive_count += 1;
                if let Some(max) = state.options.max_receive_count {
                    if stored.receive_count > max && state.options.dead_letter_queue.is_some() {
                        if settling.is_none() {
                            settling = self.broker.upgrade().map(Settling::begin);
                        }
                        expired.push(stored);
                        continue;
                    }
                }
                if self.fifo {
                    if let Some(key) = &stored.key {
                        *state.held_groups.entry(key.clone()).or_default() += 1;
                    }
                }
                let (payload, headers) = (stored.payload.clone(), stored.headers.clone());
                let (key, receive_count) = (stored.key.clone(), stored.receive_count);
                let tag = state.in_flight.insert(stored);
                let settler: Arc<dyn Settle> = self.clone();
                let delivery = Delivery::new(payload, self.name.clone(), settler, tag)
                    .with_headers(headers)
                    .with_partition_key(key)
                    .with_receive_count(receive_count);
                break Take::Taken(delivery);
            }
        };
        let expired_any = !expired.is_empty();
        if let Some(settling) = &settling {
            for stored in expired {
                let reason = format!(
                    "received {} times, more than the queue's max receive count",
                    stored.receive_count.saturating_sub(1)
                );
                self.dead_letter(settling.broker(), stored, &reason);
            }
        }
        drop(settling);
        // Taking makes nothing available to other subscribers, so only idle-waiters hear
        // of it (a subscriber that woke itself here would spin).
        if expired_any || matches!(taken, Take::Taken(_)) {
            self.broker_changed();
        }
        taken
    }

    /// Moves a rejected message to the dead-letter queue, or discards it; records both.
    fn dead_letter(&self, broker: &Arc<BrokerInner>, mut stored: Stored, reason: &str) {
        let dead_letter_queue = {
            let mut state = self.lock();
            state.stats.rejected += 1;
            state.options.dead_letter_queue.clone()
        };
        if broker.history.is_recording() {
            broker.history.record_rejected(
                &self.name,
                Rejected {
                    message: stored.record(),
                    reason: reason.to_string(),
                    dead_letter_queue: dead_letter_queue.clone(),
                },
            );
        }
        match dead_letter_queue {
            Some(dlq) => {
                crate::telemetry::record_dead_lettered("conveyor_in_process", &self.name);
                stored
                    .headers
                    .insert(REJECT_REASON_HEADER, reason.to_string());
                stored.receive_count = 0;
                broker.queue(&dlq).push(stored, None);
            }
            None => tracing::warn!(
                queue = &*self.name,
                reason,
                "discarding a rejected message: the queue has no dead-letter queue"
            ),
        }
    }

    /// Wakes subscribers and anyone waiting for the broker to go idle.
    fn changed(&self) {
        self.available.notify_waiters();
        self.broker_changed();
    }

    fn broker_changed(&self) {
        if let Some(broker) = self.broker.upgrade() {
            broker.notify_changed();
        }
    }
}

impl State {
    /// Adds a message that arrives now (published, or due after a delay) behind every
    /// ready one.
    fn arrive(&mut self, mut stored: Stored) {
        self.next_seq += 1;
        stored.seq = self.next_seq;
        self.ready.push_back(stored);
    }

    /// Puts a message back in its place: ahead of every ready message that arrived after
    /// it. So messages retried or released together keep their order.
    fn put_back(&mut self, stored: Stored) {
        let at = self.ready.partition_point(|ready| ready.seq < stored.seq);
        self.ready.insert(at, stored);
    }

    fn delay(&mut self, stored: Stored, delay: Duration, retried: bool) {
        self.next_timer += 1;
        self.delayed.insert(
            (due_after(delay), self.next_timer),
            Delayed { stored, retried },
        );
    }

    /// Moves delayed messages whose time has come to the ready list.
    fn promote_due(&mut self, now: Instant, fifo: bool) {
        while let Some(entry) = self.delayed.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let Delayed { stored, retried } = entry.remove();
            if retried {
                // Back to its place: on a FIFO queue, at the head of its group.
                self.release_group(&stored.key, fifo);
                self.put_back(stored);
            } else {
                self.arrive(stored);
            }
        }
    }

    /// The index of the first ready message whose group is not held.
    fn next_index(&self, fifo: bool, taken_groups: &[PartitionKey]) -> Option<usize> {
        if !fifo || self.held_groups.is_empty() {
            return (!self.ready.is_empty()).then_some(0);
        }
        self.ready.iter().position(|stored| match &stored.key {
            Some(key) => !self.held_groups.contains_key(key) || taken_groups.contains(key),
            None => true,
        })
    }

    /// Lets go of one delivery of the message's group; returns whether that freed the
    /// group, making its next message available.
    fn release_group(&mut self, key: &Option<PartitionKey>, fifo: bool) -> bool {
        let Some(key) = key.as_ref().filter(|_| fifo) else {
            return false;
        };
        let Some(count) = self.held_groups.get_mut(key) else {
            return false;
        };
        *count = count.saturating_sub(1);
        let freed = *count == 0;
        if freed {
            self.held_groups.remove(key);
        }
        freed
    }
}

impl Settle for Queue {
    fn settle(&self, settled: Settled<'_>) {
        // Counted before the message leaves flight, until it is recorded and dead-lettered.
        let Some(settling) = self.broker.upgrade().map(Settling::begin) else {
            return;
        };
        let broker = settling.broker();
        let mut rejected = None;
        let mut acked = None;
        // Whether a message became available (or a delayed one may now fall due first):
        // only then are subscribers woken.
        let mut available = true;
        {
            let mut state = self.lock();
            let Some(mut stored) = state.in_flight.remove(settled.tag) else {
                return;
            };
            if matches!(
                settled.settlement,
                Settlement::Retry | Settlement::RetryAfter(_)
            ) {
                // Attempts the dispatcher made while holding it count as receives.
                stored.receive_count = stored.receive_count.max(settled.attempt);
            }
            let settlement = settled.settlement;
            match settlement {
                Settlement::Ack => {
                    available = state.release_group(&stored.key, self.fifo);
                    state.stats.acked += 1;
                    acked = Some(stored);
                }
                Settlement::Retry | Settlement::Release => {
                    if settlement == Settlement::Release {
                        // The receive counts no attempt of its own; retries the mount made
                        // before it let go (a handler cancelled at shutdown) still count.
                        stored.receive_count = stored
                            .receive_count
                            .saturating_sub(1)
                            .max(settled.attempt.saturating_sub(1));
                    } else {
                        state.stats.retried += 1;
                    }
                    state.release_group(&stored.key, self.fifo);
                    state.put_back(stored);
                }
                Settlement::RetryAfter(delay) => {
                    // A FIFO group stays held until the retry is due.
                    state.stats.retried += 1;
                    state.delay(stored, delay, true);
                }
                Settlement::Reject { reason } => {
                    state.release_group(&stored.key, self.fifo);
                    rejected = Some((stored, reason));
                }
            }
        }
        if let Some((stored, reason)) = rejected {
            self.dead_letter(broker, stored, reason);
        }
        if available {
            self.available.notify_waiters();
        }
        if let Some(stored) = acked
            && broker.history.is_recording()
        {
            broker.history.record_acked(&self.name, stored.record());
        }
    }
}
