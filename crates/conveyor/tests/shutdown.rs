//! Graceful shutdown: in-flight handlers finish and settle, the rest go back at once.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use conveyor::{
    App, DeadLetter, Json, MemoryBroker, MemoryQueue, Message, MountOptions, Publisher, QueueDepth,
    QueueSpec, State,
};
use tokio::sync::Semaphore;

/// Handlers that wait for the test to let them finish, noting who started and finished.
#[derive(Clone)]
struct Work {
    gate: Arc<Semaphore>,
    started: Arc<Mutex<HashSet<u64>>>,
    finished: Arc<Mutex<HashSet<u64>>>,
}

impl Work {
    fn new() -> Self {
        Work {
            gate: Arc::new(Semaphore::new(0)),
            started: Arc::default(),
            finished: Arc::default(),
        }
    }

    async fn wait_started(&self, n: usize) {
        tokio::time::timeout(Duration::from_secs(10), async {
            while self.started.lock().unwrap().len() < n {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("handlers did not start in time");
    }
}

async fn work(Json(n): Json<u64>, State(work): State<Work>) {
    work.started.lock().unwrap().insert(n);
    work.gate.acquire().await.unwrap().forget();
    work.finished.lock().unwrap().insert(n);
}

async fn publish_numbers(broker: &MemoryBroker, n: u64) {
    for i in 0..n {
        broker.publish_json("jobs", &i).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_finishes_in_flight_work_and_returns_the_rest_at_once() {
    let broker = MemoryBroker::new();
    broker.record_history(true);
    publish_numbers(&broker, 10).await;
    let work_state = Work::new();
    let running = App::new("shutdown")
        .with_state(work_state.clone())
        .mount(broker.queue("jobs"), work, |m| m.workers(2).by_key())
        .start()
        .await
        .unwrap();
    work_state.wait_started(2).await;

    let stopping = tokio::spawn(running.shutdown());
    // While shutting down, nothing is acked before its handler finished.
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
    assert!(
        broker.acked("jobs").is_empty(),
        "acked before the handler finished"
    );
    work_state.gate.add_permits(10);
    stopping.await.unwrap().unwrap();

    let started = work_state.started.lock().unwrap().clone();
    let finished = work_state.finished.lock().unwrap().clone();
    assert_eq!(started, finished, "every started handler finished");
    let acked: HashSet<u64> = broker
        .acked("jobs")
        .iter()
        .map(|m| m.json().unwrap())
        .collect();
    assert_eq!(acked, finished);
    let stats = broker.stats("jobs");
    assert_eq!(stats.in_flight, 0);
    assert_eq!(
        stats.ready + acked.len(),
        10,
        "nothing lost: the unstarted are back"
    );
    assert_eq!(stats.consumers, 0);
}

/// Mounts `work` (which never finishes here) with `configure`, waits until `running`
/// handlers have started, and shuts down with a short timeout.
async fn shut_down_stuck(configure: fn(MountOptions) -> MountOptions, running: usize) {
    let broker = MemoryBroker::new();
    publish_numbers(&broker, 5).await;
    let work_state = Work::new();
    let app = App::new("stuck")
        .with_state(work_state.clone())
        .shutdown_timeout(Duration::from_millis(100))
        .mount(broker.queue("jobs"), work, configure)
        .start()
        .await
        .unwrap();
    work_state.wait_started(running).await;
    app.shutdown().await.unwrap();
    // Checked as soon as shutdown returns: the cancelled handlers' deliveries are back.
    let stats = broker.stats("jobs");
    assert_eq!(stats.acked, 0);
    assert_eq!(stats.in_flight, 0);
    assert_eq!(stats.ready, 5, "every message is back on the queue");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handlers_past_the_shutdown_timeout_are_cancelled_and_their_messages_returned() {
    shut_down_stuck(|m| m, 1).await;
    shut_down_stuck(|m| m.workers(3), 3).await;
    shut_down_stuck(|m| m.workers(3).by_key(), 3).await;
}

#[tokio::test]
async fn sequential_shutdown_releases_nothing_it_has_not_received() {
    let broker = MemoryBroker::new();
    publish_numbers(&broker, 3).await;
    let work_state = Work::new();
    let running = App::new("sequential")
        .with_state(work_state.clone())
        .mount(broker.queue("jobs"), work, |m| m)
        .start()
        .await
        .unwrap();
    work_state.wait_started(1).await;
    running.stop_receiving();
    work_state.gate.add_permits(1);
    running.shutdown().await.unwrap();
    assert_eq!(
        work_state.started.lock().unwrap().len(),
        1,
        "nothing started after the stop"
    );
    let stats = broker.stats("jobs");
    assert_eq!(
        stats.acked as usize,
        work_state.finished.lock().unwrap().len()
    );
    assert_eq!(stats.ready as u64 + stats.acked, 3);
}

/// An in-process broker that notes when it is closed, next to what the handler noted.
#[derive(Clone, Default)]
struct Events(Arc<Mutex<Vec<&'static str>>>, MemoryBroker);

impl Publisher for Events {
    async fn publish(&self, destination: &str, message: Message) -> Result<(), conveyor::Error> {
        self.1.publish(destination, message).await
    }
}

impl conveyor::Broker for Events {
    type Queue = MemoryQueue;

    fn queue(&self, name: &str) -> MemoryQueue {
        self.1.queue(name)
    }

    async fn declare_queue(&self, spec: &QueueSpec) -> Result<(), conveyor::Error> {
        conveyor::Broker::declare_queue(&self.1, spec).await
    }

    async fn delete_queue(&self, name: &str) -> Result<(), conveyor::Error> {
        conveyor::Broker::delete_queue(&self.1, name).await
    }

    async fn queue_depth(&self, name: &str) -> Result<QueueDepth, conveyor::Error> {
        self.1.queue_depth(name).await
    }

    async fn take_dead_letters(
        &self,
        queue: &str,
        max: usize,
    ) -> Result<Vec<DeadLetter>, conveyor::Error> {
        self.1.take_dead_letters(queue, max).await
    }

    async fn close(&self) -> Result<(), conveyor::Error> {
        self.0.lock().unwrap().push("broker closed");
        Ok(())
    }
}

async fn slow_note(Json(_n): Json<u64>, State(events): State<Events>) {
    tokio::time::sleep(Duration::from_millis(50)).await;
    events.0.lock().unwrap().push("handled");
}

#[tokio::test]
async fn the_brokers_the_app_owns_are_closed_after_the_last_handler_settles() {
    let broker = MemoryBroker::new();
    publish_numbers(&broker, 1).await;
    let events = Events::default();
    let running = App::new("owner")
        .with_state(events.clone())
        .broker(events.clone())
        .broker(broker.clone())
        .mount(broker.queue("jobs"), slow_note, |m| m)
        .start()
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), async {
        while broker.stats("jobs").in_flight == 0 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the handler started");
    running.shutdown().await.unwrap();
    assert_eq!(*events.0.lock().unwrap(), vec!["handled", "broker closed"]);
    assert_eq!(broker.stats("jobs").acked, 1);
}
