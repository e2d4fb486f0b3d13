//! The conformance suite on the in-process transport: a standard queue and a FIFO queue.

use std::sync::atomic::{AtomicU32, Ordering};

use conveyor::MemoryBroker;
use conveyor_conformance::Fixture;

/// In-process queues on one broker; FIFO queues when `fifo`.
struct Memory {
    broker: MemoryBroker,
    fifo: bool,
}

impl Memory {
    fn new(fifo: bool) -> Self {
        Memory {
            broker: MemoryBroker::new(),
            fifo,
        }
    }
}

impl Fixture for Memory {
    type Broker = MemoryBroker;

    fn broker(&self) -> &MemoryBroker {
        &self.broker
    }

    fn unique_name(&self, stem: &str) -> String {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let suffix = if self.fifo { ".fifo" } else { "" };
        format!("{stem}{n}{suffix}")
    }
}

mod standard {
    use super::*;

    conveyor_conformance::suite!(|| async { Memory::new(false) };
        round_trip_keeps_payload_headers_and_properties,
        competing_subscriptions_lose_nothing_and_handle_each_message_once,
        the_sequential_mount_never_overlaps,
        the_sequential_mount_keeps_order_across_retries,
        keyed_modes_keep_each_key_in_order_one_at_a_time_across_retries,
        max_attempts_ends_in_the_dead_letter_queue_when_the_broker_retries,
        max_attempts_ends_in_the_dead_letter_queue_when_retried_in_place,
        a_reject_reaches_the_dead_letter_queue_at_once_with_its_reason,
        retry_after_comes_no_sooner_than_its_delay,
        batches_are_never_empty_and_never_larger_than_their_size,
        a_batch_asking_for_retries_is_dead_lettered_after_max_attempts,
        draining_hands_back_unstarted_deliveries_while_handlers_run,
        stopping_and_restarting_mid_stream_loses_nothing,
        a_panic_in_decode_an_extractor_or_a_handler_leaves_the_service_up,
        a_handlers_messages_are_published_before_its_input_is_acked,
        requests_get_their_own_replies_and_a_late_one_reaches_none,
        msgpack_and_cbor_payloads_round_trip_and_a_mislabelled_one_is_rejected,
        empty_header_values_come_back_empty_alone_among_others_and_at_the_header_limit,
    );
}

mod fifo {
    use super::*;

    conveyor_conformance::suite!(|| async { Memory::new(true) };
        round_trip_keeps_payload_headers_and_properties,
        competing_subscriptions_lose_nothing_and_handle_each_message_once,
        the_sequential_mount_never_overlaps,
        the_sequential_mount_keeps_order_across_retries,
        keyed_modes_keep_each_key_in_order_one_at_a_time_across_retries,
        max_attempts_ends_in_the_dead_letter_queue_when_the_broker_retries,
        max_attempts_ends_in_the_dead_letter_queue_when_retried_in_place,
        a_reject_reaches_the_dead_letter_queue_at_once_with_its_reason,
        retry_after_comes_no_sooner_than_its_delay,
        batches_are_never_empty_and_never_larger_than_their_size,
        a_batch_asking_for_retries_is_dead_lettered_after_max_attempts,
        draining_hands_back_unstarted_deliveries_while_handlers_run,
        stopping_and_restarting_mid_stream_loses_nothing,
        a_panic_in_decode_an_extractor_or_a_handler_leaves_the_service_up,
        a_handlers_messages_are_published_before_its_input_is_acked,
        requests_get_their_own_replies_and_a_late_one_reaches_none,
        msgpack_and_cbor_payloads_round_trip_and_a_mislabelled_one_is_rejected,
        empty_header_values_come_back_empty_alone_among_others_and_at_the_header_limit,
    );
}
