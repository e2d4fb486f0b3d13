//! What the conformance suite proves by a queue's depth, proven on JetStream by another
//! subscription instead: its consumer info counts a released message as pending
//! acknowledgement, not as ready, so depth cannot show a release. Each message stays
//! leased for two minutes here, longer than any wait: only a release lets a second
//! subscription have it.

mod common;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use conveyor::{App, Broker, Json, Message, Publisher, QueueSpec, RunningApp, State};
use conveyor_nats::NatsBroker;
use tokio::sync::watch;

const LEASE: Duration = Duration::from_secs(120);
const DEADLINE: Duration = Duration::from_secs(60);

/// The jobs a handler started, and a gate they wait at.
#[derive(Clone)]
struct Seen {
    started: Arc<Mutex<Vec<u64>>>,
    gate: watch::Receiver<bool>,
}

impl Seen {
    fn new(open: bool) -> (Seen, watch::Sender<bool>) {
        let (gate, watching) = watch::channel(open);
        let seen = Seen {
            started: Arc::default(),
            gate: watching,
        };
        (seen, gate)
    }

    fn started(&self) -> Vec<u64> {
        self.started.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

async fn hold(Json(id): Json<u64>, State(seen): State<Seen>) {
    if let Ok(mut started) = seen.started.lock() {
        started.push(id);
    }
    let mut gate = seen.gate.clone();
    let _ = gate.wait_for(|open| *open).await;
}

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let waited = tokio::time::timeout(DEADLINE, async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "timed out waiting for {what}");
}

async fn queue_with(broker: &NatsBroker, jobs: u64) -> String {
    let name = common::unique("release");
    broker
        .declare_queue(&QueueSpec::new(name.as_str()).visibility_timeout(LEASE))
        .await
        .expect("declared");
    let messages = (0..jobs)
        .map(|id| Message::builder().partition_key(format!("k{id}")).json(&id))
        .collect::<Result<Vec<_>, _>>()
        .expect("encoded");
    broker
        .publish_batch(&name, messages)
        .await
        .expect("published");
    name
}

async fn app(broker: &NatsBroker, queue: &str, seen: &Seen, workers: usize) -> RunningApp {
    App::new("release")
        .with_state(seen.clone())
        .mount(broker.queue(queue), hold, |m| m.workers(workers))
        .start()
        .await
        .expect("started")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn draining_releases_what_did_not_start_to_another_subscription_while_handlers_run() {
    const JOBS: u64 = 10;
    let broker = common::broker_at(common::URL, LEASE).await;
    let queue = queue_with(&broker, JOBS).await;
    let (first, first_gate) = Seen::new(false);
    let draining = app(&broker, &queue, &first, 2).await;
    until("two handlers at the gate", || first.started().len() == 2).await;
    draining.stop_receiving();
    let (second, _open) = Seen::new(true);
    let taking_over = app(&broker, &queue, &second, 4).await;
    until("the eight unstarted jobs at the second app", || {
        second.started().len() == 8
    })
    .await;
    assert_eq!(first.started().len(), 2, "the running handlers still run");
    first_gate.send_replace(true);
    draining.shutdown().await.expect("shut down");
    taking_over.shutdown().await.expect("shut down");
    let all: BTreeSet<u64> = first
        .started()
        .into_iter()
        .chain(second.started())
        .collect();
    assert_eq!(all, (0..JOBS).collect());
    assert_eq!(broker.queue_depth(&queue).await.expect("depth").ready, 0);
    broker.delete_queue(&queue).await.expect("deleted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apps_shut_down_mid_stream_in_turn_lose_nothing_and_leave_nothing_leased() {
    const JOBS: u64 = 100;
    let broker = common::broker_at(common::URL, LEASE).await;
    let queue = queue_with(&broker, JOBS).await;
    let (seen, _open) = Seen::new(true);
    for round in 1..=5usize {
        let running = app(&broker, &queue, &seen, 3).await;
        until(&format!("{} jobs handled", round * 10), || {
            seen.started().iter().collect::<BTreeSet<_>>().len() >= round * 10
        })
        .await;
        running.shutdown().await.expect("shut down");
    }
    // Whatever the five apps held and did not finish was released at their shutdown:
    // the last app has it well within the lease.
    let last = app(&broker, &queue, &seen, 3).await;
    until("every job handled", || {
        seen.started().iter().collect::<BTreeSet<_>>().len() == JOBS as usize
    })
    .await;
    last.shutdown().await.expect("shut down");
    let depth = broker.queue_depth(&queue).await.expect("depth");
    assert_eq!(
        (depth.ready, depth.in_flight),
        (0, Some(0)),
        "all acknowledged"
    );
    broker.delete_queue(&queue).await.expect("deleted");
}
