//! Failure paths: bad payloads, handler errors and panics, retries, startup errors.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use conveyor::testing::TestApp;
use conveyor::{App, Backoff, DeliveryInfo, Error, Json, MemoryBroker, Message, Publisher, State};
use tokio::time::Instant;

#[derive(serde::Deserialize)]
struct Order {
    id: u64,
}

#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<u64>>>);

async fn take_order(Json(order): Json<Order>, State(seen): State<Seen>) {
    seen.0.lock().unwrap().push(order.id);
}

#[tokio::test]
async fn an_undecodable_payload_is_dead_lettered_and_the_service_keeps_running() {
    let broker = MemoryBroker::new();
    let seen = Seen::default();
    let app = App::new("decode").with_state(seen.clone()).mount(
        broker.queue("orders"),
        take_order,
        |m| m,
    );
    let test = TestApp::start(app, &broker).await.unwrap();
    test.publish("orders", Message::new("{not json"))
        .await
        .unwrap();
    test.publish("orders", Message::new(r#"{"id": 7}"#))
        .await
        .unwrap();
    test.settled().await.unwrap();
    let dead = test.rejected("orders");
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].message.payload.as_ref(), b"{not json");
    assert!(
        dead[0].reason.starts_with("cannot decode payload as json"),
        "{}",
        dead[0].reason
    );
    assert_eq!(*seen.0.lock().unwrap(), vec![7]);
    test.stop().await.unwrap();
}

async fn panic_on_zero(Json(n): Json<u64>, State(seen): State<Seen>) {
    assert!(n != 0, "boom");
    seen.0.lock().unwrap().push(n);
}

#[tokio::test]
async fn a_handler_panic_is_caught_and_the_message_dead_lettered() {
    let broker = MemoryBroker::new();
    let seen = Seen::default();
    let app = App::new("panics").with_state(seen.clone()).mount(
        broker.queue("numbers"),
        panic_on_zero,
        |m| m.reject_on_error(),
    );
    let test = TestApp::start(app, &broker).await.unwrap();
    for n in [0u64, 1, 0, 2] {
        test.publish_json("numbers", &n).await.unwrap();
    }
    test.settled().await.unwrap();
    let dead = test.rejected("numbers");
    assert_eq!(dead.len(), 2);
    assert!(
        dead[0].reason.contains("handler panicked: boom"),
        "{}",
        dead[0].reason
    );
    assert_eq!(*seen.0.lock().unwrap(), vec![1, 2]);
    test.stop().await.unwrap();
}

#[tokio::test]
async fn a_panic_in_a_lane_leaves_the_lane_running() {
    let broker = MemoryBroker::new();
    let seen = Seen::default();
    let app = App::new("lane-panics").with_state(seen.clone()).mount(
        broker.queue("numbers"),
        panic_on_zero,
        |m| m.workers(2).by_key().reject_on_error(),
    );
    let test = TestApp::start(app, &broker).await.unwrap();
    for n in [0u64, 1, 0, 2, 3] {
        test.publish(
            "numbers",
            Message::builder().partition_key("same").json(&n).unwrap(),
        )
        .await
        .unwrap();
    }
    test.settled().await.unwrap();
    assert_eq!(*seen.0.lock().unwrap(), vec![1, 2, 3]);
    assert_eq!(test.rejected("numbers").len(), 2);
    test.stop().await.unwrap();
}

/// Fails until the given attempt, recording when each attempt ran.
#[derive(Clone, Default)]
struct Attempts(Arc<Mutex<Vec<(u32, Instant)>>>);

async fn fail_twice(
    Json(_n): Json<u64>,
    info: DeliveryInfo,
    State(log): State<Attempts>,
) -> Result<(), String> {
    log.0.lock().unwrap().push((info.attempt, Instant::now()));
    if info.attempt < 3 {
        return Err(format!("attempt {} failed", info.attempt));
    }
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn retry_after_waits_the_backoff_between_attempts() {
    let broker = MemoryBroker::new();
    let log = Attempts::default();
    let app =
        App::new("backoff")
            .with_state(log.clone())
            .mount(broker.queue("jobs"), fail_twice, |m| {
                m.retry_after(Backoff::exponential(
                    Duration::from_secs(10),
                    Duration::from_secs(60),
                ))
            });
    let test = TestApp::start(app, &broker)
        .await
        .unwrap()
        .with_deadline(Duration::from_secs(120));
    test.publish_json("jobs", &1u64).await.unwrap();
    test.drained().await.unwrap();
    let log = log.0.lock().unwrap().clone();
    let attempts: Vec<u32> = log.iter().map(|(a, _)| *a).collect();
    assert_eq!(attempts, vec![1, 2, 3]);
    assert_eq!(log[1].1 - log[0].1, Duration::from_secs(10));
    assert_eq!(log[2].1 - log[1].1, Duration::from_secs(20));
    assert_eq!(test.acked("jobs").len(), 1);
    test.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn settled_leaves_messages_that_are_still_waiting_out_a_delay() {
    let broker = MemoryBroker::new();
    let log = Attempts::default();
    let app = App::new("backoff")
        .with_state(log.clone())
        // Workers retry through the broker (sequential and lanes retry in place).
        .mount(broker.queue("jobs"), fail_twice, |m| {
            m.workers(1)
                .retry_after(Backoff::fixed(Duration::from_secs(5)))
        });
    let test = TestApp::start(app, &broker).await.unwrap();
    test.publish_json("jobs", &1u64).await.unwrap();
    test.settled().await.unwrap();
    assert_eq!(log.0.lock().unwrap().len(), 1);
    assert_eq!(broker.stats("jobs").delayed, 1);
    tokio::time::advance(Duration::from_secs(5)).await;
    test.settled().await.unwrap();
    assert_eq!(log.0.lock().unwrap().len(), 2);
    test.stop().await.unwrap();
}

#[tokio::test]
async fn a_message_is_rejected_when_its_attempts_run_out() {
    let broker = MemoryBroker::new();
    let log = Attempts::default();
    let app =
        App::new("capped")
            .with_state(log.clone())
            .mount(broker.queue("jobs"), fail_twice, |m| {
                m.retry().max_attempts(2)
            });
    let test = TestApp::start(app, &broker).await.unwrap();
    test.publish_json("jobs", &1u64).await.unwrap();
    test.settled().await.unwrap();
    assert_eq!(log.0.lock().unwrap().len(), 2);
    let dead = test.rejected("jobs");
    assert_eq!(dead.len(), 1);
    assert_eq!(
        dead[0].reason,
        "attempt 2 failed (attempt 2, no attempts left)"
    );
    test.stop().await.unwrap();
}

#[derive(Clone)]
struct Db;

async fn needs_db(Json(_n): Json<u64>, State(_db): State<Db>) {}

#[tokio::test]
async fn a_handler_whose_state_is_missing_fails_startup() {
    let broker = MemoryBroker::new();
    let error = App::new("no-db")
        .mount(broker.queue("jobs"), needs_db, |m| m)
        .start()
        .await
        .unwrap_err();
    assert!(
        matches!(error, Error::MissingState { ref queue, .. } if queue == "jobs"),
        "{error}"
    );
    assert!(error.to_string().contains("State<failures::Db>"), "{error}");
}

async fn any(Json(_n): Json<u64>) {}

/// Starts an app with one mount configured by `configure`; the error it fails with.
async fn startup_error<L: conveyor::Layer, D>(
    configure: impl FnOnce(conveyor::MountOptions) -> conveyor::MountOptions<L, D>,
) -> Error {
    let broker = MemoryBroker::new();
    App::new("bad")
        .mount(broker.queue("jobs"), any, configure)
        .start()
        .await
        .unwrap_err()
}

/// What the types cannot rule out fails at startup (`by_key()` without workers,
/// `any_worker()` without keys and `read_ahead` without `any_worker()` do not compile:
/// see `conveyor::mode`).
#[tokio::test]
async fn impossible_mount_settings_fail_startup() {
    let errors = [
        startup_error(|m| m.workers(0)).await,
        startup_error(|m| m.batch(5)).await,
        // Fewer held than workers would leave workers idle for good.
        startup_error(|m| m.workers(4).by_key().any_worker().read_ahead(3)).await,
        startup_error(|m| m.workers(0).by_key().any_worker()).await,
        // A zero timeout would cancel every handler before it runs.
        startup_error(|m| m.timeout(Duration::ZERO)).await,
        // More than a mount runs: its tasks and lanes would be made up front.
        startup_error(|m| m.workers(usize::MAX)).await,
        startup_error(|m| m.workers(conveyor::dispatch::MAX_WORKERS + 1).by_key()).await,
    ];
    for error in errors {
        assert!(matches!(error, Error::Config(_)), "{error}");
    }
}

async fn many(_batch: conveyor::Batch<conveyor::Bytes>) {}

/// A batch size or read-ahead far beyond what comes is a limit, not an allocation made up
/// front: both mounts run. (Each panicked on its first allocation: capacity overflow.)
#[tokio::test]
async fn a_huge_batch_size_or_read_ahead_runs_like_any_other() {
    let broker = MemoryBroker::new();
    broker.publish("batches", Message::new("1")).await.unwrap();
    broker
        .publish(
            "keyed",
            Message::builder().partition_key("k").json(&1u64).unwrap(),
        )
        .await
        .unwrap();
    let test = TestApp::start(
        App::new("huge")
            .mount(broker.queue("batches"), many, |m| m.batch(usize::MAX))
            .mount(broker.queue("keyed"), any, |m| {
                m.workers(2).by_key().any_worker().read_ahead(usize::MAX)
            }),
        &broker,
    )
    .await
    .unwrap();
    test.settled().await.unwrap();
    test.stop().await.unwrap();
    assert_eq!(
        broker.stats("batches").ready + broker.stats("keyed").ready,
        0
    );
}

/// A source whose queue does not exist, or whose subscription ends after one delivery.
struct Scripted {
    fails: bool,
}

struct EndsAtOnce;

impl conveyor::Subscriber for EndsAtOnce {
    async fn recv(&mut self) -> Option<Result<conveyor::Delivery, Error>> {
        None
    }

    async fn close(self) {}
}

impl conveyor::Source for Scripted {
    type Subscriber = EndsAtOnce;

    fn queue_name(&self) -> &str {
        "scripted"
    }

    async fn subscribe(self, _: conveyor::SubscribeSettings) -> Result<EndsAtOnce, Error> {
        if self.fails {
            return Err(Error::Subscribe {
                queue: "scripted".into(),
                source: "no such queue".into(),
            });
        }
        Ok(EndsAtOnce)
    }
}

#[tokio::test]
async fn a_subscription_that_cannot_start_fails_startup() {
    let error = App::new("broken")
        .mount(Scripted { fails: true }, any, |m| m)
        .run_until(std::future::pending())
        .await
        .unwrap_err();
    assert_eq!(error.to_string(), "cannot subscribe to queue `scripted`");
    assert_eq!(
        conveyor::Report(&error).to_string(),
        "cannot subscribe to queue `scripted`: no such queue"
    );
}

#[tokio::test]
async fn a_subscription_that_ends_by_itself_stops_the_app_with_an_error() {
    let error = App::new("ending")
        .mount(Scripted { fails: false }, any, |m| m)
        .run_until(std::future::pending())
        .await
        .unwrap_err();
    assert!(
        matches!(error, Error::SubscriptionEnded { ref queue } if queue == "scripted"),
        "{error}"
    );
}

/// Notes when it is dropped before [`Finished::done`]: the handler holding it was cancelled.
struct Finished {
    cancelled: Arc<Mutex<Vec<u32>>>,
    attempt: u32,
    done: bool,
}

impl Drop for Finished {
    fn drop(&mut self) {
        if !self.done {
            self.cancelled.lock().unwrap().push(self.attempt);
        }
    }
}

#[derive(Clone, Default)]
struct Cancelled(Arc<Mutex<Vec<u32>>>);

/// Hangs on its first attempt, answers at once on the next.
async fn hang_once(
    Json(_n): Json<u64>,
    info: DeliveryInfo,
    State(cancelled): State<Cancelled>,
) -> Result<(), String> {
    let mut finished = Finished {
        cancelled: cancelled.0.clone(),
        attempt: info.attempt,
        done: false,
    };
    if info.attempt == 1 {
        tokio::time::sleep(Duration::from_secs(3600)).await;
    }
    finished.done = true;
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_handler_past_its_timeout_is_cancelled_and_the_policy_retries_it() {
    for workers in [false, true] {
        let broker = MemoryBroker::new();
        let cancelled = Cancelled::default();
        let app = App::new("timeout").with_state(cancelled.clone()).mount(
            broker.queue("jobs"),
            hang_once,
            move |m| {
                let m = m.timeout(Duration::from_secs(1)).retry();
                m.with_dispatch(if workers {
                    conveyor::Dispatch::Workers(2)
                } else {
                    conveyor::Dispatch::Sequential
                })
            },
        );
        let test = TestApp::start(app, &broker).await.unwrap();
        let started = Instant::now();
        test.publish_json("jobs", &1u64).await.unwrap();
        test.settled().await.unwrap();
        assert_eq!(
            *cancelled.0.lock().unwrap(),
            [1],
            "the first attempt was cancelled"
        );
        assert_eq!(test.acked("jobs").len(), 1, "the second attempt acked it");
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the hanging attempt was not waited out: {:?}",
            started.elapsed()
        );
        test.stop().await.unwrap();
    }
}

/// Panics when dropped: a handler's state whose cleanup fails.
struct PanicsOnDrop;

impl Drop for PanicsOnDrop {
    fn drop(&mut self) {
        panic!("cleanup failed");
    }
}

/// Hangs on its first attempt holding a guard that panics when the run is cancelled.
async fn hang_once_with_a_panicking_guard(Json(_n): Json<u64>, info: DeliveryInfo) {
    if info.attempt == 1 {
        let _guard = PanicsOnDrop;
        std::future::pending::<()>().await;
    }
}

/// A handler cancelled at its timeout whose state panics while dropped fails that
/// attempt like any timeout: the panic does not end the mount's task (and the app).
#[tokio::test(start_paused = true)]
async fn a_cancelled_handler_that_panics_while_dropped_is_retried_and_the_mount_runs_on() {
    for mode in ["sequential", "workers", "lanes"] {
        let broker = MemoryBroker::new();
        let app = App::new("drop-panic").mount(
            broker.queue("jobs"),
            hang_once_with_a_panicking_guard,
            move |m| {
                let m = m.timeout(Duration::from_secs(1)).retry();
                m.with_dispatch(match mode {
                    "workers" => conveyor::Dispatch::Workers(2),
                    "lanes" => conveyor::Dispatch::Lanes(2),
                    _ => conveyor::Dispatch::Sequential,
                })
            },
        );
        let test = TestApp::start(app, &broker).await.unwrap();
        test.publish_json("jobs", &1u64).await.unwrap();
        test.settled().await.unwrap();
        assert_eq!(
            test.acked("jobs").len(),
            1,
            "{mode}: the second attempt acked it"
        );
        // The mount still takes work.
        test.publish_json("jobs", &2u64).await.unwrap();
        test.settled().await.unwrap();
        assert_eq!(test.acked("jobs").len(), 2, "{mode}");
        test.stop().await.unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn a_timed_out_handler_is_rejected_with_a_reason_that_says_so() {
    let broker = MemoryBroker::new();
    let app = App::new("timeout-reject")
        .with_state(Cancelled::default())
        .mount(broker.queue("jobs"), hang_once, |m| {
            m.timeout(Duration::from_millis(250)).reject_on_error()
        });
    let test = TestApp::start(app, &broker).await.unwrap();
    test.publish_json("jobs", &1u64).await.unwrap();
    test.settled().await.unwrap();
    let dead = test.rejected("jobs");
    assert_eq!(dead.len(), 1);
    assert_eq!(
        dead[0].reason,
        "handler still running after its timeout of 250ms; cancelled"
    );
    test.stop().await.unwrap();
}

async fn hang_forever(_batch: conveyor::Batch<Json<u64>>) {
    std::future::pending::<()>().await;
}

#[tokio::test(start_paused = true)]
async fn a_batch_past_its_timeout_fails_every_element() {
    let broker = MemoryBroker::new();
    for n in 0..3u64 {
        conveyor::Publisher::publish_json(&broker, "jobs", &n)
            .await
            .unwrap();
    }
    let app = App::new("batch-timeout").mount(broker.queue("jobs"), hang_forever, |m| {
        m.batch(3).timeout(Duration::from_secs(5)).reject_on_error()
    });
    let test = TestApp::start(app, &broker).await.unwrap();
    test.settled().await.unwrap();
    let dead = test.rejected("jobs");
    assert_eq!(dead.len(), 3, "every element of the batch");
    assert!(dead.iter().all(|d| d.reason.contains("timeout of 5s")));
    test.stop().await.unwrap();
}
