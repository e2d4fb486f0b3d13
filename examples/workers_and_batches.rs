//! `workers(n)` and a batch handler, side by side in one app.
//!
//! Run with `cargo run --example workers_and_batches`. Thumbnails are rendered by four
//! workers at once, in no particular order; metrics are summed in batches of up to ten.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use conveyor::{App, Batch, Json, MemoryBroker, Publisher, State};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Thumbnail {
    image: u32,
}

#[derive(Serialize, Deserialize)]
struct Metric {
    value: u64,
}

/// How many thumbnails are rendering right now, and the most at once.
#[derive(Clone, Default)]
struct Concurrency {
    now: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
}

async fn render(Json(thumbnail): Json<Thumbnail>, State(load): State<Concurrency>) {
    let running = load.now.fetch_add(1, Ordering::SeqCst) + 1;
    load.peak.fetch_max(running, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(10)).await;
    println!("rendered image {}", thumbnail.image);
    load.now.fetch_sub(1, Ordering::SeqCst);
}

async fn sum(metrics: Batch<Json<Metric>>) {
    let total: u64 = metrics.iter().map(|Json(m)| m.value).sum();
    println!("batch of {} metrics, total {total}", metrics.len());
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let broker = MemoryBroker::new();
    for image in 0..12 {
        broker
            .publish_json("thumbnails", &Thumbnail { image })
            .await?;
    }
    for value in 1..=25 {
        broker.publish_json("metrics", &Metric { value }).await?;
    }

    let load = Concurrency::default();
    let idle = broker.clone();
    App::new("workers-and-batches")
        .with_state(load.clone())
        .mount(broker.queue("thumbnails"), render, |m| m.workers(4))
        .mount(broker.queue("metrics"), sum, |m| m.batch(10))
        .run_until(async move { idle.wait_idle().await })
        .await?;

    println!(
        "at most {} thumbnails rendered at once",
        load.peak.load(Ordering::SeqCst)
    );
    Ok(())
}
