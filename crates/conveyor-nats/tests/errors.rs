//! Errors name what failed and never show a password.

mod common;

use std::time::Duration;

use conveyor_nats::NatsBroker;

#[tokio::test]
async fn a_failed_connection_names_the_server_without_its_password() {
    // Nothing listens on port 1.
    let error = NatsBroker::builder()
        .url("nats://app:s3cret@127.0.0.1:1")
        .connect_timeout(Duration::from_secs(2))
        .build()
        .await
        .expect_err("nothing listens there");
    let text = format!("{error} {error:?}");
    assert!(!text.contains("s3cret"), "{text}");
    assert!(text.contains("127.0.0.1:1"), "{text}");
    // A token alone.
    let error = NatsBroker::builder()
        .url("nats://t0ken@127.0.0.1:1")
        .connect_timeout(Duration::from_secs(2))
        .build()
        .await
        .expect_err("nothing listens there");
    let text = format!("{error} {error:?}");
    assert!(!text.contains("t0ken"), "{text}");
}

#[tokio::test]
async fn a_queue_name_nats_cannot_take_is_refused_before_any_call() {
    use conveyor::Publisher;
    let broker = NatsBroker::connect("nats://127.0.0.1:4222")
        .await
        .expect("a broker on the local NATS server (scripts/services/nats.sh)");
    let refused = broker
        .publish("orders.*", conveyor::Message::new("x"))
        .await;
    assert!(
        matches!(refused, Err(conveyor::Error::Refused { .. })),
        "{refused:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_queue_ends_the_app_with_an_error_naming_it() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use conveyor::{App, Broker, Error, Publisher, State};

    async fn count(_: conveyor::Bytes, State(seen): State<Arc<AtomicU32>>) {
        seen.fetch_add(1, Ordering::SeqCst);
    }

    let broker = common::broker().await;
    let queue = common::declared_queue(&broker, "deleted").await;
    broker
        .publish(&queue, conveyor::Message::new("x"))
        .await
        .expect("published");
    let seen = Arc::new(AtomicU32::new(0));
    let app =
        App::new("deleted")
            .with_state(seen.clone())
            .mount(broker.queue(&queue), count, |m| m);
    let running = tokio::spawn(app.run_until(std::future::pending()));
    conveyor_conformance::eventually("the message handled", || async {
        seen.load(Ordering::SeqCst) > 0
    })
    .await;
    broker.delete_queue(&queue).await.expect("deleted");
    let ended = tokio::time::timeout(Duration::from_secs(60), running)
        .await
        .expect("the app stops by itself")
        .expect("the app's task");
    let error = ended.expect_err("a deleted queue is an error");
    assert!(
        matches!(&error, Error::Subscribe { queue: q, .. } if *q == queue),
        "{error:?}"
    );
}
