//! The examples run and exit 0.
//!
//! `cargo test` builds every example next to the test binaries; these tests run them as a
//! user would, from `target/<profile>/examples/`.

use std::path::PathBuf;
use std::process::Command;

fn example(name: &str) -> PathBuf {
    let test_binary = std::env::current_exe().expect("the test binary has a path");
    // target/<profile>/deps/<test> -> target/<profile>/examples/<name>
    let profile_dir = test_binary
        .parent()
        .and_then(|deps| deps.parent())
        .expect("test binaries live in target/<profile>/deps");
    let path = profile_dir
        .join("examples")
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    if !path.exists() {
        // `lanes`, the README's first command, is the core's own example: it builds without
        // the transports.
        let package = if name == "lanes" {
            "conveyor"
        } else {
            "conveyor-examples"
        };
        let built = Command::new(env!("CARGO"))
            .args(["build", "-p", package, "--example", name])
            .status()
            .expect("cargo runs");
        assert!(built.success(), "building example {name} failed");
    }
    path
}

fn run(name: &str) -> String {
    run_with(name, &[])
}

fn run_with(name: &str, args: &[&str]) -> String {
    let output = Command::new(example(name))
        .args(args)
        .output()
        .expect("the example starts");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "example {name} failed: {}\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

#[test]
fn the_lanes_example_writes_its_asyncapi_document() {
    let path = std::env::temp_dir().join(format!("lanes-asyncapi-{}.json", std::process::id()));
    let file = path.to_str().expect("a UTF-8 temporary path");
    let stdout = run_with("lanes", &["--asyncapi", file]);
    assert!(stdout.contains("wrote the AsyncAPI document"), "{stdout}");
    let text = std::fs::read_to_string(&path).expect("the document was written");
    let _ = std::fs::remove_file(&path);
    let document: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(document["asyncapi"], "3.0.0");
    assert_eq!(document["info"]["title"], "lanes");
    let channel = &document["channels"]["orders.fifo"];
    assert_eq!(channel["address"], "orders.fifo");
    assert_eq!(
        channel["messages"]["Order"]["payload"]["$ref"],
        "#/components/schemas/Order"
    );
    let dispatch = &document["operations"]["receive_orders.fifo"]["x-conveyor-dispatch"];
    assert_eq!(dispatch["mode"], "lanes");
    assert_eq!(dispatch["lanes"], 2);
    assert_eq!(
        document["components"]["schemas"]["Order"]["properties"]["number"]["type"],
        "integer"
    );
}

#[test]
fn the_lanes_example_keeps_each_group_in_order_and_exits_0() {
    let stdout = run("lanes");
    for group in ["alice", "bob", "carol"] {
        assert!(
            stdout.contains(&format!("{group}: orders [1, 2, 3, 4, 5] in order")),
            "{stdout}"
        );
    }
    assert!(stdout.contains("lane 0 served"), "{stdout}");
    assert!(stdout.contains("lane 1 served"), "{stdout}");
}

#[test]
fn the_workers_and_batches_example_runs_four_at_once_and_batches_by_ten() {
    let stdout = run("workers_and_batches");
    assert!(
        stdout.contains("at most 4 thumbnails rendered at once"),
        "{stdout}"
    );
    assert!(stdout.contains("batch of 10 metrics"), "{stdout}");
}

#[test]
fn the_idempotency_example_charges_each_payment_once_though_two_come_twice() {
    let stdout = run("idempotency");
    for id in ["p-1", "p-2", "p-3", "p-4", "p-5"] {
        assert!(
            stdout.contains(&format!("{id}: charged 1 time(s)")),
            "{stdout}"
        );
    }
    assert!(
        stdout.contains("7 messages, 5 payments, each charged once"),
        "{stdout}"
    );
}

/// GETs `path` from `address`; returns the status line and the body.
fn get(address: &str, path: &str) -> (String, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address).expect("the example listens");
    // A stuck example fails the test instead of hanging it.
    let limit = Some(std::time::Duration::from_secs(60));
    stream.set_read_timeout(limit).expect("a read timeout");
    let request = format!("GET {path} HTTP/1.1\r\nhost: {address}\r\n\r\n");
    stream.write_all(request.as_bytes()).expect("a request");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("a response");
    let (head, body) = response.split_once("\r\n\r\n").expect("a head and a body");
    let status = head.lines().next().unwrap_or_default().to_string();
    (status, body.to_string())
}

/// The value of the Prometheus series whose line starts with `series`, if there.
fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find(|line| line.starts_with(series))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
}

/// The observability example serves `/metrics` and `/health` next to its app: a scrape
/// sees every order consumed and acked, with the mount's labels, and the probe says ready.
#[test]
fn the_observability_example_serves_metrics_a_scraper_reads_and_a_health_probe() {
    use std::io::BufRead;
    let mut child = Command::new(example("observability"))
        .args(["--port", "0"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("the example starts");
    let mut stdout = std::io::BufReader::new(child.stdout.take().expect("piped"));
    let address = loop {
        let mut line = String::new();
        assert!(
            stdout.read_line(&mut line).expect("output") > 0,
            "no address printed"
        );
        if let Some(rest) = line.strip_prefix("serving http://") {
            break rest.split('/').next().unwrap_or_default().to_string();
        }
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let metrics = loop {
        let (status, metrics) = get(&address, "/metrics");
        assert_eq!(status, "HTTP/1.1 200 OK");
        let acked = metrics
            .lines()
            .find(|l| l.starts_with("conveyor_outcomes{") && l.contains("conveyor_outcome=\"ack\""))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok());
        if acked == Some(100.0) {
            break metrics;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not all acked:\n{metrics}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let mount = "{messaging_system=\"conveyor_in_process\",messaging_destination_name=\"orders\",conveyor_dispatch=\"lanes\"}";
    assert_eq!(
        sample(
            &metrics,
            &format!("messaging_client_consumed_messages{mount}")
        ),
        Some(100.0),
        "{metrics}"
    );
    assert_eq!(
        sample(
            &metrics,
            "messaging_client_sent_messages{messaging_system=\"conveyor_in_process\",messaging_destination_name=\"orders\"}"
        ),
        Some(100.0),
        "{metrics}"
    );
    for series in [
        "messaging_process_duration_count",
        "conveyor_wait_duration_count",
        "conveyor_lane_in_flight{",
        "conveyor_lane_waiting{",
        "conveyor_in_flight{",
    ] {
        assert!(metrics.contains(series), "no {series} in:\n{metrics}");
    }
    assert!(
        !metrics.contains("customer-"),
        "a partition key became a label:\n{metrics}"
    );

    let (status, health) = get(&address, "/health");
    assert_eq!(status, "HTTP/1.1 200 OK", "{health}");
    assert!(
        health.contains("ready: true") && health.contains("orders: Running"),
        "{health}"
    );
    let (_, lanes) = get(&address, "/lanes");
    assert!(
        lanes.contains("hot_keys") && lanes.contains("customer-"),
        "{lanes}"
    );

    // Closing its standard input shuts it down.
    drop(child.stdin.take());
    let status = child.wait().expect("the example exits");
    assert!(status.success(), "{status}");
}

/// The README's service, unchanged but for the line that makes the broker, places its
/// three orders and records the receipts its handler published, on every broker
/// (RabbitMQ, the SQS emulator, NATS and Redis run for the test suite).
#[test]
fn the_service_example_runs_the_same_on_every_broker() {
    for broker in ["memory", "rabbitmq", "sqs", "nats", "redis"] {
        let stdout = run_with("service", &[broker]);
        let lines = ["alice: order 1", "bob: order 2", "alice: order 3"];
        let receipts = [
            "receipt for order 1",
            "receipt for order 2",
            "receipt for order 3",
        ];
        for line in lines.into_iter().chain(receipts) {
            assert!(stdout.contains(line), "{broker}: {stdout}");
        }
    }
}

/// Request/reply runs the same on every broker: three prices asked at once, each answered.
#[test]
fn the_request_reply_example_gets_each_answer_on_every_broker() {
    for broker in ["memory", "rabbitmq", "sqs", "nats", "redis"] {
        let stdout = run_with("request_reply", &[broker]);
        for line in ["tea costs 314", "coffee costs 616", "cake costs 404"] {
            assert!(stdout.contains(line), "{broker}: {stdout}");
        }
    }
}

/// SNS fan-out on the emulator: every order billed, only the physical ones shipped, each
/// customer's in order.
#[test]
fn the_sns_example_bills_every_order_and_ships_the_physical_ones() {
    let stdout = run("sns_fan_out");
    for line in [
        "billing: alice order 1",
        "billing: bob order 2",
        "billing: alice order 3",
        "shipping: alice order 1",
        "shipping: alice order 3",
    ] {
        assert!(stdout.contains(line), "{stdout}");
    }
    assert!(!stdout.contains("shipping: bob"), "{stdout}");
    let alice = |queue: &str| {
        let first = stdout.find(&format!("{queue}: alice order 1"));
        let third = stdout.find(&format!("{queue}: alice order 3"));
        first < third
    };
    assert!(
        alice("billing") && alice("shipping"),
        "alice in order: {stdout}"
    );
}

/// The outbox over SQLite: one process saves three orders and exits without publishing
/// (a crash after the commit); another relays them: every one published, alice's in
/// order.
#[test]
fn the_outbox_example_publishes_after_a_crash_what_was_committed_before_it() {
    let db = std::env::temp_dir().join(format!("conveyor-outbox-test-{}.db", std::process::id()));
    let _ = std::fs::remove_file(&db);
    let path = db.to_string_lossy().into_owned();
    let written = run_with("outbox", &["write", &path]);
    assert!(written.contains("saved order 3"), "{written}");
    assert!(!written.contains("published"), "{written}");
    let relayed = run_with("outbox", &["relay", &path]);
    let _ = std::fs::remove_file(&db);
    for line in [
        "alice: order 1 (tea) published",
        "bob: order 2 (cake) published",
        "alice: order 3 (scone) published",
    ] {
        assert!(relayed.contains(line), "{relayed}");
    }
    let first = relayed.find("alice: order 1");
    let third = relayed.find("alice: order 3");
    assert!(first < third, "alice in order: {relayed}");
}
