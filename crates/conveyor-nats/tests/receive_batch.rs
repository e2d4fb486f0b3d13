//! A queue's `receive_batch` caps what one pull request asks for, and zero is refused.

mod common;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pull_request_asks_for_at_most_the_queues_receive_batch() {
    let broker = common::broker().await;
    let queue = common::declared_queue(&broker, "receive-three").await;
    let source = broker.queue(&queue).receive_batch(3);
    conveyor_conformance::scenarios::a_receive_brings_at_most_its_queues_receive_batch(
        &broker, &queue, source, 3,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receive_batch_of_zero_fails_the_start() {
    let broker = common::broker().await;
    let source = broker.queue("never-used").receive_batch(0);
    conveyor_conformance::scenarios::a_receive_batch_of_zero_fails_the_start(source).await;
}
