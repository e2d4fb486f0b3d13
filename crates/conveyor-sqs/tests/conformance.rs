//! The conformance suite on SQS: standard and FIFO queues on the moto emulator at
//! 127.0.0.1:4566, declared, read and emptied through the portable `Broker` API.

mod common;

use conveyor_conformance::{Fixture, VISIBILITY};
use conveyor_sqs::SqsBroker;

/// Queues on the emulator; FIFO queues when `fifo`.
struct Sqs {
    broker: SqsBroker,
    fifo: bool,
}

impl Sqs {
    async fn new(fifo: bool) -> Self {
        // A received message stays hidden as long as the suite's queues say, longer than
        // any scenario waits, so only a release makes it ready again.
        // moto answers a burst of calls (the request/reply scenario's) one after
        // another: calls wait there, so each may take long.
        let broker = SqsBroker::builder()
            .endpoint(common::ENDPOINT)
            .region("us-east-1")
            .static_credentials("test", "test")
            .receive_wait(std::time::Duration::from_secs(1))
            .visibility_timeout(VISIBILITY)
            .request_timeout(std::time::Duration::from_secs(120))
            .build()
            .await
            .expect("a broker on the local emulator");
        Sqs { broker, fifo }
    }
}

impl Fixture for Sqs {
    type Broker = SqsBroker;

    fn broker(&self) -> &SqsBroker {
        &self.broker
    }

    fn unique_name(&self, stem: &str) -> String {
        common::unique(&format!("conformance-{stem}"), self.fifo)
    }

    /// moto 5's ReceiveMessage can hand one message to two concurrent long polls.
    fn may_duplicate(&self) -> bool {
        true
    }

    /// moto serves its calls one after another: with a thousand `SendMessage` calls at
    /// once, some wait past the SDK's stalled-stream limit ("minimum throughput ... 0
    /// B/s") and fail. A hundred at once it serves.
    fn concurrent_requests(&self) -> usize {
        100
    }

    /// SQS's ten message attributes: ten headers fit whatever their values, since the
    /// empty ones share the one attribute that names them.
    fn header_limit(&self) -> Option<usize> {
        Some(conveyor_sqs::MAX_ATTRIBUTES)
    }
}

mod standard {
    use super::*;

    conveyor_conformance::suite!(|| Sqs::new(false);
        round_trip_keeps_payload_headers_and_properties,
        competing_subscriptions_lose_nothing_and_handle_each_message_once,
        the_sequential_mount_never_overlaps,
        #[ignore = "SQS standard queues keep no order; order is for FIFO queues"]
        the_sequential_mount_keeps_order_across_retries,
        #[ignore = "SQS standard queues carry no partition key; keys are FIFO message groups"]
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

    conveyor_conformance::suite!(|| Sqs::new(true);
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
