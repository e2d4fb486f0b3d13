//! Spreading partition keys over several queues on the server: a consistent-hash
//! exchange hashing the `amqp-partition-key` header, one queue per shard, one
//! subscription per queue.

use conveyor::QueueSpec;

use crate::broker::LapinBroker;
use crate::headers::PARTITION_KEY_HEADER;
use crate::queue::LapinQueue;
use crate::topology::{Binding, ExchangeSpec, ExchangeType};

/// A consistent-hash exchange over `shards` queues named `<exchange>.<i>`, hashed on
/// the [`PARTITION_KEY_HEADER`]. Needs the broker plugin
/// `rabbitmq_consistent_hash_exchange`.
///
/// One key always lands on the same queue, so mounting one subscription per queue keeps
/// each key's order across service instances (while each queue has one consumer; add
/// [`single_active_consumer`](crate::RabbitQueueSpec::single_active_consumer) through
/// [`queue`](Self::queue) to make sure).
///
/// ```no_run
/// use conveyor::{App, Message};
/// use conveyor_lapin::{ConsistentHash, LapinBroker, PublishOptions, RabbitQueueSpec};
///
/// async fn handle(_: conveyor::Bytes, key: conveyor::PartitionKey) {}
///
/// # async fn f() -> Result<(), conveyor::Error> {
/// let broker = LapinBroker::connect("amqp://guest:guest@127.0.0.1:5672").await?;
/// let shards = ConsistentHash::new("orders", 4)
///     .queue(|spec| spec.single_active_consumer())
///     .declare(&broker)
///     .await?;
/// let publisher = broker.publisher().await?;
/// publisher
///     .publish_to("orders", "", Message::builder().partition_key("alice").payload("x"), PublishOptions::default())
///     .await?;
/// let mut app = App::new("orders");
/// for shard in shards {
///     app = app.mount(shard, handle, |m| m.workers(2).by_key());
/// }
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct ConsistentHash {
    exchange: String,
    shards: usize,
    queue: fn(QueueSpec) -> QueueSpec,
}

impl ConsistentHash {
    /// An exchange `exchange` over `shards` queues.
    pub fn new(exchange: impl Into<String>, shards: usize) -> Self {
        ConsistentHash {
            exchange: exchange.into(),
            shards,
            queue: |spec| spec,
        }
    }

    /// Adjusts each shard queue's declaration (a dead-letter queue, quorum, single active
    /// consumer, ...).
    pub fn queue(mut self, configure: fn(QueueSpec) -> QueueSpec) -> Self {
        self.queue = configure;
        self
    }

    /// The shard queues' names, in order.
    pub fn queue_names(&self) -> Vec<String> {
        (0..self.shards)
            .map(|i| format!("{}.{i}", self.exchange))
            .collect()
    }

    /// Declares the exchange, the queues and the bindings (each weight 1), and returns
    /// each queue to mount. A spread over no queue is [`conveyor::Error::Config`].
    ///
    /// # Errors
    ///
    /// [`conveyor::Error::Config`] for no shard, and what declaring the exchange,
    /// a queue or a binding fails with.
    pub async fn declare(self, broker: &LapinBroker) -> Result<Vec<LapinQueue>, conveyor::Error> {
        if self.shards == 0 {
            return Err(conveyor::Error::config(format!(
                "the consistent-hash exchange `{}` needs at least one queue",
                self.exchange
            )));
        }
        broker
            .declare_exchange(
                &ExchangeSpec::new(&self.exchange, ExchangeType::ConsistentHash)
                    .argument("hash-header", PARTITION_KEY_HEADER),
            )
            .await?;
        let mut queues = Vec::with_capacity(self.shards);
        for name in self.queue_names() {
            broker
                .declare_queue(&(self.queue)(QueueSpec::new(name.as_str())))
                .await?;
            broker
                .bind(&Binding::new(name.as_str(), &self.exchange, "1"))
                .await?;
            queues.push(broker.queue(&name));
        }
        Ok(queues)
    }
}
