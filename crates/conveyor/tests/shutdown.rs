//! Graceful shutdown: in-flight handlers finish and settle, the rest go back at once.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use conveyor::{
    App, DeadLetter, Json, MemoryBroker, MemoryQueue, MemorySubscriber, Message, MountOptions,
    Publisher, QueueDepth, QueueSpec, Source, State, SubscribeSettings, Subscriber,
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
async fn shut_down_stuck<D>(
    configure: fn(MountOptions) -> MountOptions<conveyor::Identity, D>,
    running: usize,
) {
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

/// Who ran which message, in the order they did: `A` is the app being drained, `B` a
/// competing consumer of the same queue started once `A` stops receiving.
#[derive(Clone, Default)]
struct Ran(Arc<Mutex<Vec<(&'static str, u64)>>>);

impl Ran {
    fn push(&self, who: &'static str, n: u64) {
        self.0.lock().unwrap().push((who, n));
    }

    fn all(&self) -> Vec<(&'static str, u64)> {
        self.0.lock().unwrap().clone()
    }
}

/// Lets `A`'s handlers finish.
#[derive(Clone)]
struct Gate(Arc<Semaphore>);

async fn drained_app(Json(n): Json<u64>, State(ran): State<Ran>, State(gate): State<Gate>) {
    ran.push("A started", n);
    gate.0.acquire().await.unwrap().forget();
    ran.push("A finished", n);
}

async fn competing_app(Json(n): Json<u64>, State(ran): State<Ran>) {
    ran.push("B", n);
}

/// Waits for `check`, failing the test with `what` after a minute (a deadline for a
/// busy machine, not a bound the behaviour must meet).
async fn until(what: &str, mut check: impl FnMut() -> bool) {
    tokio::time::timeout(Duration::from_secs(60), async {
        while !check() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out waiting for {what}"));
}

/// Publishes message `n` with partition key `key` (none for `None`) for each pair.
async fn publish_keyed(broker: &MemoryBroker, messages: &[(u64, Option<&str>)]) {
    for &(n, key) in messages {
        let mut message = Message::builder();
        if let Some(key) = key {
            message = message.partition_key(key);
        }
        broker
            .publish("jobs", message.json(&n).unwrap())
            .await
            .unwrap();
    }
}

/// Starts app `A`: one lane on `source`, running `drained_app`.
async fn start_one_lane(source: impl Source, ran: &Ran, gate: &Gate) -> conveyor::RunningApp {
    App::new("a")
        .with_state(ran.clone())
        .with_state(gate.clone())
        .mount(source, drained_app, |m| m.workers(1).by_key())
        .start()
        .await
        .unwrap()
}

/// Starts app `B`, a sequential consumer of the same queue.
async fn start_competitor(broker: &MemoryBroker, ran: &Ran) -> conveyor::RunningApp {
    App::new("b")
        .with_state(ran.clone())
        .mount(broker.queue("jobs"), competing_app, |m| m)
        .start()
        .await
        .unwrap()
}

/// An in-process queue whose subscription notes when its mount stops receiving: a mount
/// does so once its dispatcher has let go of what it hands back at once.
struct NotesStop(MemoryQueue, Arc<AtomicBool>);

struct NotesStopSubscriber(MemorySubscriber, Arc<AtomicBool>);

impl Source for NotesStop {
    type Subscriber = NotesStopSubscriber;

    fn queue_name(&self) -> &str {
        self.0.queue_name()
    }

    async fn subscribe(
        self,
        settings: SubscribeSettings,
    ) -> Result<NotesStopSubscriber, conveyor::Error> {
        Ok(NotesStopSubscriber(
            self.0.subscribe(settings).await?,
            self.1,
        ))
    }
}

impl Subscriber for NotesStopSubscriber {
    async fn recv(&mut self) -> Option<Result<conveyor::Delivery, conveyor::Error>> {
        self.0.recv().await
    }

    async fn stop_receiving(&mut self) {
        self.0.stop_receiving().await;
        self.1.store(true, Ordering::SeqCst);
    }

    async fn close(self) {
        self.0.close().await;
    }
}

/// One lane: `0` runs, `1` waits in the lane, `2` in the dispatcher's hand (the lane is
/// full), all of key `k` on a standard queue, which holds no key back. Draining must keep
/// `1` and `2` until `0` is settled, or a competing consumer could run them first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lanes_at_shutdown_keep_the_dispatchers_delivery_until_the_running_one_of_its_key_settles()
{
    let broker = MemoryBroker::new();
    publish_keyed(&broker, &[(0, Some("k")), (1, Some("k")), (2, Some("k"))]).await;
    let (ran, gate) = (Ran::default(), Gate(Arc::new(Semaphore::new(0))));
    let stopped = Arc::new(AtomicBool::new(false));
    let a = start_one_lane(
        NotesStop(broker.queue("jobs"), stopped.clone()),
        &ran,
        &gate,
    )
    .await;
    until(
        "0 running, 1 in the lane and 2 in the dispatcher's hand",
        || ran.all() == [("A started", 0)] && broker.stats("jobs").in_flight == 3,
    )
    .await;

    a.stop_receiving();
    until("the mount to stop receiving", || {
        stopped.load(Ordering::SeqCst)
    })
    .await;
    let stats = broker.stats("jobs");
    assert_eq!(
        (stats.ready, stats.in_flight),
        (0, 3),
        "key k's 1 and 2 went back while its 0 was still running"
    );

    let b = start_competitor(&broker, &ran).await;
    gate.0.add_permits(1);
    a.shutdown().await.unwrap();
    until("B to run 1 and 2", || ran.all().len() == 4).await;
    b.shutdown().await.unwrap();
    assert_eq!(
        ran.all(),
        [("A started", 0), ("A finished", 0), ("B", 1), ("B", 2)],
        "key k ran in its order across the two consumers"
    );
    assert_eq!(broker.stats("jobs").acked, 3);
}

/// One lane: `0` (key `a`) runs and keyless `1` waits in the lane. Draining hands `1`
/// back at once, while `0` still runs: it waits behind no delivery of its own key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lanes_at_shutdown_hand_back_a_keyless_delivery_waiting_behind_a_running_handler_at_once() {
    let broker = MemoryBroker::new();
    publish_keyed(&broker, &[(0, Some("a")), (1, None)]).await;
    let (ran, gate) = (Ran::default(), Gate(Arc::new(Semaphore::new(0))));
    let a = start_one_lane(broker.queue("jobs"), &ran, &gate).await;
    until("0 running and 1 in the lane", || {
        ran.all() == [("A started", 0)] && broker.stats("jobs").in_flight == 2
    })
    .await;

    a.stop_receiving();
    let b = start_competitor(&broker, &ran).await;
    until("B to run 1 while A's 0 still runs", || ran.all().len() == 2).await;
    assert_eq!(ran.all(), [("A started", 0), ("B", 1)]);

    gate.0.add_permits(1);
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
    assert_eq!(ran.all(), [("A started", 0), ("B", 1), ("A finished", 0)]);
    assert_eq!(broker.stats("jobs").acked, 2);
}

/// One lane: `0` (key `a`) runs, `1` (key `b`) waits in the lane and `2` (key `a`) in
/// the dispatcher's hand. Draining hands `1` back at once and `2` only once `0` is
/// settled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lanes_at_shutdown_hand_back_other_keys_at_once_and_the_running_keys_rest_once_it_settles()
{
    let broker = MemoryBroker::new();
    publish_keyed(&broker, &[(0, Some("a")), (1, Some("b")), (2, Some("a"))]).await;
    let (ran, gate) = (Ran::default(), Gate(Arc::new(Semaphore::new(0))));
    let a = start_one_lane(broker.queue("jobs"), &ran, &gate).await;
    until(
        "0 running, 1 in the lane and 2 in the dispatcher's hand",
        || ran.all() == [("A started", 0)] && broker.stats("jobs").in_flight == 3,
    )
    .await;

    a.stop_receiving();
    let b = start_competitor(&broker, &ran).await;
    until("B to run a message while A's 0 still runs", || {
        ran.all().len() == 2
    })
    .await;
    assert_eq!(
        ran.all(),
        [("A started", 0), ("B", 1)],
        "key b's 1 goes back at once; key a's 2 only once 0 is settled"
    );

    gate.0.add_permits(1);
    a.shutdown().await.unwrap();
    until("B to run 2", || ran.all().len() == 4).await;
    b.shutdown().await.unwrap();
    assert_eq!(
        ran.all(),
        [("A started", 0), ("B", 1), ("A finished", 0), ("B", 2)]
    );
    assert_eq!(broker.stats("jobs").acked, 3);
}
