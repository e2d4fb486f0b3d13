//! Shared by the live tests: a broker on the local server and unique queue names.

#![allow(dead_code)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use conveyor_nats::NatsBroker;

/// Where `scripts/services/nats.sh` starts the server.
pub const URL: &str = "nats://127.0.0.1:4222";

/// A broker on the local server, fetching briefly so tests end quickly.
pub async fn broker_at(url: &str, ack_wait: Duration) -> NatsBroker {
    NatsBroker::builder()
        .url(url)
        .visibility_timeout(ack_wait)
        .receive_wait(Duration::from_secs(1))
        .build()
        .await
        .expect("a broker on the local NATS server (scripts/services/nats.sh)")
}

/// A broker on the shared server.
pub async fn broker() -> NatsBroker {
    broker_at(URL, Duration::from_secs(10)).await
}

/// A queue name no other test (or run) uses.
pub fn unique(name: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{name}-{}-{nanos:x}-{n}", std::process::id())
}

/// A queue of its own for one test, declared: its name from [`unique`].
pub async fn declared_queue(broker: &NatsBroker, name: &str) -> String {
    use conveyor::Broker;
    let queue = unique(name);
    broker
        .declare_queue(&conveyor::QueueSpec::new(queue.as_str()))
        .await
        .expect("declared");
    queue
}
