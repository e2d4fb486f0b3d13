//! Live (RabbitMQ on 127.0.0.1:5672, `rabbitmqctl` to add a user): with a plain
//! `tracing_subscriber::fmt()` at TRACE and no filter, no log line shows the password or
//! a refreshed secret, while lapin still logs the frames that carried them.
//!
//! This is a binary of its own on purpose: lapin's I/O loop logs from its own thread,
//! through the global subscriber, so the test sets one (once, for the whole binary), as
//! a service would: `fmt()` at TRACE, nothing filtered, written to a buffer the tests
//! read.

mod common;

use std::io;
use std::sync::{Arc, Mutex, OnceLock};

use conveyor::{App, Message, Publisher, QueueSpec};
use conveyor_lapin::LapinBroker;
use lapin::types::LongString;
use lapin::{Connection, ConnectionProperties};
use tracing_subscriber::fmt::MakeWriter;

use common::{Seen, TempUser, publish_one, record, wait_until};

/// A log captured in memory.
#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl Buffer {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    fn bytes(&self) -> Vec<u8> {
        self.0.lock().unwrap().clone()
    }
}

impl io::Write for Buffer {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Buffer {
    type Writer = Buffer;

    fn make_writer(&'a self) -> Buffer {
        self.clone()
    }
}

/// Sets the global subscriber, on the first call: a plain `fmt()` at TRACE, no filter,
/// no colours, writing to the returned buffer.
fn log() -> &'static Buffer {
    static LOG: OnceLock<Buffer> = OnceLock::new();
    LOG.get_or_init(|| {
        let log = Buffer::default();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(log.clone())
            .finish();
        tracing::subscriber::set_global_default(subscriber)
            .expect("the only global subscriber of this binary");
        log
    })
}

/// How lapin prints a secret: amq-protocol's `LongString` is a list of bytes
/// (`LongString([0, 117, 115, ...])`).
fn as_byte_list(secret: &str) -> String {
    secret
        .bytes()
        .map(|byte| byte.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Standard base64, with its padding.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut encoded = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, byte)| n | u32::from(*byte) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                encoded.push(char::from(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]));
            } else {
                encoded.push('=');
            }
        }
    }
    encoded
}

/// The ways a secret can be printed: as text, escaped as `Debug` escapes it (`\0` of
/// SASL PLAIN), as lapin's list of bytes, in hex and in base64 (padding dropped, as it
/// depends on what follows).
fn renderings(secret: &str) -> Vec<String> {
    let debug = format!("{secret:?}");
    vec![
        secret.to_string(),
        debug.trim_matches('"').to_string(),
        secret.escape_default().to_string(),
        as_byte_list(secret),
        secret.bytes().map(|byte| format!("{byte:02x}")).collect(),
        base64(secret.as_bytes()).trim_end_matches('=').to_string(),
    ]
}

#[test]
fn base64_is_standard() {
    assert_eq!(base64(b"\0user\0pass"), "AHVzZXIAcGFzcw==");
    assert_eq!(base64(b"Pw1xyz"), "UHcxeHl6");
    assert_eq!(base64(b"Pw"), "UHc=");
}

#[tokio::test(flavor = "multi_thread")]
async fn no_log_line_shows_the_password_or_a_new_secret() {
    let log = log();
    // A user of its own, so that its password is found in the log only where it leaked
    // (guest's would also match the user name).
    let user = TempUser::add("conveyor-trace");
    let queue = format!("conveyor-test.trace.{}", user.name);

    // Conveyor's connections: the login (Connection.StartOk, SASL PLAIN), then a
    // declaration, a confirmed publish and its consumption.
    let broker = LapinBroker::connect(&user.url()).await.unwrap();
    broker.declare_queue(&QueueSpec::new(&queue)).await.unwrap();
    let seen = Seen::<u32>::default();
    let running = App::new("trace")
        .with_state(seen.clone())
        .mount(broker.queue(&queue), record, |m| m)
        .start()
        .await
        .unwrap();
    publish_one(&broker, &queue, 7).await;
    wait_until("the message to be handled", || seen.len() == 1).await;
    running.shutdown().await.unwrap();
    broker.delete_queue(&queue).await.unwrap();
    broker.close().await.unwrap();

    // Through lapin directly, what Conveyor never does: a login with AMQPLAIN (the
    // password in a table), then a token refresh (Connection.UpdateSecret), which lapin
    // logs as an internal command and as a frame. Its answer does not matter (RabbitMQ
    // 3.10 accepts it for a user of its internal database): lapin logs both before it
    // sends the frame, as the assertions below check.
    let token = format!("Tk{}", user.password.chars().rev().collect::<String>());
    let amqplain = format!("{}?auth_mechanism=amqplain", user.url());
    let connection = Connection::connect(&amqplain, ConnectionProperties::default())
        .await
        .unwrap();
    let _answer = connection
        .update_secret(LongString::from(token.as_str()), "test".into())
        .await;
    let _ = connection.close(200, "bye".into()).await;

    let text = log.text();
    let bytes = log.bytes();
    // Neither secret shows, in any form: the password (in the SASL PLAIN response
    // `\0user\0password`, and alone, as AMQPLAIN's table holds it) and the new token.
    let login = format!("\0{}\0{}", user.name, user.password);
    for secret in [user.password.as_str(), login.as_str(), token.as_str()] {
        for rendering in renderings(secret) {
            let leak = text.lines().find(|line| line.contains(&rendering));
            assert!(leak.is_none(), "{rendering:?} (for {secret:?}) in {leak:?}");
        }
        // The raw bytes too (a NUL is kept as is in the buffer).
        assert!(
            !bytes
                .windows(secret.len())
                .any(|window| window == secret.as_bytes()),
            "{secret:?} in the log's bytes"
        );
    }
    // While the frames and commands that carried them are logged (else this test would
    // prove nothing), with the secrets hidden.
    for logged in [
        "lapin::io_loop: will write to buffer next_msg=AMQPFrame::Method(Connection(StartOk(StartOk { client_properties:",
        "mechanism: ShortString(\"PLAIN\"), response: ***, locale:",
        "mechanism: ShortString(\"AMQPLAIN\"), response: ***, locale:",
        "lapin::io_loop: will write to buffer next_msg=AMQPFrame::Method(Connection(UpdateSecret(UpdateSecret { new_secret: ***, reason: ShortString(\"test\") })))",
        "lapin::internal_rpc: Queuing internal RPC command command=UpdateSecret(***, ShortString(\"test\"), ",
        "lapin::internal_rpc: Handling internal RPC command command=UpdateSecret(***, ShortString(\"test\"), ",
        // The rest of lapin's TRACE output, as before.
        "lapin::io_loop: will write to buffer next_msg=AMQPFrame::Method(Basic(Publish(",
        "lapin::io_loop: will write to buffer next_msg=AMQPFrame::Method(Basic(Consume(",
        "lapin::io_loop: will write to buffer next_msg=AMQPFrame::Method(Connection(Open(",
        "lapin::internal_rpc: Handling internal RPC command command=CreateChannel(",
        "lapin::channels: will handle frame frame=Method(0, Connection(Start(",
    ] {
        assert!(text.contains(logged), "no {logged} in:\n{text}");
    }
}

/// lapin warns of every message the broker returns; the warning says where it went and
/// why, and no longer prints the message itself (payload and headers, the application's
/// data, at WARN).
#[tokio::test(flavor = "multi_thread")]
async fn the_warning_of_a_returned_message_leaves_the_message_out() {
    let log = log();
    let broker = LapinBroker::connect(common::URL).await.unwrap();
    let nowhere = common::unique("nowhere");
    let payload = format!("card-{}", std::process::id());
    let returned = broker
        .publish(
            &nowhere,
            Message::builder()
                .header("x-token", payload.clone())
                .payload(payload.clone()),
        )
        .await;
    assert!(returned.is_err(), "returned unroutable");
    broker.close().await.unwrap();

    let log = log.text();
    let warnings: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("Server returned us a message") && line.contains(&nowhere))
        .collect();
    assert_eq!(warnings.len(), 1, "{log}");
    assert!(warnings[0].contains("WARN"), "{}", warnings[0]);
    assert!(warnings[0].contains("NO_ROUTE"), "{}", warnings[0]);
    for rendering in renderings(&payload) {
        assert!(!warnings[0].contains(&rendering), "{}", warnings[0]);
    }
}
