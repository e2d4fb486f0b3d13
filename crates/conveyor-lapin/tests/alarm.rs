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

use common::{broker_named, cleanup, publish_one, unacked_count, unique, wait_for, wait_until};
use conveyor::{App, DeliveryInfo, Json, Publisher, QueueSpec, State};

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriptions_ack_while_a_memory_alarm_blocks_publishing_and_retries() {
    const MESSAGES: usize = 20;
    let name = unique("alarm");
    let broker = broker_named(&name).await;
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
    // A publish during the alarm: the broker blocks the connection it goes out on, and
    // the confirm waits until the alarm clears.
    let publishing = {
        let (broker, elsewhere) = (broker.clone(), elsewhere.clone());
        tokio::spawn(async move { broker.publish_json(&elsewhere, &0u32).await })
    };
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
        running
    })
    .await
    .expect("the subscription starts and acks during the alarm");
    assert!(
        !publishing.is_finished(),
        "the publish went through during the alarm: the test proves nothing"
    );

    drop(alarm);
    tokio::time::timeout(common::DEADLINE, publishing)
        .await
        .expect("the publish completes once the alarm clears")
        .unwrap()
        .unwrap();
    wait_until("the retry handled once the alarm clears", || {
        handled.load(Ordering::SeqCst) == MESSAGES + 1
    })
    .await;
    wait_for("nothing left unacked", || async {
        unacked_count(&queue) == 0
    })
    .await;
    running.shutdown().await.unwrap();
    assert_eq!(broker.queue_depth(&elsewhere).await.unwrap().ready, 1);
    cleanup(&broker, &[&queue, &elsewhere], &[]).await;
    broker.close().await.unwrap();
}
