//! An idempotency layer: a message whose id was handled before is acked without running
//! the handler again.
//!
//! Run with `cargo run --example idempotency`. It publishes five payments, two of them
//! twice under the same message id (as a publisher that retried after a lost confirm
//! would), handles them on four workers and prints what was charged. It exits non-zero
//! if a payment was charged twice or not at all.
//!
//! The store here is in memory, so it forgets at restart and is not shared between
//! instances; a service would keep the ids in its database, ideally in the same
//! transaction as the handler's own writes.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use conveyor::{
    App, BoxError, Delivery, Json, Layer, MemoryBroker, Message, Outcome, Publisher, State,
};
use serde::{Deserialize, Serialize};

/// Where a message id stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Seen {
    /// A delivery of it is running now.
    Running,
    /// It was handled and acked.
    Done,
}

/// Message ids and where they stand, in memory.
#[derive(Clone, Default)]
struct MemoryStore(Arc<Mutex<HashMap<String, Seen>>>);

impl MemoryStore {
    /// Claims `id` for a run, unless it is running or done: then says which.
    fn claim(&self, id: &str) -> Option<Seen> {
        let mut ids = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        match ids.get(id) {
            Some(seen) => Some(*seen),
            None => {
                ids.insert(id.to_string(), Seen::Running);
                None
            }
        }
    }

    /// Records how the claimed run of `id` ended: done if acked, free again otherwise.
    fn finish(&self, id: &str, acked: bool) {
        let mut ids = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if acked {
            ids.insert(id.to_string(), Seen::Done);
        } else {
            ids.remove(id);
        }
    }
}

/// A claimed id, recorded as done or freed when the run ends, however it ends.
struct Claim<'a> {
    store: &'a MemoryStore,
    id: &'a str,
    acked: bool,
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        self.store.finish(self.id, self.acked);
    }
}

/// Runs the handler once per message id: a repeat of a handled id is acked at once; one
/// that arrives while the same id runs is retried a little later, when the first has
/// finished one way or the other. A message without an id always runs.
#[derive(Clone, Default)]
struct Idempotent(MemoryStore);

impl Layer for Idempotent {
    async fn call<'a, N>(&'a self, delivery: &'a Delivery, next: N) -> Result<Outcome, BoxError>
    where
        N: Future<Output = Result<Outcome, BoxError>> + Send + 'a,
    {
        let Some(id) = delivery.message_id() else {
            return next.await;
        };
        match self.0.claim(id) {
            Some(Seen::Done) => return Ok(Outcome::Ack),
            // A copy of it runs now: look again once that one is likely done. (This
            // retry counts as an attempt, like any other.)
            Some(Seen::Running) => return Ok(Outcome::RetryAfter(Duration::from_secs(1))),
            None => {}
        }
        // Frees the claim unless the run ends in an ack: also when the run is dropped
        // (a timeout, a cancel at shutdown) or panics, so a redelivery can run.
        let mut claim = Claim {
            store: &self.0,
            id,
            acked: false,
        };
        let outcome = next.await;
        claim.acked = matches!(outcome, Ok(Outcome::Ack));
        outcome
    }
}

#[derive(Serialize, Deserialize)]
struct Payment {
    id: String,
    cents: u64,
}

/// The charges made, by payment id.
#[derive(Clone, Default)]
struct Ledger(Arc<Mutex<HashMap<String, u32>>>);

async fn charge(Json(payment): Json<Payment>, State(ledger): State<Ledger>) {
    // Stand-in for the call to the payment provider.
    tokio::time::sleep(Duration::from_millis(20)).await;
    *ledger
        .0
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .entry(payment.id)
        .or_default() += 1;
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let broker = MemoryBroker::new();
    let ledger = Ledger::default();
    let payments = ["p-1", "p-2", "p-1", "p-3", "p-4", "p-2", "p-5"];
    for id in payments {
        let payment = Payment {
            id: id.to_string(),
            cents: 1_000,
        };
        // The payment's id is the message id: a publisher's retry sends the same one.
        let message = Message::builder().message_id(id).json(&payment)?;
        broker.publish("payments", message).await?;
    }
    let idle = broker.clone();
    App::new("payments")
        .with_state(ledger.clone())
        .layer(Idempotent::default())
        .mount(broker.queue("payments"), charge, |m| m.workers(4))
        .run_until(async move { idle.wait_idle().await })
        .await?;

    let charges = ledger
        .0
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let mut ids: Vec<_> = charges.iter().collect();
    ids.sort();
    for (id, times) in &ids {
        println!("{id}: charged {times} time(s)");
    }
    let once = ids.len() == 5 && ids.iter().all(|(_, times)| **times == 1);
    if !once {
        return Err("a payment was charged twice, or not at all".into());
    }
    println!(
        "{} messages, {} payments, each charged once",
        payments.len(),
        ids.len()
    );
    Ok(())
}
