//! Errors that tell the cause: a failed first connect says why (refused, no answer, a
//! refused login) and leaves nothing running; a message whose headers the connection
//! cannot carry is refused before the broker sees it, and the connection goes on; error
//! texts quote oversize names by their start, and never say the same thing twice.
//!
//! The tests take turns ([`SERIAL`]): the first-connect ones count the process's lapin
//! threads, which another test's connection would add to.

mod common;

use std::io::Read;
use std::net::TcpListener;
use std::time::{Duration, Instant};

use conveyor::{App, DeliveryInfo, Json, Message, Publisher, QueueSpec, State};
use conveyor_lapin::{LapinBroker, LapinError, LapinQueue, PublishOptions, RabbitQueueSpec};

use common::{Seen, URL, broker_named, cleanup, connections_named, ready, unique, wait_until};

/// One test at a time in this file.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// How long lapin's thread may take to end after a failed first connect: it ends within
/// moments, so this is slack for a loaded machine, not a delay anything waits out.
const THREAD_DEADLINE: Duration = Duration::from_secs(10);

/// The first-connect timeout of these tests.
const FIRST_CONNECT: Duration = Duration::from_secs(1);

/// How many threads of this process are lapin's connection threads (`lapin-io-loop`).
fn lapin_threads() -> usize {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        panic!("no /proc/self/task: these tests need Linux");
    };
    tasks
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .filter(|name| name.trim_end() == "lapin-io-loop")
        .count()
}

/// Waits until no lapin thread is left, for at most [`THREAD_DEADLINE`].
async fn no_lapin_thread_left(after: &str) {
    let deadline = Instant::now() + THREAD_DEADLINE;
    while lapin_threads() > 0 {
        assert!(
            Instant::now() < deadline,
            "a lapin thread still runs {THREAD_DEADLINE:?} after {after}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A port of 127.0.0.1 nothing listens on (bound for a moment, then freed).
fn closed_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port()
}

/// Checks that nothing connects to `port` any more: listening there, no connection comes
/// within a second (the client has no thread left to make one, so this only confirms it).
async fn nothing_connects_to(port: u16) {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("the port again");
    let attempt = tokio::time::timeout(Duration::from_secs(1), listener.accept()).await;
    assert!(
        attempt.is_err(),
        "a connection attempt came after connect() had failed"
    );
}

/// The io::Error at the bottom of `error`'s causes, if there is one.
fn io_cause<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a std::io::Error> {
    let mut cause = Some(error);
    while let Some(error) = cause {
        if let Some(io) = error.downcast_ref::<std::io::Error>() {
            return Some(io);
        }
        cause = error.source();
    }
    None
}

#[tokio::test]
async fn lapin_threads_are_counted_and_end_with_their_connection() {
    let _serial = SERIAL.lock().await;
    no_lapin_thread_left("the previous test").await;
    let broker = LapinBroker::connect(URL)
        .await
        .expect("RabbitMQ on 127.0.0.1:5672");
    assert_eq!(
        lapin_threads(),
        2,
        "a broker's two connections (consuming, publishing) run a lapin thread each"
    );
    broker.close().await.unwrap();
    no_lapin_thread_left("the connection closed").await;
}

#[tokio::test]
async fn a_refused_first_connect_says_refused_and_leaves_nothing_running() {
    let _serial = SERIAL.lock().await;
    no_lapin_thread_left("the previous test").await;
    let port = closed_port();
    let started = Instant::now();
    let error = LapinBroker::builder(format!("amqp://guest:s3cret@127.0.0.1:{port}/%2f"))
        .first_connect_timeout(FIRST_CONNECT)
        .connect()
        .await
        .expect_err("nothing listens there");
    assert!(
        started.elapsed() < FIRST_CONNECT + Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );

    // The cause is the refusal, not a timeout: it kept trying until its time was up,
    // and every attempt was refused.
    assert!(matches!(error, LapinError::Connect { .. }), "{error:?}");
    let io = io_cause(&error).expect("an io::Error as the cause");
    assert_eq!(
        io.kind(),
        std::io::ErrorKind::ConnectionRefused,
        "{error:?}"
    );
    let text = conveyor::Report(&conveyor::Error::from(error)).to_string();
    assert!(text.to_lowercase().contains("refused"), "{text}");
    assert!(!text.contains("within"), "not a timeout: {text}");
    assert!(text.contains(&format!("127.0.0.1:{port}")), "{text}");
    assert!(!text.contains("s3cret"), "the password leaked: {text}");

    // Nothing it started goes on: no thread, no more attempts.
    no_lapin_thread_left("connect() failed").await;
    nothing_connects_to(port).await;
}

#[tokio::test]
async fn a_handshake_without_answer_times_out_and_is_cut() {
    let _serial = SERIAL.lock().await;
    no_lapin_thread_left("the previous test").await;
    // Accepts connections and never says a word: the AMQP handshake gets no answer.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let error = LapinBroker::builder(format!("amqp://guest:guest@127.0.0.1:{port}/%2f"))
        .first_connect_timeout(FIRST_CONNECT)
        .connect()
        .await
        .expect_err("nothing answers there");

    assert!(
        matches!(
            &error,
            LapinError::ConnectTimeout { after, waiting_for, .. }
                if *after == FIRST_CONNECT && waiting_for.contains("AMQP handshake")
        ),
        "{error:?}"
    );
    let text = conveyor::Report(&error).to_string();
    assert!(text.contains("did not answer within 1s"), "{text}");

    // The connections it opened (consuming, publishing) were closed: the server's end
    // reads their end.
    for _ in 0..2 {
        let (mut accepted, _) = listener.accept().expect("a connection it opened");
        accepted
            .set_read_timeout(Some(THREAD_DEADLINE))
            .expect("a read timeout");
        let mut header = [0u8; 8];
        accepted
            .read_exact(&mut header)
            .expect("the protocol header");
        assert_eq!(&header, b"AMQP\x00\x00\x09\x01");
        let mut rest = [0u8; 1];
        assert_eq!(
            accepted.read(&mut rest).expect("the end of the stream"),
            0,
            "the client closed the connection it gave up on"
        );
    }

    no_lapin_thread_left("connect() timed out").await;
    listener.set_nonblocking(true).unwrap();
    assert!(
        matches!(listener.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "no other connection came"
    );
    drop(listener);
    nothing_connects_to(port).await;
}

#[tokio::test]
async fn a_refused_login_says_so_and_leaves_nothing_running() {
    let _serial = SERIAL.lock().await;
    no_lapin_thread_left("the previous test").await;
    let error = LapinBroker::builder("amqp://guest:wrong-password@127.0.0.1:5672/%2f")
        .first_connect_timeout(Duration::from_secs(20))
        .connect()
        .await
        .expect_err("the password is wrong");
    let text = conveyor::Report(&error).to_string() + &format!(" {error:?}");
    assert!(text.contains("ACCESS_REFUSED"), "{text}");
    assert!(
        !text.contains("wrong-password"),
        "the password leaked: {text}"
    );
    no_lapin_thread_left("the login was refused").await;
}

/// Holds its handler until the test opens the gate.
#[derive(Clone)]
struct Gate(tokio::sync::watch::Receiver<bool>);

async fn held(
    Json(id): Json<u32>,
    info: DeliveryInfo,
    State(seen): State<Seen<(u32, bool)>>,
    State(gate): State<Gate>,
) {
    seen.push((id, info.redelivered));
    let _ = gate.0.clone().wait_for(|open| *open).await;
}

/// A message with one header of `size` bytes.
fn with_header_of(size: usize) -> Message {
    Message::builder()
        .header("x-big", "h".repeat(size))
        .json(&7u32)
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_over_the_frame_limit_are_refused_and_the_connection_goes_on() {
    let _serial = SERIAL.lock().await;
    let name = unique("errors-frame-connection");
    let broker = broker_named(&name).await;
    let (busy, target) = (unique("frame-busy"), unique("frame-target"));
    for queue in [&busy, &target] {
        broker.declare_queue(&queue.as_str().into()).await.unwrap();
    }

    // A delivery in flight on another channel of the same connection.
    broker.publish_json(&busy, &1u32).await.unwrap();
    let seen = Seen::<(u32, bool)>::default();
    let (open, gate) = tokio::sync::watch::channel(false);
    let running = App::new("frame")
        .with_state(seen.clone())
        .with_state(Gate(gate))
        .mount(broker.queue(busy.as_str()), held, |m| m.workers(1))
        .start()
        .await
        .unwrap();
    wait_until("the delivery in flight", || seen.len() == 1).await;
    let connections = connections_named(&name);
    assert_eq!(
        connections.len(),
        2,
        "consuming and publishing: {connections:?}"
    );

    // RabbitMQ's frame limit is 128 KiB by default: these headers need more.
    let error = broker
        .publish(&target, with_header_of(200_000))
        .await
        .expect_err("the headers are over the frame limit");
    let text = conveyor::Report(&error).to_string();
    let source = std::error::Error::source(&error).and_then(|e| e.downcast_ref::<LapinError>());
    let Some(&LapinError::HeadersTooLarge { size, limit, .. }) = source else {
        panic!("not HeadersTooLarge: {error:?}");
    };
    // Nothing was sent, and the same message would be refused again.
    assert!(
        matches!(error, conveyor::Error::Refused { .. }),
        "{error:?}"
    );
    assert!(size > 200_000 && size > limit as usize, "{size} {limit}");
    assert!(limit >= 4096, "the negotiated frame_max: {limit}");
    assert_eq!(
        text,
        format!(
            "cannot publish to `{target}`: its properties and headers make a {size}-byte header frame, over the connection's frame limit of {limit} bytes (frame_max)"
        )
    );

    // A batch with one such message sends none of them.
    let batch = vec![Message::json(&1u32).unwrap(), with_header_of(200_000)];
    let error = broker.publish_batch(&target, batch).await.unwrap_err();
    assert!(
        text_of_source(&error).contains("over the connection's frame limit"),
        "{error}"
    );
    // On an exchange too, through a publisher of its own.
    let publisher = broker.publisher().await.unwrap();
    let error = publisher
        .publish_to(
            "",
            &target,
            with_header_of(200_000),
            PublishOptions::default(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(error, LapinError::HeadersTooLarge { .. }),
        "{error:?}"
    );

    // The connection goes on: a message that fits is published, on the same connection
    // (never closed and recovered), and the delivery in flight is settled once.
    broker.publish_json(&target, &2u32).await.unwrap();
    publisher
        .publish_to("", &target, with_header_of(1000), PublishOptions::default())
        .await
        .unwrap();
    assert_eq!(ready(&broker, &target).await, 2, "only the two that fit");
    open.send_replace(true);
    running.shutdown().await.unwrap();
    assert_eq!(
        seen.all(),
        vec![(1, false)],
        "handled once, never redelivered"
    );
    assert_eq!(ready(&broker, &busy).await, 0, "acked");
    assert_eq!(
        connections_named(&name),
        connections,
        "the same connections"
    );
    cleanup(&broker, &[&busy, &target], &[]).await;
    broker.close().await.unwrap();
}

/// The text of `error`'s source alone.
fn text_of_source(error: &conveyor::Error) -> String {
    std::error::Error::source(error).map_or_else(String::new, ToString::to_string)
}

async fn ignore(Json(_): Json<u32>) {}

/// Asserts that `text` says nothing twice: no two of its `: `-separated parts are the
/// same, and no part is a wrapper's prefix said again.
fn says_nothing_twice(text: &str) {
    let parts: Vec<&str> = text.split(": ").collect();
    for (i, part) in parts.iter().enumerate() {
        assert!(
            !parts[i + 1..].contains(part),
            "`{part}` comes twice in: {text}"
        );
    }
    for prefix in ["cannot publish to", "cannot subscribe to", "transport `"] {
        assert!(
            text.matches(prefix).count() <= 1,
            "`{prefix}` comes twice in: {text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_texts_say_each_thing_once_and_quote_oversize_names_by_their_start() {
    let _serial = SERIAL.lock().await;
    let broker = broker_named("conveyor-test-errors").await;
    let queue = unique("errors-texts");
    let full = unique("errors-full");
    broker.declare_queue(&queue.as_str().into()).await.unwrap();
    broker
        .declare_queue(
            &QueueSpec::new(full.as_str())
                .argument("x-max-length", 1)
                .argument("x-overflow", "reject-publish"),
        )
        .await
        .unwrap();
    broker.publish_json(&full, &1u32).await.unwrap();
    let missing = unique("errors-missing");
    let oversize = "q".repeat(10_000);
    let mut texts = Vec::new();

    // Returned unroutable: no such queue.
    let error = broker.publish_json(&missing, &1u32).await.unwrap_err();
    assert_eq!(
        conveyor::Report(&error).to_string(),
        format!("cannot publish to `{missing}`: the message was returned unroutable: 312 NO_ROUTE")
    );
    texts.push(conveyor::Report(&error).to_string());
    // Nacked: the queue is full and refuses more.
    let error = broker.publish_json(&full, &2u32).await.unwrap_err();
    assert_eq!(
        conveyor::Report(&error).to_string(),
        format!("cannot publish to `{full}`: the broker refused the message (basic.nack)")
    );
    texts.push(conveyor::Report(&error).to_string());
    // A queue name too long for AMQP, and a header name too.
    let error = broker.publish_json(&oversize, &1u32).await.unwrap_err();
    texts.push(conveyor::Report(&error).to_string());
    let error = broker
        .publish(
            &queue,
            Message::builder()
                .header(oversize.clone(), "v")
                .payload("x"),
        )
        .await
        .unwrap_err();
    assert!(
        conveyor::Report(&error)
            .to_string()
            .contains("invalid header name"),
        "{error}"
    );
    texts.push(conveyor::Report(&error).to_string());
    // A delivery delay, which RabbitMQ cannot do.
    let error = broker
        .publish(
            &queue,
            Message::builder()
                .delay(Duration::from_secs(1))
                .payload("x"),
        )
        .await
        .unwrap_err();
    assert_eq!(
        conveyor::Report(&error).to_string(),
        format!(
            "cannot publish to `{queue}`: invalid message: it asks for a delivery delay, which plain RabbitMQ cannot do"
        )
    );
    texts.push(conveyor::Report(&error).to_string());
    // Subscribing, passively, to a missing queue; and with an oversize name.
    for name in [missing.as_str(), oversize.as_str()] {
        let source: LapinQueue = broker.queue(name).passive();
        let app = App::new("errors").mount(source, ignore, |m| m);
        let Err(error) = app.start().await else {
            panic!("subscribed to `{name}`, which does not exist");
        };
        texts.push(conveyor::Report(&error).to_string());
    }
    // Declaring with an oversize name, and reading its depth.
    let error = broker
        .declare_queue(&QueueSpec::new(oversize.as_str()))
        .await
        .unwrap_err();
    texts.push(conveyor::Report(&error).to_string());
    let error = broker.queue_depth(&oversize).await.unwrap_err();
    texts.push(conveyor::Report(&error).to_string());
    // A refused connection.
    let error = LapinBroker::builder(format!("amqp://127.0.0.1:{}", closed_port()))
        .first_connect_timeout(Duration::from_millis(200))
        .connect()
        .await
        .unwrap_err();
    texts.push(conveyor::Report(&conveyor::Error::from(error)).to_string());

    for text in &texts {
        says_nothing_twice(text);
        assert!(
            !text.contains(&"q".repeat(65)),
            "an oversize name quoted beyond its first 64 characters: {text}"
        );
        assert!(text.len() < 600, "{} bytes: {text}", text.len());
    }
    let oversize_quoted = format!("`{}…`", "q".repeat(64));
    assert!(
        texts
            .iter()
            .filter(|t| t.contains(&oversize_quoted))
            .count()
            >= 4,
        "{texts:#?}"
    );
    cleanup(&broker, &[&queue, &full], &[]).await;
    broker.close().await.unwrap();
}

/// RabbitMQ's `max_message_size` by default from 3.8 to 3.13 (4.0 lowered it to 16 MiB),
/// so a body over it is over any default.
const MAX_MESSAGE_SIZE: usize = 128 * 1024 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_the_brokers_message_size_limit_is_refused_and_the_next_publish_goes_through() {
    let _serial = SERIAL.lock().await;
    let name = unique("errors-oversize-body");
    let broker = broker_named(&name).await;
    let target = unique("oversize-target");
    broker.declare_queue(&target.as_str().into()).await.unwrap();

    // The limit is the broker's alone (AMQP does not negotiate it), so only its refusal,
    // which closes the publishing channel, can say a body is too large.
    let body = vec![b'x'; MAX_MESSAGE_SIZE + 1];
    let error = broker
        .publish(&target, Message::new(body))
        .await
        .expect_err("the body is over the broker's limit");
    assert!(
        matches!(error, conveyor::Error::Publish { .. }),
        "{error:?}"
    );
    let text = conveyor::Report(&error).to_string();
    assert!(
        text.contains("is larger than configured max size"),
        "{text}"
    );

    // The next publish opens a channel again; the refused body was not queued.
    broker.publish_json(&target, &2u32).await.unwrap();
    assert_eq!(
        ready(&broker, &target).await,
        1,
        "only the message that fits"
    );
    cleanup(&broker, &[&target], &[]).await;
    broker.close().await.unwrap();
}
