//! Spreading partition keys over several queues: one queue (stream) per shard,
//! `<queue>.<i>`, the publisher choosing a key's shard by a stable hash of the key, one
//! subscription per shard.

use conveyor::{Broker, Error, PartitionKey, QueueSpec};

use crate::broker::NatsBroker;
use crate::queue::NatsQueue;

/// `count` queues named `<queue>.0` to `<queue>.<count - 1>`, a partition key always
/// sent to the same one ([`for_key`](Self::for_key)).
///
/// JetStream hands a consumer's messages to every subscription that fetches from it, so
/// a key keeps its order across a service's instances only while each shard has one
/// subscription: give each instance its own shards (instance `i` of `n` mounts the
/// shards `s` with `s % n == i`), and within an instance mount each shard with any
/// dispatch mode (`workers(n).by_key()` keeps each key's order inside it). Changing
/// `count` moves keys between shards: drain the queues first.
///
/// ```no_run
/// use conveyor::{App, Message, Publisher};
/// use conveyor_nats::{NatsBroker, Shards};
///
/// async fn handle(_: conveyor::Bytes, key: conveyor::PartitionKey) {}
///
/// # async fn f() -> Result<(), conveyor::Error> {
/// let broker = NatsBroker::connect("nats://127.0.0.1:4222").await?;
/// let shards = Shards::new("orders", 4);
/// let queues = shards.declare(&broker, |spec| spec).await?;
/// let message = Message::builder().partition_key("alice").payload("x");
/// broker.publish(&shards.for_key(&"alice".into()), message).await?;
/// let mut app = App::new("orders");
/// for queue in queues {
///     app = app.mount(queue, handle, |m| m.workers(2).by_key());
/// }
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Shards {
    queue: String,
    count: u32,
}

impl Shards {
    /// `count` shards of `queue` (at least one).
    pub fn new(queue: impl Into<String>, count: u32) -> Self {
        Shards {
            queue: queue.into(),
            count: count.max(1),
        }
    }

    /// The shards' queue names, in order.
    pub fn names(&self) -> impl Iterator<Item = String> + '_ {
        (0..self.count).map(|shard| format!("{}.{shard}", self.queue))
    }

    /// The queue a message with `key` goes to: the same for a key whatever the process,
    /// platform or Rust version (FNV-1a of its bytes).
    pub fn for_key(&self, key: &PartitionKey) -> String {
        let shard = fnv1a(key.as_str().as_bytes()) % u64::from(self.count);
        format!("{}.{shard}", self.queue)
    }

    /// Declares every shard's queue (each adjusted by `spec`, to add a dead-letter queue
    /// say) and answers them, to mount.
    ///
    /// # Errors
    ///
    /// The first declaration that fails, as [`Broker::declare_queue`].
    pub async fn declare(
        &self,
        broker: &NatsBroker,
        spec: impl Fn(QueueSpec) -> QueueSpec,
    ) -> Result<Vec<NatsQueue>, Error> {
        let mut queues = Vec::new();
        for name in self.names() {
            broker
                .declare_queue(&spec(QueueSpec::new(name.as_str())))
                .await?;
            queues.push(broker.queue(name));
        }
        Ok(queues)
    }
}

/// 64-bit FNV-1a: stable, and spreads short keys well enough for a shard count.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_always_goes_to_the_same_shard_and_keys_spread_over_all() {
        let shards = Shards::new("orders", 4);
        let alice = PartitionKey::new("alice");
        assert_eq!(shards.for_key(&alice), shards.for_key(&alice));
        let used: std::collections::BTreeSet<String> = (0..100)
            .map(|n| shards.for_key(&PartitionKey::new(format!("customer-{n}"))))
            .collect();
        assert_eq!(used, shards.names().collect());
    }

    #[test]
    fn the_hash_is_fnv1a_so_every_process_agrees() {
        // The published FNV-1a 64 test vectors.
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn zero_shards_is_one() {
        assert_eq!(Shards::new("q", 0).names().collect::<Vec<_>>(), ["q.0"]);
    }
}
