//! The conformance suite on Redis Streams: queues on the local server at
//! 127.0.0.1:6379, declared, read and emptied through the portable `Broker` API.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use conveyor_conformance::{Fixture, VISIBILITY};
use conveyor_redis::RedisBroker;

struct Redis {
    broker: RedisBroker,
}

impl Fixture for Redis {
    type Broker = RedisBroker;

    fn broker(&self) -> &RedisBroker {
        &self.broker
    }

    fn unique_name(&self, stem: &str) -> String {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        format!("conformance-{stem}-{}-{nanos:x}-{n}", std::process::id())
    }
}

async fn redis() -> Redis {
    // A received message stays leased as long as the suite's queues say, longer than
    // any scenario waits, so only a release makes it ready again.
    let broker = RedisBroker::builder()
        .url("redis://127.0.0.1:6379")
        .visibility_timeout(VISIBILITY)
        .receive_wait(Duration::from_secs(1))
        .build()
        .await
        .expect("a broker on the local Redis (scripts/services/redis.sh)");
    Redis { broker }
}

conveyor_conformance::suite!(redis;
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
