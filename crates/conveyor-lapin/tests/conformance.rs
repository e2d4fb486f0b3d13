//! The conformance suite on RabbitMQ: classic and quorum queues on 127.0.0.1:5672.
//!
//! The suite declares its queues through the portable broker API; the quorum fixture
//! adds `quorum()` to each. A dead-letter queue is reached through the default exchange
//! (`x-dead-letter-exchange = ""`), and on quorum queues the max receive count is the
//! `x-delivery-limit`.

mod common;

use conveyor::QueueSpec;
use conveyor_conformance::Fixture;
use conveyor_lapin::{LapinBroker, RabbitQueueSpec};

/// Queues on the local RabbitMQ; quorum queues when `quorum`.
struct Rabbit {
    broker: LapinBroker,
    quorum: bool,
}

impl Rabbit {
    async fn new(quorum: bool) -> Self {
        Rabbit {
            broker: common::broker_named("conveyor-conformance").await,
            quorum,
        }
    }
}

impl Fixture for Rabbit {
    type Broker = LapinBroker;

    fn broker(&self) -> &LapinBroker {
        &self.broker
    }

    fn unique_name(&self, stem: &str) -> String {
        let kind = if self.quorum { "quorum" } else { "classic" };
        common::unique(&format!("{kind}-{stem}"))
    }

    fn with_extras(&self, spec: QueueSpec) -> QueueSpec {
        if self.quorum { spec.quorum() } else { spec }
    }
}

mod classic {
    use super::*;

    conveyor_conformance::suite!(|| Rabbit::new(false);
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

mod quorum {
    use super::*;

    conveyor_conformance::suite!(|| Rabbit::new(true);
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
