//! Dispatch modes on the in-process transport: lanes, workers, back-pressure, batches.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use conveyor::testing::TestApp;
use conveyor::{App, Batch, DeliveryInfo, Json, MemoryBroker, Message, PartitionKey, State};
use tokio::sync::Semaphore;

/// A small deterministic generator, so "random" delays repeat from run to run.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// One handled message: (lane, key, sequence number within its key).
type Entry = (Option<usize>, Option<String>, u64);

/// Every handled message, in the order handled.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<Entry>>>);

impl Log {
    fn push(&self, info: &DeliveryInfo, key: Option<PartitionKey>, n: u64) {
        self.0
            .lock()
            .unwrap()
            .push((info.lane, key.map(|k| k.to_string()), n));
    }

    fn entries(&self) -> Vec<Entry> {
        self.0.lock().unwrap().clone()
    }
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Numbered {
    n: u64,
    delay_us: u64,
}

async fn record_after_delay(
    Json(msg): Json<Numbered>,
    key: Option<PartitionKey>,
    info: DeliveryInfo,
    State(log): State<Log>,
) {
    tokio::time::sleep(Duration::from_micros(msg.delay_us)).await;
    log.push(&info, key, msg.n);
}

/// Publishes `messages` to `orders` under `keys` keys drawn at random (the same every
/// run), each numbered within its key and asking for a random delay of up to 3 ms.
async fn publish_numbered(test: &TestApp, keys: u64, messages: u64) {
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    let mut next_per_key = vec![0u64; keys as usize];
    for _ in 0..messages {
        let key = rng.next() % keys;
        let n = next_per_key[key as usize];
        next_per_key[key as usize] += 1;
        let message = Message::builder()
            .partition_key(format!("key-{key}"))
            .json(&Numbered {
                n,
                delay_us: rng.next() % 3_000,
            })
            .unwrap();
        test.publish("orders", message).await.unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn lanes_keep_each_key_in_order() {
    const KEYS: u64 = 100;
    const MESSAGES: u64 = 10_000;
    let broker = MemoryBroker::new();
    let log = Log::default();
    let app = App::new("lanes").with_state(log.clone()).mount(
        broker.queue("orders"),
        record_after_delay,
        |m| m.workers(8).by_key(),
    );
    let test = TestApp::start(app, &broker).await.unwrap();
    publish_numbered(&test, KEYS, MESSAGES).await;
    test.settled().await.unwrap();

    let entries = log.entries();
    assert_eq!(entries.len() as u64, MESSAGES);
    let mut seen: HashMap<String, (usize, u64)> = HashMap::new();
    let mut lanes_used = std::collections::HashSet::new();
    for (lane, key, n) in entries {
        let (lane, key) = (lane.unwrap(), key.unwrap());
        lanes_used.insert(lane);
        let expected = seen.entry(key.clone()).or_insert((lane, 0));
        assert_eq!(
            expected.0, lane,
            "key {key} moved from lane {} to {lane}",
            expected.0
        );
        assert_eq!(expected.1, n, "key {key} out of order");
        expected.1 += 1;
    }
    assert_eq!(lanes_used.len(), 8, "keys spread over every lane");
    test.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn any_worker_keeps_each_key_in_order_while_keys_move_between_workers() {
    const KEYS: u64 = 100;
    const MESSAGES: u64 = 10_000;
    let broker = MemoryBroker::new();
    let log = Log::default();
    let app = App::new("any-worker").with_state(log.clone()).mount(
        broker.queue("orders"),
        record_after_delay,
        |m| m.workers(8).by_key().any_worker(),
    );
    let test = TestApp::start(app, &broker).await.unwrap();
    publish_numbered(&test, KEYS, MESSAGES).await;
    test.settled().await.unwrap();

    let entries = log.entries();
    assert_eq!(entries.len() as u64, MESSAGES);
    let mut next: HashMap<String, u64> = HashMap::new();
    let mut workers_of: HashMap<String, std::collections::HashSet<usize>> = HashMap::new();
    for (worker, key, n) in entries {
        let (worker, key) = (worker.unwrap(), key.unwrap());
        let expected = next.entry(key.clone()).or_default();
        assert_eq!(*expected, n, "key {key} out of order");
        *expected += 1;
        workers_of.entry(key).or_default().insert(worker);
    }
    let used: std::collections::HashSet<usize> = workers_of.values().flatten().copied().collect();
    assert_eq!(used.len(), 8, "every worker ran");
    assert!(
        workers_of.values().all(|workers| workers.len() > 1),
        "no key is tied to one worker"
    );
    test.stop().await.unwrap();
}

#[tokio::test]
async fn keyless_deliveries_rotate_over_the_lanes() {
    let broker = MemoryBroker::new();
    let log = Log::default();
    let app = App::new("rotation").with_state(log.clone()).mount(
        broker.queue("jobs"),
        record_after_delay,
        |m| m.workers(3).by_key(),
    );
    let test = TestApp::start(app, &broker).await.unwrap();
    for n in 0..9 {
        test.publish_json("jobs", &Numbered { n, delay_us: 0 })
            .await
            .unwrap();
    }
    test.settled().await.unwrap();
    let mut lane_of = vec![0usize; 9];
    for (lane, key, n) in log.entries() {
        assert_eq!(key, None);
        lane_of[n as usize] = lane.unwrap();
    }
    for n in 1..9 {
        assert_eq!(lane_of[n], (lane_of[n - 1] + 1) % 3, "lanes {lane_of:?}");
    }
    test.stop().await.unwrap();
}

/// A handler that blocks until the test lets it go, counting how many run at once.
#[derive(Clone)]
struct Gate {
    permits: Arc<Semaphore>,
    running: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
}

impl Gate {
    fn closed() -> Self {
        Gate {
            permits: Arc::new(Semaphore::new(0)),
            running: Arc::new(AtomicUsize::new(0)),
            peak: Arc::new(AtomicUsize::new(0)),
        }
    }

    async fn wait_running(&self, n: usize) {
        tokio::time::timeout(Duration::from_secs(10), async {
            while self.running.load(Ordering::SeqCst) < n {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("handlers did not start in time");
    }
}

async fn gated(Json(_n): Json<u64>, State(gate): State<Gate>) {
    let now = gate.running.fetch_add(1, Ordering::SeqCst) + 1;
    gate.peak.fetch_max(now, Ordering::SeqCst);
    gate.permits.acquire().await.unwrap().forget();
    gate.running.fetch_sub(1, Ordering::SeqCst);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_run_up_to_n_at_once_and_never_more() {
    let broker = MemoryBroker::new();
    let gate = Gate::closed();
    let app =
        App::new("workers")
            .with_state(gate.clone())
            .mount(broker.queue("jobs"), gated, |m| m.workers(4));
    let test = TestApp::start(app, &broker).await.unwrap();
    for n in 0..40u64 {
        test.publish_json("jobs", &n).await.unwrap();
    }
    gate.wait_running(4).await;
    // Open the gate: the queue is deep enough for more, but only four may run.
    gate.permits.add_permits(40);
    test.settled().await.unwrap();
    assert_eq!(gate.peak.load(Ordering::SeqCst), 4);
    assert_eq!(test.acked("jobs").len(), 40);
    test.stop().await.unwrap();
}

/// Lanes are futures on the mount's own task, not a task each: 64 lanes with a handler
/// waiting in each of them add a handful of tasks to the runtime (the mount's), not 64.
/// Each lane is still polled on its own wake: every gated handler runs, and finishes
/// once let go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lanes_run_on_the_mounts_own_task_and_each_wakes_alone() {
    const LANES: u64 = 64;
    let broker = MemoryBroker::new();
    let gate = Gate::closed();
    let tasks = || {
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks()
    };
    let before = tasks();
    let app = App::new("lanes-on-one-task")
        .with_state(gate.clone())
        .mount(broker.queue("jobs"), gated, |m| {
            m.workers(LANES as usize).by_key()
        });
    let test = TestApp::start(app, &broker).await.unwrap();
    // One key per lane (the lane is the key's hash, so keys are picked to fill each).
    let mut keys_by_lane = HashMap::new();
    for candidate in 0.. {
        let key = format!("key-{candidate}");
        keys_by_lane
            .entry(conveyor::dispatch::lane_for_key(&key, LANES as usize))
            .or_insert(key);
        if keys_by_lane.len() == LANES as usize {
            break;
        }
    }
    for (n, key) in keys_by_lane.values().enumerate() {
        let message = Message::builder()
            .partition_key(key.as_str())
            .json(&(n as u64))
            .unwrap();
        test.publish("jobs", message).await.unwrap();
    }
    gate.wait_running(LANES as usize).await;
    let added = tasks() - before;
    assert!(added < 8, "{added} tasks for a mount of {LANES} lanes");
    gate.permits.add_permits(LANES as usize);
    test.settled().await.unwrap();
    assert_eq!(test.acked("jobs").len(), LANES as usize);
    test.stop().await.unwrap();
}

#[tokio::test]
async fn workers_read_nothing_while_n_are_in_flight() {
    let broker = MemoryBroker::new();
    let gate = Gate::closed();
    let app = App::new("back-pressure").with_state(gate.clone()).mount(
        broker.queue("jobs"),
        gated,
        |m| m.workers(3),
    );
    let test = TestApp::start(app, &broker).await.unwrap();
    for n in 0..20u64 {
        test.publish_json("jobs", &n).await.unwrap();
    }
    gate.wait_running(3).await;
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    let stats = broker.stats("jobs");
    assert_eq!(
        stats.in_flight, 3,
        "only the running deliveries are out of the queue"
    );
    assert_eq!(stats.ready, 17);
    gate.permits.add_permits(20);
    test.settled().await.unwrap();
    test.stop().await.unwrap();
}

#[tokio::test]
async fn lanes_read_ahead_stays_bounded() {
    let broker = MemoryBroker::new();
    let gate = Gate::closed();
    let app =
        App::new("lane-bound")
            .with_state(gate.clone())
            .mount(broker.queue("jobs"), gated, |m| m.workers(2).by_key());
    let test = TestApp::start(app, &broker).await.unwrap();
    for n in 0..50u64 {
        test.publish(
            "jobs",
            Message::builder()
                .partition_key(format!("k{}", n % 5))
                .json(&n)
                .unwrap(),
        )
        .await
        .unwrap();
    }
    gate.wait_running(2).await;
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    // Two running, at most one waiting in each lane, one in the dispatcher's hand.
    let in_flight = broker.stats("jobs").in_flight;
    assert!((2..=5).contains(&in_flight), "in flight: {in_flight}");
    gate.permits.add_permits(50);
    test.settled().await.unwrap();
    test.stop().await.unwrap();
}

async fn publish_keyed(test: &TestApp, count: u64, keys: u64) {
    for n in 0..count {
        test.publish(
            "jobs",
            Message::builder()
                .partition_key(format!("k{}", n % keys))
                .json(&n)
                .unwrap(),
        )
        .await
        .unwrap();
    }
}

/// Waits (for at most ten seconds) until the mount holds `held` deliveries of `jobs`, then
/// gives it many more turns of the (current-thread) runtime and checks it took no more.
async fn holds_exactly(broker: &MemoryBroker, held: usize) {
    let in_flight = || broker.stats("jobs").in_flight;
    tokio::time::timeout(Duration::from_secs(10), async {
        while in_flight() < held {
            tokio::task::yield_now().await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the mount holds {} of {held}", in_flight()));
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert_eq!(in_flight(), held, "the mount read past its bound");
}

#[tokio::test]
async fn any_worker_holds_read_ahead_deliveries_and_no_more() {
    let broker = MemoryBroker::new();
    let gate = Gate::closed();
    let app = App::new("any-worker-bound").with_state(gate.clone()).mount(
        broker.queue("jobs"),
        gated,
        |m| m.workers(2).by_key().any_worker().read_ahead(6),
    );
    let test = TestApp::start(app, &broker).await.unwrap();
    publish_keyed(&test, 50, 5).await;
    gate.wait_running(2).await;
    // Two running, four waiting for a worker or their key's turn.
    holds_exactly(&broker, 6).await;
    gate.permits.add_permits(50);
    test.settled().await.unwrap();
    assert_eq!(gate.peak.load(Ordering::SeqCst), 2);
    test.stop().await.unwrap();
}

#[tokio::test]
async fn a_hot_key_cannot_take_the_whole_any_worker_window() {
    let broker = MemoryBroker::new();
    let gate = Gate::closed();
    let app =
        App::new("hot-key")
            .with_state(gate.clone())
            .mount(broker.queue("jobs"), gated, |m| {
                m.workers(2).by_key().any_worker().read_ahead(6)
            });
    let test = TestApp::start(app, &broker).await.unwrap();
    publish_keyed(&test, 20, 1).await;
    gate.wait_running(1).await;
    // The key holds read_ahead - workers = 4 (one running), and the dispatcher holds its
    // next one until the key has room: 5 of the 6, one left for the other worker's key.
    holds_exactly(&broker, 5).await;
    assert_eq!(
        gate.running.load(Ordering::SeqCst),
        1,
        "one key runs one at a time"
    );
    gate.permits.add_permits(20);
    test.settled().await.unwrap();
    assert_eq!(gate.peak.load(Ordering::SeqCst), 1);
    test.stop().await.unwrap();
}

#[derive(Clone, Default)]
struct Sizes(Arc<Mutex<Vec<usize>>>);

async fn sizes(batch: Batch<Json<u64>>, State(sizes): State<Sizes>) {
    sizes.0.lock().unwrap().push(batch.len());
}

#[tokio::test]
async fn batches_are_never_empty_and_never_over_the_size() {
    let broker = MemoryBroker::new();
    let seen = Sizes::default();
    for n in 0..50u64 {
        conveyor::Publisher::publish_json(&broker, "metrics", &n)
            .await
            .unwrap();
    }
    let app =
        App::new("batches")
            .with_state(seen.clone())
            .mount(broker.queue("metrics"), sizes, |m| m.batch(7));
    let test = TestApp::start(app, &broker).await.unwrap();
    test.settled().await.unwrap();
    let sizes = seen.0.lock().unwrap().clone();
    assert!(sizes.iter().all(|&s| (1..=7).contains(&s)), "{sizes:?}");
    assert_eq!(sizes.iter().sum::<usize>(), 50);
    assert_eq!(
        sizes[0], 7,
        "what was already queued filled the first batch"
    );
    test.stop().await.unwrap();
}

#[tokio::test]
async fn a_batch_takes_only_what_is_already_there() {
    let broker = MemoryBroker::new();
    let seen = Sizes::default();
    let app = App::new("small-batches").with_state(seen.clone()).mount(
        broker.queue("metrics"),
        sizes,
        |m| m.batch(10),
    );
    let test = TestApp::start(app, &broker).await.unwrap();
    for n in 0..3u64 {
        test.publish_json("metrics", &n).await.unwrap();
        test.settled().await.unwrap();
    }
    assert_eq!(*seen.0.lock().unwrap(), vec![1, 1, 1]);
    test.stop().await.unwrap();
}

/// One element as a batch handler saw it: (payload, attempt, `source` header, key).
type Element = (u64, u32, String, String);

#[derive(Clone, Default)]
struct Elements(Arc<Mutex<Vec<Element>>>);

/// Retries each element the first time it sees it, from what the batch tells of it.
async fn retry_each_once(
    batch: Batch<Json<u64>>,
    State(seen): State<Elements>,
) -> Vec<conveyor::Outcome> {
    let mut outcomes = Vec::new();
    for (i, Json(n)) in batch.iter().enumerate() {
        let attempt = batch.info(i).map_or(0, |info| info.attempt);
        let source = batch
            .headers(i)
            .and_then(|h| h.get_str("source"))
            .unwrap_or_default()
            .to_string();
        let key = batch
            .partition_key(i)
            .map(|k| k.to_string())
            .unwrap_or_default();
        seen.0.lock().unwrap().push((*n, attempt, source, key));
        outcomes.push(if attempt == 1 {
            conveyor::Outcome::Retry
        } else {
            conveyor::Outcome::Ack
        });
    }
    outcomes
}

#[tokio::test]
async fn a_batch_handler_sees_each_elements_attempt_headers_and_key() {
    let broker = MemoryBroker::new();
    for n in 0..3u64 {
        let message = Message::builder()
            .header("source", format!("s{n}"))
            .partition_key(format!("k{n}"))
            .json(&n)
            .unwrap();
        conveyor::Publisher::publish(&broker, "metrics", message)
            .await
            .unwrap();
    }
    let seen = Elements::default();
    let app = App::new("per-element").with_state(seen.clone()).mount(
        broker.queue("metrics"),
        retry_each_once,
        |m| m.batch(3),
    );
    let test = TestApp::start(app, &broker).await.unwrap();
    test.settled().await.unwrap();
    test.stop().await.unwrap();
    let mut seen = seen.0.lock().unwrap().clone();
    seen.sort();
    let expected: Vec<_> = (0..3u64)
        .flat_map(|n| [1, 2].map(|attempt| (n, attempt, format!("s{n}"), format!("k{n}"))))
        .collect();
    assert_eq!(seen, expected);
    assert_eq!(broker.stats("metrics").acked, 3);
}
