//! Errors as a service sees them: made by real calls against the emulator on
//! 127.0.0.1:4566, rendered whole by `conveyor::Report` (the error and its causes),
//! and checked for what they quote: no phrase twice, and only the start of an oversize name.

mod common;

use common::{broker, declare, delete, unique};
use conveyor::{App, Broker, Bytes, Error, Message, Publisher, QueueSpec};

/// What an error quotes of a 10 000-character name: its first 80 characters and `…`.
fn cut(name: &str) -> String {
    format!("{}…", name.chars().take(80).collect::<String>())
}

/// The checks every rendered error passes: no part of it (between `: `) comes twice, its
/// own opening phrase does not come again, and no more than 80 characters of `oversize`
/// are quoted.
fn assert_readable(text: &str, oversize: &str) {
    let parts: Vec<&str> = text.split(": ").collect();
    for (i, part) in parts.iter().enumerate() {
        assert!(
            !parts[i + 1..].contains(part),
            "`{part}` comes twice in: {text}"
        );
    }
    let opening: String = parts[0].split('`').next().unwrap_or_default().to_string();
    assert_eq!(
        text.matches(opening.as_str()).count(),
        1,
        "`{opening}` comes twice in: {text}"
    );
    let run: String = oversize.chars().take(81).collect();
    assert!(
        !text.contains(&run),
        "more than 80 characters quoted: {text}"
    );
}

async fn nothing(_: Bytes) {}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_errors_say_why_once_and_cut_an_oversize_name() {
    let broker = broker().await;
    let queue = declare(&broker, QueueSpec::new(unique("texts", false))).await;
    let fifo = declare(&broker, QueueSpec::new(unique("texts", true))).await;
    let long = "x".repeat(10_000);

    let mut crowded = Message::builder();
    for i in 0..11 {
        crowded = crowded.header(format!("h{i}"), "v");
    }
    let crowded = crowded.payload("x");
    let refused = broker.publish(&queue, crowded.clone()).await.unwrap_err();
    assert_eq!(
        conveyor::Report(&refused).to_string(),
        format!(
            "cannot publish to `{queue}`: 11 message attributes (headers and properties); SQS carries at most 10"
        )
    );
    let refused = broker
        .publish_batch(&queue, vec![crowded])
        .await
        .unwrap_err();
    assert_eq!(
        conveyor::Report(&refused).to_string(),
        format!(
            "cannot publish to `{queue}`: 11 message attributes (headers and properties); SQS carries at most 10"
        )
    );

    let reserved = Message::builder().header("AWS.trace", "1").payload("x");
    let refused = broker.publish(&queue, reserved).await.unwrap_err();
    assert_eq!(
        conveyor::Report(&refused).to_string(),
        format!(
            "cannot publish to `{queue}`: header `AWS.trace` cannot be an SQS message attribute: its name starts with `AWS.` or `Amazon.` (in any case), which SQS reserves"
        )
    );

    let oversize_header = Message::builder().header(long.clone(), "1").payload("x");
    let refused = broker.publish(&queue, oversize_header).await.unwrap_err();
    assert_eq!(
        conveyor::Report(&refused).to_string(),
        format!(
            "cannot publish to `{queue}`: header `{}` cannot be an SQS message attribute: its name is longer than the 256 characters SQS takes",
            cut(&long)
        )
    );

    let other_group = Message::builder()
        .partition_key("alice")
        .header("MessageGroupId", "bob")
        .payload("x");
    let refused = broker.publish(&fifo, other_group).await.unwrap_err();
    assert_eq!(
        conveyor::Report(&refused).to_string(),
        format!(
            "cannot publish to `{fifo}`: header `MessageGroupId` is not the partition key: on a FIFO queue the message group is the partition key, which a delivery carries in that header; set `partition_key` rather than the header"
        )
    );

    // The emulator answers that no such queue exists; the SDK's causes follow.
    let missing = broker.publish(&long, Message::new("x")).await.unwrap_err();
    let text = conveyor::Report(&missing).to_string();
    assert!(
        text.starts_with(&format!(
            "cannot publish to `{}`: SQS queue `{}` does not exist: ",
            cut(&long),
            cut(&long)
        )),
        "{text}"
    );
    assert!(
        matches!(&missing, Error::Publish { destination, .. } if *destination == cut(&long)),
        "{missing:?}"
    );

    for error in [refused, missing] {
        assert_readable(&conveyor::Report(&error).to_string(), &long);
    }
    delete(&broker, &[&queue, &fifo]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_about_an_oversize_queue_name_quote_only_its_start() {
    let broker = broker().await;
    let long = "q".repeat(10_000);
    let mut texts = Vec::new();

    let declared = broker.declare_queue(&QueueSpec::new(long.clone())).await;
    let error = declared.expect_err("an oversize name");
    assert_eq!(
        conveyor::Report(&error).to_string(),
        format!(
            "invalid configuration: SQS queue `{}`: a queue name has 1 to 80 characters, `.fifo` included",
            cut(&long)
        )
    );
    texts.push(conveyor::Report(&error).to_string());

    let queue = unique("texts-dead", false);
    let spec = QueueSpec::new(queue.clone()).dead_letter_queue(long.clone(), 5);
    let error = broker
        .declare_queue(&spec)
        .await
        .expect_err("no such queue");
    assert_eq!(
        conveyor::Report(&error).to_string(),
        format!(
            "invalid configuration: the dead-letter queue `{}` of SQS queue `{queue}` does not exist: declare it first",
            cut(&long)
        )
    );
    texts.push(conveyor::Report(&error).to_string());

    // Refused before any call: a queue of that name can never exist.
    let started = App::new("texts")
        .mount(broker.queue(long.clone()), nothing, |m| m)
        .start()
        .await;
    let Err(error) = started else {
        panic!("an oversize name does not start");
    };
    assert_eq!(
        conveyor::Report(&error).to_string(),
        format!(
            "invalid configuration: SQS queue `{}`: a queue name has 1 to 80 characters, `.fifo` included",
            cut(&long)
        )
    );
    texts.push(conveyor::Report(&error).to_string());

    let error = broker.queue_depth(&long).await.expect_err("no such queue");
    assert!(
        conveyor::Report(&error).to_string().starts_with(&format!(
            "transport `sqs` failed: SQS queue `{}` does not exist: ",
            cut(&long)
        )),
        "{error}"
    );
    texts.push(conveyor::Report(&error).to_string());

    let error = broker
        .take_dead_letters(&long, 1)
        .await
        .expect_err("no such queue");
    texts.push(conveyor::Report(&error).to_string());

    for text in texts {
        assert_readable(&text, &long);
    }
}

/// The SDK has no HTTP client of its own here (its default brings a second crypto
/// provider and HTTP stack): an `https://` endpoint is reached through the transport's
/// own client, over TLS, and an endpoint that is no TLS server is an error, not a panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_endpoint_is_spoken_to_over_tls() {
    use tokio::io::AsyncReadExt;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    // Reads what the client sends first, then hangs up.
    let server = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut first = [0u8; 3];
        stream.read_exact(&mut first).await.unwrap();
        first
    });
    let broker = common::broker_at(
        &format!("https://127.0.0.1:{port}"),
        std::time::Duration::from_secs(10),
    )
    .await;
    let error = broker.queue_depth("q").await.unwrap_err();
    let first = server.await.unwrap();
    // A TLS record: handshake (22), protocol version 3.x.
    assert_eq!(&first[..2], &[22, 3], "{first:?}");
    println!("{}", conveyor::Report(&error));
}

/// No secret in logs or errors (DESIGN §6): an endpoint or a queue URL with user
/// information (a proxy or gateway in front of SQS) has its password in neither the
/// builder's `Debug` nor a publish error, shown or debugged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_in_an_endpoint_or_a_queue_url_stays_out_of_debug_and_errors() {
    let builder = conveyor_sqs::SqsBroker::builder()
        .endpoint("http://svc:s3cr3t-pw@127.0.0.1:1")
        .static_credentials("AKIAEXAMPLEKEY", "example-secret-key");
    let debug = format!("{builder:?}");
    assert!(debug.contains("svc:***@127.0.0.1:1"), "{debug}");

    let broker = broker().await;
    let error = broker
        .publish(
            &format!(
                "http://svc:s3cr3t-pw@127.0.0.1:4566/123456789012/{}",
                unique("gone", false)
            ),
            Message::new("x"),
        )
        .await
        .unwrap_err();
    let error = format!("{} | {error:?}", conveyor::Report(&error));
    assert!(error.contains("svc:***@127.0.0.1:4566"), "{error}");
    // A queue mounted by such a URL: the name the app logs it by, and its `Debug`.
    let queue = broker.queue("http://svc:s3cr3t-pw@127.0.0.1:4566/123456789012/orders");
    let mounted = format!("{} | {queue:?}", conveyor::Source::queue_name(&queue));
    assert!(mounted.contains("svc:***@127.0.0.1:4566"), "{mounted}");
    // A request to it that gets no reply in time.
    let timed_out = broker
        .request(
            "http://svc:s3cr3t-pw@127.0.0.1:4566/123456789012/orders",
            Message::new("x"),
            std::time::Duration::ZERO,
        )
        .await
        .unwrap_err();
    let timed_out = format!("{} | {timed_out:?}", conveyor::Report(&timed_out));
    for text in [&debug, &error, &mounted, &timed_out] {
        for secret in ["s3cr3t-pw", "example-secret-key"] {
            assert!(!text.contains(secret), "`{secret}` in: {text}");
        }
    }
}
