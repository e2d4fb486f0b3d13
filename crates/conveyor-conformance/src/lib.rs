//! The transport contract of Conveyor, as scenarios every transport runs.
//!
//! Each scenario is an async function generic over a [`Fixture`]: a small trait through
//! which a transport makes a queue, publishes, and reads what is ready and what was
//! dead-lettered. A transport's test suite implements the fixture against its live broker
//! and runs every scenario with [`suite!`], the way `object_store` backends share one set
//! of integration tests:
//!
//! ```text
//! conveyor_conformance::suite!(my_fixture;
//!     round_trip_keeps_payload_and_headers,
//!     #[ignore = "this broker carries no partition key"] lanes_keep_each_key_in_order_across_retries,
//!     // ... every scenario in `SCENARIOS`
//! );
//! ```
//!
//! A transport that cannot give a guarantee lists the scenario with
//! `#[ignore = "why"]`: the test runner then prints it as ignored, with the reason. A
//! scenario left out of the list fails the generated `the_suite_lists_every_scenario`
//! test, so nothing is skipped silently.

mod journal;
pub mod scenarios;

use std::future::Future;
use std::time::Duration;

use conveyor::{Bytes, Publisher, Settlement, Source, SubscribeSettings, Subscriber};

pub use journal::Journal;

/// Every scenario, by name; [`suite!`] checks that a transport lists each one.
pub const SCENARIOS: &[&str] = &[
    "round_trip_keeps_payload_and_headers",
    "competing_subscriptions_lose_nothing_and_handle_each_message_once",
    "the_sequential_mount_never_overlaps",
    "the_sequential_mount_keeps_order_across_retries",
    "lanes_keep_each_key_in_order_across_retries",
    "max_attempts_ends_in_the_dead_letter_queue_when_the_broker_retries",
    "max_attempts_ends_in_the_dead_letter_queue_when_the_lane_retries",
    "a_reject_reaches_the_dead_letter_queue_at_once_with_its_reason",
    "retry_after_comes_no_sooner_than_its_delay",
    "batches_are_never_empty_and_never_larger_than_their_size",
    "draining_hands_back_unstarted_deliveries_while_handlers_run",
    "stopping_and_restarting_mid_stream_loses_nothing",
    "a_panic_in_decode_an_extractor_or_a_handler_leaves_the_service_up",
];

/// What a scenario asks of a queue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueSpec {
    /// Whether rejected messages go to a dead-letter queue, which
    /// [`Fixture::dead_letters`] reads.
    pub dead_letter: bool,
}

impl QueueSpec {
    /// A queue with no dead-letter queue.
    pub fn plain() -> Self {
        QueueSpec { dead_letter: false }
    }

    /// A queue whose rejected messages go to a dead-letter queue. Its broker-side limits
    /// (a redrive policy's max receive count) must be high enough not to act before the
    /// mount's `max_attempts` does: at least 10.
    pub fn with_dead_letter_queue() -> Self {
        QueueSpec { dead_letter: true }
    }
}

/// A queue a fixture made for one scenario, with a name no other test uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TestQueue {
    /// The queue's name: what to publish to and subscribe to.
    pub name: String,
    /// Its dead-letter queue, if the spec asked for one.
    pub dead_letter_queue: Option<String>,
}

/// A message found in a dead-letter queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeadLetter {
    /// The payload, as published.
    pub payload: Bytes,
    /// The reason it carries in [`conveyor::REJECT_REASON_HEADER`], if any.
    pub reason: Option<String>,
}

/// A transport under test: makes queues on its live broker and reads them back.
///
/// The queues it makes must hold a received message long enough that a scenario can tell
/// a prompt release from a lapsed hold: an SQS visibility timeout of 30 s or more, say.
pub trait Fixture: Send + Sync + 'static {
    /// The queue source handlers are mounted on.
    type Source: Source;
    /// The publisher scenarios send through.
    type Publisher: Publisher + Clone + Send + Sync + 'static;

    /// Makes a new queue as `spec` asks.
    fn declare(&self, spec: QueueSpec) -> impl Future<Output = TestQueue> + Send;

    /// A source for `queue`; called once per app a scenario starts.
    fn source(&self, queue: &TestQueue) -> Self::Source;

    /// The publisher.
    fn publisher(&self) -> Self::Publisher;

    /// How many messages of `queue` are ready to be received now (not held by a
    /// consumer, not waiting out a delay).
    fn ready(&self, queue: &TestQueue) -> impl Future<Output = usize> + Send;

    /// Everything dead-lettered from `queue` so far, in the order it arrived.
    fn dead_letters(&self, queue: &TestQueue) -> impl Future<Output = Vec<DeadLetter>> + Send;

    /// Removes the queue and its dead-letter queue.
    fn delete(&self, queue: TestQueue) -> impl Future<Output = ()> + Send;

    /// Whether two subscriptions may both receive one message that neither settled yet
    /// (an emulator's race, say). Scenarios then allow a few duplicates (at most one in
    /// twenty messages) but still no loss.
    fn may_duplicate(&self) -> bool {
        false
    }
}

/// Takes (and acks) every message `source` has ready, as dead letters, into `into`: for
/// fixtures that read a dead-letter queue with their own transport. A receive that brings
/// nothing within `wait` ends it; what it misses is taken on the next call.
pub async fn collect_dead_letters<S: Source>(
    source: S,
    wait: Duration,
    into: &mut Vec<DeadLetter>,
) {
    let queue = source.queue_name().to_string();
    let mut subscriber = match source.subscribe(SubscribeSettings::new(10)).await {
        Ok(subscriber) => subscriber,
        Err(error) => panic!("cannot read the dead-letter queue `{queue}`: {error}"),
    };
    while let Ok(Some(Ok(delivery))) = tokio::time::timeout(wait, subscriber.recv()).await {
        into.push(DeadLetter {
            payload: delivery.payload().clone(),
            reason: delivery
                .headers()
                .get_str(conveyor::REJECT_REASON_HEADER)
                .map(str::to_string),
        });
        delivery.settle(Settlement::Ack);
    }
    subscriber.stop_receiving().await;
    subscriber.close().await;
}

/// How long a scenario may wait for any one condition.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// Waits until `condition` holds, checking every 20 ms; panics with `what` after
/// [`DEADLINE`].
pub async fn eventually<F, Fut>(what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let waited = tokio::time::timeout(DEADLINE, async {
        while !condition().await {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(
        waited.is_ok(),
        "timed out after {DEADLINE:?} waiting for {what}"
    );
}

/// Runs a scenario on a fresh two-thread runtime; used by [`suite!`].
pub fn run<F: Future<Output = ()>>(scenario: F) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build();
    match runtime {
        Ok(runtime) => runtime.block_on(scenario),
        Err(error) => panic!("cannot build a runtime: {error}"),
    }
}

/// Panics unless `listed` names every scenario in [`SCENARIOS`] exactly once; used by
/// [`suite!`].
pub fn check_listed(listed: &[&str]) {
    let missing: Vec<_> = SCENARIOS.iter().filter(|s| !listed.contains(s)).collect();
    assert!(missing.is_empty(), "scenarios not run: {missing:?}");
    let mut sorted = listed.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), listed.len(), "a scenario is listed twice");
}

/// Generates one test per scenario for a fixture, and a test that every scenario is
/// listed.
///
/// The first argument is an async function (or closure) that makes the fixture; then
/// every scenario of [`SCENARIOS`], each optionally with `#[ignore = "why"]` where the
/// transport cannot give that guarantee.
#[macro_export]
macro_rules! suite {
    ($fixture:expr; $( $(#[$attr:meta])* $scenario:ident ),+ $(,)?) => {
        $(
            $(#[$attr])*
            #[test]
            fn $scenario() {
                $crate::run(async {
                    let fixture = ($fixture)().await;
                    $crate::scenarios::$scenario(&fixture).await;
                });
            }
        )+

        #[test]
        fn the_suite_lists_every_scenario() {
            $crate::check_listed(&[$(stringify!($scenario)),+]);
        }
    };
}
