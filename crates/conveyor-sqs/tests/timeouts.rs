//! How long a call to SQS may take: a receive long-polls for `receive_wait` and may take the
//! `request_timeout` beyond it; every other call (a publish, a settlement, a renewal) gets
//! the `request_timeout` alone, so one that gets no answer fails and is tried again
//! without waiting out a long poll it never made.
//!
//! The fault proxy (`common::proxy`) holds this test's traffic only, so the shared
//! emulator goes on serving the other tests meanwhile.

mod common;

use std::time::Duration;

use common::proxy::Proxy;
use common::{declare, delete, unique};
use conveyor::{App, Bytes, Message, Publisher, QueueSpec};
use conveyor_sqs::SqsBroker;

async fn broker_through(proxy: &Proxy, wait: Duration, request_timeout: Duration) -> SqsBroker {
    SqsBroker::builder()
        .endpoint(proxy.endpoint())
        .region("us-east-1")
        .static_credentials("test", "test")
        .receive_wait(wait)
        .request_timeout(request_timeout)
        .build()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_publish_that_gets_no_answer_fails_after_the_request_timeout_not_the_long_poll_wait() {
    let proxy = Proxy::start("127.0.0.1:4566").await;
    let wait = Duration::from_secs(20);
    let broker = broker_through(&proxy, wait, Duration::from_secs(1)).await;
    let queue = declare(&broker, QueueSpec::new(unique("no-answer", false))).await;

    proxy.stall();
    let started = tokio::time::Instant::now();
    let published = broker.publish(&queue, Message::new("hello")).await;
    let took = started.elapsed();

    assert!(published.is_err(), "nothing answered the publish");
    // Three attempts of 1 s and the SDK's backoff between them take about 5 s; a single
    // attempt given the long-poll wait as well would have taken 21 s.
    assert!(
        took < wait,
        "the publish failed after {took:?}, not within the request timeout's attempts"
    );
    drop(proxy);
    delete(&common::broker().await, &[&queue]).await;
}

#[tokio::test]
async fn a_receive_long_polls_for_its_wait_time_though_it_is_longer_than_the_request_timeout() {
    let proxy = Proxy::start("127.0.0.1:4566").await;
    // The emulator answers a receive on an empty queue once the wait is over: 5 s after
    // the request timeout, and 5 s before the receive's own deadline.
    let broker = broker_through(&proxy, Duration::from_secs(10), Duration::from_secs(5)).await;
    let queue = declare(&broker, QueueSpec::new(unique("long-poll", false))).await;

    let running = App::new("long-poll")
        .mount(broker.queue(&queue), |_: Bytes| async {}, |m| m)
        .start()
        .await
        .unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(60), proxy.receive_ended())
        .await
        .expect("a receive ends within a minute");
    assert_eq!(ended.given_up, 0, "{ended:?}");
    assert_eq!(ended.answered, 1, "{ended:?}");

    running.shutdown().await.unwrap();
    delete(&broker, &[&queue]).await;
}
