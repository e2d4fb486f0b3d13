//! SNS fan-out on the SQS emulator (127.0.0.1:4566): one FIFO topic, two FIFO queues
//! subscribed with raw delivery, one of them filtered on a header. Each queue's mount
//! runs lanes keyed by customer, so each customer's orders come in order on both.
//!
//! Run with `cargo run --example sns_fan_out` (after `scripts/services/sqs.sh`).

use conveyor::{App, Broker, Json, Message, PartitionKey, Publisher, QueueSpec, State};
use conveyor_sqs::TopicSubscription;
use tokio::sync::mpsc;

#[derive(Clone)]
struct Done(mpsc::UnboundedSender<()>);

async fn bill(Json(order): Json<u64>, key: PartitionKey, State(done): State<Done>) {
    println!("billing: {key} order {order}");
    let _ = done.0.send(());
}

async fn ship(Json(order): Json<u64>, key: PartitionKey, State(done): State<Done>) {
    println!("shipping: {key} order {order}");
    let _ = done.0.send(());
}

#[tokio::main]
async fn main() -> Result<(), conveyor::Error> {
    let broker = conveyor_examples::sqs_emulator().await?;
    let sns = broker.sns()?;
    let topic = sns.declare_topic("example-orders.fifo").await?;
    for queue in ["example-billing.fifo", "example-shipping.fifo"] {
        broker.delete_queue(queue).await?;
        broker.declare_queue(&QueueSpec::new(queue)).await?;
    }
    broker
        .subscribe_to_topic(
            &sns,
            &topic,
            "example-billing.fifo",
            TopicSubscription::raw(),
        )
        .await?;
    // Only physical goods are shipped.
    let physical = TopicSubscription::raw().filter("kind", ["physical"]);
    broker
        .subscribe_to_topic(&sns, &topic, "example-shipping.fifo", physical)
        .await?;

    for (order, customer, kind) in [
        (1, "alice", "physical"),
        (2, "bob", "digital"),
        (3, "alice", "physical"),
    ] {
        let message = Message::builder()
            .partition_key(customer)
            .header("kind", kind)
            .json(&order)?;
        sns.publish(&topic, message).await?;
    }

    let (done, mut handled) = mpsc::unbounded_channel();
    let app = App::new("fan-out")
        .with_state(Done(done))
        .mount(broker.queue("example-billing.fifo"), bill, |m| {
            m.workers(2).by_key()
        })
        .mount(broker.queue("example-shipping.fifo"), ship, |m| {
            m.workers(2).by_key()
        })
        .start()
        .await?;
    // Three orders billed, two shipped.
    for _ in 0..5 {
        handled.recv().await;
    }
    app.shutdown().await
}
