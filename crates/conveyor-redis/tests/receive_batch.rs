//! A queue's `receive_batch` caps what one read asks for, and zero is refused.

use std::time::Duration;

use conveyor::{Broker, QueueSpec};
use conveyor_redis::RedisBroker;

async fn broker() -> RedisBroker {
    RedisBroker::builder()
        .receive_wait(Duration::from_millis(500))
        .build()
        .await
        .expect("a broker on the local Redis (scripts/services/redis.sh)")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_asks_for_at_most_the_queues_receive_batch() {
    let broker = broker().await;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let queue = format!("receive-three-{}-{nanos:x}", std::process::id());
    broker
        .declare_queue(&QueueSpec::new(queue.as_str()))
        .await
        .expect("declared");
    let source = broker.queue(&queue).receive_batch(3);
    conveyor_conformance::scenarios::a_receive_brings_at_most_its_queues_receive_batch(
        &broker, &queue, source, 3,
    )
    .await;
    broker.delete_queue(&queue).await.expect("deleted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receive_batch_of_zero_fails_the_start() {
    let broker = broker().await;
    let source = broker.queue("never-used").receive_batch(0);
    conveyor_conformance::scenarios::a_receive_batch_of_zero_fails_the_start(source).await;
}
