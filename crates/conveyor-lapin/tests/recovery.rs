//! Connections killed mid-stream: subscriptions resume by themselves and nothing is lost.
//!
//! The test kills its own connections from the server's side (`rabbitmqctl
//! close_connection`, as `close_all_connections` would, but sparing every other client
//! of the broker), while deliveries are in flight on them.

mod common;

use std::collections::HashSet;
use std::process::Command;

use conveyor::{App, Json, Message, Publisher, State};
use conveyor_lapin::LapinPublisher;

use common::{Seen, broker_named, cleanup, unique, wait_until};

/// Holds handlers of messages from 300 on until the connections have been killed, so
/// that deliveries are in flight on the channel that dies.
#[derive(Clone)]
struct Gate(tokio::sync::watch::Receiver<bool>);

async fn record(Json(id): Json<u32>, State(seen): State<Seen<u32>>, State(gate): State<Gate>) {
    if id >= 300 {
        let _ = gate.0.clone().wait_for(|open| *open).await;
    }
    seen.push(id);
}

/// Closes, from the server's side, every connection named `name` (and only those, so
/// that nothing else using this broker is disturbed), the way
/// `rabbitmqctl close_all_connections` closes them all. Returns how many it closed.
fn close_connections_named(name: &str) -> usize {
    let listing = Command::new("rabbitmqctl")
        .args(["-q", "-s", "list_connections", "pid", "client_properties"])
        .output()
        .expect("rabbitmqctl");
    assert!(
        listing.status.success(),
        "rabbitmqctl list_connections failed"
    );
    let mut closed = 0;
    for line in String::from_utf8_lossy(&listing.stdout).lines() {
        let Some((pid, properties)) = line.split_once('\t') else {
            continue;
        };
        if !properties.contains(name) {
            continue;
        }
        let output = Command::new("rabbitmqctl")
            .args(["-q", "close_connection", pid, "test"])
            .output()
            .expect("rabbitmqctl");
        assert!(
            output.status.success(),
            "rabbitmqctl close_connection {pid} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        closed += 1;
    }
    closed
}

/// Publishes `ids`, retrying each until the broker confirms it (a publish cut by the
/// connection loss may or may not have arrived; at-least-once allows a duplicate).
async fn publish_confirmed(publisher: &LapinPublisher, queue: &str, ids: std::ops::Range<u32>) {
    for id in ids {
        let deadline = tokio::time::Instant::now() + common::DEADLINE;
        loop {
            let message = Message::json(&id)
                .unwrap()
                .partition_key(format!("k{}", id % 20));
            match publisher.publish(queue, message).await {
                Ok(()) => break,
                Err(error) => {
                    assert!(
                        tokio::time::Instant::now() < deadline,
                        "publish never recovered: {error}"
                    );
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_connections_resume_and_lose_nothing() {
    let name = unique("recovery-connection");
    let broker = broker_named(&name).await;
    let queue = unique("recovery");
    let seen = Seen::<u32>::default();
    let (open, gate) = tokio::sync::watch::channel(false);
    let running = App::new("recovery")
        .with_state(seen.clone())
        .with_state(Gate(gate))
        .mount(broker.queue(queue.as_str()), record, |m| {
            m.workers(4).by_key()
        })
        .start()
        .await
        .unwrap();

    let publisher_broker = broker_named(&name).await;
    let publisher = publisher_broker.publisher().await.unwrap();
    let publishing = {
        let (publisher, queue) = (publisher.clone(), queue.clone());
        tokio::spawn(async move { publish_confirmed(&publisher, &queue, 0..2000).await })
    };
    wait_until("the first 300 messages to be handled", || seen.len() >= 300).await;

    assert_eq!(close_connections_named(&name), 2, "both connections closed");
    open.send_replace(true);

    publishing.await.unwrap();
    wait_until(
        "every message to be handled after the connection loss",
        || {
            let handled: HashSet<u32> = seen.all().into_iter().collect();
            (0..2000).all(|id| handled.contains(&id))
        },
    )
    .await;
    let all = seen.all();
    let unique_ids: HashSet<u32> = all.iter().copied().collect();
    assert!(
        all.len() > unique_ids.len(),
        "deliveries in flight on the dead channel come again"
    );

    // And the subscription keeps going on the recovered connection.
    publish_confirmed(&publisher, &queue, 2000..2010).await;
    wait_until("messages after recovery to be handled", || {
        let handled: HashSet<u32> = seen.all().into_iter().collect();
        (2000..2010).all(|id| handled.contains(&id))
    })
    .await;

    running.shutdown().await.unwrap();
    cleanup(&broker, &[&queue], &[]).await;
}

async fn record_plain(Json(id): Json<u32>, State(seen): State<Seen<u32>>) {
    seen.push(id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_deleted_with_the_connection_is_declared_again() {
    let name = unique("recovery-topology");
    let broker = broker_named(&name).await;
    let queue = unique("recovery-exclusive");
    let seen = Seen::<u32>::default();
    let running = App::new("recovery-topology")
        .with_state(seen.clone())
        .mount(
            broker.queue(
                conveyor_lapin::QueueSpec::new(queue.as_str())
                    .durable(false)
                    .exclusive(),
            ),
            record_plain,
            |m| m,
        )
        .start()
        .await
        .unwrap();
    let publisher_broker = common::broker().await;
    let publisher = publisher_broker.publisher().await.unwrap();
    publish_confirmed(&publisher, &queue, 0..1).await;
    wait_until("the first message", || seen.len() == 1).await;

    // The exclusive queue goes with its connection; recovery declares it again and
    // resumes the consumer on it.
    assert_eq!(close_connections_named(&name), 1);
    publish_confirmed(&publisher, &queue, 1..2).await;
    wait_until("a message after recovery", || seen.all().contains(&1)).await;

    running.shutdown().await.unwrap();
    cleanup(&broker, &[&queue], &[]).await;
}
