//! Errors name what failed and never show a password.

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
