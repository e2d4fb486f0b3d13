//! The conformance suite on SQS: standard and FIFO queues on the moto emulator at
//! 127.0.0.1:4566.

mod common;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use aws_sdk_sqs::types::QueueAttributeName;
use conveyor_conformance::{DeadLetter, Fixture, QueueSpec, TestQueue, collect_dead_letters};
use conveyor_sqs::{SqsBroker, SqsQueue};

/// Queues on the emulator; FIFO queues when `fifo`. Received messages stay hidden for two
/// minutes, longer than any scenario waits, so only a release makes them ready again.
struct Sqs {
    broker: SqsBroker,
    fifo: bool,
    dead: Mutex<HashMap<String, Vec<DeadLetter>>>,
}

impl Sqs {
    async fn new(fifo: bool) -> Self {
        Sqs {
            broker: common::broker_at(common::ENDPOINT, Duration::from_secs(120)).await,
            fifo,
            dead: Mutex::default(),
        }
    }
}

impl Fixture for Sqs {
    type Source = SqsQueue;
    type Publisher = SqsBroker;

    async fn declare(&self, spec: QueueSpec) -> TestQueue {
        let name = common::unique("conformance", self.fifo);
        let mut queue = conveyor_sqs::QueueSpec::new(name.as_str());
        let dead_letter_queue = spec
            .dead_letter
            .then(|| common::unique("conformance-dead", self.fifo));
        if let Some(dlq) = &dead_letter_queue {
            // High enough that the mount's max_attempts acts first.
            queue = queue.dead_letter_queue(dlq.as_str(), 10);
        }
        common::declare(&self.broker, queue).await;
        TestQueue {
            name,
            dead_letter_queue,
        }
    }

    fn source(&self, queue: &TestQueue) -> SqsQueue {
        self.broker.queue(queue.name.as_str())
    }

    fn publisher(&self) -> SqsBroker {
        self.broker.clone()
    }

    async fn ready(&self, queue: &TestQueue) -> usize {
        let url = self
            .broker
            .client()
            .get_queue_url()
            .queue_name(&queue.name)
            .send()
            .await
            .expect("the queue's url");
        let attributes = self
            .broker
            .client()
            .get_queue_attributes()
            .queue_url(url.queue_url().unwrap_or_default())
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
            .send()
            .await
            .expect("the queue's attributes");
        attributes
            .attributes()
            .and_then(|a| a.get(&QueueAttributeName::ApproximateNumberOfMessages))
            .and_then(|n| n.parse().ok())
            .expect("a message count")
    }

    async fn dead_letters(&self, queue: &TestQueue) -> Vec<DeadLetter> {
        let Some(dlq) = &queue.dead_letter_queue else {
            return Vec::new();
        };
        let mut found = Vec::new();
        let source = self.broker.queue(dlq.as_str());
        collect_dead_letters(source, Duration::from_millis(1500), &mut found).await;
        let mut dead = self.dead.lock().unwrap();
        let all = dead.entry(queue.name.clone()).or_default();
        all.extend(found);
        all.clone()
    }

    async fn delete(&self, queue: TestQueue) {
        let mut names = vec![queue.name.as_str()];
        names.extend(queue.dead_letter_queue.as_deref());
        common::delete(&self.broker, &names).await;
    }

    /// moto 5's ReceiveMessage can hand one message to two concurrent long polls.
    fn may_duplicate(&self) -> bool {
        true
    }
}

mod standard {
    use super::*;

    conveyor_conformance::suite!(|| Sqs::new(false);
        round_trip_keeps_payload_and_headers,
        competing_subscriptions_lose_nothing_and_handle_each_message_once,
        the_sequential_mount_never_overlaps,
        #[ignore = "SQS standard queues keep no order; order is for FIFO queues"]
        the_sequential_mount_keeps_order_across_retries,
        #[ignore = "SQS standard queues carry no partition key; keys are FIFO message groups"]
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

    conveyor_conformance::suite!(|| Sqs::new(true);
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
