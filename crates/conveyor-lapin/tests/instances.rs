//! Several app instances on one queue, graceful shutdown with work in flight, and
//! draining: the prefetch window goes back to the queue while handlers still run.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use conveyor::{App, Json, Message, Publisher, State};

use common::{
    Instance, Seen, broker, cleanup, ready, record_instance, take_all, unique, wait_for, wait_until,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn competing_instances_handle_every_message_once() {
    let broker = broker().await;
    let queue = unique("compete");
    let seen = Seen::<(&'static str, u32)>::default();
    let start = |name: &'static str| {
        App::new(name)
            .with_state(seen.clone())
            .with_state(Instance(name))
            .mount(broker.queue(queue.as_str()), record_instance, |m| {
                m.workers(4).by_key()
            })
            .start()
    };
    let a = start("a").await.unwrap();
    let b = start("b").await.unwrap();
    let publisher = broker.publisher().await.unwrap();
    let messages = (0..1000u32)
        .map(|i| {
            Message::builder()
                .partition_key(format!("k{}", i % 10))
                .json(&i)
                .unwrap()
        })
        .collect();
    publisher.publish_batch(&queue, messages).await.unwrap();

    wait_until("every message to be handled", || seen.len() >= 1000).await;
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();

    let mut times: HashMap<u32, usize> = HashMap::new();
    for (_, id) in seen.all() {
        *times.entry(id).or_default() += 1;
    }
    assert_eq!(times.len(), 1000);
    assert!(
        times.values().all(|&n| n == 1),
        "a message was handled twice"
    );
    for who in ["a", "b"] {
        assert!(
            seen.all().iter().any(|(w, _)| *w == who),
            "instance {who} got nothing"
        );
    }
    cleanup(&broker, &[&queue], &[]).await;
}

#[derive(Clone, Default)]
struct Started(Arc<AtomicUsize>);

async fn slow(Json(id): Json<u32>, State(started): State<Started>, State(seen): State<Seen<u32>>) {
    started.0.fetch_add(1, Ordering::SeqCst);
    // Simulated work: long enough that shutdown finds handlers in flight.
    tokio::time::sleep(Duration::from_millis(100)).await;
    seen.push(id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_with_work_in_flight_loses_nothing() {
    let broker = broker().await;
    let queue = unique("shutdown");
    broker.declare_queue(&queue.as_str().into()).await.unwrap();
    let publisher = broker.publisher().await.unwrap();
    let messages = (0..200u32).map(|i| Message::json(&i).unwrap()).collect();
    publisher.publish_batch(&queue, messages).await.unwrap();

    let seen = Seen::<u32>::default();
    let started = Started::default();
    let app = |started: &Started| {
        App::new("shutdown")
            .with_state(seen.clone())
            .with_state(started.clone())
            .mount(broker.queue(queue.as_str()), slow, |m| m.workers(4))
    };
    let first = app(&started).start().await.unwrap();
    wait_until("handlers in flight", || {
        started.0.load(Ordering::SeqCst) >= 8
    })
    .await;
    first.shutdown().await.unwrap();
    let handled_by_first = seen.len();
    assert_eq!(
        handled_by_first,
        started.0.load(Ordering::SeqCst),
        "every handler that started finished before shutdown returned"
    );
    assert_eq!(
        ready(&broker, &queue).await as usize,
        200 - handled_by_first,
        "everything not handled went back to the queue"
    );

    let second = app(&Started::default()).start().await.unwrap();
    wait_until("the rest to be handled", || seen.len() >= 200).await;
    second.shutdown().await.unwrap();
    let mut ids = seen.all();
    ids.sort_unstable();
    assert_eq!(ids, (0..200).collect::<Vec<_>>());
    cleanup(&broker, &[&queue], &[]).await;
}

async fn never_finish(_: Json<u32>, State(started): State<Started>) {
    started.0.fetch_add(1, Ordering::SeqCst);
    std::future::pending::<()>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_app_returns_every_message_to_the_queue() {
    let broker = broker().await;
    let queue = unique("dropped");
    broker.declare_queue(&queue.as_str().into()).await.unwrap();
    let publisher = broker.publisher().await.unwrap();
    let messages = (0..50u32).map(|i| Message::json(&i).unwrap()).collect();
    publisher.publish_batch(&queue, messages).await.unwrap();

    let started = Started::default();
    let running = App::new("dropped")
        .with_state(started.clone())
        .mount(broker.queue(queue.as_str()), never_finish, |m| m.workers(4))
        .start()
        .await
        .unwrap();
    wait_until("handlers in flight", || {
        started.0.load(Ordering::SeqCst) == 4
    })
    .await;
    drop(running);
    common::wait_for("every message back in the queue", || async {
        ready(&broker, &queue).await == 50
    })
    .await;
    cleanup(&broker, &[&queue], &[]).await;
}

/// Holds every handler until the test opens it.
#[derive(Clone, Default)]
struct Gate(Arc<tokio::sync::Notify>);

async fn gated(
    Json(id): Json<u32>,
    State(started): State<Started>,
    State(gate): State<Gate>,
    State(seen): State<Seen<u32>>,
) {
    started.0.fetch_add(1, Ordering::SeqCst);
    gate.0.notified().await;
    seen.push(id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn draining_hands_the_prefetch_window_back_while_a_handler_runs() {
    let broker = broker().await;
    let queue = unique("drain");
    broker.declare_queue(&queue.as_str().into()).await.unwrap();
    let publisher = broker.publisher().await.unwrap();
    let messages = (0..20u32).map(|i| Message::json(&i).unwrap()).collect();
    publisher.publish_batch(&queue, messages).await.unwrap();

    let (started, gate, seen) = (Started::default(), Gate::default(), Seen::<u32>::default());
    let running = App::new("drain")
        .with_state(started.clone())
        .with_state(gate.clone())
        .with_state(seen.clone())
        .mount(broker.queue(queue.as_str()).prefetch(16), gated, |m| {
            m.workers(1)
        })
        .start()
        .await
        .unwrap();
    wait_until("a handler in flight", || {
        started.0.load(Ordering::SeqCst) == 1
    })
    .await;
    wait_for("the prefetch window to fill", || async {
        ready(&broker, &queue).await == 4
    })
    .await;

    running.stop_receiving();
    wait_for(
        "the 15 buffered deliveries back in the queue, beside the 4 never sent",
        || async { ready(&broker, &queue).await == 19 },
    )
    .await;
    assert_eq!(seen.len(), 0, "the handler is still running");
    assert_eq!(started.0.load(Ordering::SeqCst), 1, "nothing else started");

    gate.0.notify_one();
    running.shutdown().await.unwrap();
    assert_eq!(seen.all(), vec![0], "the handler in flight finished");
    let mut left: Vec<u32> = take_all(&queue).await.iter().map(|m| m.number()).collect();
    left.sort_unstable();
    assert_eq!(
        left,
        (1..20).collect::<Vec<_>>(),
        "the one handled was acked, the rest are back"
    );
    cleanup(&broker, &[&queue], &[]).await;
}
