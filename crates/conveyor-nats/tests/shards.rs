//! Shards of a queue: each key lands in one shard's queue, in the order it was sent.

mod common;

use conveyor::{Broker, Message, Publisher};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_keys_each_land_in_one_shard_queue_in_order() {
    let broker = common::broker().await;
    let shards = conveyor_nats::Shards::new(common::unique("shards"), 3);
    let queues = shards
        .declare(&broker, |spec| spec)
        .await
        .expect("declared");
    assert_eq!(queues.len(), 3);
    for n in 0..30u64 {
        let key = conveyor::PartitionKey::new(format!("k{}", n % 5));
        let message = Message::builder()
            .partition_key(key.clone())
            .json(&n)
            .expect("json");
        broker
            .publish(&shards.for_key(&key), message)
            .await
            .expect("published");
    }
    let mut total = 0;
    for name in shards.names() {
        let letters = broker
            .take_dead_letters(&name, usize::MAX)
            .await
            .expect("read");
        total += letters.len();
        let mut last: std::collections::HashMap<String, u64> = Default::default();
        for letter in letters {
            let key = letter.partition_key.expect("a key").as_str().to_string();
            assert_eq!(
                shards.for_key(&conveyor::PartitionKey::new(key.clone())),
                name
            );
            let n: u64 = serde_json::from_slice(&letter.payload).expect("a number");
            assert!(
                last.insert(key, n).is_none_or(|before| before < n),
                "in order"
            );
        }
        broker.delete_queue(&name).await.expect("deleted");
    }
    assert_eq!(total, 30);
}
