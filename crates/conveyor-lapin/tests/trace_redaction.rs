//! Live (RabbitMQ on 127.0.0.1:5672, `rabbitmqctl` to add a user): at TRACE, lapin prints
//! the login's password, unless `hide_credentials()` (or the
//! `HIDE_CREDENTIALS_DIRECTIVES`) filter it out.
//!
//! This is a binary of its own on purpose: lapin's I/O loop logs from its own thread,
//! through the global subscriber, so the test has to set one (once, for the whole
//! binary), with one capturing layer per way of filtering. Every layer sees the same
//! events, so comparing their captures is deterministic: the unfiltered one proves that
//! the password was printed, the others that it was dropped, and only it.

mod common;

use std::io;
use std::sync::{Arc, Mutex, OnceLock};

use conveyor::{Message, Publisher, QueueSpec};
use conveyor_lapin::{HIDE_CREDENTIALS_DIRECTIVES, LapinBroker, hide_credentials};
use lapin::types::LongString;
use lapin::{Connection, ConnectionProperties};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::fmt::format::{DefaultFields, Format};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::{EnvFilter, Layer, fmt};

use common::TempUser;

/// A log captured in memory.
#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl Buffer {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
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

/// What each layer of the global subscriber wrote.
struct Captures {
    /// Everything, at TRACE.
    unfiltered: Buffer,
    /// Filtered by `hide_credentials()`.
    hidden: Buffer,
    /// Filtered by an `EnvFilter` with `trace` and the `HIDE_CREDENTIALS_DIRECTIVES`.
    directives: Buffer,
}

/// A fmt layer writing to `buffer`, without colours.
fn plain_layer<S>(buffer: &Buffer) -> fmt::Layer<S, DefaultFields, Format, Buffer> {
    fmt::layer().with_ansi(false).with_writer(buffer.clone())
}

/// Sets the global subscriber, on the first call.
fn captures() -> &'static Captures {
    static CAPTURES: OnceLock<Captures> = OnceLock::new();
    CAPTURES.get_or_init(|| {
        let captures = Captures {
            unfiltered: Buffer::default(),
            hidden: Buffer::default(),
            directives: Buffer::default(),
        };
        let directives = EnvFilter::new(format!("trace,{HIDE_CREDENTIALS_DIRECTIVES}"));
        let subscriber = tracing_subscriber::registry()
            .with(plain_layer(&captures.unfiltered).with_filter(LevelFilter::TRACE))
            .with(plain_layer(&captures.hidden).with_filter(hide_credentials()))
            .with(plain_layer(&captures.directives).with_filter(directives));
        tracing::subscriber::set_global_default(subscriber)
            .expect("the only global subscriber of this binary");
        captures
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

/// Whether `log` shows `secret`, as text or as lapin's list of bytes.
fn shows(log: &str, secret: &str) -> bool {
    log.contains(secret) || log.contains(&as_byte_list(secret))
}

#[tokio::test(flavor = "multi_thread")]
async fn lapin_traces_show_the_password_unless_filtered() {
    let captures = captures();
    // A user of its own, so that its password is found in the logs only where it
    // leaked (guest's would also match the user name).
    let user = TempUser::add("conveyor-trace");
    let queue = format!("conveyor-test.trace.{}", user.name);

    // Conveyor's connection: the login (Connection.StartOk, SASL PLAIN), then a
    // declaration and a confirmed publish, whose frames should stay in the logs.
    let broker = LapinBroker::connect(&user.url()).await.unwrap();
    broker.declare_queue(&QueueSpec::new(&queue)).await.unwrap();
    broker.publish(&queue, Message::new("hello")).await.unwrap();
    broker.delete_queue(&queue).await.unwrap();
    broker.close().await.unwrap();

    // Through lapin directly, what Conveyor never does: a login with AMQPLAIN (the
    // password in a table), then a token refresh (Connection.UpdateSecret), which lapin
    // logs as a frame and as an internal command. RabbitMQ may refuse the new secret;
    // by then it has been logged.
    let token = format!("Tk{}zz", user.password);
    let amqplain = format!("{}?auth_mechanism=amqplain", user.url());
    let connection = Connection::connect(&amqplain, ConnectionProperties::default())
        .await
        .unwrap();
    let _refused = connection
        .update_secret(LongString::from(token.as_str()), "test".into())
        .await;
    let _ = connection.close(200, "bye".into()).await;

    let unfiltered = captures.unfiltered.text();
    let hidden = captures.hidden.text();
    let directives = captures.directives.text();

    // Unfiltered, the password shows, in the form lapin prints it: the SASL PLAIN
    // response (`\0user\0password`) as a list of bytes. So does the new token, in the
    // frame and in the internal command. Else this test could not see a leak.
    let login = format!("\0{}\0{}", user.name, user.password);
    for leak in [
        "next_msg=AMQPFrame::Method(Connection(StartOk(StartOk { client_properties:".into(),
        format!("response: LongString([{}])", as_byte_list(&login)),
        "mechanism: ShortString(\"AMQPLAIN\"), response: LongString([".into(),
        format!("{}]), locale", as_byte_list(&user.password)),
        format!("new_secret: LongString([{}])", as_byte_list(&token)),
        format!(
            "command=UpdateSecret(LongString([{}])",
            as_byte_list(&token)
        ),
    ] {
        assert!(unfiltered.contains(&leak), "no {leak} in:\n{unfiltered}");
    }

    // Filtered, neither the password nor the token shows, as text or as bytes.
    for secret in [user.password.as_str(), token.as_str()] {
        assert!(
            !shows(&hidden, secret),
            "hide_credentials let {secret} through:\n{hidden}"
        );
        assert!(
            !shows(&directives, secret),
            "the directives let {secret} through:\n{directives}"
        );
    }

    // And the rest of lapin's TRACE output stays: with `hide_credentials`, the other
    // outgoing frames and internal commands too.
    for kept in [
        "lapin::io_loop: will write to buffer next_msg=AMQPFrame::Method(Basic(Publish(",
        "lapin::io_loop: will write to buffer next_msg=AMQPFrame::Method(Queue(Declare(",
        "lapin::io_loop: will write to buffer next_msg=AMQPFrame::Method(Connection(Open(",
        "lapin::io_loop: will write to buffer next_msg=AMQPFrame::Body",
        "lapin::internal_rpc: Handling internal RPC command command=CreateChannel(",
        "lapin::channels: will handle frame frame=Method(0, Connection(Start(",
        "lapin::io_loop: wrote ",
    ] {
        assert!(
            hidden.contains(kept),
            "hide_credentials dropped {kept}:\n{hidden}"
        );
    }
    for kept in [
        "lapin::channels: will handle frame frame=Method(0, Connection(Start(",
        "lapin::io_loop: wrote ",
        "lapin::frames: state is now waiting",
    ] {
        assert!(
            directives.contains(kept),
            "the directives dropped {kept}:\n{directives}"
        );
    }
}

/// lapin warns of every message the broker returns; the warning says where it went and
/// why, and no longer prints the message itself (payload and headers, the application's
/// data, at WARN).
#[tokio::test(flavor = "multi_thread")]
async fn the_warning_of_a_returned_message_leaves_the_message_out() {
    let captures = captures();
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

    let log = captures.unfiltered.text();
    let warnings: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("Server returned us a message") && line.contains(&nowhere))
        .collect();
    assert_eq!(warnings.len(), 1, "{log}");
    assert!(warnings[0].contains("WARN"), "{}", warnings[0]);
    assert!(warnings[0].contains("NO_ROUTE"), "{}", warnings[0]);
    assert!(!shows(warnings[0], &payload), "{}", warnings[0]);
}
