//! The scenarios: each proves one guarantee of the transport contract on a live broker.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use conveyor::kit;
use conveyor::{
    App, Backoff, Batch, Broker, Bytes, Context, DecodeError, Delivery, Dispatch, FromDelivery,
    FromPayload, Headers, Identity, Json, Message, MountOptions, Publisher, Rejection, RunningApp,
    State, mode,
};

use crate::journal::{Job, Journal, Run, handle};
use crate::{Fixture, QueueKind, Queues, TestQueue, eventually};

/// The partition key of job `id` when a scenario spreads jobs over `keys` keys.
fn key(id: u64, keys: u64) -> String {
    format!("k{}", id % keys.max(1))
}

/// Publishes `jobs`, job `id` under the key `key(id, keys)`.
async fn publish<F: Fixture>(fixture: &F, queue: &TestQueue, jobs: Vec<Job>, keys: u64) {
    publish_as(fixture, queue, jobs, keys, None).await;
}

/// [`publish`], job `id` with the message id `{ids}-{id}` when `ids` is given.
async fn publish_as<F: Fixture>(
    fixture: &F,
    queue: &TestQueue,
    jobs: Vec<Job>,
    keys: u64,
    ids: Option<&str>,
) {
    let messages = jobs
        .into_iter()
        .map(|job| {
            let mut builder = Message::builder().partition_key(key(job.id, keys));
            if let Some(prefix) = ids {
                builder = builder.message_id(format!("{prefix}-{}", job.id));
            }
            match builder.json(&job) {
                Ok(message) => message,
                Err(error) => panic!("cannot encode a job: {error}"),
            }
        })
        .collect();
    if let Err(error) = fixture
        .publisher()
        .publish_batch(&queue.name, messages)
        .await
    {
        panic!("cannot publish to `{}`: {error}", queue.name);
    }
}

/// Starts an app running the scenarios' handler on `queue`.
async fn start<F: Fixture, D>(
    fixture: &F,
    queue: &TestQueue,
    journal: &Journal,
    configure: impl FnOnce(MountOptions) -> MountOptions<Identity, D>,
) -> RunningApp {
    let started = App::new("conformance")
        .with_state(journal.clone())
        .shutdown_timeout(Duration::from_secs(30))
        .mount(fixture.source(queue), handle, configure)
        .start()
        .await;
    match started {
        Ok(app) => app,
        Err(error) => panic!("the app does not start on `{}`: {error}", queue.name),
    }
}

async fn stop(app: RunningApp) {
    if let Err(error) = app.shutdown().await {
        panic!("the app does not shut down cleanly: {error}");
    }
}

async fn all_acked(journal: &Journal, count: usize) {
    eventually(&format!("{count} jobs acked"), || async {
        journal.acked_distinct() >= count
    })
    .await;
}

async fn dead_lettered<F: Fixture>(
    fixture: &F,
    queue: &TestQueue,
    count: usize,
) -> Vec<conveyor::DeadLetter> {
    eventually(&format!("{count} dead letters"), || async {
        fixture.dead_letters(queue).await.len() >= count
    })
    .await;
    fixture.dead_letters(queue).await
}

/// No job was acked twice; on a broker that may duplicate, at most one in twenty.
fn assert_duplicates_allowed<F: Fixture>(fixture: &F, journal: &Journal, jobs: usize) {
    let duplicates = journal.acked().len().saturating_sub(jobs);
    if fixture.may_duplicate() {
        if duplicates > 0 {
            println!("{duplicates} duplicate deliveries of {jobs} (the broker may duplicate)");
        }
        assert!(
            duplicates <= jobs / 20,
            "{duplicates} duplicates of {jobs} jobs"
        );
    } else {
        assert_eq!(duplicates, 0, "a message was handled twice");
    }
}

/// Whether `ids` never go back: a retried job runs again before any later one.
fn in_order(ids: &[u64]) -> bool {
    ids.windows(2).all(|pair| pair[0] <= pair[1])
}

fn fixed(ms: u64) -> Backoff {
    Backoff::fixed(Duration::from_millis(ms))
}

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<(Bytes, Headers)>>>);

async fn capture(payload: Bytes, headers: Headers, State(seen): State<Captured>) {
    kit::lock(&seen.0).push((payload, headers));
}

/// The payload arrives byte for byte, and so do text and binary headers; the message's
/// properties arrive as the same headers on every transport.
pub async fn round_trip_keeps_payload_headers_and_properties<F: Fixture>(fixture: &F) {
    let queue = fixture.declare(QueueKind::plain()).await;
    let payload = Bytes::from_static(b"{\"id\":1,\"note\":\"caf\xc3\xa9\"}");
    let binary = Bytes::from_static(&[0, 159, 146, 150, 255]);
    let message = Message::builder()
        .header("x-trace", "abc-123")
        .header("x-binary", binary.clone())
        .partition_key("k0")
        .content_type("application/vnd.job+json")
        .message_id("job-1")
        .correlation_id("order-7")
        .reply_to("conformance-replies")
        .payload(payload.clone());
    if let Err(error) = fixture.publisher().publish(&queue.name, message).await {
        panic!("cannot publish: {error}");
    }
    let seen = Captured::default();
    let app = App::new("conformance")
        .with_state(seen.clone())
        .mount(fixture.source(&queue), capture, |m| m)
        .start()
        .await
        .unwrap_or_else(|error| panic!("the app does not start: {error}"));
    eventually("the message to arrive", || async {
        !kit::lock(&seen.0).is_empty()
    })
    .await;
    stop(app).await;
    let (got, headers) = kit::lock(&seen.0)[0].clone();
    assert_eq!(got, payload);
    assert_eq!(headers.get_str("x-trace"), Some("abc-123"));
    assert_eq!(headers.get("x-binary"), Some(&binary));
    assert_eq!(
        headers.get_str(conveyor::CONTENT_TYPE_HEADER),
        Some("application/vnd.job+json")
    );
    assert_eq!(headers.get_str(conveyor::MESSAGE_ID_HEADER), Some("job-1"));
    assert_eq!(
        headers.get_str(conveyor::CORRELATION_ID_HEADER),
        Some("order-7")
    );
    assert_eq!(
        headers.get_str(conveyor::REPLY_TO_HEADER),
        Some("conformance-replies")
    );
    fixture.delete(queue).await;
}

/// Two apps on one queue: every message is handled, and (unless the broker says it may
/// duplicate) by one of them only.
pub async fn competing_subscriptions_lose_nothing_and_handle_each_message_once<F: Fixture>(
    fixture: &F,
) {
    const JOBS: u64 = 200;
    let queue = fixture.declare(QueueKind::plain()).await;
    let journal = Journal::default();
    let one = start(fixture, &queue, &journal, |m| m.workers(4)).await;
    let two = start(fixture, &queue, &journal, |m| m.workers(4)).await;
    publish(fixture, &queue, (0..JOBS).map(Job::new).collect(), 8).await;
    all_acked(&journal, JOBS as usize).await;
    stop(one).await;
    stop(two).await;
    assert_duplicates_allowed(fixture, &journal, JOBS as usize);
    fixture.delete(queue).await;
}

/// A mount with no `workers` runs one handler at a time.
pub async fn the_sequential_mount_never_overlaps<F: Fixture>(fixture: &F) {
    const JOBS: u64 = 30;
    let queue = fixture.declare(QueueKind::plain()).await;
    let journal = Journal::default();
    publish(fixture, &queue, (0..JOBS).map(Job::new).collect(), 4).await;
    let app = start(fixture, &queue, &journal, |m| m).await;
    all_acked(&journal, JOBS as usize).await;
    stop(app).await;
    assert_eq!(journal.most_running(), 1);
    fixture.delete(queue).await;
}

/// Jobs of one key, some failing before they succeed: each runs again, until it
/// succeeds, before the next one starts.
pub async fn the_sequential_mount_keeps_order_across_retries<F: Fixture>(fixture: &F) {
    const JOBS: u64 = 20;
    let queue = fixture.declare(QueueKind::plain()).await;
    let journal = Journal::default();
    let jobs = (0..JOBS)
        .map(|id| Job {
            fail_first: u32::from(id % 4 == 1),
            ..Job::new(id)
        })
        .collect();
    publish(fixture, &queue, jobs, 1).await;
    let app = start(fixture, &queue, &journal, |m| m.retry_after(fixed(20))).await;
    all_acked(&journal, JOBS as usize).await;
    stop(app).await;
    let ids: Vec<u64> = journal.runs().iter().map(|run| run.id).collect();
    assert!(in_order(&ids), "handled out of order: {ids:?}");
    assert_eq!(journal.acked().len(), JOBS as usize);
    fixture.delete(queue).await;
}

/// The two modes that keep each key in order over several workers.
#[derive(Clone, Copy, Debug)]
enum Keyed {
    /// `workers(n).by_key()`: a key's lane fixed by a hash.
    Lanes,
    /// `workers(n).by_key().any_worker()`: a key on whichever worker is free.
    AnyWorker,
}

const KEYED: [Keyed; 2] = [Keyed::Lanes, Keyed::AnyWorker];

impl Keyed {
    /// The mode with `workers` workers (any-worker reading ahead its default).
    fn dispatch(self, workers: usize) -> Dispatch {
        match self {
            Keyed::Lanes => Dispatch::Lanes(workers),
            Keyed::AnyWorker => Dispatch::AnyWorker {
                workers,
                read_ahead: workers
                    .saturating_mul(conveyor::dispatch::DEFAULT_READ_AHEAD_PER_WORKER),
            },
        }
    }

    fn with(self, m: MountOptions, workers: usize) -> MountOptions<Identity, mode::Chosen> {
        m.with_dispatch(self.dispatch(workers))
    }
}

/// Each keyed mode, with failures that are retried now or later: every key's jobs run in
/// order and one at a time, a retried job again before any later job of its key.
pub async fn keyed_modes_keep_each_key_in_order_one_at_a_time_across_retries<F: Fixture>(
    fixture: &F,
) {
    const KEYS: u64 = 4;
    const JOBS: u64 = 60;
    for mode in KEYED {
        for retry_later in [false, true] {
            let queue = fixture.declare(QueueKind::plain()).await;
            let journal = Journal::default();
            let jobs = (0..JOBS)
                .map(|id| Job {
                    fail_first: match id % 5 {
                        1 => 1,
                        3 => 2,
                        _ => 0,
                    },
                    ..Job::new(id)
                })
                .collect();
            publish(fixture, &queue, jobs, KEYS).await;
            let app = start(fixture, &queue, &journal, |m| {
                let keyed = mode.with(m, 3);
                if retry_later {
                    keyed.retry_after(fixed(20))
                } else {
                    keyed.retry()
                }
            })
            .await;
            all_acked(&journal, JOBS as usize).await;
            stop(app).await;
            let mut by_key: HashMap<String, Vec<Run>> = HashMap::new();
            for run in journal.runs() {
                by_key.entry(key(run.id, KEYS)).or_default().push(run);
            }
            for (key, mut runs) in by_key {
                runs.sort_by_key(|run| run.started);
                let ids: Vec<u64> = runs.iter().map(|run| run.id).collect();
                assert!(
                    in_order(&ids),
                    "{mode:?}: key {key} out of order (retry later: {retry_later}): {ids:?}"
                );
                for pair in runs.windows(2) {
                    assert!(
                        pair[1].started >= pair[0].finished,
                        "{mode:?}: key {key} ran jobs {} and {} at once",
                        pair[0].id,
                        pair[1].id
                    );
                }
            }
            fixture.delete(queue).await;
        }
    }
}

async fn max_attempts_end_in_the_dead_letter_queue<F: Fixture, D>(
    fixture: &F,
    configure: impl FnOnce(MountOptions) -> MountOptions<Identity, D>,
) {
    let queue = fixture.declare(QueueKind::with_dead_letter_queue()).await;
    let journal = Journal::default();
    let poison = Job {
        always_fail: true,
        ..Job::new(7)
    };
    publish(fixture, &queue, vec![poison], 1).await;
    let app = start(fixture, &queue, &journal, |m| configure(m).max_attempts(3)).await;
    let dead = dead_lettered(fixture, &queue, 1).await;
    stop(app).await;
    let attempts: Vec<u32> = journal.runs_of(7).iter().map(|run| run.attempt).collect();
    assert_eq!(attempts, [1, 2, 3], "the handler runs once per attempt");
    assert_eq!(dead.len(), 1);
    let reason = dead[0].reason.clone().unwrap_or_default();
    assert!(
        reason.contains("planned failure") && reason.contains("no attempts left"),
        "the dead letter carries the policy's reason, not {reason:?}"
    );
    fixture.delete(queue).await;
}

/// `workers(1).retry().max_attempts(3)`: the broker counts the attempts (a classic
/// RabbitMQ queue keeps no count of its own), and the third failure dead-letters.
pub async fn max_attempts_ends_in_the_dead_letter_queue_when_the_broker_retries<F: Fixture>(
    fixture: &F,
) {
    max_attempts_end_in_the_dead_letter_queue(fixture, |m| m.workers(1).retry()).await;
}

/// Keyed modes retry in place and count the attempts themselves; the third failure
/// dead-letters.
pub async fn max_attempts_ends_in_the_dead_letter_queue_when_retried_in_place<F: Fixture>(
    fixture: &F,
) {
    for mode in KEYED {
        max_attempts_end_in_the_dead_letter_queue(fixture, |m| mode.with(m, 2).retry()).await;
    }
}

/// `reject_on_error`: the first failure dead-letters the message, with the handler's
/// error as its reason, and the handler never runs again for it.
pub async fn a_reject_reaches_the_dead_letter_queue_at_once_with_its_reason<F: Fixture>(
    fixture: &F,
) {
    let queue = fixture.declare(QueueKind::with_dead_letter_queue()).await;
    let journal = Journal::default();
    let poison = Job {
        always_fail: true,
        ..Job::new(3)
    };
    publish(fixture, &queue, vec![poison, Job::new(4)], 2).await;
    let app = start(fixture, &queue, &journal, |m| {
        m.workers(2).reject_on_error()
    })
    .await;
    let dead = dead_lettered(fixture, &queue, 1).await;
    all_acked(&journal, 1).await;
    stop(app).await;
    assert_eq!(journal.runs_of(3).len(), 1, "the handler ran once");
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].reason.as_deref(), Some("planned failure"));
    let job: Job = serde_json::from_slice(&dead[0].payload)
        .unwrap_or_else(|error| panic!("the dead letter keeps its payload: {error}"));
    assert_eq!(job.id, 3);
    fixture.delete(queue).await;
}

/// A retry-after comes back no sooner than its delay, sub-second delays included, when
/// the broker holds it (workers) and when the mount does (the keyed modes).
pub async fn retry_after_comes_no_sooner_than_its_delay<F: Fixture>(fixture: &F) {
    let delays = [300u64, 1500];
    for keyed in [None, Some(Keyed::Lanes), Some(Keyed::AnyWorker)] {
        let queue = fixture.declare(QueueKind::plain()).await;
        let journal = Journal::default();
        let jobs = delays
            .iter()
            .enumerate()
            .map(|(id, &ms)| Job {
                retry_after_ms: Some(ms),
                ..Job::new(id as u64)
            })
            .collect();
        publish(fixture, &queue, jobs, 2).await;
        let app = start(fixture, &queue, &journal, |m| match keyed {
            Some(mode) => mode.with(m, 2),
            None => m.with_dispatch(Dispatch::Workers(2)),
        })
        .await;
        all_acked(&journal, delays.len()).await;
        stop(app).await;
        for (id, &ms) in delays.iter().enumerate() {
            let runs = journal.runs_of(id as u64);
            assert_eq!(runs.len(), 2, "job {id}: {runs:?}");
            // The delay counts from the end of the run that asked for it.
            let waited = runs[1].started - runs[0].finished;
            assert!(
                waited >= Duration::from_millis(ms),
                "job {id} came back {waited:?} after its first run ended, before its {ms} ms ({keyed:?})"
            );
        }
        fixture.delete(queue).await;
    }
}

#[derive(Clone, Default)]
struct Sizes(Arc<Mutex<Vec<usize>>>);

async fn sizes(batch: Batch<Json<Job>>, State(sizes): State<Sizes>) {
    kit::lock(&sizes.0).push(batch.len());
}

/// Batch handlers get between one and `size` messages, and every message once.
pub async fn batches_are_never_empty_and_never_larger_than_their_size<F: Fixture>(fixture: &F) {
    const JOBS: usize = 25;
    let queue = fixture.declare(QueueKind::plain()).await;
    publish(fixture, &queue, (0..JOBS as u64).map(Job::new).collect(), 5).await;
    let seen = Sizes::default();
    let app = App::new("conformance")
        .with_state(seen.clone())
        .mount(fixture.source(&queue), sizes, |m| m.batch(4))
        .start()
        .await
        .unwrap_or_else(|error| panic!("the app does not start: {error}"));
    let total = || kit::lock(&seen.0).iter().sum::<usize>();
    eventually("every job in some batch", || async { total() >= JOBS }).await;
    stop(app).await;
    let sizes = kit::lock(&seen.0).clone();
    assert!(sizes.iter().all(|&n| (1..=4).contains(&n)), "{sizes:?}");
    assert_eq!(total(), JOBS);
    fixture.delete(queue).await;
}

/// On a pulling transport whose queue caps what one receive asks for: with ten messages
/// waiting in `queue`, a batch mount of up to ten on `source` (that queue, capped at
/// `most`, below ten) gets at most `most` at a time, since a batch holds what one receive
/// brought, and gets `most` first. Without the cap the first batch would hold all ten.
pub async fn a_receive_brings_at_most_its_queues_receive_batch<P, S>(
    publisher: &P,
    queue: &str,
    source: S,
    most: usize,
) where
    P: Publisher,
    S: conveyor::Source,
{
    const JOBS: u64 = 10;
    let messages = (0..JOBS)
        .map(|id| Message::json(&Job::new(id)))
        .collect::<Result<Vec<_>, _>>()
        .unwrap_or_else(|error| panic!("cannot encode a job: {error}"));
    if let Err(error) = publisher.publish_batch(queue, messages).await {
        panic!("cannot publish to `{queue}`: {error}");
    }
    let seen = Sizes::default();
    let app = App::new("conformance")
        .with_state(seen.clone())
        .mount(source, sizes, |m| m.batch(JOBS as usize))
        .start()
        .await
        .unwrap_or_else(|error| panic!("the app does not start: {error}"));
    let total = || kit::lock(&seen.0).iter().sum::<usize>();
    eventually("every job in some batch", || async {
        total() >= JOBS as usize
    })
    .await;
    stop(app).await;
    let sizes = kit::lock(&seen.0).clone();
    assert!(sizes.iter().all(|&n| (1..=most).contains(&n)), "{sizes:?}");
    assert_eq!(sizes.first(), Some(&most), "{sizes:?}");
}

/// A queue whose receive batch is zero (`source`) fails the app's start with a
/// configuration error that names it.
pub async fn a_receive_batch_of_zero_fails_the_start<S: conveyor::Source>(source: S) {
    let started = App::new("zero")
        .mount(source, |_: Bytes| async {}, |m| m)
        .start()
        .await;
    assert!(
        matches!(&started, Err(conveyor::Error::Config(message)) if message.contains("receive_batch(0)")),
        "{:?}",
        started.err()
    );
}

#[derive(Clone, Default)]
struct Attempts(Arc<Mutex<Vec<u32>>>);

/// Asks for every message of its batch again, noting each one's attempt.
async fn retry_all(batch: Batch<Json<Job>>, State(seen): State<Attempts>) -> conveyor::Outcome {
    let attempts = (0..batch.len()).filter_map(|index| batch.info(index).map(|info| info.attempt));
    kit::lock(&seen.0).extend(attempts);
    conveyor::Outcome::Retry
}

/// A batch handler that asks for a retry on every attempt gets as many as
/// `max_attempts` allows, as a single delivery's would, and its message is then
/// dead-lettered: the retries it asks for do not go on until the broker's own limit.
pub async fn a_batch_asking_for_retries_is_dead_lettered_after_max_attempts<F: Fixture>(
    fixture: &F,
) {
    let queue = fixture.declare(QueueKind::with_dead_letter_queue()).await;
    publish(fixture, &queue, vec![Job::new(7)], 1).await;
    let seen = Attempts::default();
    let app = App::new("conformance")
        .with_state(seen.clone())
        .mount(fixture.source(&queue), retry_all, |m| {
            m.batch(4).max_attempts(3)
        })
        .start()
        .await
        .unwrap_or_else(|error| panic!("the app does not start: {error}"));
    let dead = dead_lettered(fixture, &queue, 1).await;
    stop(app).await;
    assert_eq!(*kit::lock(&seen.0), [1, 2, 3], "one run per attempt");
    let reason = dead[0].reason.clone().unwrap_or_default();
    assert!(
        reason.contains("asked for a retry on attempt 3"),
        "the dead letter carries the policy's reason, not {reason:?}"
    );
    fixture.delete(queue).await;
}

/// When the app starts draining, what it received but has not started goes back to the
/// queue while the running handlers carry on; those then finish and are acked. For
/// workers, for a sequential mount (whose transport may read ahead of it), for lanes
/// (whose lanes queue what they cannot run yet) and for any-worker (which reads ahead to
/// find keys to run). Every job has a key of its own: none waits behind a running one of
/// its key, which lanes hand back only once that one has settled, to keep the key's
/// order.
pub async fn draining_hands_back_unstarted_deliveries_while_handlers_run<F: Fixture>(fixture: &F) {
    const JOBS: u64 = 10;
    // (handlers that run at once, the keyed mode if any)
    for (running, keyed) in [
        (2usize, None),
        (1, None),
        (2, Some(Keyed::Lanes)),
        (2, Some(Keyed::AnyWorker)),
    ] {
        let queue = fixture.declare(QueueKind::plain()).await;
        let journal = Journal::gated();
        publish(fixture, &queue, (0..JOBS).map(Job::new).collect(), JOBS).await;
        let app = start(fixture, &queue, &journal, |m| match (running, keyed) {
            (_, Some(mode)) => mode.with(m, running),
            (1, None) => m.with_dispatch(Dispatch::Sequential),
            (_, None) => m.with_dispatch(Dispatch::Workers(running)),
        })
        .await;
        eventually(&format!("{running} handlers at the gate"), || async {
            journal.waiting() == running
        })
        .await;
        app.stop_receiving();
        // The queue's hold (visibility, prefetch) outlasts the deadline: only a release
        // passes.
        let unstarted = JOBS - running as u64;
        eventually(
            &format!("{unstarted} unstarted jobs back on the queue"),
            || async { fixture.ready(&queue).await == unstarted },
        )
        .await;
        assert_eq!(journal.waiting(), running, "the running handlers still run");
        journal.open();
        stop(app).await;
        assert_eq!(journal.acked().len(), running);
        assert_eq!(fixture.ready(&queue).await, unstarted);
        fixture.delete(queue).await;
    }
}

/// Five apps in turn, each shut down mid-stream, then a last one: nothing is lost, and
/// after each shutdown every message not acked is ready again at once.
pub async fn stopping_and_restarting_mid_stream_loses_nothing<F: Fixture>(fixture: &F) {
    const JOBS: u64 = 100;
    let queue = fixture.declare(QueueKind::plain()).await;
    let journal = Journal::default();
    publish(fixture, &queue, (0..JOBS).map(Job::new).collect(), 8).await;
    for round in 1..=5usize {
        let app = start(fixture, &queue, &journal, |m| m.workers(3)).await;
        all_acked(&journal, round * 10).await;
        stop(app).await;
        let left = JOBS - journal.acked_distinct() as u64;
        eventually(
            &format!("{left} jobs ready after shutdown {round}"),
            || async { fixture.ready(&queue).await == left },
        )
        .await;
    }
    let app = start(fixture, &queue, &journal, |m| m.workers(3)).await;
    all_acked(&journal, JOBS as usize).await;
    stop(app).await;
    assert_duplicates_allowed(fixture, &journal, JOBS as usize);
    fixture.delete(queue).await;
}

/// A job whose decoder panics when its id is 1.
struct Touchy(Job);

impl FromPayload for Touchy {
    fn from_payload(payload: &Bytes) -> Result<Self, DecodeError> {
        let Json(job) = Json::<Job>::from_payload(payload)?;
        assert!(job.id != 1, "the decoder panics on job 1");
        Ok(Touchy(job))
    }
}

/// An extractor that panics on a message with a `boom` header.
struct Fussy;

impl FromDelivery for Fussy {
    fn from_delivery(delivery: &Delivery, _: &Context) -> Result<Self, Rejection> {
        assert!(!delivery.headers().contains("boom"), "the extractor panics");
        Ok(Fussy)
    }
}

async fn touchy(Touchy(job): Touchy, _: Fussy, State(journal): State<Journal>) {
    assert!(!job.panic, "the handler panics");
    journal.start().await;
    let now = tokio::time::Instant::now();
    journal.finish(Run {
        id: job.id,
        key: None,
        attempt: 1,
        started: now,
        finished: now,
        acked: true,
    });
}

/// Panics while decoding, in an extractor and in the handler each dead-letter their
/// message; the other messages are handled and the app shuts down cleanly.
pub async fn a_panic_in_decode_an_extractor_or_a_handler_leaves_the_service_up<F: Fixture>(
    fixture: &F,
) {
    let queue = fixture.declare(QueueKind::with_dead_letter_queue()).await;
    let journal = Journal::default();
    let mut messages = Vec::new();
    for id in 0..10u64 {
        let job = Job {
            panic: id == 3,
            ..Job::new(id)
        };
        let mut message = Message::builder().partition_key(key(id, 3));
        if id == 2 {
            message = message.header("boom", "1");
        }
        messages.push(
            message
                .json(&job)
                .unwrap_or_else(|error| panic!("cannot encode: {error}")),
        );
    }
    if let Err(error) = fixture
        .publisher()
        .publish_batch(&queue.name, messages)
        .await
    {
        panic!("cannot publish: {error}");
    }
    let app = App::new("conformance")
        .with_state(journal.clone())
        .mount(fixture.source(&queue), touchy, |m| {
            m.workers(2).by_key().reject_on_error()
        })
        .start()
        .await
        .unwrap_or_else(|error| panic!("the app does not start: {error}"));
    let dead = dead_lettered(fixture, &queue, 3).await;
    all_acked(&journal, 7).await;
    stop(app).await;
    let mut reasons: Vec<String> = dead.into_iter().filter_map(|d| d.reason).collect();
    reasons.sort();
    assert_eq!(reasons.len(), 3, "{reasons:?}");
    for (reason, expected) in reasons.iter().zip([
        "handler panicked: the decoder panics on job 1",
        "handler panicked: the extractor panics",
        "handler panicked: the handler panics",
    ]) {
        assert_eq!(reason, expected);
    }
    fixture.delete(queue).await;
}

/// A publisher that refuses the first publish of each message whose id is listed, then
/// lets them through, counting the refusals.
#[derive(Clone)]
struct Refusing<P> {
    inner: P,
    refuse: Arc<Mutex<Vec<String>>>,
    refused: Arc<Mutex<Vec<String>>>,
}

impl<P: Publisher> Publisher for Refusing<P> {
    async fn publish(&self, destination: &str, message: Message) -> Result<(), conveyor::Error> {
        let cause = message
            .headers()
            .get_str(conveyor::CAUSATION_ID_HEADER)
            .unwrap_or_default()
            .to_string();
        let refuse = {
            let mut listed = kit::lock(&self.refuse);
            let at = listed.iter().position(|id| *id == cause);
            at.map(|at| listed.remove(at)).is_some()
        };
        if refuse {
            kit::lock(&self.refused).push(cause);
            return Err(conveyor::Error::config("refused once by the scenario"));
        }
        self.inner.publish(destination, message).await
    }
}

/// A job's id, then its attempt (for an input) or its causation id (for an output),
/// and its partition key.
type Seen<T> = Arc<Mutex<Vec<(u64, T, Option<String>)>>>;

/// What a forwarding stage saw: each input's id, attempt and partition key.
#[derive(Clone, Default)]
struct Forwarded(Seen<u32>);

/// Forwards each job as a message: the mount publishes it before the input is acked.
async fn forward(
    Json(job): Json<Job>,
    info: conveyor::DeliveryInfo,
    key: Option<conveyor::PartitionKey>,
    State(seen): State<Forwarded>,
) -> Result<Message, conveyor::Error> {
    kit::lock(&seen.0).push((job.id, info.attempt, key.map(|key| key.to_string())));
    Message::json(&job)
}

/// What arrived downstream: the job, its causation id and its partition key.
#[derive(Clone, Default)]
struct Arrived(Seen<Option<String>>);

async fn arrive(
    Json(job): Json<Job>,
    headers: Headers,
    key: Option<conveyor::PartitionKey>,
    State(seen): State<Arrived>,
) {
    let cause = headers
        .get_str(conveyor::CAUSATION_ID_HEADER)
        .map(str::to_string);
    kit::lock(&seen.0).push((job.id, cause, key.map(|key| key.to_string())));
}

/// A handler's returned message goes out through the mount's own broker (or the
/// publisher given to `publish_via`) before its input is acked, carrying the input's
/// partition key (where the transport carries keys) and its message id as causation id. A publish the broker refuses fails
/// the run: the input is retried (attempt 2), never acked before its output is out.
pub async fn a_handlers_messages_are_published_before_its_input_is_acked<F: Fixture>(fixture: &F) {
    const JOBS: u64 = 20;
    let own = fixture.declare(QueueKind::plain()).await;
    let via = fixture.declare(QueueKind::plain()).await;
    let out = fixture.declare(QueueKind::plain()).await;
    for (queue, prefix) in [(&own, "own"), (&via, "via")] {
        let jobs = (0..JOBS).map(Job::new).collect();
        publish_as(fixture, queue, jobs, 4, Some(prefix)).await;
    }
    let refusing = Refusing {
        inner: fixture.publisher(),
        refuse: Arc::new(Mutex::new(
            (0..JOBS).step_by(5).map(|id| format!("via-{id}")).collect(),
        )),
        refused: Arc::default(),
    };
    let (from_own, from_via) = (Forwarded::default(), Forwarded::default());
    let arrived = Arrived::default();
    let started = App::new("conformance-outputs")
        .with_state(arrived.clone())
        .mount(fixture.source(&out), arrive, |m| m)
        .start()
        .await;
    let downstream = started.unwrap_or_else(|error| panic!("the app does not start: {error}"));
    // One app per stage: each has its own `State<Forwarded>`.
    let own_stage = App::new("conformance-forward-own")
        .with_state(from_own.clone())
        .mount(fixture.source(&own), forward, |m| {
            m.workers(3).by_key().publish_to(out.name.as_str())
        })
        .start()
        .await
        .unwrap_or_else(|error| panic!("the app does not start: {error}"));
    let via_stage = App::new("conformance-forward-via")
        .with_state(from_via.clone())
        .mount(fixture.source(&via), forward, |m| {
            m.publish_to(out.name.as_str())
                .publish_via(refusing.clone())
                .retry()
        })
        .start()
        .await
        .unwrap_or_else(|error| panic!("the app does not start: {error}"));

    eventually("every output downstream", || async {
        kit::lock(&arrived.0).len() >= 2 * JOBS as usize
    })
    .await;
    stop(own_stage).await;
    stop(via_stage).await;
    stop(downstream).await;

    let arrived = kit::lock(&arrived.0).clone();
    for (prefix, forwarded) in [("own", &from_own), ("via", &from_via)] {
        let forwarded = kit::lock(&forwarded.0).clone();
        let mut ids: Vec<u64> = arrived
            .iter()
            .filter(|(_, cause, _)| cause.as_deref().is_some_and(|c| c.starts_with(prefix)))
            .map(|(id, cause, key_seen)| {
                assert_eq!(cause.as_deref(), Some(format!("{prefix}-{id}").as_str()));
                // The input's key, where the transport carries one.
                let input_key = forwarded
                    .iter()
                    .find(|(job, _, _)| job == id)
                    .and_then(|(_, _, key)| key.clone());
                assert_eq!(*key_seen, input_key, "job {id} keeps its input's key");
                *id
            })
            .collect();
        ids.sort_unstable();
        let arrivals = ids.len();
        ids.dedup();
        assert_eq!(
            ids,
            (0..JOBS).collect::<Vec<_>>(),
            "every {prefix} job's output arrived"
        );
        // Once each, but where the broker itself may hand a message out twice.
        if !fixture.may_duplicate() {
            assert_eq!(arrivals, ids.len(), "a {prefix} job's output arrived twice");
        }
    }
    // The refused ones ran twice, and only their second run was acked.
    let refused = kit::lock(&refusing.refused).len();
    assert_eq!(refused, (JOBS as usize).div_ceil(5));
    let runs = kit::lock(&from_via.0).clone();
    for id in (0..JOBS).step_by(5) {
        let attempts: Vec<u32> = runs
            .iter()
            .filter(|(job, _, _)| *job == id)
            .map(|(_, attempt, _)| *attempt)
            .collect();
        assert_eq!(
            attempts,
            vec![1, 2],
            "job {id}: refused once, then published"
        );
    }
    for queue in [&own, &via] {
        assert_eq!(fixture.ready(queue).await, 0, "`{}` is drained", queue.name);
    }
    for queue in [own, via, out] {
        fixture.delete(queue).await;
    }
}

/// The job whose reply comes only once the scenario opens the gate.
const LATE: u64 = 1_000_000;

/// Holds the answer to [`LATE`] until it is opened.
#[derive(Clone)]
struct ReplyGate(Arc<tokio::sync::watch::Sender<bool>>);

/// The responder: the reply to `n` is `2n`.
async fn answer(
    Json(n): Json<u64>,
    State(gate): State<ReplyGate>,
) -> Result<Message, conveyor::Error> {
    if n == LATE {
        let _ = gate.0.subscribe().wait_for(|open| *open).await;
    }
    Message::json(&(n * 2))
}

/// Sends requests for `numbers`, as many at once as the fixture allows, and checks that
/// each gets its own reply.
async fn request_all<F: Fixture>(fixture: &F, queue: &TestQueue, numbers: std::ops::Range<u64>) {
    use futures_util::StreamExt;
    let broker = fixture.broker();
    let requests = numbers.map(|n| async move {
        // Keyed, for FIFO queues, which need a group.
        let request = Message::builder()
            .partition_key(key(n, 16))
            .json(&n)
            .unwrap_or_else(|error| panic!("{error}"));
        let reply = broker
            .request(&queue.name, request, Duration::from_secs(120))
            .await
            .unwrap_or_else(|error| panic!("request {n}: {error}"));
        let doubled: u64 = serde_json::from_slice(reply.payload())
            .unwrap_or_else(|error| panic!("reply to {n}: {error}"));
        assert_eq!(doubled, 2 * n, "request {n} got another's reply");
    });
    futures_util::stream::iter(requests)
        .buffer_unordered(fixture.concurrent_requests())
        .collect::<Vec<()>>()
        .await;
}

/// Starts a responder on `queue`: `answer`, behind `gate`, as `configure` mounts it.
async fn responder<F: Fixture, D>(
    fixture: &F,
    queue: &TestQueue,
    gate: &ReplyGate,
    configure: impl FnOnce(MountOptions) -> MountOptions<Identity, D>,
) -> RunningApp {
    App::new("conformance-responder")
        .with_state(gate.clone())
        .mount(fixture.source(queue), answer, configure)
        .start()
        .await
        .unwrap_or_else(|error| panic!("the responder does not start: {error}"))
}

/// A thousand requests at once on one requester (or as many at once as the fixture
/// allows) each get their own reply, through the handler that answers by returning a
/// message. A request whose responder does not answer in time fails with a timeout, and
/// its reply, when it comes, reaches no other request: it is sent while fifty others
/// wait, ahead of their replies.
pub async fn requests_get_their_own_replies_and_a_late_one_reaches_none<F: Fixture>(fixture: &F) {
    let queue = fixture.declare(QueueKind::plain()).await;
    let gate = ReplyGate(Arc::new(tokio::sync::watch::Sender::new(false)));
    let many = responder(fixture, &queue, &gate, |m| m.workers(16)).await;
    request_all(fixture, &queue, 0..1000).await;
    stop(many).await;

    // A sequential responder: it answers the others only once the late reply is sent
    // (a reply goes out before its request is acked, and the next is handled after).
    let one_at_a_time = responder(fixture, &queue, &gate, |m| m).await;
    let late = Message::builder()
        .partition_key("late")
        .json(&LATE)
        .unwrap_or_else(|error| panic!("{error}"));
    let timed_out = fixture
        .broker()
        .request(&queue.name, late, Duration::from_millis(300))
        .await;
    assert!(
        matches!(timed_out, Err(conveyor::Error::Timeout { .. })),
        "{timed_out:?}"
    );
    // Once most of the fifty wait, the late reply goes out. A request is on the queue
    // only once it waits for its reply; the responder reads up to 16 ahead (RabbitMQ's
    // smallest default prefetch window; SQS reads ten), the late one among them, so 34
    // ready means at least 34 waiting.
    let open_once_waiting = async {
        eventually("most of the fifty requests waiting", || async {
            fixture.ready(&queue).await >= 34
        })
        .await;
        gate.0.send_replace(true);
    };
    futures_util::future::join(request_all(fixture, &queue, 0..50), open_once_waiting).await;

    stop(one_at_a_time).await;
    fixture.delete(queue).await;
    // What the requests made (an SQS reply queue) goes with the broker.
    if let Err(error) = fixture.broker().close().await {
        panic!("the broker does not close: {error}");
    }
}

/// A reading, as the codec scenario sends it in MessagePack and CBOR.
#[derive(serde::Serialize, serde::Deserialize, Clone, Debug, PartialEq)]
struct Reading {
    sensor: u32,
    label: String,
    celsius: f64,
}

/// A reading as a handler decoded it, with the content type it arrived with.
type Received = (Reading, Option<String>);

#[derive(Clone, Default)]
struct Readings(Arc<Mutex<Vec<Received>>>);

impl Readings {
    fn record(&self, reading: Reading, headers: &Headers) {
        let content_type = headers
            .get_str(conveyor::CONTENT_TYPE_HEADER)
            .map(str::to_string);
        kit::lock(&self.0).push((reading, content_type));
    }
}

async fn read_msgpack(
    conveyor::MsgPack(reading): conveyor::MsgPack<Reading>,
    headers: Headers,
    State(seen): State<Readings>,
) {
    seen.record(reading, &headers);
}

async fn read_cbor(
    conveyor::Cbor(reading): conveyor::Cbor<Reading>,
    headers: Headers,
    State(seen): State<Readings>,
) {
    seen.record(reading, &headers);
}

/// A MessagePack and a CBOR payload (binary bodies: bytes no text encoding allows) arrive
/// byte for byte with their content types, and each handler decodes its own; a payload
/// labelled with another format is rejected, with a reason naming both, before decoding.
pub async fn msgpack_and_cbor_payloads_round_trip_and_a_mislabelled_one_is_rejected<F: Fixture>(
    fixture: &F,
) {
    let packed = fixture.declare(QueueKind::with_dead_letter_queue()).await;
    let cbor = fixture.declare(QueueKind::plain()).await;
    let reading = |sensor| Reading {
        sensor,
        label: "café ☕".into(),
        celsius: -12.25,
    };
    let encoded = |result: Result<Message, conveyor::Error>| {
        result.unwrap_or_else(|error| panic!("cannot encode a reading: {error}"))
    };
    let builder = || Message::builder().partition_key("k0");
    let sends = [
        (&packed, encoded(builder().msgpack(&reading(1)))),
        (&cbor, encoded(builder().cbor(&reading(2)))),
        // MessagePack labelled JSON: the MessagePack handler must not take it.
        (
            &packed,
            encoded(
                builder()
                    .content_type("application/json")
                    .msgpack(&reading(3)),
            ),
        ),
    ];
    for (queue, message) in sends {
        if let Err(error) = fixture.publisher().publish(&queue.name, message).await {
            panic!("cannot publish to `{}`: {error}", queue.name);
        }
    }
    let seen = Readings::default();
    let app = App::new("conformance")
        .with_state(seen.clone())
        .mount(fixture.source(&packed), read_msgpack, |m| m)
        .mount(fixture.source(&cbor), read_cbor, |m| m)
        .start()
        .await
        .unwrap_or_else(|error| panic!("the app does not start: {error}"));
    let dead = dead_lettered(fixture, &packed, 1).await;
    eventually("both readings to arrive", || async {
        kit::lock(&seen.0).len() >= 2
    })
    .await;
    stop(app).await;

    let mut got = kit::lock(&seen.0).clone();
    got.sort_by_key(|(reading, _)| reading.sensor);
    assert_eq!(
        got,
        [
            (reading(1), Some("application/msgpack".to_string())),
            (reading(2), Some("application/cbor".to_string())),
        ]
    );
    assert_eq!(dead.len(), 1);
    let reason = dead[0].reason.as_deref().unwrap_or_default();
    assert!(
        reason
            .contains("content type is `application/json`, and msgpack reads application/msgpack"),
        "{reason}"
    );
    fixture.delete(packed).await;
    fixture.delete(cbor).await;
}

/// Headers by name and value, in the order a scenario sets them.
type Sent = Vec<(String, Bytes)>;

async fn capture_and_reject(
    payload: Bytes,
    headers: Headers,
    State(seen): State<Captured>,
) -> Result<(), String> {
    kit::lock(&seen.0).push((payload, headers));
    Err("seen".into())
}

/// Panics unless every header of `sent` is in `got` with the same bytes.
fn assert_each_header_kept(what: &str, sent: &Sent, got: &Headers) {
    for (name, value) in sent {
        assert_eq!(
            got.get(name),
            Some(value),
            "{what}: header `{name}` did not come back as sent; got {got:?}"
        );
    }
}

/// A header with an empty value comes back, empty, byte for byte, to the handler and
/// in the dead-letter queue: alone, among headers with values (text and binary), and at
/// the transport's header limit ([`Fixture::header_limit`]), one empty among headers
/// with values and all of them empty.
pub async fn empty_header_values_come_back_empty_alone_among_others_and_at_the_header_limit<
    F: Fixture,
>(
    fixture: &F,
) {
    let limit = fixture
        .header_limit()
        .unwrap_or(crate::HEADERS_WITHOUT_A_LIMIT);
    let empty = Bytes::new;
    let mut messages: Vec<(&str, Sent)> = vec![
        ("alone", vec![("x-h00".into(), empty())]),
        (
            "among others",
            vec![
                ("x-h00".into(), empty()),
                ("x-text".into(), Bytes::from_static(b"acme")),
                ("x-h02".into(), empty()),
                ("x-binary".into(), Bytes::from_static(&[0, 159, 255])),
            ],
        ),
    ];
    let one_empty = (0..limit)
        .map(|i| {
            let value = if i == 0 {
                empty()
            } else {
                Bytes::from(format!("v{i}"))
            };
            (format!("x-h{i:02}"), value)
        })
        .collect();
    messages.push(("at the limit, one empty", one_empty));
    let all_empty = (0..limit)
        .map(|i| (format!("x-h{i:02}"), empty()))
        .collect();
    messages.push(("at the limit, all empty", all_empty));

    let queue = fixture.declare(QueueKind::with_dead_letter_queue()).await;
    for (label, headers) in &messages {
        let mut message = Message::builder().partition_key("k0");
        for (name, value) in headers {
            message = message.header(name.clone(), value.clone());
        }
        if let Err(error) = fixture
            .publisher()
            .publish(&queue.name, message.payload(*label))
            .await
        {
            panic!("cannot publish the message {label}: {error}");
        }
    }
    let seen = Captured::default();
    let app = App::new("conformance")
        .with_state(seen.clone())
        .mount(fixture.source(&queue), capture_and_reject, |m| {
            m.reject_on_error()
        })
        .start()
        .await
        .unwrap_or_else(|error| panic!("the app does not start: {error}"));
    let dead = dead_lettered(fixture, &queue, messages.len()).await;
    stop(app).await;
    let seen = kit::lock(&seen.0).clone();
    for (label, sent) in &messages {
        let handled = seen
            .iter()
            .find(|(payload, _)| payload.as_ref() == label.as_bytes())
            .unwrap_or_else(|| panic!("the message {label} never reached the handler"));
        assert_each_header_kept(&format!("handled, {label}"), sent, &handled.1);
        let dead = dead
            .iter()
            .find(|dead| dead.payload.as_ref() == label.as_bytes())
            .unwrap_or_else(|| panic!("the message {label} was not dead-lettered"));
        assert_each_header_kept(&format!("dead-lettered, {label}"), sent, &dead.headers);
    }
    fixture.delete(queue).await;
}
