//! Memory under a long run: the process's resident set (RSS), sampled as messages are
//! handled, must stay flat once warmed up. In-process: 1,000,000 messages through
//! `workers(4).by_key()` lanes, 64 keys. RabbitMQ (127.0.0.1:5672): 200,000 messages the
//! same way. Publishing keeps at most `BACKLOG` messages waiting, so that what is
//! measured is Conveyor's own memory, not a growing queue.
//!
//! Run: `scripts/services/rabbitmq.sh && cargo bench -p conveyor-benches --bench soak`
//! (`SOAK_MEMORY_MESSAGES`, `SOAK_RABBITMQ_MESSAGES` change the sizes; 0 skips one).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use conveyor::{App, Broker, Json, MemoryBroker, Message, QueueSpec, State};
use conveyor_lapin::LapinBroker;

const URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
/// Messages published ahead of those handled, at most.
const BACKLOG: u64 = 10_000;
const CHUNK: u64 = 1_000;

#[derive(serde::Serialize, serde::Deserialize)]
struct Order {
    id: u64,
    item: String,
    quantity: u32,
}

/// The resident set of this process, in KiB (`VmRSS` in /proc/self/status).
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("VmRSS:"))
                .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

async fn handle(Json(order): Json<Order>, State(handled): State<Arc<AtomicU64>>) {
    std::hint::black_box(order);
    handled.fetch_add(1, Ordering::Relaxed);
}

/// Publishes `n` messages to `queue` on `broker` with a mounted lanes app consuming them,
/// keeping the backlog bounded; samples RSS `samples` times; prints the samples and the
/// spread after the first fifth (the warm-up).
async fn soak<B: Broker>(name: &str, broker: B, queue: &str, n: u64, samples: u64) {
    broker
        .declare_queue(&QueueSpec::new(queue))
        .await
        .expect("declare");
    let handled = Arc::new(AtomicU64::new(0));
    let running = App::new("soak")
        .with_state(handled.clone())
        .mount(broker.queue(queue), handle, |m| m.workers(4).by_key())
        .start()
        .await
        .expect("start");
    let every = (n / samples).max(1);
    let mut next_sample = every;
    let mut rss = Vec::new();
    let mut published = 0;
    while handled.load(Ordering::Relaxed) < n {
        let done = handled.load(Ordering::Relaxed);
        if published < n && published < done + BACKLOG {
            let chunk = (published..(published + CHUNK).min(n))
                .map(|id| {
                    Message::builder()
                        .partition_key(format!("customer-{}", id % 64))
                        .json(&Order {
                            id,
                            item: "tea".into(),
                            quantity: 3,
                        })
                        .expect("json")
                })
                .collect();
            broker.publish_batch(queue, chunk).await.expect("publish");
            published = (published + CHUNK).min(n);
        } else {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        if done >= next_sample {
            rss.push((done, rss_kib()));
            next_sample += every;
        }
    }
    running.shutdown().await.expect("shutdown");
    let _ = broker.delete_queue(queue).await;
    let warm = rss.len() / 5;
    let steady: Vec<u64> = rss[warm..].iter().map(|(_, kib)| *kib).collect();
    let (low, high) = (
        steady.iter().copied().min().unwrap_or(0),
        steady.iter().copied().max().unwrap_or(0),
    );
    let first = steady.first().copied().unwrap_or(0);
    let last = steady.last().copied().unwrap_or(0);
    println!("{name}: {n} messages, RSS samples (handled, KiB):");
    for (done, kib) in &rss {
        println!("  {done:>9} {kib:>8}");
    }
    println!(
        "{name}: after warm-up RSS {low}..{high} KiB (spread {:.1}% of the low), first {first}, last {last} ({:+.1}%)",
        (high - low) as f64 / low.max(1) as f64 * 100.0,
        (last as f64 / first.max(1) as f64 - 1.0) * 100.0
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let memory = conveyor_benches::env_or("SOAK_MEMORY_MESSAGES", 1_000_000);
    let rabbitmq = conveyor_benches::env_or("SOAK_RABBITMQ_MESSAGES", 200_000);
    if memory > 0 {
        soak("in-process", MemoryBroker::new(), "soak", memory, 20).await;
    }
    if rabbitmq > 0 {
        let broker = LapinBroker::connect(URL)
            .await
            .expect("RabbitMQ on 127.0.0.1:5672");
        let queue = format!("conveyor-bench-soak.{}", std::process::id());
        soak("rabbitmq", broker.clone(), &queue, rabbitmq, 20).await;
        let _ = broker.close().await;
    }
}
