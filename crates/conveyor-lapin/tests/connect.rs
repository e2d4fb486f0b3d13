//! Connecting: a broker that cannot be reached fails the first connect within its
//! timeout, with an error that names the URL without its password. (`errors.rs` tells
//! a refusal from a timeout, and checks that a failed connect leaves nothing running.)

use std::time::{Duration, Instant};

use conveyor_lapin::{LapinBroker, LapinError};

#[tokio::test]
async fn a_broker_that_cannot_be_reached_fails_the_first_connect_in_time() {
    // A port nothing listens on: bound for a moment, then freed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port();
    let started = Instant::now();
    let error = LapinBroker::builder(format!("amqp://guest:s3cret@127.0.0.1:{port}/%2f"))
        .first_connect_timeout(Duration::from_secs(1))
        .connect()
        .await
        .expect_err("nothing listens there");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    // Every attempt was refused: that is the cause, not the time running out.
    assert!(matches!(error, LapinError::Connect { .. }), "{error:?}");
    let text = format!("{error} {error:?}");
    assert!(text.contains(&format!("127.0.0.1:{port}")), "{text}");
    assert!(!text.contains("s3cret"), "the password leaked: {text}");
}

/// With fallback nodes, a failed first connect names every node it tried, not the
/// URL's alone.
#[tokio::test]
async fn a_failed_first_connect_names_every_node_it_tried() {
    let free_port = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port()
    };
    let (first, second, third) = (free_port(), free_port(), free_port());
    let error = LapinBroker::builder(format!("amqp://guest:s3cret@127.0.0.1:{first}/%2f"))
        .fallback_nodes([format!("127.0.0.1:{second}"), format!("127.0.0.1:{third}")])
        .first_connect_timeout(Duration::from_secs(1))
        .connect()
        .await
        .expect_err("nothing listens there");
    let text = error.to_string();
    for port in [first, second, third] {
        assert!(text.contains(&format!("127.0.0.1:{port}")), "{text}");
    }
    assert!(!text.contains("s3cret"), "the password leaked: {text}");
}

#[tokio::test]
async fn a_zero_reconnect_handshake_timeout_is_refused_before_connecting() {
    // The broker that listens on this machine: the refusal must not depend on reaching it.
    let error = LapinBroker::builder("amqp://guest:guest@127.0.0.1:5672/%2f")
        .reconnect_handshake_timeout(Duration::ZERO)
        .connect()
        .await
        .expect_err("every reconnect would be cut at once");
    assert!(
        matches!(
            error,
            LapinError::Invalid {
                what: "reconnect handshake timeout",
                ..
            }
        ),
        "{error:?}"
    );
    assert_eq!(
        error.to_string(),
        "invalid reconnect handshake timeout: it must be longer than zero"
    );
}

#[tokio::test]
async fn a_url_mistyped_with_one_slash_is_refused_without_showing_its_password() {
    // lapin alone reads it as the default host with the vhost `guest:s3cret@...`, and the
    // broker's refusal names that vhost.
    let error = LapinBroker::connect("amqp:/guest:s3cret@127.0.0.1:5672/%2f")
        .await
        .expect_err("not an amqp:// URL");
    assert!(matches!(error, LapinError::InvalidUrl { .. }), "{error:?}");
    for shown in [error.to_string(), format!("{error:?}")] {
        assert!(!shown.contains("s3cret"), "{shown}");
    }
}

#[tokio::test]
async fn a_first_connect_timeout_of_duration_max_waits_without_overflowing() {
    // The broker that listens on this machine.
    let broker = LapinBroker::builder("amqp://guest:guest@127.0.0.1:5672/%2f")
        .first_connect_timeout(Duration::MAX)
        .connect()
        .await
        .expect("connected");
    broker.close().await.expect("closed");
}
