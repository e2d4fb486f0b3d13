//! Request/reply, on the broker its first argument names: `memory` (the default),
//! `rabbitmq` (127.0.0.1:5672), `sqs` (the emulator on 127.0.0.1:4566), `nats`
//! (JetStream on 127.0.0.1:4222) or `redis` (Redis Streams on 127.0.0.1:6379).
//!
//! Run with `cargo run --example request_reply -- rabbitmq`. A pricing service answers
//! by returning a message; a client asks it for three prices at once with
//! `Broker::request` and prints each answer. On RabbitMQ the replies come back through
//! direct reply-to, on SQS through a reply queue the broker makes and deletes, in process
//! straight to the request.

use std::time::Duration;

use conveyor::{App, Broker, Json, MemoryBroker, Message, QueueSpec};
use conveyor_lapin::LapinBroker;

/// The pricing service: its reply is the message it returns.
async fn price(Json(item): Json<String>) -> Result<Message, conveyor::Error> {
    let cents: u64 = item.bytes().map(u64::from).sum();
    Message::json(&cents)
}

/// Serves prices, asks for three at once, prints the answers, and stops.
async fn ask<B: Broker>(broker: B) -> Result<(), conveyor::Error> {
    broker.declare_queue(&QueueSpec::new("prices")).await?;
    let app = App::new("pricing")
        .broker(broker.clone())
        .mount(broker.queue("prices"), price, |m| m.workers(4))
        .start()
        .await?;
    let ask_for = |item: &'static str| {
        let broker = broker.clone();
        async move {
            let reply = broker
                .request("prices", Message::json(&item)?, Duration::from_secs(10))
                .await?;
            let cents: u64 = serde_json::from_slice(reply.payload())
                .map_err(|e| conveyor::Error::config(format!("a reply that is no price: {e}")))?;
            println!("{item} costs {cents}");
            Ok::<(), conveyor::Error>(())
        }
    };
    // Three requests wait at once, each for its own reply.
    let (tea, coffee, cake) = tokio::join!(ask_for("tea"), ask_for("coffee"), ask_for("cake"));
    // Closes the broker too (and deletes its reply queue, on SQS).
    app.shutdown().await?;
    tea.and(coffee).and(cake)
}

#[tokio::main]
async fn main() -> Result<(), conveyor::Error> {
    match std::env::args().nth(1).as_deref().unwrap_or("memory") {
        "memory" => ask(MemoryBroker::new()).await,
        "rabbitmq" => {
            ask(LapinBroker::connect("amqp://guest:guest@127.0.0.1:5672/%2f").await?).await
        }
        "sqs" => ask(conveyor_examples::sqs_emulator().await?).await,
        "nats" => ask(conveyor_nats::NatsBroker::connect("nats://127.0.0.1:4222").await?).await,
        "redis" => ask(conveyor_redis::RedisBroker::connect("redis://127.0.0.1:6379").await?).await,
        other => Err(conveyor::Error::config(format!(
            "unknown broker `{other}`: name memory, rabbitmq, sqs, nats or redis"
        ))),
    }
}
