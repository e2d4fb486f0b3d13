//! Shared helpers for the live tests: a broker on 127.0.0.1, unique names, cleanup, and
//! waiting on conditions with deadlines.
#![allow(dead_code)]

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use conveyor_lapin::LapinBroker;

/// The broker the live tests use.
pub const URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// How long a test waits for a condition before failing.
pub const DEADLINE: Duration = Duration::from_secs(60);

pub async fn broker() -> LapinBroker {
    broker_named("conveyor-test").await
}

/// A broker whose connection shows as `name` on the server.
pub async fn broker_named(name: &str) -> LapinBroker {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    LapinBroker::builder(URL)
        .connection_name(name)
        .connect()
        .await
        .expect("RabbitMQ on 127.0.0.1:5672 (run scripts/services/rabbitmq.sh)")
}

/// A name no other test (or run) uses.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "conveyor-test.{prefix}.{}.{}.{}",
        std::process::id(),
        nanos % 1_000_000_000,
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Waits until `condition` holds, checking every 10 ms, for at most [`DEADLINE`].
pub async fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while !condition() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {DEADLINE:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until the async `condition` holds, for at most [`DEADLINE`].
pub async fn wait_for<F: Future<Output = bool>>(what: &str, mut condition: impl FnMut() -> F) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while !condition().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {DEADLINE:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Deletes the named queues and exchanges.
pub async fn cleanup(broker: &LapinBroker, queues: &[&str], exchanges: &[&str]) {
    for queue in queues {
        let _ = broker.delete_queue(queue).await;
        let _ = broker.delete_queue(&format!("{queue}.delay")).await;
    }
    for exchange in exchanges {
        let _ = broker.delete_exchange(exchange).await;
    }
}

/// A shared, cloneable record of what handlers saw.
pub struct Seen<T>(Arc<Mutex<Vec<T>>>);

impl<T> Clone for Seen<T> {
    fn clone(&self) -> Self {
        Seen(self.0.clone())
    }
}

impl<T> Default for Seen<T> {
    fn default() -> Self {
        Seen(Arc::default())
    }
}

impl<T: Clone> Seen<T> {
    pub fn push(&self, item: T) {
        self.0.lock().unwrap().push(item);
    }
    pub fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }
    pub fn all(&self) -> Vec<T> {
        self.0.lock().unwrap().clone()
    }
}
