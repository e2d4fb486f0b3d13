//! Topology on RabbitMQ: single active consumer (asked for, or by a `.fifo` name), and the
//! consistent-hash helper.

mod common;

use std::collections::{HashMap, HashSet};

use conveyor::{App, DeliveryInfo, Json, Message, PartitionKey, Publisher, QueueSpec, State};
use conveyor_lapin::{ConsistentHash, PublishOptions, RabbitQueueSpec};

use common::{Instance, Seen, broker, cleanup, record_instance, unique, wait_until};

/// Declares `spec`, mounts two apps on its queue (by name), and checks that the first
/// gets every message until it stops, then the second.
async fn one_subscription_at_a_time(spec: QueueSpec) {
    let broker = broker().await;
    let queue = spec.name().to_string();
    broker.declare_queue(&spec).await.unwrap();
    let seen = Seen::<(&'static str, u32)>::default();
    let start = |name: &'static str| {
        App::new(name)
            .with_state(seen.clone())
            .with_state(Instance(name))
            .mount(broker.queue(&queue), record_instance, |m| m.workers(2))
            .start()
    };
    let first = start("first").await.unwrap();
    let second = start("second").await.unwrap();
    let messages = (0..20u32).map(|i| Message::json(&i).unwrap()).collect();
    broker.publish_batch(&queue, messages).await.unwrap();
    wait_until("the first batch", || seen.len() == 20).await;
    assert!(
        seen.all().iter().all(|(who, _)| *who == "first"),
        "{:?}",
        seen.all()
    );

    first.shutdown().await.unwrap();
    let messages = (20..40u32).map(|i| Message::json(&i).unwrap()).collect();
    broker.publish_batch(&queue, messages).await.unwrap();
    wait_until("the second batch", || seen.len() == 40).await;
    assert!(
        seen.all()[20..].iter().all(|(who, _)| *who == "second"),
        "{:?}",
        seen.all()
    );

    second.shutdown().await.unwrap();
    cleanup(&broker, &[&queue], &[]).await;
}

#[tokio::test]
async fn a_single_active_consumer_queue_feeds_one_subscription_until_it_stops() {
    one_subscription_at_a_time(QueueSpec::new(unique("sac")).single_active_consumer()).await;
}

/// RabbitMQ keeps a queue's order across competing consumers only by letting one of them
/// read it at a time: a `.fifo` name asks for that.
#[tokio::test]
async fn a_fifo_queue_feeds_one_subscription_until_it_stops() {
    one_subscription_at_a_time(QueueSpec::new(format!("{}.fifo", unique("fifo")))).await;
}

async fn record_shard(
    _: Json<u32>,
    key: PartitionKey,
    info: DeliveryInfo,
    State(seen): State<Seen<(String, PartitionKey)>>,
) {
    seen.push((info.queue.to_string(), key));
}

#[tokio::test]
async fn consistent_hash_puts_each_key_on_exactly_one_queue() {
    const SHARDS: usize = 4;
    let broker = broker().await;
    let exchange = unique("hash");
    let hash = ConsistentHash::new(exchange.as_str(), SHARDS);
    let queues = hash.queue_names();
    let shards = hash.declare(&broker).await.unwrap();
    assert_eq!(shards.len(), SHARDS);

    let seen = Seen::<(String, PartitionKey)>::default();
    let mut app = App::new("hash").with_state(seen.clone());
    for shard in shards {
        app = app.mount(shard, record_shard, |m| m.workers(2).by_key());
    }
    let running = app.start().await.unwrap();

    let publisher = broker.publisher().await.unwrap();
    let messages: Vec<Message> = (0..3u32)
        .flat_map(|round| {
            (0..100).map(move |k| {
                Message::builder()
                    .partition_key(format!("user-{k}"))
                    .json(&round)
                    .unwrap()
            })
        })
        .collect();
    publisher
        .publish_all_to(&exchange, "", messages, PublishOptions::default())
        .await
        .unwrap();
    wait_until("every message to be handled", || seen.len() == 300).await;

    let mut queues_of: HashMap<PartitionKey, HashSet<String>> = HashMap::new();
    for (queue, key) in seen.all() {
        queues_of.entry(key).or_default().insert(queue);
    }
    assert_eq!(queues_of.len(), 100);
    assert!(
        queues_of.values().all(|q| q.len() == 1),
        "a key went to two queues"
    );
    let used: HashSet<String> = queues_of.into_values().flatten().collect();
    assert_eq!(
        used,
        queues.iter().cloned().collect(),
        "keys must spread over every queue"
    );

    running.shutdown().await.unwrap();
    let queue_refs: Vec<&str> = queues.iter().map(String::as_str).collect();
    cleanup(&broker, &queue_refs, &[&exchange]).await;
}

#[tokio::test]
async fn a_consistent_hash_over_no_queue_is_a_configuration_error() {
    let broker = broker().await;
    let error = ConsistentHash::new(unique("no-shards"), 0)
        .declare(&broker)
        .await
        .unwrap_err();
    assert!(matches!(error, conveyor::Error::Config(_)), "{error}");
}
