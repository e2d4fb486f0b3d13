//! A resource alarm blocks publishing, not acking.
//!
//! RabbitMQ blocks a connection that publishes while a memory or disk alarm is on, and
//! lapin writes nothing more on a blocked connection, acks included. A broker publishes
//! on a connection of its own, so its subscriptions go on acking through an alarm.
//!
//! The alarm is the node's (`rabbitmqctl set_vm_memory_high_watermark 0`), so this is the
//! only test in its binary: nothing else runs beside it while publishing is blocked, and
//! the watermark is put back even if the test fails.

mod common;

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{cleanup, publish_one, unacked_count, unique, wait_for, wait_until};
use conveyor::{App, ConnectionState, DeliveryInfo, Json, Publisher, QueueSpec, State};
use conveyor_lapin::LapinBroker;

fn rabbitmqctl(args: &[&str]) -> String {
    let output = Command::new("rabbitmqctl")
        .args(args)
        .output()
        .expect("rabbitmqctl");
    assert!(
        output.status.success(),
        "rabbitmqctl {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

/// The node's memory alarm, on while this lives: a watermark of 0 sets it off at once.
/// Dropping it puts the watermark back.
struct MemoryAlarm {
    watermark: String,
}

impl MemoryAlarm {
    fn raise() -> Self {
        let watermark = rabbitmqctl(&[
            "-q",
            "eval",
            "vm_memory_monitor:get_vm_memory_high_watermark().",
        ]);
        assert!(
            watermark.parse::<f64>().is_ok_and(|w| w > 0.0),
            "an unexpected watermark: {watermark}"
        );
        rabbitmqctl(&["-q", "set_vm_memory_high_watermark", "0"]);
        MemoryAlarm { watermark }
    }
}

impl Drop for MemoryAlarm {
    fn drop(&mut self) {
        rabbitmqctl(&["-q", "set_vm_memory_high_watermark", &self.watermark]);
    }
}

/// Fails the first attempt of message 0, so that one retry is republished during the
/// alarm; handles everything else at once.
async fn count(
    Json(n): Json<u32>,
    info: DeliveryInfo,
    State(handled): State<Arc<AtomicUsize>>,
) -> Result<(), String> {
    handled.fetch_add(1, Ordering::SeqCst);
    if n == 0 && info.attempt == 1 {
        return Err("planned failure".into());
    }
    Ok(())
}

/// The state the server gives the connection named `name` (`running`, `blocking`,
/// `blocked`, `flow`), if there is one. (The name is the client's `connection_name`
/// property, which the listing quotes whole: `X` does not match `X (publishing)`.)
fn connection_state(name: &str) -> Option<String> {
    let quoted = [format!("\"{name}\""), format!("<<\"{name}\">>")];
    rabbitmqctl(&["-q", "-s", "list_connections", "state", "client_properties"])
        .lines()
        .find(|line| quoted.iter().any(|q| line.contains(q.as_str())))
        .and_then(|line| line.split('\t').next())
        .map(str::to_string)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriptions_ack_while_a_memory_alarm_blocks_publishing_and_retries_wait() {
    const MESSAGES: usize = 20;
    const CONFIRM_TIMEOUT: Duration = Duration::from_secs(3);
    let name = unique("alarm");
    let broker = LapinBroker::builder(common::URL)
        .connection_name(name.as_str())
        .confirm_timeout(CONFIRM_TIMEOUT)
        .connect()
        .await
        .unwrap();
    let (queue, elsewhere) = (unique("alarm-consumed"), unique("alarm-published"));
    for queue in [&queue, &elsewhere] {
        broker
            .declare_queue(&QueueSpec::new(queue.as_str()))
            .await
            .unwrap();
    }
    for n in 0..MESSAGES {
        publish_one(&broker, &queue, n as u32).await;
    }

    let alarm = MemoryAlarm::raise();
    // A publish during the alarm: the broker blocks the connection it goes out on (the
    // publish itself gives up after the confirm timeout).
    let publishing = {
        let (broker, elsewhere) = (broker.clone(), elsewhere.clone());
        tokio::spawn(async move { broker.publish_json(&elsewhere, &0u32).await })
    };
    let publishing_connection = format!("{name} (publishing)");
    wait_until("the publishing connection to be blocked", || {
        connection_state(&publishing_connection).as_deref() == Some("blocked")
    })
    .await;
    // The app's health shows it too, from what RabbitMQ told the client.
    let states = || {
        conveyor::Broker::connections(&broker)
            .into_iter()
            .map(|c| (c.name, c.state))
            .collect::<Vec<_>>()
    };
    wait_until(
        "the health to show the publishing connection blocked",
        || {
            states()
                == [
                    ("consuming".to_string(), ConnectionState::Connected),
                    ("publishing".to_string(), ConnectionState::Blocked),
                ]
        },
    )
    .await;
    // A publish into the blocked connection is not sent: it would wait in the client for
    // the alarm's end. It fails after the confirm timeout, not when the alarm clears.
    let blocked = tokio::time::timeout(common::DEADLINE, broker.publish_json(&elsewhere, &2u32))
        .await
        .expect("a publish into a blocked connection ends");
    let error = blocked.unwrap_err();
    let conveyor::Error::Publish { source, .. } = &error else {
        panic!("{error}");
    };
    assert!(
        matches!(
            source.downcast_ref::<conveyor_lapin::LapinError>(),
            Some(conveyor_lapin::LapinError::Blocked { .. })
        ),
        "{error}: {source}"
    );
    // Nor does a new publisher's channel open: it fails as blocked after the confirm
    // timeout, instead of waiting for the alarm's end (and every publish behind it).
    let opened = tokio::time::timeout(common::DEADLINE, broker.publisher())
        .await
        .expect("opening a channel on a blocked connection ends");
    assert!(
        matches!(opened, Err(conveyor_lapin::LapinError::Blocked { .. })),
        "{:?}",
        opened.err()
    );
    // The consuming connection is `blocking`: it would be blocked if it published, and it
    // never does.
    assert_ne!(
        connection_state(&name).as_deref(),
        Some("blocked"),
        "the consuming connection never publishes"
    );
    let handled = Arc::new(AtomicUsize::new(0));
    // Bounded, so that a hang fails the test and the alarm is cleared on the way out.
    let running = tokio::time::timeout(common::DEADLINE, async {
        let running = App::new("alarm")
            .with_state(handled.clone())
            .mount(broker.queue(queue.as_str()), count, |m| {
                m.workers(4).retry()
            })
            .start()
            .await
            .unwrap();
        wait_until("every message handled once", || {
            handled.load(Ordering::SeqCst) == MESSAGES
        })
        .await;
        // Every ack reaches the broker; only message 0 is held, its copy waiting to be
        // published.
        wait_for("the acks to reach the broker", || {
            let (broker, queue) = (&broker, &queue);
            async move {
                unacked_count(queue) == 1 && broker.queue_depth(queue).await.unwrap().ready == 0
            }
        })
        .await;
        // Several confirm timeouts later, message 0 is still held: its copy was never
        // sent into the blocked connection, so it did not time out, and the original was
        // not requeued to fail and be copied again.
        tokio::time::sleep(3 * CONFIRM_TIMEOUT).await;
        assert_eq!(
            handled.load(Ordering::SeqCst),
            MESSAGES,
            "no run during the alarm"
        );
        assert_eq!(unacked_count(&queue), 1, "message 0 still held");
        running
    })
    .await
    .expect("the subscription starts and acks during the alarm");

    drop(alarm);
    let _ = publishing.await;
    wait_until("the retry handled once the alarm clears", || {
        handled.load(Ordering::SeqCst) == MESSAGES + 1
    })
    .await;
    wait_for("nothing left unacked or ready", || async {
        unacked_count(&queue) == 0 && broker.queue_depth(&queue).await.unwrap().ready == 0
    })
    .await;
    assert_eq!(
        handled.load(Ordering::SeqCst),
        MESSAGES + 1,
        "one copy of message 0, not one per confirm timeout"
    );
    running.shutdown().await.unwrap();
    // Published and confirmed after the alarm, on the same channel: whatever that
    // channel had written before is in the queue before it. The first publish is (its
    // frames waited in the client, and went out when the alarm ended); the one refused
    // as blocked is not.
    broker.publish_json(&elsewhere, &1u32).await.unwrap();
    let arrived: Vec<u32> = common::take_all(&elsewhere)
        .await
        .iter()
        .map(|message| message.number())
        .collect();
    assert_eq!(arrived, [0, 1], "the blocked publish (2) was never sent");
    cleanup(&broker, &[&queue, &elsewhere], &[]).await;
    broker.close().await.unwrap();
}
