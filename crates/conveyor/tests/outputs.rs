//! A handler's result as messages: published to the mount's destination (or their own)
//! before the input is acked, with the input's key, correlation and message id; a failed
//! publish sends the input to the failure policy instead of acking it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use conveyor::testing::TestApp;
use conveyor::{
    App, Batch, CAUSATION_ID_HEADER, CORRELATION_ID_HEADER, Error, Json, MemoryBroker, Message,
    Output, Publisher, State,
};

async fn double(Json(n): Json<u64>) -> Result<Message, Error> {
    Message::json(&(n * 2))
}

/// A publisher in front of the in-process broker that records, at each publish, how
/// many deliveries of `watched` were still unsettled, and refuses the first `failures`.
#[derive(Clone)]
struct Watching {
    broker: MemoryBroker,
    watched: &'static str,
    in_flight_at_publish: Arc<Mutex<Vec<usize>>>,
    failures: Arc<AtomicUsize>,
}

impl Watching {
    fn new(broker: &MemoryBroker, watched: &'static str, failures: usize) -> Self {
        Watching {
            broker: broker.clone(),
            watched,
            in_flight_at_publish: Arc::default(),
            failures: Arc::new(AtomicUsize::new(failures)),
        }
    }
}

impl Publisher for Watching {
    async fn publish(&self, destination: &str, message: Message) -> Result<(), Error> {
        let in_flight = self.broker.stats(self.watched).in_flight;
        self.in_flight_at_publish.lock().unwrap().push(in_flight);
        let failed = self
            .failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                left.checked_sub(1)
            })
            .is_ok();
        if failed {
            return Err(Error::config("the broker is away"));
        }
        self.broker.publish(destination, message).await
    }
}

#[tokio::test]
async fn a_returned_message_is_published_before_its_input_is_acked_and_carries_its_lineage() {
    let broker = MemoryBroker::new();
    let watching = Watching::new(&broker, "numbers", 0);
    let app = App::new("outputs").mount(broker.queue("numbers"), double, |m| {
        m.publish_to("doubled").publish_via(watching.clone())
    });
    let app = TestApp::start(app, &broker).await.unwrap();
    let input = Message::builder()
        .message_id("m-21")
        .correlation_id("order-7")
        .partition_key("alice")
        .json(&21u64)
        .unwrap();
    app.publish("numbers", input).await.unwrap();
    app.settled().await.unwrap();

    let out = app.published("doubled");
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].json::<u64>().unwrap(), 42);
    assert_eq!(out[0].headers.get_str(CAUSATION_ID_HEADER), Some("m-21"));
    assert_eq!(
        out[0].headers.get_str(CORRELATION_ID_HEADER),
        Some("order-7")
    );
    assert_eq!(out[0].partition_key.as_deref(), Some("alice"));
    // Published while its input was still held, then the input was acked.
    assert_eq!(*watching.in_flight_at_publish.lock().unwrap(), vec![1]);
    assert_eq!(app.acked("numbers").len(), 1);
    app.stop().await.unwrap();
}

#[tokio::test]
async fn a_failed_publish_retries_the_input_instead_of_acking_it() {
    let broker = MemoryBroker::new();
    let watching = Watching::new(&broker, "numbers", 1);
    let app = App::new("outputs").mount(broker.queue("numbers"), double, |m| {
        m.publish_to("doubled")
            .publish_via(watching.clone())
            .retry()
    });
    let app = TestApp::start(app, &broker).await.unwrap();
    app.publish_json("numbers", &5u64).await.unwrap();
    app.settled().await.unwrap();

    // Refused once, then published on the retry (in place: the mount is sequential):
    // one output, one ack.
    assert_eq!(watching.in_flight_at_publish.lock().unwrap().len(), 2);
    let out = app.published("doubled");
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].json::<u64>().unwrap(), 10);
    assert_eq!(app.acked("numbers").len(), 1);
    assert!(app.rejected("numbers").is_empty());
    app.stop().await.unwrap();
}

#[tokio::test]
async fn a_publish_that_keeps_failing_ends_where_the_policy_says_with_the_reason() {
    let broker = MemoryBroker::new();
    let watching = Watching::new(&broker, "numbers", usize::MAX);
    let app = App::new("outputs").mount(broker.queue("numbers"), double, |m| {
        m.publish_to("doubled")
            .publish_via(watching.clone())
            .reject_on_error()
    });
    let app = TestApp::start(app, &broker).await.unwrap();
    app.publish_json("numbers", &5u64).await.unwrap();
    app.settled().await.unwrap();

    assert!(app.published("doubled").is_empty());
    assert!(app.acked("numbers").is_empty());
    let rejected = app.rejected("numbers");
    assert_eq!(rejected.len(), 1);
    assert!(
        rejected[0]
            .reason
            .contains("publishing the handler's output to `doubled`")
            && rejected[0].reason.contains("the broker is away"),
        "{}",
        rejected[0].reason
    );
    app.stop().await.unwrap();
}

async fn fan_out(Json(n): Json<u64>) -> Result<Vec<Output>, Error> {
    Ok(vec![
        Output::new(Message::json(&n)?),
        Output::new(Message::json(&(n + 1))?),
        Output::to("audit", Message::new(format!("saw {n}"))),
        Output::new(Message::json(&(n + 2))?),
    ])
}

async fn only_even(Json(n): Json<u64>) -> Option<Message> {
    (n % 2 == 0).then(|| Message::new(n.to_string()))
}

#[tokio::test]
async fn several_outputs_go_in_order_to_their_destinations_and_none_publishes_nothing() {
    let broker = MemoryBroker::new();
    let app = App::new("outputs")
        .mount(broker.queue("numbers"), fan_out, |m| m.publish_to("next"))
        .mount(broker.queue("maybe"), only_even, |m| m.publish_to("even"));
    let app = TestApp::start(app, &broker).await.unwrap();
    app.publish_json("numbers", &10u64).await.unwrap();
    for n in 1..=4u64 {
        app.publish_json("maybe", &n).await.unwrap();
    }
    app.settled().await.unwrap();

    let next: Vec<u64> = app
        .published("next")
        .iter()
        .map(|m| m.json().unwrap())
        .collect();
    assert_eq!(next, vec![10, 11, 12]);
    let audit = app.published("audit");
    assert_eq!(audit.len(), 1);
    assert_eq!(&audit[0].payload[..], b"saw 10");
    let even: Vec<Vec<u8>> = app
        .published("even")
        .iter()
        .map(|m| m.payload.to_vec())
        .collect();
    assert_eq!(even, vec![b"2".to_vec(), b"4".to_vec()]);
    assert_eq!(app.acked("maybe").len(), 4);
    app.stop().await.unwrap();
}

#[tokio::test]
async fn a_message_with_nowhere_to_go_fails_its_run_with_a_clear_reason() {
    let broker = MemoryBroker::new();
    let app = App::new("outputs").mount(broker.queue("numbers"), double, |m| m.reject_on_error());
    let app = TestApp::start(app, &broker).await.unwrap();
    app.publish_json("numbers", &1u64).await.unwrap();
    app.settled().await.unwrap();
    let rejected = app.rejected("numbers");
    assert_eq!(rejected.len(), 1);
    assert!(
        rejected[0].reason.contains("publish_to"),
        "{}",
        rejected[0].reason
    );
    app.stop().await.unwrap();
}

/// Two outputs with destinations of their own, then one with none: on a mount without
/// `publish_to`, and for an input that is no request, the last can never be sent.
async fn audit_bill_and_stray(
    Json(n): Json<u64>,
    State(attempts): State<Arc<AtomicUsize>>,
) -> Vec<Output> {
    attempts.fetch_add(1, Ordering::SeqCst);
    vec![
        Output::to("audit", Message::new(format!("saw {n}"))),
        Output::to("billing", Message::new(format!("bill {n}"))),
        Output::new(Message::new(format!("stray {n}"))),
    ]
}

#[tokio::test]
async fn an_output_with_nowhere_to_go_fails_each_attempt_before_any_output_is_sent() {
    let broker = MemoryBroker::new();
    let attempts = Arc::new(AtomicUsize::new(0));
    let app = App::new("outputs").with_state(attempts.clone()).mount(
        broker.queue("numbers"),
        audit_bill_and_stray,
        |m| m.retry().max_attempts(3),
    );
    let app = TestApp::start(app, &broker).await.unwrap();
    app.publish_json("numbers", &1u64).await.unwrap();
    app.settled().await.unwrap();

    // Three attempts, each failed by the stray output, and no copy of the others.
    let rejected = app.rejected("numbers");
    assert_eq!(rejected.len(), 1);
    assert_eq!(attempts.load(Ordering::SeqCst), 3);
    assert!(
        rejected[0].reason.contains("publish_to"),
        "{}",
        rejected[0].reason
    );
    assert_eq!(app.published("audit").len(), 0);
    assert_eq!(app.published("billing").len(), 0);
    app.stop().await.unwrap();
}

async fn count(batch: Batch<Json<u64>>) {
    let _ = batch;
}

#[tokio::test]
async fn a_batch_mount_that_would_publish_fails_to_start() {
    let broker = MemoryBroker::new();
    let error = App::new("outputs")
        .mount(broker.queue("numbers"), count, |m| {
            m.batch(10).publish_to("next")
        })
        .start()
        .await
        .unwrap_err();
    assert!(error.to_string().contains("publish_to"), "{error}");
}

#[tokio::test]
async fn a_reply_address_the_producer_set_does_not_divert_a_mounts_outputs() {
    let broker = MemoryBroker::new();
    let app =
        App::new("outputs").mount(broker.queue("numbers"), double, |m| m.publish_to("doubled"));
    let app = TestApp::start(app, &broker).await.unwrap();
    let input = Message::builder()
        .reply_to("elsewhere")
        .json(&4u64)
        .unwrap();
    app.publish("numbers", input).await.unwrap();
    app.settled().await.unwrap();
    assert_eq!(app.published("doubled").len(), 1);
    assert!(app.published("elsewhere").is_empty());
    app.stop().await.unwrap();
}
