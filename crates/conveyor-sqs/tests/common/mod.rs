//! Shared by the live tests: a broker on the local emulator, unique queue names, and
//! waiting on conditions with a deadline.

#![allow(dead_code)]

pub mod proxy;

use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use conveyor::{Broker, QueueSpec};
use conveyor_sqs::SqsBroker;

/// Where `scripts/services/sqs.sh` starts the emulator.
pub const ENDPOINT: &str = "http://127.0.0.1:4566";

/// A broker on the emulator at `endpoint`, polling briefly so tests end quickly.
pub async fn broker_at(endpoint: &str, visibility: Duration) -> SqsBroker {
    SqsBroker::builder()
        .endpoint(endpoint)
        .region("us-east-1")
        .static_credentials("test", "test")
        .receive_wait(Duration::from_secs(1))
        .visibility_timeout(visibility)
        .build()
        .await
        .expect("a broker on the local emulator")
}

/// A broker on the shared emulator.
pub async fn broker() -> SqsBroker {
    broker_at(ENDPOINT, Duration::from_secs(10)).await
}

/// A queue name no other test (or run) uses; FIFO when `fifo`.
pub fn unique(name: &str, fifo: bool) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let suffix = if fifo { ".fifo" } else { "" };
    format!("t-{name}-{}-{nanos:x}-{n}{suffix}", std::process::id())
}

/// Declares a queue and returns its name; `delete` removes it again.
pub async fn declare(broker: &SqsBroker, spec: QueueSpec) -> String {
    if let Err(error) = broker.declare_queue(&spec).await {
        panic!("cannot declare `{}`: {error}", spec.name());
    }
    spec.name().to_string()
}

/// The URL of the queue `queue`, for calls made with the SQS client itself.
pub async fn queue_url(broker: &SqsBroker, queue: &str) -> String {
    broker
        .client()
        .get_queue_url()
        .queue_name(queue)
        .send()
        .await
        .expect("the queue's URL")
        .queue_url
        .expect("a URL in the answer")
}

/// Deletes the queues a test made.
pub async fn delete(broker: &SqsBroker, queues: &[&str]) {
    for queue in queues {
        let _ = broker.delete_queue(queue).await;
    }
}

/// Polls `condition` every 20 ms until it holds, failing the test after `deadline`.
pub async fn eventually<F, Fut>(what: &str, deadline: Duration, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let result = tokio::time::timeout(deadline, async {
        while !condition().await {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(
        result.is_ok(),
        "timed out after {deadline:?} waiting for {what}"
    );
}
