//! Connections killed mid-stream: subscriptions resume by themselves and nothing is lost.
//!
//! This file is its own test binary, so killing every connection cannot disturb the other
//! live tests (cargo runs test binaries one after another).

mod common;

use std::collections::HashSet;
use std::process::Command;

use conveyor::{App, Json, Message, Publisher, State};
use conveyor_lapin::LapinPublisher;

use common::{Seen, broker, cleanup, unique, wait_until};

async fn record(Json(id): Json<u32>, State(seen): State<Seen<u32>>) {
    seen.push(id);
}

fn close_all_connections() {
    let status = Command::new("rabbitmqctl")
        .args(["-q", "close_all_connections", "test"])
        .status()
        .expect("rabbitmqctl");
    assert!(status.success(), "rabbitmqctl close_all_connections failed");
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
    let broker = broker().await;
    let queue = unique("recovery");
    let seen = Seen::<u32>::default();
    let running = App::new("recovery")
        .with_state(seen.clone())
        .mount(broker.queue(queue.as_str()), record, |m| {
            m.workers(4).by_key()
        })
        .start()
        .await
        .unwrap();

    let publisher_broker = common::broker().await;
    let publisher = publisher_broker.publisher().await.unwrap();
    let publishing = {
        let (publisher, queue) = (publisher.clone(), queue.clone());
        tokio::spawn(async move { publish_confirmed(&publisher, &queue, 0..2000).await })
    };
    wait_until("some messages to be handled", || seen.len() >= 300).await;

    close_all_connections();
    let handled_at_kill = seen.len();

    publishing.await.unwrap();
    wait_until(
        "every message to be handled after the connection loss",
        || {
            let handled: HashSet<u32> = seen.all().into_iter().collect();
            (0..2000).all(|id| handled.contains(&id))
        },
    )
    .await;
    assert!(
        handled_at_kill < 2000,
        "the kill came after everything was handled"
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
