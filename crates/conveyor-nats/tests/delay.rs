//! A delayed message reaches its handler once its delay is over, as its first attempt:
//! JetStream 2.9 delays nothing itself, so the subscription that receives it early hands
//! it back with the rest of its delay, and that early delivery is not counted.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use conveyor::{App, Broker, Bytes, DeliveryInfo, Message, Publisher, State};

type Seen = Arc<Mutex<Vec<(Option<u32>, bool)>>>;

async fn record(_: Bytes, info: DeliveryInfo, State(seen): State<Seen>) {
    if let Ok(mut seen) = seen.lock() {
        seen.push((info.receive_count, info.redelivered));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_message_is_handled_as_its_first_attempt() {
    let broker = common::broker().await;
    let queue = common::declared_queue(&broker, "delayed").await;
    let seen = Seen::default();
    let running = App::new("delayed")
        .with_state(seen.clone())
        .mount(broker.queue(&queue), record, |m| m)
        .start()
        .await
        .expect("started");
    broker
        .publish(
            &queue,
            Message::builder()
                .delay(Duration::from_millis(1500))
                .payload("later"),
        )
        .await
        .expect("published");
    let handled = || seen.lock().map(|seen| seen.clone()).unwrap_or_default();
    conveyor_conformance::eventually("the delayed message handled", || async {
        !handled().is_empty()
    })
    .await;
    let handled = handled();
    running.shutdown().await.expect("shut down");
    broker.delete_queue(&queue).await.expect("deleted");
    assert_eq!(
        handled,
        [(Some(1), false)],
        "handled once, as a first attempt"
    );
}
