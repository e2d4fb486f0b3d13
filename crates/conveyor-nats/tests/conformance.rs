//! The conformance suite on NATS JetStream: queues on the local server at
//! 127.0.0.1:4222, declared, read and emptied through the portable `Broker` API.

mod common;

use conveyor_conformance::{Fixture, VISIBILITY};
use conveyor_nats::NatsBroker;

struct Nats {
    broker: NatsBroker,
}

impl Fixture for Nats {
    type Broker = NatsBroker;

    fn broker(&self) -> &NatsBroker {
        &self.broker
    }

    fn unique_name(&self, stem: &str) -> String {
        common::unique(&format!("conformance-{stem}"))
    }
}

async fn nats() -> Nats {
    // A received message stays leased as long as the suite's queues say, longer than
    // any scenario waits, so only a release makes it ready again.
    Nats {
        broker: common::broker_at(common::URL, VISIBILITY).await,
    }
}

conveyor_conformance::suite!(nats;
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
    #[ignore = "JetStream's consumer info counts a released message as pending acknowledgement, not ready: the release is proven by another subscription in tests/release.rs"]
    draining_hands_back_unstarted_deliveries_while_handlers_run,
    #[ignore = "JetStream's consumer info counts a released message as pending acknowledgement, not ready: the release is proven by another subscription in tests/release.rs"]
    stopping_and_restarting_mid_stream_loses_nothing,
    a_panic_in_decode_an_extractor_or_a_handler_leaves_the_service_up,
    a_handlers_messages_are_published_before_its_input_is_acked,
    requests_get_their_own_replies_and_a_late_one_reaches_none,
    msgpack_and_cbor_payloads_round_trip_and_a_mislabelled_one_is_rejected,
    empty_header_values_come_back_empty_alone_among_others_and_at_the_header_limit,
);
