//! Live (the SQS emulator through the fault proxy): a request's timeout covers everything
//! it waits for, making the reply queue included.

mod common;

use std::time::Duration;

use conveyor::{Broker, Error, Message};
use conveyor_sqs::SqsBroker;

use common::proxy::Proxy;

/// SQS stops answering before the first request, whose reply queue (made by that
/// request) then cannot be made: the request fails at its timeout all the same. (It
/// waited for `CreateQueue`'s attempts, about 30 s, and every request behind it too.)
#[tokio::test]
async fn a_request_fails_at_its_timeout_though_its_reply_queue_cannot_be_made() {
    let proxy = Proxy::start("127.0.0.1:4566").await;
    let broker = SqsBroker::builder()
        .endpoint(proxy.endpoint())
        .region("us-east-1")
        .static_credentials("test", "test")
        .request_timeout(Duration::from_secs(60))
        .build()
        .await
        .unwrap();
    proxy.stall();

    let requested = tokio::time::timeout(
        Duration::from_secs(60),
        broker.request("prices", Message::new("x"), Duration::from_secs(1)),
    )
    .await
    .expect("the request ended");
    assert!(
        matches!(requested, Err(Error::Timeout { .. })),
        "{requested:?}"
    );
}
