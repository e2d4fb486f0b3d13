//! A broker given the nodes of a three-node RabbitMQ cluster
//! (`scripts/services/rabbitmq-cluster.sh`: 127.0.0.1:5681, 5682 and 5683) publishes
//! and consumes, connects to a fallback node when the URL's node does not answer, and
//! fails over when the node its consumer is connected to is stopped, losing no
//! confirmed message of a quorum queue.
//!
//! Gating, kept simple: the tests run only when `CONVEYOR_RABBITMQ_CLUSTER=1` is set,
//! by whoever started the cluster; otherwise each returns at once with a note. They are
//! not part of `scripts/test.sh` or CI. To run them:
//!
//! ```sh
//! bash scripts/services/rabbitmq-cluster.sh start && \
//!     CONVEYOR_RABBITMQ_CLUSTER=1 cargo test -p conveyor-lapin --test cluster
//! ```
//!
//! The failover test stops a node with the script's `stop-node` and starts it again
//! (`start-node`) before it ends, pass or fail. Every wait is on a condition with a
//! deadline.

mod common;

use std::collections::HashSet;
use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use conveyor::{App, Publisher, QueueSpec};
use conveyor_lapin::{LapinBroker, RabbitQueueSpec};

use common::{Seen, cleanup, record, unique, wait_until};

/// The cluster's AMQP ports, node 1 first.
const PORTS: [u16; 3] = [5681, 5682, 5683];

/// Whether the cluster tests are to run; prints why not when they are not.
fn cluster_up(test: &str) -> bool {
    if std::env::var("CONVEYOR_RABBITMQ_CLUSTER").as_deref() == Ok("1") {
        return true;
    }
    println!(
        "{test}: skipped: set CONVEYOR_RABBITMQ_CLUSTER=1 after \
         `bash scripts/services/rabbitmq-cluster.sh start`"
    );
    false
}

/// The URL of node `n` (1..=3).
fn url(n: usize) -> String {
    format!("amqp://guest:guest@127.0.0.1:{}/%2f", PORTS[n - 1])
}

/// The `host:port` of node `n`.
fn address(n: usize) -> String {
    format!("127.0.0.1:{}", PORTS[n - 1])
}

/// A broker on node `first`, with the other two as its fallback nodes (in order), its
/// connections named `name`.
async fn broker_on(first: usize, name: &str) -> LapinBroker {
    common::init_tracing();
    let others: Vec<String> = (1..=3).filter(|n| *n != first).map(address).collect();
    LapinBroker::builder(url(first))
        .fallback_nodes(others)
        .connection_name(name)
        .connect()
        .await
        .expect("the cluster (run scripts/services/rabbitmq-cluster.sh start)")
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/services/rabbitmq-cluster.sh")
}

/// Runs the cluster script with `args`, failing the test if it fails.
fn cluster_script(args: &[&str]) {
    let output = Command::new("bash")
        .arg(script())
        .args(args)
        .output()
        .expect("bash");
    assert!(
        output.status.success(),
        "rabbitmq-cluster.sh {args:?} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The node (1..=3) the consuming connection named `name` is connected to, asked of
/// node `ask` (which must be running); `None` while there is no such connection.
fn consumer_node(name: &str, ask: usize) -> Option<usize> {
    let output = Command::new("rabbitmqctl")
        .args([
            "-q",
            "-s",
            "-n",
            &format!("conveyor-c{ask}@localhost"),
            "list_connections",
            "port",
            "client_properties",
        ])
        .output()
        .expect("rabbitmqctl");
    if !output.status.success() {
        return None;
    }
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|line| line.contains(&format!("\"{name}\"")))
        .find_map(|line| {
            let port: u16 = line.split('\t').next()?.trim().parse().ok()?;
            PORTS.iter().position(|p| *p == port).map(|i| i + 1)
        })
}

/// Starts node `n` again when dropped, so that a failing test leaves the cluster whole.
struct Restart(usize);

impl Drop for Restart {
    fn drop(&mut self) {
        let n = self.0.to_string();
        let _ = Command::new("bash")
            .arg(script())
            .args(["start-node", &n])
            .status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_given_the_clusters_nodes_publishes_and_consumes() {
    if !cluster_up("publishes_and_consumes") {
        return;
    }
    let broker = broker_on(1, &unique("cluster-round-trip")).await;
    let queue = unique("cluster-round-trip");
    broker
        .declare_queue(&QueueSpec::new(queue.as_str()).quorum())
        .await
        .unwrap();
    let seen = Seen::<u32>::default();
    let running = App::new("cluster-round-trip")
        .with_state(seen.clone())
        .mount(broker.queue(&queue), record, |m| m)
        .start()
        .await
        .unwrap();
    for n in 0..20u32 {
        broker.publish_json(&queue, &n).await.unwrap();
    }
    wait_until("20 messages handled", || seen.len() >= 20).await;
    running.shutdown().await.unwrap();
    let ids: HashSet<u32> = seen.all().into_iter().collect();
    assert_eq!(ids, (0..20).collect());
    cleanup(&broker, &[&queue], &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_url_whose_node_does_not_answer_connects_to_a_fallback_node() {
    if !cluster_up("connects_to_a_fallback_node") {
        return;
    }
    common::init_tracing();
    // Port 1 on loopback: nothing listens there, so the connection is refused.
    let broker = LapinBroker::builder("amqp://guest:guest@127.0.0.1:1/%2f")
        .fallback_nodes([address(2), address(3)])
        .connect()
        .await
        .expect("a fallback node");
    let queue = unique("cluster-fallback");
    broker
        .declare_queue(&QueueSpec::new(queue.as_str()))
        .await
        .unwrap();
    broker.publish_json(&queue, &1u32).await.unwrap();
    assert_eq!(broker.queue_depth(&queue).await.unwrap().ready, 1);
    cleanup(&broker, &[&queue], &[]).await;
}

/// Stops the node the consumer is connected to, in the middle of a stream of confirmed
/// publishes to a quorum queue: consumption resumes on another node, and every message
/// whose publish was confirmed is handled (duplicates allowed: at least once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_the_consumers_node_fails_over_and_loses_no_confirmed_message() {
    if !cluster_up("fails_over") {
        return;
    }
    let name = unique("cluster-failover");
    let broker = broker_on(1, &name).await;
    let queue = unique("cluster-failover");
    broker
        .declare_queue(&QueueSpec::new(queue.as_str()).quorum())
        .await
        .unwrap();
    let seen = Seen::<u32>::default();
    // No delay queue: the mount's default one is a classic queue, which lives on one
    // node only; were that the stopped node, redeclaring it on the recovered channel
    // fails (NOT_FOUND, "home node ... is down") and the consumer does not come back.
    let running = App::new("cluster-failover")
        .with_state(seen.clone())
        .mount(broker.queue(&queue).without_delay_queue(), record, |m| m)
        .start()
        .await
        .unwrap();
    let publisher = broker.publisher().await.unwrap();
    for n in 0..100u32 {
        common::publish_confirmed(&publisher, &queue, conveyor::Message::json(&n).unwrap()).await;
    }
    wait_until("the first 100 handled", || seen.len() >= 100).await;

    let mut on = None;
    wait_until("the consumer's connection listed", || {
        on = consumer_node(&name, 2).or_else(|| consumer_node(&name, 3));
        on.is_some()
    })
    .await;
    let stopped = on.unwrap();
    let ask = if stopped == 1 { 2 } else { 1 };
    let _restart = Restart(stopped);
    let handled_before = seen.len();
    let stopping = Instant::now();
    tokio::task::spawn_blocking(move || cluster_script(&["stop-node", &stopped.to_string()]))
        .await
        .unwrap();
    let stop_took = stopping.elapsed();

    for n in 100..200u32 {
        common::publish_confirmed(&publisher, &queue, conveyor::Message::json(&n).unwrap()).await;
    }
    wait_until("a delivery after the stop", || seen.len() > handled_before).await;
    let resumed = stopping.elapsed();
    wait_until("every confirmed message handled", || {
        seen.all().into_iter().collect::<HashSet<_>>().len() == 200
    })
    .await;
    let now_on = consumer_node(&name, ask);
    println!(
        "failover: node {stopped} stopped in {stop_took:?}; first delivery {resumed:?} after \
         the stop began; consumer now on node {now_on:?}"
    );
    // The broker dials 1, 2, 3 in turn, and node 1 answered its first connect. The
    // reconnect goes to node 2 first, but a connection to node 2 made just after the
    // stop has been seen to be dropped again about 3 s later (cause not looked into
    // yet), and the next reconnect then goes to node 3: any node but the stopped one.
    assert_eq!(stopped, 1, "the consumer connected to the URL's node");
    assert!(now_on.is_some_and(|n| n != stopped), "{now_on:?}");

    running.shutdown().await.unwrap();
    cleanup(&broker, &[&queue], &[]).await;
    drop(_restart);
    // The node is back and in the cluster.
    cluster_script(&["start-node", &stopped.to_string()]);
}
