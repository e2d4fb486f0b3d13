//! The transport contract of Conveyor, as scenarios every transport runs.
//!
//! Each scenario is an async function generic over a [`Fixture`]: a small trait that
//! hands over a transport's [`Broker`] and says how to name and dress the queues the
//! scenarios declare. Scenarios make queues, publish, and read depth and dead letters
//! through the portable broker API only ([`Queues`]). A transport's test suite implements
//! the fixture against its live broker and runs every scenario with [`suite!`], the way
//! `object_store` backends share one set of integration tests:
//!
//! ```text
//! conveyor_conformance::suite!(my_fixture;
//!     round_trip_keeps_payload_headers_and_properties,
//!     #[ignore = "this broker carries no partition key"] keyed_modes_keep_each_key_in_order_one_at_a_time_across_retries,
//!     // ... every scenario in `SCENARIOS`
//! );
//! ```
//!
//! A transport that cannot give a guarantee lists the scenario with
//! `#[ignore = "why"]`: the test runner then prints it as ignored, with the reason. A
//! scenario left out of the list fails the generated `the_suite_lists_every_scenario`
//! test, so nothing is skipped silently.

pub mod errors;
mod journal;
pub mod scenarios;

use std::future::Future;
use std::time::Duration;

use std::sync::{Arc, Mutex};

use conveyor::{Broker, DeadLetter, QueueSpec, kit};

pub use journal::Journal;

/// Every scenario, by name; [`suite!`] checks that a transport lists each one.
pub const SCENARIOS: &[&str] = &[
    "round_trip_keeps_payload_headers_and_properties",
    "competing_subscriptions_lose_nothing_and_handle_each_message_once",
    "the_sequential_mount_never_overlaps",
    "the_sequential_mount_keeps_order_across_retries",
    "keyed_modes_keep_each_key_in_order_one_at_a_time_across_retries",
    "max_attempts_ends_in_the_dead_letter_queue_when_the_broker_retries",
    "max_attempts_ends_in_the_dead_letter_queue_when_retried_in_place",
    "a_reject_reaches_the_dead_letter_queue_at_once_with_its_reason",
    "retry_after_comes_no_sooner_than_its_delay",
    "batches_are_never_empty_and_never_larger_than_their_size",
    "a_batch_asking_for_retries_is_dead_lettered_after_max_attempts",
    "draining_hands_back_unstarted_deliveries_while_handlers_run",
    "stopping_and_restarting_mid_stream_loses_nothing",
    "a_panic_in_decode_an_extractor_or_a_handler_leaves_the_service_up",
    "a_handlers_messages_are_published_before_its_input_is_acked",
    "requests_get_their_own_replies_and_a_late_one_reaches_none",
    "msgpack_and_cbor_payloads_round_trip_and_a_mislabelled_one_is_rejected",
    "empty_header_values_come_back_empty_alone_among_others_and_at_the_header_limit",
];

/// What a scenario asks of a queue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueKind {
    /// Whether rejected messages go to a dead-letter queue, which
    /// [`Queues::dead_letters`] reads.
    pub dead_letter: bool,
}

impl QueueKind {
    /// A queue with no dead-letter queue.
    pub fn plain() -> Self {
        QueueKind { dead_letter: false }
    }

    /// A queue whose rejected messages go to a dead-letter queue, with a max receive
    /// count high enough (10) that the mount's `max_attempts` acts first.
    pub fn with_dead_letter_queue() -> Self {
        QueueKind { dead_letter: true }
    }
}

/// A queue made for one scenario, with a name no other test uses.
#[derive(Clone, Debug)]
pub struct TestQueue {
    /// The queue's name: what to publish to and subscribe to.
    pub name: String,
    /// Its dead-letter queue, if the kind asked for one.
    pub dead_letter_queue: Option<String>,
    /// Everything taken out of the dead-letter queue so far.
    taken: Arc<Mutex<Vec<DeadLetter>>>,
}

/// How long a received message stays hidden from other consumers on the queues the
/// suite declares: longer than any scenario waits, so that only a release, never a
/// lapsed hold, makes a message ready again.
pub const VISIBILITY: Duration = Duration::from_secs(120);

/// The max receive count of the dead-letter queues the suite declares.
pub const MAX_RECEIVE_COUNT: u32 = 10;

/// A transport under test: its broker, and how to name and dress the queues the
/// scenarios declare. Everything else goes through the portable
/// [`Broker`] API, by way of [`Queues`].
pub trait Fixture: Send + Sync + 'static {
    /// The broker under test.
    type Broker: Broker;

    /// The broker.
    fn broker(&self) -> &Self::Broker;

    /// A queue name no other test uses, starting with `stem`; one ending in `.fifo`
    /// where the fixture runs FIFO queues.
    fn unique_name(&self, stem: &str) -> String;

    /// Adds the transport's own settings to a queue the suite declares (a quorum queue,
    /// say). The default adds none.
    fn with_extras(&self, spec: QueueSpec) -> QueueSpec {
        spec
    }

    /// Whether two subscriptions may both receive one message that neither settled yet
    /// (an emulator's race, say). Scenarios then allow a few duplicates (at most one in
    /// twenty messages) but still no loss.
    fn may_duplicate(&self) -> bool {
        false
    }

    /// How many requests the request/reply scenario keeps waiting at once (of its
    /// thousand). The default sends them all at once; an emulator that serves calls one
    /// after another may need fewer.
    fn concurrent_requests(&self) -> usize {
        1000
    }

    /// The most headers a message may carry on this transport whatever their values,
    /// empty ones included, counting what the transport adds to carry them (on SQS, ten
    /// message attributes, the one that names the empty headers among them), for a
    /// message with no properties. `None` (the default) for a transport with no such
    /// limit a scenario would reach: in process, or RabbitMQ, whose limit is the frame
    /// size in bytes; scenarios then use [`HEADERS_WITHOUT_A_LIMIT`].
    fn header_limit(&self) -> Option<usize> {
        None
    }
}

/// How many headers a scenario puts on a message "at the header limit" where the
/// transport has none ([`Fixture::header_limit`]).
pub const HEADERS_WITHOUT_A_LIMIT: usize = 64;

/// What scenarios do with queues, through the portable broker API only; every
/// [`Fixture`] has it.
pub trait Queues: Fixture {
    /// Declares a new queue of `kind` (and its dead-letter queue first).
    fn declare(&self, kind: QueueKind) -> impl Future<Output = TestQueue> + Send {
        async move {
            let name = self.unique_name("q");
            let mut spec = QueueSpec::new(name.as_str()).visibility_timeout(VISIBILITY);
            let dead_letter_queue = kind.dead_letter.then(|| self.unique_name("dead"));
            if let Some(dlq) = &dead_letter_queue {
                let dead = self.with_extras(QueueSpec::new(dlq.as_str()));
                if let Err(error) = self.broker().declare_queue(&dead).await {
                    panic!("cannot declare the dead-letter queue `{dlq}`: {error}");
                }
                spec = spec.dead_letter_queue(dlq.as_str(), MAX_RECEIVE_COUNT);
            }
            if let Err(error) = self.broker().declare_queue(&self.with_extras(spec)).await {
                panic!("cannot declare the queue `{name}`: {error}");
            }
            TestQueue {
                name,
                dead_letter_queue,
                taken: Arc::default(),
            }
        }
    }

    /// A source for `queue`, from its bare name.
    fn source(&self, queue: &TestQueue) -> <Self::Broker as Broker>::Queue {
        self.broker().queue(&queue.name)
    }

    /// The publisher: the broker itself.
    fn publisher(&self) -> Self::Broker {
        self.broker().clone()
    }

    /// How many messages of `queue` are ready to be received now (not held by a
    /// consumer, not waiting out a delay).
    fn ready(&self, queue: &TestQueue) -> impl Future<Output = u64> + Send {
        async move {
            match self.broker().queue_depth(&queue.name).await {
                Ok(depth) => depth.ready,
                Err(error) => panic!("cannot read the depth of `{}`: {error}", queue.name),
            }
        }
    }

    /// Everything dead-lettered from `queue` so far, in the order it arrived.
    fn dead_letters(&self, queue: &TestQueue) -> impl Future<Output = Vec<DeadLetter>> + Send {
        async move {
            let Some(dlq) = &queue.dead_letter_queue else {
                return Vec::new();
            };
            let taken = match self.broker().take_dead_letters(dlq, usize::MAX).await {
                Ok(taken) => taken,
                Err(error) => panic!("cannot read the dead-letter queue `{dlq}`: {error}"),
            };
            let mut all = kit::lock(&queue.taken);
            all.extend(taken);
            all.clone()
        }
    }

    /// Deletes the queue and its dead-letter queue.
    fn delete(&self, queue: TestQueue) -> impl Future<Output = ()> + Send {
        async move {
            let names = std::iter::once(&queue.name).chain(&queue.dead_letter_queue);
            for name in names {
                if let Err(error) = self.broker().delete_queue(name).await {
                    panic!("cannot delete the queue `{name}`: {error}");
                }
            }
        }
    }
}

impl<F: Fixture> Queues for F {}

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
