//! The conformance suite on RabbitMQ: classic and quorum queues on 127.0.0.1:5672.

mod common;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use conveyor_conformance::{DeadLetter, Fixture, QueueSpec, TestQueue, collect_dead_letters};
use conveyor_lapin::{LapinBroker, LapinPublisher, LapinSource};

/// Queues on the local RabbitMQ; quorum queues when `quorum`. A dead-letter queue is
/// bound through the default exchange (`x-dead-letter-exchange = ""`).
struct Rabbit {
    broker: LapinBroker,
    publisher: LapinPublisher,
    quorum: bool,
    specs: Mutex<HashMap<String, conveyor_lapin::QueueSpec>>,
    dead: Mutex<HashMap<String, Vec<DeadLetter>>>,
}

impl Rabbit {
    async fn new(quorum: bool) -> Self {
        let broker = common::broker_named("conveyor-conformance").await;
        let publisher = broker.publisher().await.expect("a publisher");
        Rabbit {
            broker,
            publisher,
            quorum,
            specs: Mutex::default(),
            dead: Mutex::default(),
        }
    }
}

impl Fixture for Rabbit {
    type Source = LapinSource;
    type Publisher = LapinPublisher;

    async fn declare(&self, spec: QueueSpec) -> TestQueue {
        let name = common::unique(if self.quorum { "quorum" } else { "classic" });
        let mut queue = conveyor_lapin::QueueSpec::new(name.as_str());
        if self.quorum {
            queue = queue.quorum();
        }
        let dead_letter_queue = spec.dead_letter.then(|| format!("{name}.dead"));
        if let Some(dlq) = &dead_letter_queue {
            let dead = conveyor_lapin::QueueSpec::new(dlq.as_str());
            self.broker
                .declare_queue(&dead)
                .await
                .expect("dead-letter queue declared");
            queue = queue
                .dead_letter_exchange("")
                .dead_letter_routing_key(dlq.as_str());
        }
        self.broker
            .declare_queue(&queue)
            .await
            .expect("queue declared");
        self.specs.lock().unwrap().insert(name.clone(), queue);
        TestQueue {
            name,
            dead_letter_queue,
        }
    }

    fn source(&self, queue: &TestQueue) -> LapinSource {
        let spec = self.specs.lock().unwrap()[&queue.name].clone();
        self.broker.queue(spec)
    }

    fn publisher(&self) -> LapinPublisher {
        self.publisher.clone()
    }

    async fn ready(&self, queue: &TestQueue) -> usize {
        self.broker
            .ready_count(&queue.name)
            .await
            .expect("a queue depth") as usize
    }

    async fn dead_letters(&self, queue: &TestQueue) -> Vec<DeadLetter> {
        let Some(dlq) = &queue.dead_letter_queue else {
            return Vec::new();
        };
        let mut found = Vec::new();
        let source = self
            .broker
            .queue(conveyor_lapin::QueueSpec::new(dlq.as_str()))
            .without_delay_queue();
        collect_dead_letters(source, Duration::from_millis(200), &mut found).await;
        let mut dead = self.dead.lock().unwrap();
        let all = dead.entry(queue.name.clone()).or_default();
        all.extend(found);
        all.clone()
    }

    async fn delete(&self, queue: TestQueue) {
        let mut names = vec![queue.name.as_str()];
        names.extend(queue.dead_letter_queue.as_deref());
        common::cleanup(&self.broker, &names, &[]).await;
    }
}

mod classic {
    use super::*;

    conveyor_conformance::suite!(|| Rabbit::new(false);
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

mod quorum {
    use super::*;

    conveyor_conformance::suite!(|| Rabbit::new(true);
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
