//! The README's service, on the broker its first argument names: `memory` (the default),
//! `rabbitmq` (127.0.0.1:5672), `sqs` (the emulator on 127.0.0.1:4566), `nats`
//! (JetStream on 127.0.0.1:4222) or `redis` (Redis Streams on 127.0.0.1:6379).
//!
//! Run with `cargo run --example service -- rabbitmq`. `serve` is the same code on every
//! broker; only the line in `main` that makes the broker differs. It declares its queues,
//! publishes three orders, handles them on two lanes keyed by customer (each handler
//! returns a receipt, which the mount publishes before it acks the order), and exits
//! once the three receipts are recorded.

use std::future::Future;

use conveyor::{App, Broker, Json, MemoryBroker, Message, PartitionKey, QueueSpec, State};
use conveyor_lapin::LapinBroker;
use tokio::sync::mpsc;

#[derive(serde::Deserialize, serde::Serialize)]
struct Order {
    id: u64,
    item: String,
}

/// Where receipts are recorded: a channel `main` reads to know when to stop.
#[derive(Clone)]
struct Db(mpsc::UnboundedSender<u64>);

/// Places an order and returns its receipt: the mount publishes it (to `receipts`, on
/// the broker the order came from) before it acks the order, the same way on every
/// broker.
async fn place(Json(order): Json<Order>, key: PartitionKey) -> Result<Message, conveyor::Error> {
    println!("{key}: order {} for {}", order.id, order.item);
    Message::json(&order.id)
}

async fn record(Json(id): Json<u64>, State(db): State<Db>) -> Result<(), std::io::Error> {
    println!("receipt for order {id}");
    db.0.send(id).map_err(std::io::Error::other)
}

/// The service, on any broker: declares its queues, publishes three orders, and serves
/// until `shutdown`.
async fn serve<B: Broker>(
    broker: B,
    db: Db,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), conveyor::Error> {
    broker
        .declare_queue(&QueueSpec::new("orders-dead.fifo"))
        .await?;
    let orders = QueueSpec::new("orders.fifo").dead_letter_queue("orders-dead.fifo", 5);
    broker.declare_queue(&orders).await?;
    broker.declare_queue(&QueueSpec::new("receipts")).await?;
    for (id, customer) in [(1, "alice"), (2, "bob"), (3, "alice")] {
        let order = Order {
            id,
            item: "tea".into(),
        };
        broker
            .publish(
                "orders.fifo",
                Message::builder().partition_key(customer).json(&order)?,
            )
            .await?;
    }
    App::new("orders")
        .broker(broker.clone())
        .with_state(db)
        .mount(broker.queue("orders.fifo"), place, |m| {
            m.workers(2).by_key().publish_to("receipts")
        })
        .mount(broker.queue("receipts"), record, |m| m)
        .run_until(shutdown)
        .await
}

/// Serves until three receipts are recorded, on queues emptied first (by deleting them,
/// so a second run starts afresh). The app closes the broker as it stops.
async fn serve_three<B: Broker>(broker: B) -> Result<(), conveyor::Error> {
    for queue in ["orders.fifo", "orders-dead.fifo", "receipts"] {
        broker.delete_queue(queue).await?;
    }
    let (db, mut placed) = mpsc::unbounded_channel();
    let three_placed = async move {
        for _ in 0..3 {
            placed.recv().await;
        }
    };
    serve(broker, Db(db), three_placed).await
}

#[tokio::main]
async fn main() -> Result<(), conveyor::Error> {
    match std::env::args().nth(1).as_deref().unwrap_or("memory") {
        "memory" => serve_three(MemoryBroker::new()).await,
        "rabbitmq" => {
            serve_three(LapinBroker::connect("amqp://guest:guest@127.0.0.1:5672/%2f").await?).await
        }
        "sqs" => serve_three(conveyor_examples::sqs_emulator().await?).await,
        "nats" => {
            serve_three(conveyor_nats::NatsBroker::connect("nats://127.0.0.1:4222").await?).await
        }
        "redis" => {
            serve_three(conveyor_redis::RedisBroker::connect("redis://127.0.0.1:6379").await?).await
        }
        other => Err(conveyor::Error::config(format!(
            "unknown broker `{other}`: name memory, rabbitmq, sqs, nats or redis"
        ))),
    }
}
