//! SQS stalls for 10 s in the middle of a run: the fault proxy (`common::proxy`) holds
//! every request and answer, closing nothing, so calls under way hang until they time
//! out and new ones get no answer either. The pump and the keeper fail, back off and try
//! again, and the app's health shows the mount as reconnecting; once traffic flows,
//! consumption resumes by itself, the mount shows as running, and no message is lost (what
//! the stall kept from being deleted comes back after its visibility timeout and is
//! handled again: a duplicate, never a loss).
//!
//! The proxy holds this test's traffic only, so the shared emulator on 127.0.0.1:4566
//! (`scripts/services/sqs.sh`) goes on serving the other tests meanwhile.

mod common;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::proxy::Proxy;
use common::{declare, delete, eventually, unique};
use conveyor::{App, Broker, Json, Message, Publisher, QueueSpec, State};
use conveyor_sqs::SqsBroker;

/// How many messages the app consumes across the stall: enough that it is mid-run when
/// the stall comes, few enough that the emulator stays quick (it scans its queue on every
/// receive).
const MESSAGES: u64 = 300;

/// How many workers the mount runs, and how many messages one receive asks for: what the
/// subscription can hold when the stall comes, and so all it can handle during it.
const WORKERS: usize = 2;
const RECEIVE_BATCH: usize = 10;

type Seen = Arc<Mutex<Vec<u64>>>;

fn distinct(seen: &Seen) -> usize {
    seen.lock().unwrap().iter().collect::<HashSet<_>>().len()
}

async fn slowly(Json(n): Json<u64>, State(seen): State<Seen>) {
    tokio::time::sleep(Duration::from_millis(50)).await;
    seen.lock().unwrap().push(n);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumption_resumes_after_a_ten_second_stall_and_nothing_is_lost() {
    let proxy = Proxy::start("127.0.0.1:4566").await;
    // Calls give up 2 s after their poll, so the stall shows as failed calls, many times.
    let broker = SqsBroker::builder()
        .endpoint(proxy.endpoint())
        .region("us-east-1")
        .static_credentials("test", "test")
        .receive_wait(Duration::from_secs(1))
        .visibility_timeout(Duration::from_secs(5))
        .request_timeout(Duration::from_secs(2))
        .build()
        .await
        .unwrap();
    let queue = declare(&broker, QueueSpec::new(unique("outage", false))).await;
    let messages: Vec<Message> = (0..MESSAGES).map(|n| Message::json(&n).unwrap()).collect();
    broker.publish_batch(&queue, messages).await.unwrap();

    let seen = Seen::default();
    let running = App::new("outage")
        .with_state(seen.clone())
        .mount(
            broker.queue(&queue).receive_batch(RECEIVE_BATCH),
            slowly,
            |m| m.workers(WORKERS),
        )
        .start()
        .await
        .unwrap();
    eventually(
        "some messages before the stall",
        Duration::from_secs(30),
        || async { distinct(&seen) >= 30 },
    )
    .await;

    proxy.stall();
    let at_stall = distinct(&seen);
    assert!(
        at_stall < 200,
        "the stall comes mid-run ({at_stall} of {MESSAGES} handled)"
    );
    // The scenario itself: SQS answers nothing for 10 s, or until the mount shows as
    // reconnecting, if that comes later: each call gives up 2 s after its poll, and the
    // SDK tries each three times before the transport sees it fail.
    let stalled = tokio::time::Instant::now();
    eventually(
        "the mount to show as reconnecting",
        Duration::from_secs(30),
        || async { running.health().mounts[0].state == conveyor::MountState::Reconnecting },
    )
    .await;
    assert!(running.health().is_live());
    tokio::time::sleep_until(stalled + Duration::from_secs(10)).await;
    let at_resume = distinct(&seen);
    // Nothing got through: the app handled only what it held when the stall came (the
    // mount's workers plus one receive, and one receive completed just before it).
    assert!(
        at_resume - at_stall <= WORKERS + 2 * RECEIVE_BATCH,
        "{} messages handled during the stall",
        at_resume - at_stall
    );
    proxy.resume();

    eventually(
        "consumption to resume after the stall",
        Duration::from_secs(30),
        || async { distinct(&seen) > at_resume },
    )
    .await;
    eventually(
        "the mount to run again",
        Duration::from_secs(30),
        || async { running.health().is_ready() },
    )
    .await;
    eventually(
        "every message after the stall",
        Duration::from_secs(120),
        || async { distinct(&seen) == MESSAGES as usize },
    )
    .await;
    // Every message was deleted too: none is left to come back.
    eventually("the queue to be empty", Duration::from_secs(60), || async {
        broker
            .queue_depth(&queue)
            .await
            .is_ok_and(|depth| depth.ready == 0 && depth.in_flight == Some(0))
    })
    .await;
    running.shutdown().await.unwrap();

    let handled: HashSet<u64> = seen.lock().unwrap().iter().copied().collect();
    assert_eq!(
        handled,
        (0..MESSAGES).collect::<HashSet<u64>>(),
        "no message lost"
    );
    delete(&broker, &[&queue]).await;
}
