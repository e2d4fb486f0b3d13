//! The portable queue administration (`conveyor::Broker`) on SQS, against the moto
//! emulator on 127.0.0.1:4566 (`scripts/services/sqs.sh` starts it): declaring from the
//! one `QueueSpec`, depth, dead letters, deleting, and the errors. Every test makes its own
//! queues and deletes them.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_sqs::config::http::HttpResponse;
use aws_sdk_sqs::error::SdkError;
use aws_sdk_sqs::operation::get_queue_attributes::GetQueueAttributesError;
use aws_sdk_sqs::types::QueueAttributeName;
use common::{ENDPOINT, broker, declare, delete, eventually, unique};
use conveyor::{
    App, Broker, DeadLetter, Error, Json, Message, Outcome, PartitionKey, Publisher, QueueDepth,
    QueueSpec, REJECT_REASON_HEADER, State,
};
use conveyor_sqs::{PARTITION_KEY_HEADER, SqsBroker, SqsError, SqsQueueSpec};

/// The queue's attributes, as SQS tells them.
async fn attributes(broker: &SqsBroker, queue: &str) -> HashMap<QueueAttributeName, String> {
    let url = broker.queue_url(queue).await.expect("the queue's URL");
    broker
        .client()
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::All)
        .send()
        .await
        .expect("the queue's attributes")
        .attributes()
        .cloned()
        .unwrap_or_default()
}

fn attribute(
    attributes: &HashMap<QueueAttributeName, String>,
    name: QueueAttributeName,
) -> Option<&str> {
    attributes.get(&name).map(String::as_str)
}

/// Takes dead letters from `queue` until `count` have come, within 30 s.
async fn take(broker: &SqsBroker, queue: &str, count: usize) -> Vec<DeadLetter> {
    let taken = Arc::new(Mutex::new(Vec::new()));
    eventually(
        &format!("{count} dead letters in `{queue}`"),
        Duration::from_secs(30),
        || async {
            let batch = broker
                .take_dead_letters(queue, usize::MAX)
                .await
                .expect("dead letters taken");
            let mut taken = taken.lock().unwrap();
            taken.extend(batch);
            taken.len() >= count
        },
    )
    .await;
    let taken = taken.lock().unwrap().clone();
    assert_eq!(taken.len(), count, "more dead letters than rejected");
    taken
}

fn number(dead: &DeadLetter) -> u64 {
    serde_json::from_slice(&dead.payload).expect("a number")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_depth_counts_ready_in_flight_and_delayed() {
    let broker = broker().await;
    let queue = declare(&broker, QueueSpec::new(unique("depth", false))).await;
    assert_eq!(
        broker.queue_depth(&queue).await.unwrap(),
        QueueDepth::new(0).in_flight(0).delayed(0)
    );
    broker.publish_json(&queue, &1u64).await.unwrap();
    broker.publish_json(&queue, &2u64).await.unwrap();
    let later = Message::builder()
        .delay(Duration::from_secs(60))
        .json(&3u64)
        .unwrap();
    broker.publish(&queue, later).await.unwrap();
    // One of the two ready messages received and held for a minute: in flight.
    let url = broker.queue_url(&queue).await.unwrap();
    let received = broker
        .client()
        .receive_message()
        .queue_url(url)
        .max_number_of_messages(1)
        .visibility_timeout(60)
        .send()
        .await
        .unwrap();
    assert_eq!(received.messages().len(), 1);
    assert_eq!(
        broker.queue_depth(&queue).await.unwrap(),
        QueueDepth::new(1).in_flight(1).delayed(1)
    );
    delete(&broker, &[&queue]).await;
}

async fn reject(Json(_n): Json<u64>) -> Outcome {
    Outcome::Reject
}

/// Rejects `count` messages (with a header; in groups on FIFO queues) and takes them back
/// out of the dead-letter queue with `take_dead_letters`: each with its reason, payload,
/// headers and (FIFO) partition key, and the dead-letter queue empty afterwards.
async fn rejects_are_taken_with_their_reason(fifo: bool, count: u64) {
    let broker = broker().await;
    let dlq = declare(&broker, QueueSpec::new(unique("taken-dead", fifo))).await;
    let queue = declare(
        &broker,
        QueueSpec::new(unique("taken", fifo)).dead_letter_queue(&dlq, 5),
    )
    .await;
    let messages = (0..count)
        .map(|n| {
            let message = Message::builder().header("x-tenant", "acme");
            let message = if fifo {
                message.partition_key(format!("k{}", n % 3))
            } else {
                message
            };
            message.json(&n).unwrap()
        })
        .collect();
    broker.publish_batch(&queue, messages).await.unwrap();
    let running = App::new("taken")
        .mount(broker.queue(&queue), reject, |m| m.workers(4))
        .start()
        .await
        .unwrap();
    let dead = take(&broker, &dlq, usize::try_from(count).unwrap()).await;
    running.shutdown().await.unwrap();

    let mut numbers: Vec<u64> = dead.iter().map(number).collect();
    numbers.sort_unstable();
    assert_eq!(numbers, (0..count).collect::<Vec<_>>());
    for letter in &dead {
        assert_eq!(letter.reason.as_deref(), Some("rejected by the handler"));
        assert_eq!(
            letter.headers.get_str(REJECT_REASON_HEADER),
            Some("rejected by the handler")
        );
        assert_eq!(letter.headers.get_str("x-tenant"), Some("acme"));
        assert_eq!(
            letter.headers.get_str("content-type"),
            Some("application/json")
        );
        if fifo {
            let key = format!("k{}", number(letter) % 3);
            assert_eq!(letter.partition_key, Some(PartitionKey::from(key.as_str())));
            // As a subscriber's delivery carries it.
            assert_eq!(
                letter.headers.get_str(PARTITION_KEY_HEADER),
                Some(key.as_str())
            );
        } else {
            assert_eq!(letter.partition_key, None);
            assert!(!letter.headers.contains(PARTITION_KEY_HEADER));
        }
    }
    assert_eq!(
        broker.queue_depth(&dlq).await.unwrap(),
        QueueDepth::new(0).in_flight(0).delayed(0),
        "taken means deleted"
    );
    assert!(broker.take_dead_letters(&dlq, 10).await.unwrap().is_empty());
    delete(&broker, &[&queue, &dlq]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn take_dead_letters_returns_the_reject_reason_and_empties_the_dead_letter_queue() {
    // More than one receive's ten.
    rejects_are_taken_with_their_reason(false, 12).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn take_dead_letters_gives_a_fifo_dead_letter_its_group_as_partition_key() {
    rejects_are_taken_with_their_reason(true, 6).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn take_dead_letters_takes_at_most_max_and_leaves_the_rest() {
    let broker = broker().await;
    let queue = declare(&broker, QueueSpec::new(unique("take-max", false))).await;
    let messages = (0..15u64).map(|n| Message::json(&n).unwrap()).collect();
    broker.publish_batch(&queue, messages).await.unwrap();
    assert!(
        broker
            .take_dead_letters(&queue, 0)
            .await
            .unwrap()
            .is_empty()
    );
    // Twelve: a receive of ten, then one of two.
    let first = broker.take_dead_letters(&queue, 12).await.unwrap();
    assert_eq!(first.len(), 12);
    assert!(
        first.iter().all(|letter| letter.reason.is_none()),
        "never rejected"
    );
    assert_eq!(broker.queue_depth(&queue).await.unwrap().ready, 3);
    let rest = take(&broker, &queue, 3).await;
    let mut numbers: Vec<u64> = first.iter().chain(&rest).map(number).collect();
    numbers.sort_unstable();
    assert_eq!(numbers, (0..15).collect::<Vec<_>>());
    delete(&broker, &[&queue]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redrive_from_the_portable_spec_moves_a_message_received_too_often() {
    let broker = broker().await;
    let dlq = declare(&broker, QueueSpec::new(unique("redrive-dead", false))).await;
    let queue = declare(
        &broker,
        QueueSpec::new(unique("redrive", false)).dead_letter_queue(&dlq, 1),
    )
    .await;
    let policy: serde_json::Value = serde_json::from_str(
        attribute(
            &attributes(&broker, &queue).await,
            QueueAttributeName::RedrivePolicy,
        )
        .expect("a redrive policy"),
    )
    .unwrap();
    let dlq_arn = attributes(&broker, &dlq).await[&QueueAttributeName::QueueArn].clone();
    assert_eq!(policy["deadLetterTargetArn"], dlq_arn.as_str());
    assert_eq!(policy["maxReceiveCount"].to_string().trim_matches('"'), "1");

    broker.publish_json(&queue, &9u64).await.unwrap();
    // Received once and given straight back (visibility 0): the next receive finds it
    // received as often as the policy allows, and SQS moves it to the dead-letter queue.
    let url = broker.queue_url(&queue).await.unwrap();
    let client = broker.client();
    let first = client
        .receive_message()
        .queue_url(&url)
        .visibility_timeout(0)
        .send()
        .await
        .unwrap();
    assert_eq!(first.messages().len(), 1);
    eventually("the message moved", Duration::from_secs(20), || async {
        let again = client
            .receive_message()
            .queue_url(&url)
            .visibility_timeout(0)
            .send()
            .await
            .unwrap();
        again.messages().is_empty()
            && broker
                .queue_depth(&dlq)
                .await
                .is_ok_and(|depth| depth.ready == 1)
    })
    .await;
    let dead = take(&broker, &dlq, 1).await;
    assert_eq!(number(&dead[0]), 9);
    assert_eq!(dead[0].reason, None, "SQS's own redrive gives no reason");
    delete(&broker, &[&queue, &dlq]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_range_visibility_delay_or_max_receive_count_is_a_config_error_and_makes_no_queue() {
    let broker = broker().await;
    let dlq = declare(&broker, QueueSpec::new(unique("range-dead", false))).await;
    let name = unique("range", false);
    for spec in [
        QueueSpec::new(&*name).visibility_timeout(Duration::from_secs(43_201)),
        // Rounded up, 43,200.5 s is 43,201 s.
        QueueSpec::new(&*name).visibility_timeout(Duration::from_millis(43_200_500)),
        QueueSpec::new(&*name).delay(Duration::from_secs(901)),
        QueueSpec::new(&*name).delay(Duration::from_millis(900_001)),
        QueueSpec::new(&*name).dead_letter_queue(&dlq, 0),
        QueueSpec::new(&*name).dead_letter_queue(&dlq, 1001),
    ] {
        match broker.declare_queue(&spec).await {
            Err(Error::Config(message)) => assert!(message.contains(&name), "{message}"),
            other => panic!("{spec:?}: {other:?}"),
        }
    }
    assert!(
        broker.queue_url(&name).await.is_err(),
        "nothing was created"
    );
    // The limits themselves are SQS's and are taken.
    declare(
        &broker,
        QueueSpec::new(&*name)
            .visibility_timeout(Duration::from_secs(43_200))
            .delay(Duration::from_secs(900))
            .dead_letter_queue(&dlq, 1000),
    )
    .await;
    let declared = attributes(&broker, &name).await;
    assert_eq!(
        attribute(&declared, QueueAttributeName::VisibilityTimeout),
        Some("43200")
    );
    assert_eq!(
        attribute(&declared, QueueAttributeName::DelaySeconds),
        Some("900")
    );
    delete(&broker, &[&name, &dlq]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn visibility_and_delay_round_up_to_whole_seconds() {
    let broker = broker().await;
    let queue = declare(
        &broker,
        QueueSpec::new(unique("round-up", false))
            .visibility_timeout(Duration::from_millis(1500))
            .delay(Duration::from_millis(300)),
    )
    .await;
    let declared = attributes(&broker, &queue).await;
    assert_eq!(
        attribute(&declared, QueueAttributeName::VisibilityTimeout),
        Some("2")
    );
    assert_eq!(
        attribute(&declared, QueueAttributeName::DelaySeconds),
        Some("1")
    );
    delete(&broker, &[&queue]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_dead_letter_queue_is_a_config_error_naming_it() {
    let broker = broker().await;
    let name = unique("orphan", false);
    let missing = unique("never-declared", false);
    let spec = QueueSpec::new(&*name).dead_letter_queue(&missing, 3);
    match broker.declare_queue(&spec).await {
        Err(Error::Config(message)) => {
            assert!(
                message.contains(&missing) && message.contains("declare it first"),
                "{message}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(
        broker.queue_url(&name).await.is_err(),
        "nothing was created"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declaring_an_existing_queue_with_other_attributes_changes_them() {
    let broker = broker().await;
    let name = unique("redeclared", false);
    declare(
        &broker,
        QueueSpec::new(&*name).visibility_timeout(Duration::from_secs(30)),
    )
    .await;
    let changed = QueueSpec::new(&*name)
        .visibility_timeout(Duration::from_secs(60))
        .delay(Duration::from_secs(5))
        .attribute(QueueAttributeName::MessageRetentionPeriod, "3600");
    broker.declare_queue(&changed).await.unwrap();
    let declared = attributes(&broker, &name).await;
    assert_eq!(
        attribute(&declared, QueueAttributeName::VisibilityTimeout),
        Some("60")
    );
    assert_eq!(
        attribute(&declared, QueueAttributeName::DelaySeconds),
        Some("5")
    );
    assert_eq!(
        attribute(&declared, QueueAttributeName::MessageRetentionPeriod),
        Some("3600")
    );
    // The same again, and a spec that leaves them unset: both succeed and change nothing.
    broker.declare_queue(&changed).await.unwrap();
    broker.declare_queue(&QueueSpec::new(&*name)).await.unwrap();
    let again = attributes(&broker, &name).await;
    assert_eq!(
        attribute(&again, QueueAttributeName::VisibilityTimeout),
        Some("60")
    );
    assert_eq!(
        attribute(&again, QueueAttributeName::DelaySeconds),
        Some("5")
    );

    // A FIFO queue too: SQS refuses `FifoQueue` on a change, so it is left out.
    let fifo = declare(&broker, QueueSpec::new(unique("redeclared", true))).await;
    broker
        .declare_queue(&QueueSpec::new(&*fifo).content_based_deduplication())
        .await
        .unwrap();
    let declared = attributes(&broker, &fifo).await;
    assert_eq!(
        attribute(&declared, QueueAttributeName::ContentBasedDeduplication),
        Some("true")
    );
    assert_eq!(
        attribute(&declared, QueueAttributeName::FifoQueue),
        Some("true")
    );
    delete(&broker, &[&name, &fifo]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_queue_declared_later_reaches_the_next_subscription() {
    let broker = broker().await;
    let queue = declare(&broker, QueueSpec::new(unique("dlq-later", false))).await;
    // Publishing resolves the queue, without a redrive policy, into the broker's cache.
    broker.publish_json(&queue, &1u64).await.unwrap();
    let dlq = declare(&broker, QueueSpec::new(unique("dlq-later-dead", false))).await;
    declare(&broker, QueueSpec::new(&*queue).dead_letter_queue(&dlq, 5)).await;
    let running = App::new("dlq-later")
        .mount(broker.queue(&queue), reject, |m| m)
        .start()
        .await
        .unwrap();
    let dead = take(&broker, &dlq, 1).await;
    running.shutdown().await.unwrap();
    assert_eq!(dead[0].reason.as_deref(), Some("rejected by the handler"));
    delete(&broker, &[&queue, &dlq]).await;
}

type Seen = Arc<Mutex<Vec<(String, u64)>>>;

async fn keyed(Json(n): Json<u64>, key: PartitionKey, State(seen): State<Seen>) -> Outcome {
    seen.lock().unwrap().push((key.to_string(), n));
    if n == 3 {
        Outcome::Reject
    } else {
        Outcome::Ack
    }
}

/// A service written against the portable API only: it mounts a queue by its bare name.
async fn serve_by_name<B: Broker>(
    broker: &B,
    queue: &str,
    seen: Seen,
    until: impl Future<Output = ()> + Send + 'static,
) {
    App::new("by-name")
        .with_state(seen)
        .mount(broker.queue(queue), keyed, |m| m.workers(2).by_key())
        .run_until(until)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bare_name_source_works_on_a_declared_fifo_queue_with_a_dead_letter_queue() {
    let broker = broker().await;
    let dlq = declare(&broker, QueueSpec::new(unique("by-name-dead", true))).await;
    let queue = declare(
        &broker,
        QueueSpec::new(unique("by-name", true))
            .dead_letter_queue(&dlq, 5)
            .content_based_deduplication(),
    )
    .await;
    let messages = (0..8u64)
        .map(|n| {
            Message::builder()
                .partition_key(if n % 2 == 0 { "alice" } else { "bob" })
                .json(&n)
                .unwrap()
        })
        .collect();
    broker.publish_batch(&queue, messages).await.unwrap();

    let seen = Seen::default();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let service = tokio::spawn({
        let broker = broker.clone();
        let queue = queue.clone();
        let seen = seen.clone();
        async move {
            serve_by_name(&broker, &queue, seen, async {
                let _ = stopped.await;
            })
            .await;
        }
    });
    let dead = take(&broker, &dlq, 1).await;
    eventually("every message handled", Duration::from_secs(30), || async {
        seen.lock().unwrap().len() == 8
    })
    .await;
    let _ = stop.send(());
    service.await.unwrap();

    // The queue kept its spec: the subscription did not declare it again.
    let declared = attributes(&broker, &queue).await;
    assert_eq!(
        attribute(&declared, QueueAttributeName::FifoQueue),
        Some("true")
    );
    assert_eq!(
        attribute(&declared, QueueAttributeName::ContentBasedDeduplication),
        Some("true")
    );
    assert!(declared.contains_key(&QueueAttributeName::RedrivePolicy));
    // Each group in order, and the rejected message in the dead-letter queue with its
    // group and reason.
    let seen = seen.lock().unwrap().clone();
    for (key, parity) in [("alice", 0), ("bob", 1)] {
        let numbers: Vec<u64> = seen
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, n)| *n)
            .collect();
        let expected: Vec<u64> = (0..8).filter(|n| n % 2 == parity).collect();
        assert_eq!(numbers, expected, "{key} in order");
    }
    assert_eq!(number(&dead[0]), 3);
    assert_eq!(dead[0].partition_key, Some(PartitionKey::from("bob")));
    assert_eq!(dead[0].reason.as_deref(), Some("rejected by the handler"));
    delete(&broker, &[&queue, &dlq]).await;
}

async fn count(Json(_n): Json<u64>, State(seen): State<Arc<Mutex<u32>>>) {
    *seen.lock().unwrap() += 1;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_named_for_a_missing_queue_creates_it_plainly() {
    let broker = broker().await;
    let queue = unique("created", true);
    let seen = Arc::new(Mutex::new(0u32));
    let running = App::new("created")
        .with_state(seen.clone())
        .mount(broker.queue(&queue), count, |m| m)
        .start()
        .await
        .unwrap();
    let declared = attributes(&broker, &queue).await;
    assert_eq!(
        attribute(&declared, QueueAttributeName::FifoQueue),
        Some("true")
    );
    assert!(!declared.contains_key(&QueueAttributeName::RedrivePolicy));
    broker
        .publish(
            &queue,
            Message::builder().partition_key("k").json(&1u64).unwrap(),
        )
        .await
        .unwrap();
    eventually("the message", Duration::from_secs(20), || async {
        *seen.lock().unwrap() == 1
    })
    .await;
    running.shutdown().await.unwrap();
    delete(&broker, &[&queue]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_queue_that_does_not_exist_succeeds() {
    let broker = broker().await;
    let queue = declare(&broker, QueueSpec::new(unique("deleted-twice", false))).await;
    broker.delete_queue(&queue).await.unwrap();
    broker.delete_queue(&queue).await.unwrap();
    broker
        .delete_queue(&unique("never-made", false))
        .await
        .unwrap();
    assert!(broker.queue_url(&queue).await.is_err(), "gone");
}

/// Credentials that must never show in an error.
const KEY_ID: &str = "AKIACONVEYORKEYID1234";
const SECRET: &str = "conveyor/Secret+Key/never-shown";

async fn broker_with_secrets(endpoint: &str) -> SqsBroker {
    SqsBroker::builder()
        .endpoint(endpoint)
        .region("us-east-1")
        .static_credentials(KEY_ID, SECRET)
        .receive_wait(Duration::from_secs(1))
        .request_timeout(Duration::from_secs(2))
        .build()
        .await
        .unwrap()
}

fn assert_no_secrets(error: &Error) {
    for text in [conveyor::Report(error).to_string(), format!("{error:?}")] {
        assert!(!text.contains(SECRET) && !text.contains(KEY_ID), "{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_keep_the_sdk_error_as_their_source_and_show_no_credentials() {
    let broker = broker_with_secrets(ENDPOINT).await;
    // A URL is taken as given, so SQS itself answers that the queue does not exist.
    let missing = format!("{ENDPOINT}/123456789012/{}", unique("missing", false));
    let error = broker
        .queue_depth(&missing)
        .await
        .expect_err("no such queue");
    assert!(
        matches!(
            error,
            Error::Transport {
                transport: "sqs",
                ..
            }
        ),
        "{error:?}"
    );
    let sqs = std::error::Error::source(&error)
        .and_then(|source| source.downcast_ref::<SqsError>())
        .expect("an SqsError as the source");
    assert!(matches!(sqs, SqsError::NoSuchQueue { .. }), "{sqs:?}");
    let sdk = std::error::Error::source(sqs)
        .and_then(|source| source.downcast_ref::<SdkError<GetQueueAttributesError, HttpResponse>>())
        .expect("the SDK's error, whole, as its source");
    assert!(
        sdk.as_service_error()
            .is_some_and(|e| e.is_queue_does_not_exist())
    );
    let text = conveyor::Report(&error).to_string();
    assert!(
        text.contains("QueueDoesNotExist") || text.contains("NonExistentQueue"),
        "the causes show: {text}"
    );
    assert_no_secrets(&error);

    // Nothing answering at all.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let unreachable = broker_with_secrets(&endpoint).await;
    let error = unreachable
        .declare_queue(&QueueSpec::new("anything"))
        .await
        .expect_err("nothing answers");
    assert!(matches!(error, Error::Transport { .. }), "{error:?}");
    assert_no_secrets(&error);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_settings_on_the_portable_spec_reach_the_queue() {
    let broker = broker().await;
    let queue = declare(
        &broker,
        QueueSpec::new(unique("extras", true))
            .content_based_deduplication()
            .attribute(QueueAttributeName::MaximumMessageSize, "2048"),
    )
    .await;
    let declared = attributes(&broker, &queue).await;
    assert_eq!(
        attribute(&declared, QueueAttributeName::ContentBasedDeduplication),
        Some("true")
    );
    assert_eq!(
        attribute(&declared, QueueAttributeName::MaximumMessageSize),
        Some("2048")
    );
    // The broker reads the size limit back: a larger message is refused before any call.
    let big = Message::builder()
        .partition_key("k")
        .payload(vec![b'x'; 4096]);
    let error = broker.publish(&queue, big).await.expect_err("too large");
    assert!(
        conveyor::Report(&error).to_string().contains("2048"),
        "{error}"
    );
    delete(&broker, &[&queue]).await;
}

async fn ignore(Json(_): Json<u32>) {}

/// A request timeout too long for the clock (the sums the broker makes with it
/// overflowed) means no timeout in practice: the broker builds, and a mount runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_timeout_of_duration_max_builds_a_broker_that_works() {
    let broker = SqsBroker::builder()
        .endpoint(ENDPOINT)
        .region("us-east-1")
        .static_credentials("test", "test")
        .receive_wait(Duration::from_secs(1))
        .request_timeout(Duration::MAX)
        .build()
        .await
        .expect("a broker");
    let queue = declare(&broker, QueueSpec::new(unique("long-timeout", false))).await;
    let running = App::new("long-timeout")
        .mount(broker.queue(&queue), ignore, |m| m)
        .start()
        .await
        .expect("the mount starts");
    running.shutdown().await.expect("a clean shutdown");
    assert_eq!(broker.queue_depth(&queue).await.unwrap().ready, 0);
    delete(&broker, &[&queue]).await;
}
