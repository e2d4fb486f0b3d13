//! `amqps://` against the local broker's TLS listener (127.0.0.1:5671, set up by
//! `scripts/services/rabbitmq.sh` with a certificate from a throwaway CA): trusting the
//! CA, messages go round and the connection recovers over TLS; without it, connecting
//! fails with a certificate error that keeps the password out.
//!
//! The CA certificate is read from [`DEFAULT_CA`], or from the file the
//! `CONVEYOR_RABBITMQ_CA` environment variable names.

mod common;

use conveyor::{App, Message, Publisher};
use conveyor_lapin::{LapinBroker, LapinError};

use common::{
    DEADLINE, Seen, cleanup, close_connections_named, connections_named, init_tracing,
    publish_confirmed, ready, record, unique, wait_until,
};

/// Where `scripts/services/rabbitmq.sh` puts the CA that signed the broker's certificate.
const DEFAULT_CA: &str = "/etc/rabbitmq/conveyor-tls/ca_certificate.pem";

/// The broker's TLS listener; `localhost` is the name its certificate carries.
const TLS_URL: &str = "amqps://guest:guest@localhost:5671/%2f";

/// The CA certificate (PEM) the tests trust.
fn ca_certificate() -> String {
    let path = std::env::var("CONVEYOR_RABBITMQ_CA").unwrap_or_else(|_| DEFAULT_CA.to_string());
    std::fs::read_to_string(&path).unwrap_or_else(|error| {
        panic!("cannot read the broker's CA certificate {path} (run scripts/services/rabbitmq.sh): {error}")
    })
}

/// A TLS connection trusting the test CA, shown as `name` on the server.
async fn tls_broker(name: &str) -> LapinBroker {
    init_tracing();
    LapinBroker::builder(TLS_URL)
        .tls_ca_certificate(ca_certificate())
        .connection_name(name)
        .connect()
        .await
        .expect("RabbitMQ TLS listener on localhost:5671 (run scripts/services/rabbitmq.sh)")
}

/// An error and its sources, one per line.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str("\n  caused by: ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqps_with_the_private_ca_round_trips_a_message() {
    let name = unique("tls-round-trip");
    let broker = tls_broker(&name).await;
    assert_eq!(
        connections_named(&name)
            .into_iter()
            .map(|(_, ssl)| ssl)
            .collect::<Vec<_>>(),
        [true, true],
        "the server sees two TLS connections (consuming and publishing)"
    );
    let queue = unique("tls-round-trip");
    let seen = Seen::<u32>::default();
    let running = App::new("tls-round-trip")
        .with_state(seen.clone())
        .mount(broker.queue(queue.as_str()), record, |m| m)
        .start()
        .await
        .unwrap();

    broker
        .publish(&queue, Message::json(&7u32).unwrap())
        .await
        .unwrap();
    wait_until("the message sent over TLS to be handled", || {
        seen.len() == 1
    })
    .await;
    assert_eq!(seen.all(), [7]);

    running.shutdown().await.unwrap();
    assert_eq!(ready(&broker, &queue).await, 0);
    cleanup(&broker, &[&queue], &[]).await;
    broker.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_amqps_connection_recovers_over_tls() {
    let name = unique("tls-recovery");
    let broker = tls_broker(&name).await;
    let queue = unique("tls-recovery");
    let seen = Seen::<u32>::default();
    let running = App::new("tls-recovery")
        .with_state(seen.clone())
        .mount(broker.queue(queue.as_str()), record, |m| m)
        .start()
        .await
        .unwrap();
    let publisher = broker.publisher().await.unwrap();
    publish_confirmed(&publisher, &queue, Message::json(&1u32).unwrap()).await;
    wait_until("the first message", || seen.len() == 1).await;

    // lapin reconnects with the TLS settings the broker was built with: without the
    // CA, the new handshake would fail and nothing below would arrive.
    assert_eq!(close_connections_named(&name), 2);
    publish_confirmed(&publisher, &queue, Message::json(&2u32).unwrap()).await;
    wait_until("a message after the reconnection", || {
        seen.all().contains(&2)
    })
    .await;
    assert_eq!(
        connections_named(&name)
            .into_iter()
            .map(|(_, ssl)| ssl)
            .collect::<Vec<_>>(),
        [true, true],
        "the recovered connections are TLS ones"
    );

    running.shutdown().await.unwrap();
    cleanup(&broker, &[&queue], &[]).await;
    broker.close().await.unwrap();
}

#[tokio::test]
async fn amqps_without_the_private_ca_fails_with_a_certificate_error_and_no_password() {
    // The handshake fails before any login, so the password is never checked: a
    // distinctive one shows whether it leaks anywhere into the error.
    let password = "tls-test-s3cret";
    let url = format!("amqps://guest:{password}@localhost:5671/%2f");
    let result = tokio::time::timeout(DEADLINE, LapinBroker::connect(&url))
        .await
        .expect("a failed TLS handshake is reported, not retried forever");
    let error = result.expect_err("the broker's certificate is not trusted without its CA");
    assert!(matches!(error, LapinError::Connect { .. }), "{error:?}");

    let text = chain(&error);
    assert!(
        text.contains("certificate"),
        "the error says the certificate is the problem:\n{text}"
    );
    assert!(
        text.contains("amqps://guest:***@localhost:5671/%2f"),
        "the error names the broker:\n{text}"
    );
    let debug = format!("{error:?}");
    assert!(!text.contains(password), "{text}");
    assert!(!debug.contains(password), "{debug}");
}

#[tokio::test]
async fn a_ca_option_without_a_certificate_is_refused_before_connecting() {
    let error = LapinBroker::builder(TLS_URL)
        .tls_ca_certificate("/etc/rabbitmq/conveyor-tls/ca_certificate.pem")
        .connect()
        .await
        .expect_err("a path is not a PEM certificate");
    assert!(
        matches!(
            error,
            LapinError::Invalid {
                what: "TLS CA certificate",
                ..
            }
        ),
        "{error:?}"
    );
}
