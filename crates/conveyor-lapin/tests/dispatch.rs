//! Dispatch over a RabbitMQ subscription: lanes keep each key's order, keyless messages
//! rotate, the prefetch window bounds concurrency, batches take what has arrived.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use conveyor::{App, Batch, DeliveryInfo, Json, Message, PartitionKey, Publisher, State};

use common::{Seen, broker, cleanup, unique, wait_until};

async fn record_keyed(
    Json(seq): Json<u32>,
    key: PartitionKey,
    State(seen): State<Seen<(PartitionKey, u32)>>,
) {
    seen.push((key, seq));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lanes_keep_each_key_in_order() {
    const KEYS: u32 = 50;
    const PER_KEY: u32 = 200;
    let broker = broker().await;
    let queue = unique("lanes");
    let seen = Seen::default();
    let running = App::new("lanes")
        .with_state(seen.clone())
        .mount(broker.queue(queue.as_str()), record_keyed, |m| {
            m.workers(4).by_key()
        })
        .start()
        .await
        .unwrap();

    let publisher = broker.publisher().await.unwrap();
    for seq in 0..PER_KEY {
        let messages = (0..KEYS)
            .map(|k| {
                Message::builder()
                    .partition_key(format!("key-{k}"))
                    .json(&seq)
                    .unwrap()
            })
            .collect();
        publisher.publish_batch(&queue, messages).await.unwrap();
    }

    let total = (KEYS * PER_KEY) as usize;
    wait_until("every message to be handled", || seen.len() >= total).await;
    let mut per_key: BTreeMap<PartitionKey, Vec<u32>> = BTreeMap::new();
    for (key, seq) in seen.all() {
        per_key.entry(key).or_default().push(seq);
    }
    assert_eq!(per_key.len(), KEYS as usize);
    for (key, seqs) in per_key {
        assert_eq!(
            seqs,
            (0..PER_KEY).collect::<Vec<_>>(),
            "key {key} out of order"
        );
    }

    running.shutdown().await.unwrap();
    cleanup(&broker, &[&queue], &[]).await;
}

async fn record_lane(
    _: Json<u32>,
    key: Option<PartitionKey>,
    info: DeliveryInfo,
    State(seen): State<Seen<Option<usize>>>,
) {
    assert!(key.is_none());
    seen.push(info.lane);
}

#[tokio::test]
async fn keyless_messages_rotate_over_the_lanes() {
    let broker = broker().await;
    let queue = unique("keyless");
    let seen = Seen::default();
    let running = App::new("keyless")
        .with_state(seen.clone())
        .mount(broker.queue(queue.as_str()), record_lane, |m| {
            m.workers(4).by_key()
        })
        .start()
        .await
        .unwrap();
    let publisher = broker.publisher().await.unwrap();
    let messages = (0..40u32).map(|i| Message::json(&i).unwrap()).collect();
    publisher.publish_batch(&queue, messages).await.unwrap();

    wait_until("every message to be handled", || seen.len() == 40).await;
    let lanes: HashSet<Option<usize>> = seen.all().into_iter().collect();
    assert_eq!(lanes, (0..4).map(Some).collect());

    running.shutdown().await.unwrap();
    cleanup(&broker, &[&queue], &[]).await;
}

/// How many handlers run at once, at most.
#[derive(Clone, Default)]
struct Concurrency {
    now: Arc<AtomicUsize>,
    max: Arc<AtomicUsize>,
    done: Arc<AtomicUsize>,
}

async fn slow(_: Json<u32>, State(c): State<Concurrency>) {
    let now = c.now.fetch_add(1, Ordering::SeqCst) + 1;
    c.max.fetch_max(now, Ordering::SeqCst);
    // Simulated work, so that handlers have a chance to overlap.
    tokio::time::sleep(Duration::from_millis(20)).await;
    c.now.fetch_sub(1, Ordering::SeqCst);
    c.done.fetch_add(1, Ordering::SeqCst);
}

async fn max_concurrency(prefetch: u16) -> usize {
    let broker = broker().await;
    let queue = unique("prefetch");
    let c = Concurrency::default();
    let publisher = broker.publisher().await.unwrap();
    broker.declare_queue(&queue.as_str().into()).await.unwrap();
    let messages = (0..24u32)
        .map(|i| {
            Message::builder()
                .partition_key(format!("k{i}"))
                .json(&i)
                .unwrap()
        })
        .collect();
    publisher.publish_batch(&queue, messages).await.unwrap();
    let running = App::new("prefetch")
        .with_state(c.clone())
        .mount(
            broker.queue(queue.as_str()).prefetch(prefetch),
            slow,
            move |m| m.workers(4).by_key(),
        )
        .start()
        .await
        .unwrap();
    wait_until("every message to be handled", || {
        c.done.load(Ordering::SeqCst) == 24
    })
    .await;
    running.shutdown().await.unwrap();
    cleanup(&broker, &[&queue], &[]).await;
    c.max.load(Ordering::SeqCst)
}

#[tokio::test]
async fn prefetch_one_makes_lanes_take_turns_and_a_wider_window_runs_them_together() {
    assert_eq!(max_concurrency(1).await, 1);
    assert!(max_concurrency(16).await > 1);
}

async fn record_batch(batch: Batch<Json<u32>>, State(seen): State<Seen<usize>>) {
    seen.push(batch.into_vec().len());
}

#[tokio::test]
async fn a_batch_takes_what_has_arrived_up_to_its_size() {
    let broker = broker().await;
    let queue = unique("batch");
    let seen = Seen::default();
    let publisher = broker.publisher().await.unwrap();
    broker.declare_queue(&queue.as_str().into()).await.unwrap();
    let messages = (0..25u32).map(|i| Message::json(&i).unwrap()).collect();
    publisher.publish_batch(&queue, messages).await.unwrap();

    let running = App::new("batch")
        .with_state(seen.clone())
        .mount(
            broker.queue(queue.as_str()).prefetch(50),
            record_batch,
            |m| m.batch(10),
        )
        .start()
        .await
        .unwrap();
    wait_until("every message to be handled", || {
        seen.all().iter().sum::<usize>() == 25
    })
    .await;
    let sizes = seen.all();
    assert!(sizes.iter().all(|&n| (1..=10).contains(&n)), "{sizes:?}");
    assert!(sizes.iter().any(|&n| n > 1), "{sizes:?}");

    // One message alone makes a batch of one: nothing waits for more.
    publisher.publish_json(&queue, &99u32).await.unwrap();
    wait_until("the lone message", || {
        seen.all().iter().sum::<usize>() == 26
    })
    .await;
    assert_eq!(seen.all().last(), Some(&1));

    running.shutdown().await.unwrap();
    cleanup(&broker, &[&queue], &[]).await;
}
