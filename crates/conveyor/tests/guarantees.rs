//! The core's side of the delivery guarantees, on the in-process transport: panics are
//! caught wherever user code runs, a task that dies anyway stops the app, no user-given
//! delay can overflow the clock, messages handed back together keep their order, and a
//! subscription that cannot heal stops the app. (The guarantees every transport shares
//! are proved by `conveyor-conformance`.)

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use conveyor::testing::TestApp;
use conveyor::{
    App, Batch, Bytes, Context, DecodeError, Delivery, DeliveryInfo, Dispatch, Error, FromDelivery,
    FromPayload, Json, MemoryBroker, Message, MountOptions, Outcome, Publisher, Rejection, Source,
    State, SubscribeSettings, Subscriber,
};

/// A payload whose decoder panics on "boom".
struct Touchy(String);

impl FromPayload for Touchy {
    fn from_payload(payload: &Bytes) -> Result<Self, DecodeError> {
        let text = String::from_utf8_lossy(payload).into_owned();
        assert!(text != "boom", "the decoder blew up");
        Ok(Touchy(text))
    }
}

#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<String>>>);

impl Seen {
    fn all(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

async fn record_touchy(Touchy(text): Touchy, State(seen): State<Seen>) {
    seen.0.lock().unwrap().push(text);
}

#[tokio::test]
async fn a_panic_while_decoding_goes_to_the_failure_policy_and_the_lanes_keep_running() {
    let broker = MemoryBroker::new();
    let seen = Seen::default();
    let app = App::new("decode-panic").with_state(seen.clone()).mount(
        broker.queue("q"),
        record_touchy,
        |m| m.workers(2).by_key().reject_on_error(),
    );
    let test = TestApp::start(app, &broker).await.unwrap();
    for text in ["boom", "a", "boom", "b", "c", "boom", "d"] {
        test.publish("q", Message::new(text)).await.unwrap();
    }
    test.settled().await.unwrap();
    let mut handled = seen.all();
    handled.sort();
    assert_eq!(handled, ["a", "b", "c", "d"]);
    let dead = test.rejected("q");
    assert_eq!(dead.len(), 3);
    assert!(
        dead[0].reason.contains("the decoder blew up"),
        "{}",
        dead[0].reason
    );
    test.stop().await.unwrap();
}

/// An extractor that panics when the message carries a `boom` header.
struct Fussy;

impl FromDelivery for Fussy {
    fn from_delivery(delivery: &Delivery, _: &Context) -> Result<Self, Rejection> {
        assert!(
            !delivery.headers().contains("boom"),
            "the extractor blew up"
        );
        Ok(Fussy)
    }
}

async fn record_fussy(Json(n): Json<u64>, _: Fussy, State(seen): State<Seen>) {
    seen.0.lock().unwrap().push(n.to_string());
}

#[tokio::test]
async fn a_panic_in_an_extractor_goes_to_the_failure_policy_and_no_worker_is_lost() {
    let broker = MemoryBroker::new();
    let seen = Seen::default();
    let app = App::new("extractor-panic").with_state(seen.clone()).mount(
        broker.queue("q"),
        record_fussy,
        |m| m.workers(2).reject_on_error(),
    );
    let test = TestApp::start(app, &broker).await.unwrap();
    // More panics than workers: each used to take a worker with it.
    for n in 0..4u64 {
        let boom = Message::builder().header("boom", "1").json(&n).unwrap();
        test.publish("q", boom).await.unwrap();
    }
    for n in 10..14u64 {
        test.publish_json("q", &n).await.unwrap();
    }
    test.settled().await.unwrap();
    let mut handled = seen.all();
    handled.sort();
    assert_eq!(handled, ["10", "11", "12", "13"]);
    assert_eq!(test.rejected("q").len(), 4);
    test.stop().await.unwrap();
}

/// An error whose `Display` panics: nothing in the dispatcher can catch that for the
/// delivery, so the lane dies.
#[derive(Debug)]
struct Unprintable;

impl fmt::Display for Unprintable {
    fn fmt(&self, _: &mut fmt::Formatter<'_>) -> fmt::Result {
        panic!("cannot print this error")
    }
}

impl std::error::Error for Unprintable {}

async fn fail_unprintably(Json(_n): Json<u64>) -> Result<(), Unprintable> {
    Err(Unprintable)
}

#[tokio::test]
async fn a_worker_or_lane_that_dies_anyway_stops_the_app_with_a_mount_error() {
    for (mode, dispatch) in [
        ("lanes", Dispatch::Lanes(2)),
        ("workers", Dispatch::Workers(2)),
        (
            "any-worker",
            Dispatch::AnyWorker {
                workers: 2,
                read_ahead: 8,
            },
        ),
    ] {
        let configure = move |m: MountOptions| m.with_dispatch(dispatch);
        let broker = MemoryBroker::new();
        broker.publish_json("q", &1u64).await.unwrap();
        let run = App::new("dying")
            .mount(broker.queue("q"), fail_unprintably, move |m| {
                configure(m).reject_on_error()
            })
            .run_until(std::future::pending());
        let error = tokio::time::timeout(Duration::from_secs(60), run)
            .await
            .unwrap_or_else(|_| panic!("{mode}: the app does not stop by itself"))
            .unwrap_err();
        assert!(
            matches!(&error, Error::MountTask(what) if what.contains("`q`")),
            "{mode}: {error}"
        );
    }
}

async fn retry_forever_later(Json(_n): Json<u64>, State(runs): State<Arc<AtomicUsize>>) -> Outcome {
    runs.fetch_add(1, Ordering::SeqCst);
    Outcome::RetryAfter(Duration::MAX)
}

#[tokio::test(start_paused = true)]
async fn a_retry_after_too_long_for_the_clock_waits_instead_of_panicking() {
    for workers in [false, true] {
        let broker = MemoryBroker::new();
        let runs = Arc::new(AtomicUsize::new(0));
        let app = App::new("forever").with_state(runs.clone()).mount(
            broker.queue("q"),
            retry_forever_later,
            move |m| {
                m.with_dispatch(if workers {
                    Dispatch::Workers(1)
                } else {
                    Dispatch::Sequential
                })
            },
        );
        let test = TestApp::start(app, &broker).await.unwrap();
        test.publish_json("q", &1u64).await.unwrap();
        let ran = async {
            while runs.load(Ordering::SeqCst) == 0 {
                tokio::task::yield_now().await;
            }
        };
        tokio::time::timeout(Duration::from_secs(60), ran)
            .await
            .unwrap();
        // Workers hand it to the queue's delay; sequential holds it, then hands it back
        // at shutdown with what is left of the delay. Neither overflows an instant.
        test.stop().await.unwrap();
        assert_eq!(broker.stats("q").delayed, 1, "workers: {workers}");
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }
}

#[tokio::test]
async fn deliveries_released_together_go_back_in_their_order() {
    let broker = MemoryBroker::new();
    for n in 1..=3u64 {
        broker.publish_json("q", &n).await.unwrap();
    }
    let mut subscriber = broker
        .queue("q")
        .subscribe(SubscribeSettings::new(3))
        .await
        .unwrap();
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(subscriber.recv().await.unwrap().unwrap());
    }
    // Released one after the other, first to last: each used to go back at the head.
    drop(held);
    let mut order = Vec::new();
    for _ in 0..3 {
        let delivery = subscriber.recv().await.unwrap().unwrap();
        order.push(String::from_utf8_lossy(delivery.payload()).into_owned());
        delivery.settle(conveyor::Settlement::Ack);
    }
    assert_eq!(order, ["1", "2", "3"]);
}

#[derive(Clone, Default)]
struct Batches(Arc<Mutex<Vec<Vec<u64>>>>);

async fn fail_first_batch(
    batch: Batch<Json<u64>>,
    State(seen): State<Batches>,
) -> Result<(), String> {
    let mut seen = seen.0.lock().unwrap();
    seen.push(batch.iter().map(|Json(n)| *n).collect());
    if seen.len() == 1 {
        Err("first batch fails".into())
    } else {
        Ok(())
    }
}

#[tokio::test]
async fn a_failed_batch_is_retried_in_its_order() {
    let broker = MemoryBroker::new();
    for n in 1..=3u64 {
        broker.publish_json("q", &n).await.unwrap();
    }
    let seen = Batches::default();
    let app = App::new("batch-order").with_state(seen.clone()).mount(
        broker.queue("q"),
        fail_first_batch,
        |m| m.batch(3).retry(),
    );
    let test = TestApp::start(app, &broker).await.unwrap();
    test.settled().await.unwrap();
    assert_eq!(*seen.0.lock().unwrap(), [vec![1, 2, 3], vec![1, 2, 3]]);
    test.stop().await.unwrap();
}

/// A subscriber whose receives fail: for good (`Error::Subscribe`) or for a while.
struct Failing {
    for_good: bool,
    calls: Arc<AtomicUsize>,
}

impl Subscriber for Failing {
    async fn recv(&mut self) -> Option<Result<Delivery, Error>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let source = "AWS.SimpleQueueService.NonExistentQueue".into();
        Some(Err(if self.for_good {
            Error::Subscribe {
                queue: "gone".into(),
                source,
            }
        } else {
            Error::Transport {
                transport: "test",
                source,
            }
        }))
    }

    async fn close(self) {}
}

struct FailingSource(Failing);

impl Source for FailingSource {
    type Subscriber = Failing;

    fn queue_name(&self) -> &str {
        "gone"
    }

    async fn subscribe(self, _: SubscribeSettings) -> Result<Failing, Error> {
        Ok(self.0)
    }
}

async fn any(Json(_n): Json<u64>) {}

#[tokio::test]
async fn a_receive_that_cannot_heal_stops_the_app_with_its_error() {
    let calls = Arc::new(AtomicUsize::new(0));
    let source = FailingSource(Failing {
        for_good: true,
        calls: calls.clone(),
    });
    let run = App::new("gone")
        .mount(source, any, |m| m)
        .run_until(std::future::pending());
    let error = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the app stops by itself")
        .unwrap_err();
    assert!(
        matches!(&error, Error::Subscribe { queue, .. } if queue == "gone"),
        "{error}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_passing_receive_error_is_retried_with_a_growing_pause() {
    let calls = Arc::new(AtomicUsize::new(0));
    let source = FailingSource(Failing {
        for_good: false,
        calls: calls.clone(),
    });
    let counted = calls.clone();
    let started = tokio::time::Instant::now();
    let result = App::new("flaky")
        .mount(source, any, |m| m)
        .run_until(async move {
            while counted.load(Ordering::SeqCst) < 5 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
    assert!(result.is_ok(), "{result:?}");
    // 100 ms, 200, 400, 800: the fifth receive comes after 1.5 s of pauses.
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(1500), "{waited:?}");
    assert!(waited < Duration::from_millis(3100), "{waited:?}");
}

async fn retry_now_forever(Json(_n): Json<u64>, State(runs): State<Arc<AtomicUsize>>) -> Outcome {
    runs.fetch_add(1, Ordering::SeqCst);
    Outcome::Retry
}

#[tokio::test]
async fn an_immediate_retry_in_place_lets_the_runtime_run() {
    let broker = MemoryBroker::new();
    broker.publish_json("q", &1u64).await.unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    // One thread: a retry loop that never yields would starve the signal below forever.
    let run = App::new("spinning")
        .with_state(runs.clone())
        .mount(broker.queue("q"), retry_now_forever, |m| {
            m.unlimited_attempts()
        })
        .run_until(async move {
            while counted.load(Ordering::SeqCst) < 100 {
                tokio::task::yield_now().await;
            }
        });
    let result = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the app shuts down while its handler retries");
    assert!(result.is_ok(), "{result:?}");
    // Handed back at shutdown, with its attempts.
    assert_eq!(broker.stats("q").ready, 1);
}

/// How long `retry_once_after` asks its first attempt to wait.
#[derive(Clone, Copy)]
struct RetryDelay(Duration);

/// Asks for one retry after the app's `RetryDelay`, then acks; counts its runs.
async fn retry_once_after(
    Json(_n): Json<u64>,
    info: DeliveryInfo,
    State(runs): State<Arc<AtomicUsize>>,
    State(RetryDelay(delay)): State<RetryDelay>,
) -> Outcome {
    runs.fetch_add(1, Ordering::SeqCst);
    if info.attempt == 1 {
        Outcome::RetryAfter(delay)
    } else {
        Outcome::Ack
    }
}

#[tokio::test(start_paused = true)]
async fn a_retry_longer_than_the_in_place_hold_goes_back_to_the_broker() {
    assert!(Duration::from_secs(20 * 60) > conveyor::dispatch::MAX_IN_PLACE_HOLD);
    let broker = MemoryBroker::new();
    let runs = Arc::new(AtomicUsize::new(0));
    let app = App::new("long-retry")
        .with_state(runs.clone())
        .with_state(RetryDelay(Duration::from_secs(20 * 60)))
        .mount(broker.queue("q"), retry_once_after, |m| m);
    let test = TestApp::start(app, &broker)
        .await
        .unwrap()
        .with_deadline(Duration::from_secs(3600));
    test.publish_json("q", &1u64).await.unwrap();
    test.settled().await.unwrap();
    // Not held in flight (past RabbitMQ's consumer timeout): waiting in the queue.
    let stats = broker.stats("q");
    assert_eq!((stats.in_flight, stats.delayed), (0, 1));
    test.drained().await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert_eq!(test.acked("q").len(), 1);
    test.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_retry_that_falls_due_goes_back_to_its_place() {
    let broker = MemoryBroker::new();
    for n in 1..=3u64 {
        broker.publish_json("q", &n).await.unwrap();
    }
    let mut subscriber = broker
        .queue("q")
        .subscribe(SubscribeSettings::new(1))
        .await
        .unwrap();
    let first = subscriber.recv().await.unwrap().unwrap();
    first.settle(conveyor::Settlement::RetryAfter(Duration::from_secs(1)));
    tokio::time::advance(Duration::from_secs(1)).await;
    let mut order = Vec::new();
    for _ in 0..3 {
        let delivery = subscriber.recv().await.unwrap().unwrap();
        order.push(String::from_utf8_lossy(delivery.payload()).into_owned());
        delivery.settle(conveyor::Settlement::Ack);
    }
    // It used to arrive again behind 2 and 3.
    assert_eq!(order, ["1", "2", "3"]);
}

async fn fail_twice_then_hang(Json(_n): Json<u64>, info: DeliveryInfo) -> Result<(), String> {
    if info.attempt <= 2 {
        return Err("not yet".into());
    }
    std::future::pending().await
}

async fn note_attempt(Json(_n): Json<u64>, info: DeliveryInfo, State(seen): State<Seen>) {
    seen.0.lock().unwrap().push(info.attempt.to_string());
}

#[tokio::test(start_paused = true)]
async fn a_handler_cancelled_after_retries_in_place_keeps_their_count() {
    let broker = MemoryBroker::new();
    broker.publish_json("q", &1u64).await.unwrap();
    let app = App::new("hanging")
        .shutdown_timeout(Duration::from_secs(1))
        .mount(broker.queue("q"), fail_twice_then_hang, |m| m.retry());
    let running = app.start().await.unwrap();
    // Attempts 1 and 2 fail in place; attempt 3 hangs until the shutdown timeout.
    while broker.stats("q").in_flight == 0 {
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(Duration::from_millis(10)).await;
    running.shutdown().await.unwrap();
    let seen = Seen::default();
    let app =
        App::new("after")
            .with_state(seen.clone())
            .mount(broker.queue("q"), note_attempt, |m| m);
    let test = TestApp::start(app, &broker).await.unwrap();
    test.settled().await.unwrap();
    // The hung third attempt counts; the release itself does not.
    assert_eq!(seen.all(), ["3"]);
    test.stop().await.unwrap();
}

/// An in-process queue whose subscriptions say the broker takes a delivery back after
/// ten minutes, as a RabbitMQ queue with a consumer timeout does.
struct HeldTenMinutes(conveyor::MemoryQueue);

struct HeldTenMinutesSubscriber(conveyor::MemorySubscriber);

impl conveyor::Source for HeldTenMinutes {
    type Subscriber = HeldTenMinutesSubscriber;

    fn queue_name(&self) -> &str {
        self.0.queue_name()
    }

    async fn subscribe(
        self,
        settings: SubscribeSettings,
    ) -> Result<HeldTenMinutesSubscriber, conveyor::Error> {
        Ok(HeldTenMinutesSubscriber(self.0.subscribe(settings).await?))
    }
}

impl Subscriber for HeldTenMinutesSubscriber {
    async fn recv(&mut self) -> Option<Result<conveyor::Delivery, conveyor::Error>> {
        self.0.recv().await
    }

    fn max_hold(&self) -> Option<Duration> {
        Some(Duration::from_secs(10 * 60))
    }

    async fn stop_receiving(&mut self) {
        self.0.stop_receiving().await;
    }

    async fn close(self) {
        self.0.close().await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_retry_longer_than_half_what_the_subscription_can_hold_goes_back_to_the_broker() {
    // Six minutes is within the in-place hold, but more than half of the ten the
    // subscription can hold a delivery.
    assert!(Duration::from_secs(6 * 60) < conveyor::dispatch::MAX_IN_PLACE_HOLD);
    let broker = MemoryBroker::new();
    let runs = Arc::new(AtomicUsize::new(0));
    let app = App::new("bounded-hold")
        .with_state(runs.clone())
        .with_state(RetryDelay(Duration::from_secs(6 * 60)))
        .mount(HeldTenMinutes(broker.queue("q")), retry_once_after, |m| m);
    let test = TestApp::start(app, &broker)
        .await
        .unwrap()
        .with_deadline(Duration::from_secs(3600));
    test.publish_json("q", &1u64).await.unwrap();
    test.settled().await.unwrap();
    let stats = broker.stats("q");
    assert_eq!(
        (stats.in_flight, stats.delayed),
        (0, 1),
        "waiting on the queue"
    );
    test.drained().await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    test.stop().await.unwrap();
}
