//! Ordered lanes on a FIFO queue: `workers(2).by_key()` over the groups alice, bob, carol.
//!
//! Run with `cargo run --example lanes`. It publishes five orders per group, handles them
//! on two lanes keyed by the message group, prints which lane served which groups, and
//! exits non-zero if any group's orders were handled out of order.
//!
//! `cargo run --example lanes -- --asyncapi lanes.json` writes the service's AsyncAPI 3.0
//! document to `lanes.json` instead, and exits.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use conveyor::{App, DeliveryInfo, Json, MemoryBroker, Message, PartitionKey, Publisher, State};
use serde::{Deserialize, Serialize};

const GROUPS: [&str; 3] = ["alice", "bob", "carol"];
const ORDERS_PER_GROUP: u32 = 5;

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct Order {
    /// The order's place among its group's orders, from 1.
    number: u32,
}

/// What each lane handled, in the order it handled it.
#[derive(Clone, Default)]
struct Ledger(Arc<Mutex<Vec<(usize, PartitionKey, u32)>>>);

async fn place(
    Json(order): Json<Order>,
    group: PartitionKey,
    info: DeliveryInfo,
    State(ledger): State<Ledger>,
) -> Result<(), String> {
    // Stand-in for real work, long enough for the lanes to overlap.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let lane = info
        .lane
        .ok_or("lanes always say which lane runs a delivery")?;
    ledger
        .0
        .lock()
        .map_err(|_| "ledger poisoned")?
        .push((lane, group, order.number));
    Ok(())
}

/// The service: orders handled on two lanes keyed by their group.
fn app(broker: &MemoryBroker, ledger: &Ledger) -> App {
    App::new("lanes")
        .version(env!("CARGO_PKG_VERSION"))
        .with_state(ledger.clone())
        .mount(broker.queue("orders.fifo"), place, |m| {
            m.workers(2).by_key().payload_schema::<Order>()
        })
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let broker = MemoryBroker::new();
    let ledger = Ledger::default();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [flag, path] = args.as_slice()
        && flag == "--asyncapi"
    {
        let document = app(&broker, &ledger).asyncapi();
        std::fs::write(path, document.to_pretty_string())?;
        println!("wrote the AsyncAPI document to {path}");
        return Ok(());
    }

    for number in 1..=ORDERS_PER_GROUP {
        for group in GROUPS {
            let order = Message::builder()
                .partition_key(group)
                .json(&Order { number })?;
            broker.publish("orders.fifo", order).await?;
        }
    }

    let idle = broker.clone();
    app(&broker, &ledger)
        .run_until(async move { idle.wait_idle().await })
        .await?;

    let handled = ledger.0.lock().map_err(|_| "ledger poisoned")?.clone();
    let mut lanes: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    let mut per_group: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for (lane, group, number) in &handled {
        let groups = lanes.entry(*lane).or_default();
        if !groups.contains(&group.to_string()) {
            groups.push(group.to_string());
        }
        per_group
            .entry(group.to_string())
            .or_default()
            .push(*number);
    }
    for (lane, groups) in &lanes {
        println!("lane {lane} served {}", groups.join(", "));
    }
    let expected: Vec<u32> = (1..=ORDERS_PER_GROUP).collect();
    let mut in_order = true;
    for (group, numbers) in &per_group {
        let held = *numbers == expected;
        in_order &= held;
        println!(
            "{group}: orders {numbers:?} {}",
            if held { "in order" } else { "OUT OF ORDER" }
        );
    }
    if !in_order || handled.len() != GROUPS.len() * ORDERS_PER_GROUP as usize {
        return Err("a group's order did not hold".into());
    }
    println!("each group's order held");
    Ok(())
}
