//! Live (RabbitMQ through the fault proxy): a request's timeout covers everything it
//! waits for, opening the requester's channel included.

mod common;

use std::time::Duration;

use conveyor::{Broker, Error, Message};
use conveyor_lapin::LapinBroker;

use common::proxy::Proxy;

/// The broker stops answering before the first request, whose channel (opened by that
/// request) then never opens: the request fails at its timeout all the same. (It waited
/// for the channel without a limit, and so did every request behind it.)
#[tokio::test]
async fn a_request_fails_at_its_timeout_though_its_channel_never_opens() {
    let proxy = Proxy::start("127.0.0.1:5672").await;
    let broker = LapinBroker::connect(&proxy.url()).await.unwrap();
    proxy.stall_replies();

    let requested = tokio::time::timeout(
        common::DEADLINE,
        broker.request("prices", Message::new("x"), Duration::from_secs(1)),
    )
    .await
    .expect("the request ended");
    assert!(
        matches!(requested, Err(Error::Timeout { .. })),
        "{requested:?}"
    );
}
