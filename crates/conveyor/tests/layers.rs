//! Layers around handlers: they see each delivery, can skip the handler, change its
//! outcome and time it out; app layers wrap mount layers; batch mounts take none.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use conveyor::testing::TestApp;
use conveyor::{
    App, Batch, BoxError, Delivery, Error, Json, Layer, MemoryBroker, Message, Outcome, State,
};

/// What ran, in order: layer entries and exits, and handler runs.
#[derive(Clone, Default)]
struct Trail(Arc<Mutex<Vec<String>>>);

impl Trail {
    fn push(&self, step: impl Into<String>) {
        self.0.lock().unwrap().push(step.into());
    }

    fn steps(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

async fn record(Json(n): Json<u64>, State(trail): State<Trail>) -> Result<(), String> {
    trail.push(format!("handler {n}"));
    if n == 0 { Err("zero".into()) } else { Ok(()) }
}

/// Records its name around the run, with what it saw of the delivery and what came out.
#[derive(Clone)]
struct Named(&'static str, Trail);

impl Layer for Named {
    async fn call<'a, N>(&'a self, delivery: &'a Delivery, next: N) -> Result<Outcome, BoxError>
    where
        N: Future<Output = Result<Outcome, BoxError>> + Send + 'a,
    {
        self.1.push(format!(
            "{} in: {} attempt {}",
            self.0,
            delivery.message_id().unwrap_or("-"),
            delivery.attempt()
        ));
        let outcome = next.await;
        self.1.push(format!("{} out: {}", self.0, outcome.is_ok()));
        outcome
    }
}

#[tokio::test]
async fn app_layers_wrap_mount_layers_which_wrap_the_handler_and_see_the_delivery() {
    let broker = MemoryBroker::new();
    let trail = Trail::default();
    let app = App::new("layers")
        .with_state(trail.clone())
        // The later layer wraps the earlier one, as it wraps the mount's.
        .layer(Named("app inner", trail.clone()))
        .layer(Named("app outer", trail.clone()))
        .mount(broker.queue("numbers"), record, |m| {
            m.layer(Named("mount", trail.clone()))
        });
    let test = TestApp::start(app, &broker).await.unwrap();
    test.publish(
        "numbers",
        Message::builder().message_id("m-7").json(&7u64).unwrap(),
    )
    .await
    .unwrap();
    test.settled().await.unwrap();
    assert_eq!(
        trail.steps(),
        [
            "app outer in: m-7 attempt 1",
            "app inner in: m-7 attempt 1",
            "mount in: m-7 attempt 1",
            "handler 7",
            "mount out: true",
            "app inner out: true",
            "app outer out: true",
        ]
    );
    assert_eq!(test.acked("numbers").len(), 1);
    test.stop().await.unwrap();
}

/// Acks a delivery whose message id was acked before, without running the handler.
#[derive(Clone, Default)]
struct SkipSeen(Arc<Mutex<Vec<String>>>);

impl Layer for SkipSeen {
    async fn call<'a, N>(&'a self, delivery: &'a Delivery, next: N) -> Result<Outcome, BoxError>
    where
        N: Future<Output = Result<Outcome, BoxError>> + Send + 'a,
    {
        let id = delivery.message_id().unwrap_or_default().to_string();
        if self.0.lock().unwrap().contains(&id) {
            return Ok(Outcome::Ack);
        }
        let outcome = next.await;
        if let Ok(Outcome::Ack) = outcome {
            self.0.lock().unwrap().push(id);
        }
        outcome
    }
}

#[tokio::test]
async fn a_layer_can_ack_without_calling_the_handler() {
    let broker = MemoryBroker::new();
    let trail = Trail::default();
    let app =
        App::new("dedup")
            .with_state(trail.clone())
            .mount(broker.queue("numbers"), record, |m| {
                m.workers(4).by_key().layer(SkipSeen::default())
            });
    let test = TestApp::start(app, &broker).await.unwrap();
    for (id, n) in [("a", 1u64), ("b", 2), ("a", 1), ("a", 1)] {
        let message = Message::builder().message_id(id).json(&n).unwrap();
        test.publish("numbers", message).await.unwrap();
        // One at a time, so the repeat comes after the first is acked.
        test.settled().await.unwrap();
    }
    assert_eq!(trail.steps(), ["handler 1", "handler 2"]);
    assert_eq!(test.acked("numbers").len(), 4);
    test.stop().await.unwrap();
}

/// Turns a handler error into a reject, and a reject into an ack.
#[derive(Clone)]
struct Remap;

impl Layer for Remap {
    async fn call<'a, N>(&'a self, _delivery: &'a Delivery, next: N) -> Result<Outcome, BoxError>
    where
        N: Future<Output = Result<Outcome, BoxError>> + Send + 'a,
    {
        match next.await {
            Err(_) => Ok(Outcome::Reject),
            Ok(Outcome::Reject) => Ok(Outcome::Ack),
            other => other,
        }
    }
}

async fn reject_two(Json(n): Json<u64>) -> Result<Outcome, String> {
    match n {
        0 => Err("zero".into()),
        2 => Ok(Outcome::Reject),
        _ => Ok(Outcome::Ack),
    }
}

#[tokio::test]
async fn a_layer_can_change_the_outcome() {
    let broker = MemoryBroker::new();
    // Without the layer, the error would be retried forever.
    let app = App::new("remap").mount(broker.queue("numbers"), reject_two, |m| {
        m.unlimited_attempts().retry().layer(Remap)
    });
    let test = TestApp::start(app, &broker).await.unwrap();
    for n in [0u64, 1, 2] {
        test.publish_json("numbers", &n).await.unwrap();
    }
    test.settled().await.unwrap();
    let rejected = test.rejected("numbers");
    assert_eq!(rejected.len(), 1);
    assert_eq!(rejected[0].message.payload.as_ref(), b"0");
    assert_eq!(rejected[0].reason, "rejected by the handler");
    assert_eq!(test.acked("numbers").len(), 2);
    test.stop().await.unwrap();
}

/// Cancels a run that takes longer than its limit, as a handler error.
#[derive(Clone)]
struct Deadline(Duration);

impl Layer for Deadline {
    async fn call<'a, N>(&'a self, _delivery: &'a Delivery, next: N) -> Result<Outcome, BoxError>
    where
        N: Future<Output = Result<Outcome, BoxError>> + Send + 'a,
    {
        tokio::time::timeout(self.0, next)
            .await
            .map_err(|_| BoxError::from("the deadline layer gave up"))?
    }
}

async fn sleep_forever_on_zero(Json(n): Json<u64>, State(trail): State<Trail>) {
    if n == 0 {
        std::future::pending::<()>().await;
    }
    trail.push(format!("handler {n}"));
}

#[tokio::test(start_paused = true)]
async fn a_layer_can_time_the_handler_out() {
    let broker = MemoryBroker::new();
    let trail = Trail::default();
    let app = App::new("deadline").with_state(trail.clone()).mount(
        broker.queue("numbers"),
        sleep_forever_on_zero,
        |m| m.reject_on_error().layer(Deadline(Duration::from_secs(5))),
    );
    let test = TestApp::start(app, &broker).await.unwrap();
    for n in [0u64, 1] {
        test.publish_json("numbers", &n).await.unwrap();
    }
    test.settled().await.unwrap();
    let rejected = test.rejected("numbers");
    assert_eq!(rejected.len(), 1);
    assert_eq!(rejected[0].reason, "the deadline layer gave up");
    assert_eq!(trail.steps(), ["handler 1"]);
    test.stop().await.unwrap();
}

/// Panics on every delivery.
#[derive(Clone)]
struct Panics;

impl Layer for Panics {
    async fn call<'a, N>(&'a self, _delivery: &'a Delivery, _next: N) -> Result<Outcome, BoxError>
    where
        N: Future<Output = Result<Outcome, BoxError>> + Send + 'a,
    {
        panic!("the layer broke")
    }
}

#[tokio::test]
async fn a_panicking_layer_is_caught_like_a_panicking_handler() {
    let broker = MemoryBroker::new();
    let trail = Trail::default();
    let app = App::new("panics")
        .with_state(trail.clone())
        .layer(Panics)
        .mount(broker.queue("numbers"), record, |m| m.reject_on_error());
    let test = TestApp::start(app, &broker).await.unwrap();
    test.publish_json("numbers", &1u64).await.unwrap();
    test.settled().await.unwrap();
    let rejected = test.rejected("numbers");
    assert_eq!(rejected.len(), 1);
    assert_eq!(rejected[0].reason, "handler panicked: the layer broke");
    assert!(trail.steps().is_empty());
    test.stop().await.unwrap();
}

async fn sum(numbers: Batch<Json<u64>>) {
    let _ = numbers.iter().map(|Json(n)| n).sum::<u64>();
}

#[tokio::test]
async fn layers_on_a_batch_mount_or_an_app_layer_after_a_mount_fail_to_start() {
    let broker = MemoryBroker::new();
    let trail = Trail::default();
    let on_batch = App::new("batch")
        .mount(broker.queue("numbers"), sum, |m| {
            m.layer(Named("mount", trail.clone()))
        })
        .start()
        .await
        .unwrap_err();
    assert!(
        matches!(&on_batch, Error::Config(text) if text.contains("a batch handler takes no layer")),
        "{on_batch}"
    );
    let app_wide = App::new("batch")
        .layer(Named("app", trail.clone()))
        .mount(broker.queue("numbers"), sum, |m| m)
        .start()
        .await
        .unwrap_err();
    assert!(
        matches!(&app_wide, Error::Config(text) if text.contains("a batch handler takes no layer")),
        "{app_wide}"
    );
    let late = App::new("late")
        .with_state(trail.clone())
        .mount(broker.queue("numbers"), record, |m| m)
        .layer(Named("app", trail.clone()))
        .start()
        .await
        .unwrap_err();
    assert!(
        matches!(&late, Error::Config(text) if text.contains("App::layer came after a mount")),
        "{late}"
    );
}
