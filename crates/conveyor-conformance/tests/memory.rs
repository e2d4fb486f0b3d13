//! The conformance suite on the in-process transport: a standard queue and a FIFO queue.

use std::sync::atomic::{AtomicU32, Ordering};

use conveyor::memory::MemoryQueue;
use conveyor::{MemoryBroker, QueueOptions};
use conveyor_conformance::{DeadLetter, Fixture, QueueSpec, TestQueue};

/// In-process queues on one broker; FIFO queues when `fifo`.
struct Memory {
    broker: MemoryBroker,
    fifo: bool,
}

impl Memory {
    fn new(fifo: bool) -> Self {
        let broker = MemoryBroker::new();
        broker.record_history(true);
        Memory { broker, fifo }
    }
}

impl Fixture for Memory {
    type Source = MemoryQueue;
    type Publisher = MemoryBroker;

    async fn declare(&self, spec: QueueSpec) -> TestQueue {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let suffix = if self.fifo { ".fifo" } else { "" };
        let name = format!("q{n}{suffix}");
        let dead_letter_queue = spec.dead_letter.then(|| format!("q{n}-dead{suffix}"));
        let mut options = QueueOptions::new();
        if let Some(dlq) = &dead_letter_queue {
            options = options.dead_letter_queue(dlq.clone(), 100);
        }
        self.broker.declare_queue(&name, options);
        TestQueue {
            name,
            dead_letter_queue,
        }
    }

    fn source(&self, queue: &TestQueue) -> MemoryQueue {
        self.broker.queue(queue.name.clone())
    }

    fn publisher(&self) -> MemoryBroker {
        self.broker.clone()
    }

    async fn ready(&self, queue: &TestQueue) -> usize {
        self.broker.stats(&queue.name).ready
    }

    async fn dead_letters(&self, queue: &TestQueue) -> Vec<DeadLetter> {
        self.broker
            .dead_lettered(&queue.name)
            .into_iter()
            .filter(|dead| dead.dead_letter_queue.is_some())
            .map(|dead| DeadLetter {
                reason: Some(dead.reason),
                payload: dead.message.payload,
            })
            .collect()
    }

    async fn delete(&self, _queue: TestQueue) {}
}

mod standard {
    use super::*;

    conveyor_conformance::suite!(|| async { Memory::new(false) };
        round_trip_keeps_payload_and_headers,
        competing_subscriptions_lose_nothing_and_handle_each_message_once,
        the_sequential_mount_never_overlaps,
        the_sequential_mount_keeps_order_across_retries,
        lanes_keep_each_key_in_order_across_retries,
        max_attempts_ends_in_the_dead_letter_queue_when_the_broker_retries,
        max_attempts_ends_in_the_dead_letter_queue_when_the_lane_retries,
        a_reject_reaches_the_dead_letter_queue_at_once_with_its_reason,
        retry_after_comes_no_sooner_than_its_delay,
        batches_are_never_empty_and_never_larger_than_their_size,
        draining_hands_back_unstarted_deliveries_while_handlers_run,
        stopping_and_restarting_mid_stream_loses_nothing,
        a_panic_in_decode_an_extractor_or_a_handler_leaves_the_service_up,
    );
}

mod fifo {
    use super::*;

    conveyor_conformance::suite!(|| async { Memory::new(true) };
        round_trip_keeps_payload_and_headers,
        competing_subscriptions_lose_nothing_and_handle_each_message_once,
        the_sequential_mount_never_overlaps,
        the_sequential_mount_keeps_order_across_retries,
        lanes_keep_each_key_in_order_across_retries,
        max_attempts_ends_in_the_dead_letter_queue_when_the_broker_retries,
        max_attempts_ends_in_the_dead_letter_queue_when_the_lane_retries,
        a_reject_reaches_the_dead_letter_queue_at_once_with_its_reason,
        retry_after_comes_no_sooner_than_its_delay,
        batches_are_never_empty_and_never_larger_than_their_size,
        draining_hands_back_unstarted_deliveries_while_handlers_run,
        stopping_and_restarting_mid_stream_loses_nothing,
        a_panic_in_decode_an_extractor_or_a_handler_leaves_the_service_up,
    );
}
