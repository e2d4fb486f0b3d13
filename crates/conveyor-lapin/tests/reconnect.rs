//! Connections cut under load by a fault-injecting proxy (`common::proxy`): consumption
//! resumes, each connection back on its first reconnect, and loses nothing, confirmed
//! publishes survive a cut, a broker that refuses connections fails `connect` instead of
//! hanging, and a reconnect whose handshake gets no answer is cut and tried again, and a
//! subscription that stops receiving while its connection is lost holds nothing once
//! lapin restores its consumer.
//!
//! Every fault is provoked by the proxy at a point the test chooses by a condition (so
//! many messages handled, so many publishes confirmed), never by a sleep, so the tests
//! behave the same at any machine load. How soon a recovery comes is never asserted on
//! the clock: it is proven by counting the reconnect attempts (the connections the proxy
//! accepted), and the deadlines are only there to turn a hang into a failure.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use conveyor::{
    App, ConnectionState, DeliveryInfo, Json, Message, Publisher, QueueSpec, Source, State,
    SubscribeSettings, Subscriber,
};
use conveyor_lapin::{LapinBroker, LapinError, LapinSubscriber};
use futures_util::{FutureExt, StreamExt};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tokio::sync::watch;

use common::proxy::Proxy;
use common::{cleanup, ready, take_all, unique, wait_for, wait_until};

const UPSTREAM: &str = "127.0.0.1:5672";

/// The mount's prefetch window: at a cut, at most this many deliveries of the dead
/// connection are unacked, so at most this many are handled after it; the next one
/// handled came on the recovered connection.
const PREFETCH: u16 = 32;

/// One handled delivery.
#[derive(Clone, Copy)]
struct Handled {
    id: u32,
    at: Instant,
    redelivered: bool,
}

/// What the handler saw, in order, and how far it may go: a handler waits while
/// `allowed` deliveries have been handled, so that a cut always finds work left, however
/// slowly the test itself gets to run.
#[derive(Clone)]
struct Log {
    handled: Arc<Mutex<Vec<Handled>>>,
    allowed: Arc<watch::Sender<usize>>,
}

impl Log {
    fn new() -> Self {
        Log {
            handled: Arc::default(),
            allowed: Arc::new(watch::Sender::new(usize::MAX)),
        }
    }

    fn len(&self) -> usize {
        self.handled.lock().unwrap().len()
    }

    fn all(&self) -> Vec<Handled> {
        self.handled.lock().unwrap().clone()
    }

    fn allow(&self, up_to: usize) {
        self.allowed.send_replace(up_to);
    }

    /// The distinct ids handled.
    fn ids(&self) -> HashSet<u32> {
        self.handled.lock().unwrap().iter().map(|h| h.id).collect()
    }
}

async fn handle(Json(id): Json<u32>, info: DeliveryInfo, State(log): State<Log>) {
    let _ = log
        .allowed
        .subscribe()
        .wait_for(|allowed| log.len() < *allowed)
        .await;
    log.handled.lock().unwrap().push(Handled {
        id,
        at: Instant::now(),
        redelivered: info.redelivered,
    });
}

/// Message `id`, keyed over 64 partition keys (so every lane gets work).
fn message(id: u32) -> Message {
    Message::builder()
        .partition_key(format!("k{}", id % 64))
        .json(&id)
        .unwrap()
}

/// What most tests here start from: the direct connection, a new queue named after
/// `purpose` declared with it, and a proxy in front of RabbitMQ.
async fn queue_and_proxy(purpose: &str) -> (LapinBroker, String, Proxy) {
    let admin = common::broker().await;
    let queue = unique(purpose);
    admin
        .declare_queue(&QueueSpec::new(queue.as_str()))
        .await
        .unwrap();
    (admin, queue, Proxy::start(UPSTREAM).await)
}

/// A broker connected through `proxy`, its connection named `name`.
async fn through(proxy: &Proxy, name: &str) -> LapinBroker {
    common::init_tracing();
    LapinBroker::builder(proxy.url())
        .connection_name(name)
        .connect()
        .await
        .expect("RabbitMQ through the proxy")
}

/// A broker connected through `proxy`, its connection named `name`, whose reconnect
/// handshakes are cut only after [`common::DEADLINE`] instead of the default 10 s: on a
/// busy machine a handshake slower than that would be cut and tried again, an attempt
/// more than the test counts, though nothing went wrong.
async fn through_unhurried(proxy: &Proxy, name: &str) -> LapinBroker {
    common::init_tracing();
    LapinBroker::builder(proxy.url())
        .connection_name(name)
        .reconnect_handshake_timeout(common::DEADLINE)
        .connect()
        .await
        .expect("RabbitMQ through the proxy")
}

/// Whether every connection of `brokers` is up, as lapin's status says.
fn all_connected(brokers: &[&LapinBroker]) -> bool {
    brokers.iter().all(|broker| {
        conveyor::Broker::connections(*broker)
            .iter()
            .all(|connection| connection.state == ConnectionState::Connected)
    })
}

/// Waits until every id in `ids` has been handled, for at most [`common::DEADLINE`];
/// fails naming how many (and which first few) never were.
async fn wait_for_all(log: &Log, ids: impl Iterator<Item = u32> + Clone) {
    let deadline = Instant::now() + common::DEADLINE;
    loop {
        let handled = log.ids();
        let missing: Vec<u32> = ids.clone().filter(|id| !handled.contains(id)).collect();
        if missing.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{} message(s) never handled (lost?) after {:?}, first {:?}",
            missing.len(),
            common::DEADLINE,
            &missing[..missing.len().min(20)]
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What one cut measured. The durations are for the output only: nothing is asserted on
/// them, since a busy machine can make any of them long.
struct Cut {
    /// Deliveries handled when the cut was made.
    at_handled: usize,
    /// Connections the proxy cut.
    connections: usize,
    /// Connections the proxy accepted from the cut until every cut connection was back:
    /// the reconnect attempts, one per connection when none failed.
    dials: usize,
    /// From the cut to the next delivery handled (possibly one of the dead connection,
    /// still in the dispatcher).
    first_handled: Duration,
    /// From the cut to the first redelivery handled (the broker requeued it at the cut).
    first_redelivery: Option<Duration>,
    /// From the cut to the first delivery handled that must have come on the recovered
    /// connection: the (prefetch + 1)-th handled after the cut.
    resumed: Duration,
}

impl std::fmt::Display for Cut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "at {} handled, {} connection(s) cut, {} reconnect attempt(s); next handled \
             after {:?}, first redelivery after {:?}, resumed on the new connection after {:?}",
            self.at_handled,
            self.connections,
            self.dials,
            self.first_handled,
            self.first_redelivery,
            self.resumed
        )
    }
}

/// Cuts every connection of `brokers` (all through `proxy`) once they are all up (they
/// have all reconnected since the last cut), lets the handlers go up to
/// `allow_after(handled at the cut)`, waits until consumption has resumed on a new
/// connection and every connection is back, and says what it took.
async fn cut_and_measure(
    proxy: &Proxy,
    log: &Log,
    brokers: &[&LapinBroker],
    allow_after: impl Fn(usize) -> usize,
) -> Cut {
    let connections = 2 * brokers.len();
    wait_until("every connection through the proxy to be up", || {
        proxy.open_connections() >= connections && all_connected(brokers)
    })
    .await;
    let cut_at = Instant::now();
    let accepted_at_cut = proxy.accepted();
    let (deliveries_at_cut, consumes_at_cut) = (proxy.deliveries(), proxy.consumes());
    let cut = proxy.cut_connections().await;
    // Nothing more comes on the dead connections: from here on, at most PREFETCH of
    // their deliveries can still be handled.
    let at_handled = log.len();
    log.allow(allow_after(at_handled));
    let resumed_at = at_handled + usize::from(PREFETCH);
    // The deadline only tells a recovery that never comes (a stall) from a slow one.
    let deadline = Instant::now() + common::DEADLINE;
    while log.len() <= resumed_at {
        assert!(
            Instant::now() < deadline,
            "consumption did not resume within {:?} of the cut: {} handled at the cut, {} \
             since (at most {PREFETCH} can be of the cut connection); {} connection(s) made \
             through the proxy since the cut, {} open (of {connections} before it); since \
             the cut the broker pushed {} deliveries and the clients sent {} basic.consume; \
             the brokers' connections: {:?}",
            common::DEADLINE,
            at_handled,
            log.len() - at_handled,
            proxy.accepted() - accepted_at_cut,
            proxy.open_connections(),
            proxy.deliveries() - deliveries_at_cut,
            proxy.consumes() - consumes_at_cut,
            brokers
                .iter()
                .map(|broker| conveyor::Broker::connections(*broker))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Every cut connection dialed again (after its loss: what lapin's status says from
    // then on is the new connection's) and is up.
    wait_until("every cut connection to be back", || {
        proxy.accepted() - accepted_at_cut >= cut && all_connected(brokers)
    })
    .await;
    let dials = proxy.accepted() - accepted_at_cut;
    let all = log.all();
    let after = &all[at_handled..];
    Cut {
        at_handled,
        connections: cut,
        dials,
        first_handled: after[0].at.saturating_duration_since(cut_at),
        first_redelivery: after
            .iter()
            .find(|h| h.redelivered)
            .map(|h| h.at.saturating_duration_since(cut_at)),
        resumed: all[resumed_at].at.saturating_duration_since(cut_at),
    }
}

/// Duplicates in what was handled: deliveries beyond the first of each id.
fn duplicates(log: &Log) -> usize {
    let all = log.all();
    let mut seen: HashMap<u32, usize> = HashMap::new();
    for h in &all {
        *seen.entry(h.id).or_default() += 1;
    }
    all.len() - seen.len()
}

/// After each of three cuts of every connection under load, consumption over lanes
/// resumes on the recovered connection, each connection having come back on its first
/// reconnect attempt (no attempt failed, so no backoff grew between attempts: the one
/// pause was the dialer's shortest), and none of 10,000 messages is lost. How long a
/// recovery took is printed, not asserted: on a busy machine any bound on it can be
/// missed while nothing is wrong; a recovery that never comes fails at the deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lanes_resume_on_the_first_reconnect_after_each_of_3_cuts_and_lose_none_of_10_000_messages()
{
    const MESSAGES: u32 = 10_000;
    const CUTS: usize = 3;
    /// The first cut comes once this many deliveries have been handled, each later one
    /// this many after the one before.
    const SPACING: usize = 2_000;
    /// How far past a cut's mark the handlers may go before the cut has been made.
    const SLACK: usize = 500;

    let started = Instant::now();
    let (admin, queue, proxy) = queue_and_proxy("reconnect-load").await;
    let publishing = through_unhurried(&proxy, &unique("reconnect-publisher")).await;
    let consuming = through_unhurried(&proxy, &unique("reconnect-consumer")).await;
    // Two connections each: every connection the proxy accepts from here on is a
    // reconnect attempt.
    let accepted_before_cuts = proxy.accepted();

    // The load: 10,000 messages waiting, published through the proxy.
    for chunk in (0..MESSAGES).collect::<Vec<_>>().chunks(500) {
        let messages = chunk.iter().map(|&id| message(id)).collect();
        publishing.publish_batch(&queue, messages).await.unwrap();
    }
    let published = started.elapsed();

    let log = Log::new();
    log.allow(SPACING + SLACK);
    let running = App::new("reconnect-load")
        .broker(consuming.clone())
        .with_state(log.clone())
        .mount(consuming.queue(&queue).prefetch(PREFETCH), handle, |m| {
            m.workers(4).by_key()
        })
        .start()
        .await
        .unwrap();

    let mut cuts = Vec::new();
    let mut mark = SPACING;
    for n in 0..CUTS {
        wait_until("the next cut's mark", || log.len() >= mark).await;
        let last = n + 1 == CUTS;
        let cut = cut_and_measure(&proxy, &log, &[&publishing, &consuming], |handled| {
            if last {
                usize::MAX
            } else {
                handled + SPACING + SLACK
            }
        })
        .await;
        println!("cut {}: {cut}", n + 1);
        mark = cut.at_handled + SPACING;
        cuts.push(cut);
    }
    wait_for_all(&log, 0..MESSAGES).await;
    let consumed = started.elapsed();
    // Redeliveries too: nothing waits in the queue or unacked when the app stops.
    common::wait_for("every delivery to be settled", || {
        let (admin, queue) = (&admin, &queue);
        async move {
            admin.queue_depth(queue).await.unwrap().ready == 0 && common::unacked_count(queue) == 0
        }
    })
    .await;
    // No attempt was made after the last count (a connection lost again, say).
    let accepted = proxy.accepted() - accepted_before_cuts;
    running.shutdown().await.unwrap();

    let handled = log.len();
    let duplicates = duplicates(&log);
    println!(
        "published {MESSAGES} in {published:?}, all handled {consumed:?} from the start; \
         {handled} deliveries handled, {duplicates} duplicates"
    );
    for (n, cut) in cuts.iter().enumerate() {
        assert!(
            cut.connections >= 4,
            "cut {} found all four connections (two brokers, consuming and publishing each)",
            n + 1
        );
        assert_eq!(
            cut.dials,
            cut.connections,
            "cut {}: each cut connection came back on its first reconnect attempt: {cut}",
            n + 1
        );
    }
    assert_eq!(
        accepted,
        cuts.iter().map(|cut| cut.connections).sum::<usize>(),
        "no reconnect attempt besides the first after each cut"
    );
    assert_eq!(log.ids().len(), MESSAGES as usize, "nothing lost");
    assert_eq!(
        admin.queue_depth(&queue).await.unwrap().ready,
        0,
        "nothing left behind"
    );
    publishing.close().await.unwrap();
    cleanup(&admin, &[&queue], &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_publish_confirmed_across_a_cut_reaches_the_queue() {
    const MESSAGES: usize = 2_000;
    /// The cut comes once this many publishes have been confirmed ...
    const CUT_AFTER: usize = 1_000;
    /// ... and no publish past this one starts before it.
    const HELD_FROM: usize = 1_200;
    const PUBLISHERS: usize = 8;

    let (admin, queue, proxy) = queue_and_proxy("reconnect-publish").await;
    let broker = through(&proxy, &unique("reconnect-publish")).await;

    let next = Arc::new(AtomicUsize::new(0));
    let confirmed = Arc::new(Mutex::new(Vec::<u32>::new()));
    let errors = Arc::new(Mutex::new(Vec::<String>::new()));
    let slowest = Arc::new(Mutex::new(Duration::ZERO));
    let (cut_done, cut_signal) = watch::channel(false);
    let mut publishers = Vec::new();
    for _ in 0..PUBLISHERS {
        let (broker, queue, next, confirmed, errors, slowest, mut cut_signal) = (
            broker.clone(),
            queue.clone(),
            next.clone(),
            confirmed.clone(),
            errors.clone(),
            slowest.clone(),
            cut_signal.clone(),
        );
        publishers.push(tokio::spawn(async move {
            loop {
                let n = next.fetch_add(1, Ordering::SeqCst);
                if n >= MESSAGES {
                    return;
                }
                if n >= HELD_FROM {
                    let _ = cut_signal.wait_for(|done| *done).await;
                }
                let id = n as u32;
                // An error may be retried (at-least-once: a duplicate is allowed).
                loop {
                    let sent = Instant::now();
                    let result = broker.publish(&queue, message(id)).await;
                    let took = sent.elapsed();
                    {
                        let mut slowest = slowest.lock().unwrap();
                        *slowest = (*slowest).max(took);
                    }
                    match result {
                        Ok(()) => {
                            confirmed.lock().unwrap().push(id);
                            break;
                        }
                        Err(error) => {
                            errors
                                .lock()
                                .unwrap()
                                .push(format!("{}", conveyor::Report(&error)));
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    }
                }
            }
        }));
    }
    wait_until("the first publishes to be confirmed", || {
        confirmed.lock().unwrap().len() >= CUT_AFTER
    })
    .await;
    let confirmed_before = confirmed.lock().unwrap().len();
    let accepted_at_cut = proxy.accepted();
    let cut = proxy.cut_connections().await;
    cut_done.send_replace(true);
    let publishing = futures_util::future::join_all(publishers);
    let Ok(done) = tokio::time::timeout(common::DEADLINE, publishing).await else {
        panic!(
            "publishes still waiting {:?} after the cut: {} of {MESSAGES} confirmed \
             ({confirmed_before} before the cut), {} errors; {} connection(s) made through \
             the proxy since the cut, {} open",
            common::DEADLINE,
            confirmed.lock().unwrap().len(),
            errors.lock().unwrap().len(),
            proxy.accepted() - accepted_at_cut,
            proxy.open_connections()
        );
    };
    for publisher in done {
        publisher.unwrap();
    }

    let confirmed = confirmed.lock().unwrap().clone();
    let errors = errors.lock().unwrap().clone();
    let arrived: Vec<u32> = take_all(&queue).await.iter().map(|m| m.number()).collect();
    let arrived_ids: HashSet<u32> = arrived.iter().copied().collect();
    let lost: Vec<u32> = confirmed
        .iter()
        .copied()
        .filter(|id| !arrived_ids.contains(id))
        .collect();
    println!(
        "{MESSAGES} published, {} confirmed ({confirmed_before} before the cut of {cut} \
         connection(s)), {} errors retried, {} arrived ({} duplicates), slowest publish {:?}",
        confirmed.len(),
        errors.len(),
        arrived.len(),
        arrived.len() - arrived_ids.len(),
        *slowest.lock().unwrap()
    );
    for error in errors.iter().take(5) {
        println!("publish error: {error}");
    }
    for error in &errors {
        let parts: Vec<&str> = error.split(": ").collect();
        let distinct: HashSet<&str> = parts.iter().copied().collect();
        assert_eq!(distinct.len(), parts.len(), "a cause said twice: {error}");
    }
    assert_eq!(
        cut, 2,
        "the broker's connections were cut, the publishing one among them"
    );
    assert_eq!(
        confirmed.len(),
        MESSAGES,
        "every publish confirmed in the end"
    );
    assert!(lost.is_empty(), "confirmed but never arrived: {lost:?}");
    broker.close().await.unwrap();
    cleanup(&admin, &[&queue], &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connecting_through_a_proxy_that_refuses_connections_fails_instead_of_hanging() {
    common::init_tracing();
    let proxy = Proxy::start(UPSTREAM).await;
    proxy.refuse_new_connections();
    let timeout = Duration::from_secs(2);
    let started = Instant::now();
    let connecting = LapinBroker::builder(proxy.url())
        .first_connect_timeout(timeout)
        .connect();
    // The outer bound only turns a hang into a failure; the connect's own timeout is far
    // shorter.
    let error = tokio::time::timeout(Duration::from_secs(60), connecting)
        .await
        .expect("connect gave up instead of hanging")
        .expect_err("every connection is refused");
    let took = started.elapsed();
    println!(
        "refused {} time(s); connect failed after {took:?}: {}",
        proxy.refused(),
        conveyor::Report(&error)
    );
    assert!(proxy.refused() >= 1, "the client tried, and was refused");
    assert_eq!(proxy.accepted(), 0, "nothing got through");
    assert!(
        matches!(
            error,
            LapinError::Connect { .. } | LapinError::ConnectTimeout { .. }
        ),
        "{error:?}"
    );

    // The same proxy lets the next connection through once it accepts again.
    proxy.accept_new_connections();
    let broker = LapinBroker::builder(proxy.url())
        .first_connect_timeout(Duration::from_secs(30))
        .connect()
        .await
        .expect("a connection once the proxy accepts again");
    assert!(proxy.accepted() >= 1);
    broker.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_holds_a_publish_back_for_its_latency_and_while_requests_stall() {
    let (admin, queue, proxy) = queue_and_proxy("reconnect-faults").await;
    let broker = through(&proxy, &unique("reconnect-faults")).await;
    broker.publish(&queue, message(0)).await.unwrap();

    // A publish is a request and its confirm a reply: it takes both ways' latency.
    let latency = Duration::from_millis(150);
    proxy.latency(latency);
    let sent = Instant::now();
    broker.publish(&queue, message(1)).await.unwrap();
    let took = sent.elapsed();
    assert!(took >= 2 * latency, "a publish took {took:?}");
    proxy.latency(Duration::ZERO);

    // While requests stall, a publish never reaches the broker; once they flow, it does.
    proxy.stall_requests();
    let publishing = {
        let (broker, queue) = (broker.clone(), queue.clone());
        tokio::spawn(async move { broker.publish(&queue, message(2)).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!publishing.is_finished(), "a stalled publish completed");
    assert_eq!(admin.queue_depth(&queue).await.unwrap().ready, 2);
    proxy.resume();
    publishing.await.unwrap().unwrap();
    assert_eq!(admin.queue_depth(&queue).await.unwrap().ready, 3);
    broker.close().await.unwrap();
    cleanup(&admin, &[&queue], &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_fails_as_unavailable_while_the_connection_stays_lost_and_succeeds_once_it_is_back()
 {
    let (admin, queue, proxy) = queue_and_proxy("reconnect-unavailable").await;
    common::init_tracing();
    let confirm_timeout = Duration::from_secs(1);
    let broker = LapinBroker::builder(proxy.url())
        .connection_name(unique("reconnect-unavailable"))
        .confirm_timeout(confirm_timeout)
        .connect()
        .await
        .unwrap();
    broker.publish(&queue, message(0)).await.unwrap();

    proxy.refuse_new_connections();
    assert_eq!(proxy.cut_connections().await, 2, "consuming and publishing");
    // Until the client has seen the cut, a publish may also fail on the dead channel or
    // its confirm; once it has, every publish waits for the recovery, which never comes.
    // Each must return: the outer bound only turns a hang into a failure.
    let deadline = Instant::now() + common::DEADLINE;
    let error = loop {
        let publishing = broker.publish(&queue, message(1));
        let result = tokio::time::timeout(Duration::from_secs(60), publishing)
            .await
            .expect("a publish returned instead of hanging");
        let error = result.expect_err("nothing can be published while the broker is away");
        let unavailable = std::error::Error::source(&error)
            .and_then(|source| source.downcast_ref::<LapinError>())
            .is_some_and(|e| matches!(e, LapinError::Unavailable { .. }));
        if unavailable {
            break error;
        }
        assert!(
            Instant::now() < deadline,
            "never Unavailable; last: {error:?}"
        );
    };
    let shown = conveyor::Report(&error).to_string();
    println!("{shown}");
    assert_eq!(
        shown,
        format!(
            "cannot publish to `{queue}`: the connection was lost and did not recover within {confirm_timeout:?}"
        )
    );

    proxy.accept_new_connections();
    common::wait_for("a publish to succeed once the broker is back", || {
        let (broker, queue) = (&broker, &queue);
        async move { broker.publish(queue, message(2)).await.is_ok() }
    })
    .await;
    broker.close().await.unwrap();
    cleanup(&admin, &[&queue], &[]).await;
}

async fn ignore(Json(_): Json<u32>) {}

/// The process-wide metrics recorder of this test binary, installed on first use. Its
/// snapshot drains what it shows; tests tell their series apart by connection name.
fn recorder() -> &'static Snapshotter {
    static RECORDER: OnceLock<Snapshotter> = OnceLock::new();
    RECORDER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("the only recorder of this binary");
        snapshotter
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_shows_the_mount_reconnecting_while_its_connection_is_lost_then_running() {
    let (admin, queue, proxy) = queue_and_proxy("reconnect-health").await;
    let recoveries = recorder();
    let name = unique("reconnect-health");
    let broker = through(&proxy, &name).await;
    let app = App::new("health")
        .broker(broker.clone())
        .mount(broker.queue(queue.as_str()), ignore, |m| m)
        .start()
        .await
        .unwrap();
    assert!(app.health().is_ready(), "{:?}", app.health());
    let connections = |health: &conveyor::Health| {
        health
            .connections
            .iter()
            .map(|c| (c.name.clone(), c.state))
            .collect::<Vec<_>>()
    };
    let both = |state| {
        vec![
            ("consuming".to_string(), state),
            ("publishing".to_string(), state),
        ]
    };
    assert_eq!(connections(&app.health()), both(ConnectionState::Connected));

    proxy.refuse_new_connections();
    assert_eq!(proxy.cut_connections().await, 2, "consuming and publishing");
    wait_until(
        "the mount and both connections to show as reconnecting",
        || {
            let health = app.health();
            health.mounts[0].state == conveyor::MountState::Reconnecting
                && connections(&health) == both(ConnectionState::Reconnecting)
        },
    )
    .await;
    let health = app.health();
    assert!(health.is_live() && !health.is_ready(), "{health:?}");

    proxy.accept_new_connections();
    wait_until("the mount to run again", || app.health().is_ready()).await;
    assert_eq!(connections(&app.health()), both(ConnectionState::Connected));
    // Each connection was recovered once, and counted (other tests' connections have
    // other names). A recovery is counted by the task that watches its connection, which
    // may run after the health shows it; a snapshot drains the counters it shows.
    let mut counted: BTreeMap<String, u64> = BTreeMap::new();
    wait_until("both recoveries to be counted", || {
        for (key, _, _, value) in recoveries.snapshot().into_vec() {
            if key.key().name() != "conveyor.connection.reconnects" {
                continue;
            }
            let connection = key
                .key()
                .labels()
                .find(|l| l.key() == "conveyor.connection")
                .map(|l| l.value().to_string());
            if let (Some(connection), DebugValue::Counter(n)) = (connection, value)
                && connection.starts_with(&name)
            {
                *counted.entry(connection).or_default() += n;
            }
        }
        // A series registered but not yet raised shows as 0.
        counted.values().filter(|n| **n > 0).count() == 2
    })
    .await;
    assert_eq!(
        counted.into_iter().collect::<Vec<_>>(),
        [(name.clone(), 1), (format!("{name} (publishing)"), 1)]
    );
    // The app closes the broker it was given.
    app.shutdown().await.unwrap();
    cleanup(&admin, &[&queue], &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnect_whose_handshake_gets_no_answer_is_cut_and_tried_again_until_the_broker_answers()
 {
    let (admin, queue, proxy) = queue_and_proxy("reconnect-handshake").await;
    let broker = through(&proxy, &unique("reconnect-handshake")).await;
    broker.publish(&queue, message(0)).await.unwrap();

    // From now on nothing RabbitMQ sends gets through, as behind a load balancer whose
    // brokers are gone: a reconnect opens its stream, and its handshake hears nothing.
    proxy.stall_replies();
    let before = proxy.accepted();
    assert_eq!(proxy.cut_connections().await, 2, "consuming and publishing");
    // Each connection's first reconnect stalls; only cutting its handshake leads to a
    // second one.
    wait_until(
        "each connection to try again after a handshake that got no answer",
        || proxy.accepted() >= before + 4,
    )
    .await;

    // The attempts under way have just opened their streams: once RabbitMQ's answer gets
    // through, their handshakes finish, with no new connection (a handshake that failed
    // before the broker's first answer once left lapin expecting that answer twice, so
    // the next one failed too).
    let at_resume = proxy.accepted();
    proxy.resume();
    common::wait_for("a publish to succeed once the broker answers", || {
        let (broker, queue) = (&broker, &queue);
        async move { broker.publish(queue, message(1)).await.is_ok() }
    })
    .await;
    wait_until("both connections to be open again", || {
        proxy.open_connections() == 2
    })
    .await;
    assert_eq!(
        proxy.accepted(),
        at_resume,
        "recovered on the streams already open"
    );
    broker.close().await.unwrap();
    cleanup(&admin, &[&queue], &[]).await;
}

/// The state of `broker`'s consuming connection.
fn consuming(broker: &LapinBroker) -> ConnectionState {
    conveyor::Broker::connections(broker)
        .into_iter()
        .find(|connection| connection.name == "consuming")
        .expect("a consuming connection")
        .state
}

/// How many messages of `queue` are ready, and how many consumers it has, from a passive
/// declare on a connection of its own (straight to RabbitMQ, not through a proxy).
async fn ready_and_consumers(queue: &str) -> (u32, u32) {
    let connection = lapin::Connection::connect(common::URL, Default::default())
        .await
        .unwrap();
    let channel = connection.create_channel().await.unwrap();
    let declared = channel
        .queue_declare(
            queue.into(),
            lapin::options::QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            lapin::types::FieldTable::default(),
        )
        .await
        .unwrap();
    let _ = connection.close(200, "done".into()).await;
    (declared.message_count(), declared.consumer_count())
}

/// What [`lost_while_subscribed`] leaves: the admin broker, the queue, the proxy, the
/// broker through it, its subscription and the delivery taken.
type Lost = (
    LapinBroker,
    String,
    Proxy,
    LapinBroker,
    LapinSubscriber,
    conveyor::Delivery,
);

/// Subscribes to a queue of 20 messages through a proxy with a prefetch of 5, takes one
/// delivery (held as a running handler holds it), cuts the connection and keeps it down,
/// then stops receiving: the cancel cannot be sent.
async fn stopped_while_lost(name: &str) -> Lost {
    let (admin, queue, proxy, broker, mut subscriber, running) = lost_while_subscribed(name).await;
    subscriber.stop_receiving().await;
    (admin, queue, proxy, broker, subscriber, running)
}

/// Subscribes to a queue of 20 messages through a proxy with a prefetch of 5, takes one
/// delivery (held as a running handler holds it), then cuts the connection and keeps it
/// down.
async fn lost_while_subscribed(name: &str) -> Lost {
    let (admin, queue, proxy) = queue_and_proxy(name).await;
    for id in 0..20 {
        admin.publish(&queue, message(id)).await.unwrap();
    }
    let broker = through(&proxy, &unique(name)).await;
    let mut subscriber = broker
        .queue(queue.as_str())
        .prefetch(5)
        .subscribe(SubscribeSettings::new(1))
        .await
        .unwrap();
    // It goes back to the queue with the connection.
    let running = subscriber.recv().await.unwrap().unwrap();
    wait_until("the prefetch window to fill", || proxy.deliveries() >= 5).await;

    proxy.refuse_new_connections();
    proxy.cut_connections().await;
    wait_until("the consuming connection to be lost", || {
        consuming(&broker) == ConnectionState::Reconnecting
    })
    .await;
    (admin, queue, proxy, broker, subscriber, running)
}

/// Lets `proxy` take connections again, waits for the restored consumer's window, then
/// until every message of `queue` is ready again and the queue has no consumer: nothing
/// is held, and nothing more will be pushed. (Without the owed cancel the restored
/// consumer holds its window until the connection closes: this never holds. The
/// contract's second is not checked against the clock, which a busy machine could lose.)
async fn restored_consumer_hands_all_back(proxy: &Proxy, queue: &str) {
    proxy.accept_new_connections();
    // lapin restores the consumer with the channel, and the broker fills its window again.
    wait_until("the restored consumer's deliveries", || {
        proxy.deliveries() >= 10
    })
    .await;
    all_ready_and_unconsumed(queue, "the restored consumer's deliveries").await;
}

/// Waits until all 20 messages of `queue` are ready and it has no consumer.
async fn all_ready_and_unconsumed(queue: &str, after: &str) {
    let deadline = Instant::now() + common::DEADLINE;
    loop {
        let (ready, consumers) = ready_and_consumers(queue).await;
        if (ready, consumers) == (20, 0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after {after}: {ready} of 20 ready, {consumers} consumers"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Stopping receiving while the connection is lost cannot send the consumer's cancel.
/// lapin restores the consumer with the connection, and the broker fills its prefetch
/// window again for a subscription that no longer reads: those deliveries go back to the
/// queue and the consumer is cancelled, rather than both staying until the subscription
/// closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_stopped_while_its_connection_is_lost_hands_back_what_the_restored_consumer_gets()
 {
    let (admin, queue, proxy, broker, subscriber, running) =
        stopped_while_lost("reconnect-stopped").await;
    restored_consumer_hands_all_back(&proxy, &queue).await;
    drop(running);
    subscriber.close().await;
    broker.close().await.unwrap();
    cleanup(&admin, &[&queue], &[]).await;
}

/// The same, with the subscription closed before the connection is back, as a drain
/// whose handlers end at once closes it: the cancel is still owed, and carried out once
/// lapin restores the consumer. (Closing stopped it, and the restored consumer held its
/// window with no one reading it until the connection closed.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_closed_while_its_connection_is_lost_still_hands_back_what_the_restored_consumer_gets()
 {
    let (admin, queue, proxy, broker, subscriber, running) =
        stopped_while_lost("reconnect-closed").await;
    drop(running);
    subscriber.close().await;
    restored_consumer_hands_all_back(&proxy, &queue).await;
    broker.close().await.unwrap();
    cleanup(&admin, &[&queue], &[]).await;
}

/// A subscription closed without stopping first, as a replica closes a shard it hands
/// over, while its connection is lost: the close cannot be sent, and lapin brings the
/// channel back with its consumer. It is closed once back, handing back the window the
/// broker filled again (a restored consumer no one read held it, and on a
/// single-active-consumer shard held the shard from its next replica).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_handed_over_while_its_connection_is_lost_is_closed_once_back() {
    let (admin, queue, proxy, broker, subscriber, running) =
        lost_while_subscribed("reconnect-handed-over").await;
    drop(running);
    let consumes = proxy.consumes();
    subscriber.close().await;
    proxy.accept_new_connections();
    wait_until("lapin to restore the consumer", || {
        proxy.consumes() > consumes
    })
    .await;
    all_ready_and_unconsumed(&queue, "the consumer was restored").await;
    broker.close().await.unwrap();
    cleanup(&admin, &[&queue], &[]).await;
}

/// The first publish of a broker whose publishing connection is being recovered waits
/// for the recovery (at most its confirm timeout), as a publish on an open channel does:
/// it opens its channel then. lapin opens no channel on a connection it is recovering,
/// and the publish failed at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_publish_during_a_reconnect_waits_for_it() {
    let (admin, queue, proxy) = queue_and_proxy("first-publish-reconnect").await;
    common::init_tracing();
    let broker = LapinBroker::builder(proxy.url())
        .confirm_timeout(common::DEADLINE)
        .connect()
        .await
        .expect("RabbitMQ through the proxy");
    proxy.refuse_new_connections();
    let refused_before = proxy.refused();
    assert_eq!(proxy.cut_connections().await, 2);
    let states = || {
        conveyor::Broker::connections(&broker)
            .into_iter()
            .map(|c| c.state)
            .collect::<Vec<_>>()
    };
    wait_until("both connections reconnecting, refused", || {
        proxy.refused() > refused_before
            && states() == [ConnectionState::Reconnecting, ConnectionState::Reconnecting]
    })
    .await;

    let publishing = {
        let (broker, queue) = (broker.clone(), queue.clone());
        tokio::spawn(async move { broker.publish_json(&queue, &7u32).await })
    };
    // Another refused attempt: the publish has had the time to fail, if it does.
    let refused = proxy.refused();
    wait_until("another refused attempt", || proxy.refused() > refused).await;
    assert!(!publishing.is_finished(), "{:?}", publishing.await);
    proxy.accept_new_connections();
    publishing.await.unwrap().expect("published once recovered");
    wait_for("the message in the queue", || async {
        ready(&admin, &queue).await == 1
    })
    .await;
    broker.close().await.unwrap();
    cleanup(&admin, &[&queue], &[]).await;
}

/// A publish on a broker closed by the application fails at once: only a connection
/// being recovered is waited for (here the confirm timeout is an hour, and the test's
/// deadline a minute).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_after_close_fails_without_waiting_for_a_recovery() {
    common::init_tracing();
    let broker = LapinBroker::builder(common::URL)
        .confirm_timeout(Duration::from_secs(3600))
        .connect()
        .await
        .unwrap();
    broker.close().await.unwrap();
    let published = tokio::time::timeout(common::DEADLINE, broker.publish_json("anywhere", &1u32))
        .await
        .expect("a publish after close ends");
    assert!(published.is_err(), "{published:?}");
}

/// Consumers on `queue`, as the broker counts them (a passive declare).
async fn consumers_on(channel: &lapin::Channel, queue: &str) -> u32 {
    let options = lapin::options::QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    channel
        .queue_declare(queue.into(), options, Default::default())
        .await
        .expect("the queue exists")
        .consumer_count()
}

/// A channel whose close was under way when its connection died is closed, not brought
/// back with the connection: brought back, its consumer would take deliveries (and, on a
/// single-active-consumer queue, the queue itself) for an application that had let go of
/// it (lapin PATCHED.md, the eighth change). The proxy holds back the broker's
/// `close-ok`, so the connection dies between the broker closing the channel and lapin
/// hearing it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_being_closed_when_its_connection_dies_is_closed_not_recovered() {
    use lapin::options::BasicConsumeOptions;
    use lapin::{Connection, ConnectionProperties};

    common::init_tracing();
    let admin = common::broker().await;
    let queue = unique("closing-at-cut");
    admin
        .declare_queue(&QueueSpec::new(queue.as_str()))
        .await
        .unwrap();
    let direct = Connection::connect(common::URL, ConnectionProperties::default())
        .await
        .unwrap();
    let counting = direct.create_channel().await.unwrap();

    let proxy = Proxy::start(UPSTREAM).await;
    let connection = Connection::connect(
        &proxy.url(),
        ConnectionProperties::default().enable_auto_recover(),
    )
    .await
    .unwrap();
    let channel = connection.create_channel().await.unwrap();
    let _consumer = channel
        .basic_consume(
            queue.as_str().into(),
            "closing".into(),
            BasicConsumeOptions::default(),
            Default::default(),
        )
        .await
        .unwrap();
    assert_eq!(consumers_on(&counting, &queue).await, 1);

    proxy.stall_replies();
    let closing = {
        let channel = channel.clone();
        tokio::spawn(async move { channel.close(200, "done".into()).await })
    };
    wait_for("the broker to close the channel", || async {
        consumers_on(&counting, &queue).await == 0
    })
    .await;
    proxy.cut_connections().await;
    proxy.resume();
    // The close asked for is done: the broker closed the channel with the connection.
    let closed = closing.await.unwrap();
    assert!(closed.is_ok(), "{closed:?}");
    wait_until("the channel to leave closing", || {
        !channel.status().closing()
    })
    .await;
    assert!(
        !channel.status().connected(),
        "the channel was brought back with its connection"
    );
    wait_until("the connection to come back", || {
        connection.status().connected()
    })
    .await;
    // A channel opened now is on the recovered connection; the closed one has no consumer.
    connection.create_channel().await.unwrap();
    assert_eq!(consumers_on(&counting, &queue).await, 0);
    cleanup(&admin, &[&queue], &[]).await;
}

/// A replica group's membership comes back with its connection at the first reconnect
/// that is let through, after an outage longer than three heartbeats:
/// - recovery declares the member's queue again by its name (a server-named queue, as it
///   was, is refused, which failed that connection's whole recovery and cost it another;
///   an auto-delete one could be deleted under the recovery when the broker noticed the
///   old connection's consumer gone: NOT_FOUND, and another reconnect);
/// - a heartbeat that cannot be sent meanwhile is skipped (it ended the member's session,
///   which closed its channels while they were reconnecting: lapin restored them all the
///   same, next to the new session's, and the queue had two consumers).
///
/// Leaving deletes the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_group_member_comes_back_with_the_first_reconnect() {
    common::init_tracing();
    let proxy = Proxy::start(UPSTREAM).await;
    let broker = LapinBroker::connect(&proxy.url()).await.unwrap();
    let group = unique("member-recovery");
    let member = conveyor_lapin::ReplicaGroup::new(&group, 4)
        .heartbeat(Duration::from_millis(200))
        .id("only")
        .join(&broker)
        .await
        .unwrap();
    let queue = format!("{group}.replicas.only");
    let direct = lapin::Connection::connect(common::URL, Default::default())
        .await
        .unwrap();
    // A passive declare of a missing queue closes its channel: one channel per look.
    let look = || async {
        let channel = direct.create_channel().await.unwrap();
        let options = lapin::options::QueueDeclareOptions {
            passive: true,
            ..Default::default()
        };
        channel
            .queue_declare(queue.as_str().into(), options, Default::default())
            .await
    };
    let consumers = || async { look().await.map_or(0, |declared| declared.consumer_count()) };
    // The group's heartbeats, as a member of it would hear them.
    let hearing = direct.create_channel().await.unwrap();
    let heard = hearing
        .queue_declare(
            "".into(),
            lapin::options::QueueDeclareOptions {
                exclusive: true,
                ..Default::default()
            },
            Default::default(),
        )
        .await
        .unwrap();
    hearing
        .queue_bind(
            heard.name().clone(),
            format!("{group}.replicas").as_str().into(),
            "".into(),
            Default::default(),
            Default::default(),
        )
        .await
        .unwrap();
    let mut heartbeats = hearing
        .basic_consume(
            heard.name().clone(),
            "heartbeats".into(),
            lapin::options::BasicConsumeOptions {
                no_ack: true,
                ..Default::default()
            },
            Default::default(),
        )
        .await
        .unwrap();
    wait_for("the member's queue and its consumer", || async {
        consumers().await == 1
    })
    .await;
    let accepted = proxy.accepted();

    // Down for longer than three heartbeats, with reconnects refused.
    proxy.refuse_new_connections();
    let cut_at = Instant::now();
    assert_eq!(proxy.cut_connections().await, 2, "consuming and publishing");
    wait_until("reconnects refused for three heartbeats", || {
        proxy.refused() >= 2 && cut_at.elapsed() > Duration::from_millis(3 * 200)
    })
    .await;
    proxy.accept_new_connections();
    wait_until("the broker's connections up", || {
        conveyor::Broker::connections(&broker)
            .iter()
            .all(|c| c.state == ConnectionState::Connected)
    })
    .await;
    wait_for("the member's consumer back", || async {
        consumers().await >= 1
    })
    .await;
    // A heartbeat sent after the reconnect: a second session would have subscribed
    // before its first beat. What was heard before now is passed over.
    while let Some(Some(_)) = heartbeats.next().now_or_never() {}
    tokio::time::timeout(common::DEADLINE, heartbeats.next())
        .await
        .expect("a heartbeat after the reconnect")
        .expect("the heartbeats consumer")
        .unwrap();
    assert_eq!(consumers().await, 1, "the member's one consumer");
    assert_eq!(
        proxy.accepted() - accepted,
        2,
        "one reconnect let through per connection (publishing and consuming)"
    );
    member.leave().await;
    assert!(
        look().await.is_err(),
        "leaving the group deletes the member's queue"
    );
    broker.close().await.unwrap();
}
