//! Shared helpers for the live tests: a broker on 127.0.0.1, unique names, topology and
//! cleanup, recording handlers, killing connections from the server's side, and waiting
//! on conditions with deadlines.
#![allow(dead_code)]

pub mod proxy;

use std::future::Future;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use conveyor::{Json, Message, Publisher, QueueSpec, State};
use conveyor_lapin::{Binding, ExchangeSpec, ExchangeType, LapinBroker, LapinPublisher};

/// The broker the live tests use.
pub const URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// How long a test waits for a condition before failing.
pub const DEADLINE: Duration = Duration::from_secs(60);

pub async fn broker() -> LapinBroker {
    broker_named("conveyor-test").await
}

/// A broker whose connection shows as `name` on the server.
pub async fn broker_named(name: &str) -> LapinBroker {
    init_tracing();
    LapinBroker::builder(URL)
        .connection_name(name)
        .connect()
        .await
        .expect("RabbitMQ on 127.0.0.1:5672 (run scripts/services/rabbitmq.sh)")
}

/// Logs to the test output, filtered by `RUST_LOG` (once per test binary).
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
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

/// Declares the exchange `exchange` of type `kind` and the queue `queue`, and binds the
/// queue to it under `routing_key`.
pub async fn declare_bound_queue(
    broker: &LapinBroker,
    exchange: &str,
    kind: ExchangeType,
    queue: &str,
    routing_key: &str,
) {
    broker
        .declare_exchange(&ExchangeSpec::new(exchange, kind))
        .await
        .unwrap();
    broker.declare_queue(&QueueSpec::new(queue)).await.unwrap();
    broker
        .bind(&Binding::new(queue, exchange, routing_key))
        .await
        .unwrap();
}

/// Publishes `n` as JSON to `queue` through `broker`.
pub async fn publish_one(broker: &LapinBroker, queue: &str, n: u32) {
    broker.publish_json(queue, &n).await.unwrap();
}

/// How many messages are ready in `queue`.
pub async fn ready(broker: &LapinBroker, queue: &str) -> u64 {
    broker.queue_depth(queue).await.unwrap().ready
}

/// The arguments the server holds for `queue`, as `rabbitmqctl list_queues` prints them
/// (`[{"x-queue-type","quorum"},...]`).
pub fn queue_arguments(queue: &str) -> String {
    let listing = Command::new("rabbitmqctl")
        .args(["-q", "-s", "list_queues", "name", "arguments"])
        .output()
        .expect("rabbitmqctl");
    assert!(listing.status.success(), "rabbitmqctl list_queues failed");
    String::from_utf8_lossy(&listing.stdout)
        .lines()
        .find_map(|line| {
            let (name, arguments) = line.split_once('\t')?;
            (name == queue).then(|| arguments.to_string())
        })
        .unwrap_or_else(|| panic!("no queue {queue} on the broker"))
}

/// Publishes `message` to `queue`, retrying until the broker confirms it (a publish cut
/// by a connection loss is retried on the recovered connection; at-least-once allows a
/// duplicate), for at most [`DEADLINE`].
pub async fn publish_confirmed(publisher: &LapinPublisher, queue: &str, message: Message) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while let Err(error) = publisher.publish(queue, message.clone()).await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "publish never succeeded: {error}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The server's connections named `name`: each one's pid and whether it is a TLS one.
pub fn connections_named(name: &str) -> Vec<(String, bool)> {
    let listing = Command::new("rabbitmqctl")
        .args([
            "-q",
            "-s",
            "list_connections",
            "pid",
            "ssl",
            "client_properties",
        ])
        .output()
        .expect("rabbitmqctl");
    assert!(
        listing.status.success(),
        "rabbitmqctl list_connections failed"
    );
    String::from_utf8_lossy(&listing.stdout)
        .lines()
        .filter(|line| line.contains(name))
        .filter_map(|line| {
            let mut columns = line.split('\t');
            let pid = columns.next()?.to_string();
            let ssl = columns.next()? == "true";
            Some((pid, ssl))
        })
        .collect()
}

/// Closes, from the server's side, every connection named `name` (and only those, so
/// that nothing else using this broker is disturbed), the way
/// `rabbitmqctl close_all_connections` closes them all. Returns how many it closed.
pub fn close_connections_named(name: &str) -> usize {
    let connections = connections_named(name);
    for (pid, _) in &connections {
        let output = Command::new("rabbitmqctl")
            .args(["-q", "close_connection", pid, "test"])
            .output()
            .expect("rabbitmqctl");
        assert!(
            output.status.success(),
            "rabbitmqctl close_connection {pid} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    connections.len()
}

/// How many messages of `queue` the broker has delivered and not had acked yet (from
/// `rabbitmqctl`, which asks the queue itself).
pub fn unacked_count(queue: &str) -> usize {
    let listing = Command::new("rabbitmqctl")
        .args(["-q", "-s", "list_queues", "name", "messages_unacknowledged"])
        .output()
        .expect("rabbitmqctl");
    assert!(listing.status.success(), "rabbitmqctl list_queues failed");
    String::from_utf8_lossy(&listing.stdout)
        .lines()
        .find_map(|line| {
            let (name, count) = line.split_once('\t')?;
            (name == queue).then(|| count.trim().parse().expect("a count"))
        })
        .unwrap_or_else(|| panic!("no queue {queue} on the broker"))
}

/// A message taken from a queue by [`take_all`]: its payload, AMQP headers and TTL.
pub struct Taken {
    pub payload: Vec<u8>,
    pub headers: lapin::types::FieldTable,
    /// Its per-message TTL, if it has one.
    pub expiration: Option<String>,
}

impl Taken {
    /// The header `name` as text, if it is a string.
    pub fn header(&self, name: &str) -> Option<String> {
        match self.headers.inner().get(name)? {
            lapin::types::AMQPValue::LongString(s) => {
                Some(String::from_utf8_lossy(s.as_bytes()).into_owned())
            }
            lapin::types::AMQPValue::ShortString(s) => Some(s.as_str().to_string()),
            _ => None,
        }
    }

    /// The names of its headers.
    pub fn header_names(&self) -> Vec<String> {
        self.headers
            .inner()
            .keys()
            .map(|k| k.as_str().to_string())
            .collect()
    }

    /// The payload as a JSON number.
    pub fn number(&self) -> u32 {
        serde_json::from_slice(&self.payload).unwrap()
    }
}

/// Takes (and acks) every message ready in `queue`, in order, on a connection of its own
/// (plain `basic.get`, beside the transport under test).
pub async fn take_all(queue: &str) -> Vec<Taken> {
    use lapin::options::BasicGetOptions;
    let connection = lapin::Connection::connect(URL, lapin::ConnectionProperties::default())
        .await
        .unwrap();
    let channel = connection.create_channel().await.unwrap();
    let mut taken = Vec::new();
    while let Some(message) = channel
        .basic_get(queue.into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
    {
        let delivery = message.delivery;
        taken.push(Taken {
            headers: delivery.properties.headers().clone().unwrap_or_default(),
            expiration: (delivery.properties.expiration().as_ref()).map(|e| e.to_string()),
            payload: delivery.data,
        });
    }
    let _ = connection.close(200, "done".into()).await;
    taken
}

/// Deletes the named queues (with their delay queues) and exchanges.
pub async fn cleanup(broker: &LapinBroker, queues: &[&str], exchanges: &[&str]) {
    for queue in queues {
        let _ = broker.delete_queue(queue).await;
    }
    for exchange in exchanges {
        let _ = broker.delete_exchange(exchange).await;
    }
}

/// A handler that records each number it gets.
pub async fn record(Json(n): Json<u32>, State(seen): State<Seen<u32>>) {
    seen.push(n);
}

/// Which app instance a handler runs in.
#[derive(Clone)]
pub struct Instance(pub &'static str);

/// A handler that records each number it gets with the instance that got it.
pub async fn record_instance(
    Json(id): Json<u32>,
    State(instance): State<Instance>,
    State(seen): State<Seen<(&'static str, u32)>>,
) {
    seen.push((instance.0, id));
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

/// A RabbitMQ user added for one test (all permissions on `/`), deleted on drop.
pub struct TempUser {
    pub name: String,
    pub password: String,
}

impl TempUser {
    /// Adds a user named after `prefix`, this process and the time.
    pub fn add(prefix: &str) -> TempUser {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let user = TempUser {
            name: format!("{prefix}-{}-{nanos}", std::process::id()),
            password: format!("Pw{nanos}xyz"),
        };
        rabbitmqctl(&["add_user", &user.name, &user.password]);
        rabbitmqctl(&["set_permissions", "-p", "/", &user.name, ".*", ".*", ".*"]);
        user
    }

    /// The URL that logs in as this user.
    pub fn url(&self) -> String {
        format!("amqp://{}:{}@127.0.0.1:5672/%2f", self.name, self.password)
    }
}

impl Drop for TempUser {
    fn drop(&mut self) {
        let _ = Command::new("rabbitmqctl")
            .args(["-q", "delete_user", &self.name])
            .output();
    }
}

/// Runs `rabbitmqctl -q <args>`, failing the test if it fails.
pub fn rabbitmqctl(args: &[&str]) {
    let output = Command::new("rabbitmqctl")
        .arg("-q")
        .args(args)
        .output()
        .expect("rabbitmqctl (run scripts/services/rabbitmq.sh)");
    assert!(
        output.status.success(),
        "rabbitmqctl {} failed: {}",
        args[0],
        String::from_utf8_lossy(&output.stderr)
    );
}
