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
        let built = Command::new(env!("CARGO"))
            .args(["build", "-p", "conveyor-examples", "--example", name])
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

/// The README's service, unchanged but for the line that makes the broker, places its
/// three orders and records the receipts its handler published, on every broker
/// (RabbitMQ and the SQS emulator run for the test suite).
#[test]
fn the_service_example_runs_the_same_on_every_broker() {
    for broker in ["memory", "rabbitmq", "sqs"] {
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
