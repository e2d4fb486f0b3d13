//! An idle subscription waits on the server, not in a loop: on an empty queue each fetch
//! waits up to the fetch wait for a first message, so the mount asks about once per
//! fetch wait. Watched from a second connection, as the pull requests
//! (`$JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer>`) reach the server.

mod common;

use std::time::{Duration, Instant};

use conveyor::{App, Broker};
use conveyor_nats::DEFAULT_CONSUMER;
use futures_util::StreamExt;

async fn ignore(_: conveyor::Bytes) {}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_subscription_asks_about_once_per_fetch_wait() {
    // The fetch wait is 1 s (`common::broker`).
    const WATCHED: Duration = Duration::from_secs(3);
    let broker = common::broker().await;
    let queue = common::declared_queue(&broker, "idle").await;
    let watcher = async_nats::connect(common::URL)
        .await
        .expect("second connection");
    let mut requests = watcher
        .subscribe(format!(
            "$JS.API.CONSUMER.MSG.NEXT.{}.{DEFAULT_CONSUMER}",
            queue.replace('.', "~")
        ))
        .await
        .expect("subscribe");
    watcher.flush().await.expect("flush");
    let running = App::new("idle")
        .mount(broker.queue(&queue), ignore, |m| m)
        .start()
        .await
        .expect("started");
    // The first request says the subscription is fetching; then count the requests over
    // a window: a slow machine makes fewer, never more.
    let first = tokio::time::timeout(Duration::from_secs(60), requests.next()).await;
    assert!(
        matches!(first, Ok(Some(_))),
        "no pull request within a minute"
    );
    let started = Instant::now();
    let mut seen = 0u32;
    while let Some(left) = WATCHED.checked_sub(started.elapsed()) {
        match tokio::time::timeout(left, requests.next()).await {
            Ok(Some(_)) => seen += 1,
            Ok(None) | Err(_) => break,
        }
    }
    running.shutdown().await.expect("shut down");
    broker.delete_queue(&queue).await.expect("deleted");
    // One a second, each waiting the fetch wait out; two more for slack.
    assert!(
        seen <= 5,
        "{seen} pull requests in {WATCHED:?} on an empty queue"
    );
}
