//! API requests per consumed message, and messages per second, on the SQS emulator:
//! Conveyor's SQS transport next to a raw aws-sdk-sqs loop (receive ten, decode, delete
//! one by one), in the same run against the same emulator.
//!
//! ```text
//! cargo bench -p conveyor-benches --bench sqs                  # 300 messages per run
//! cargo bench -p conveyor-benches --bench sqs -- --messages 500
//! ```
//!
//! It starts its own moto server (`python3 -m moto.server`; `scripts/services/sqs.sh`
//! installs moto) and counts requests from its log, one line per
//! request. Publishing happens before each run and is not counted. moto scans the whole
//! queue on every call, so msg/s says little about SQS itself: compare requests/message.
//! Without `--bench` (as `cargo test --all-targets` runs it) it makes a quick 30-message
//! smoke run.

use std::error::Error;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use conveyor::{
    App, Batch, Broker, Identity, Json, Message, MountOptions, Publisher, QueueSpec, State,
};
use conveyor_sqs::SqsBroker;
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

#[derive(Serialize, Deserialize)]
struct Order {
    id: u64,
    qty: u32,
}

/// A moto server of the bench's own, its log in a file; killed when dropped.
struct Emulator {
    child: Child,
    endpoint: String,
    log: PathBuf,
}

impl Emulator {
    fn start() -> Result<Emulator, Box<dyn Error>> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let log = std::env::temp_dir().join(format!("conveyor-bench-moto-{port}.log"));
        let file = std::fs::File::create(&log)?;
        let child = Command::new("python3")
            .args([
                "-m",
                "moto.server",
                "-H",
                "127.0.0.1",
                "-p",
                &port.to_string(),
            ])
            .stdout(Stdio::from(file.try_clone()?))
            .stderr(Stdio::from(file))
            .spawn()
            .map_err(|e| format!("python3 with moto (scripts/services/sqs.sh): {e}"))?;
        Ok(Emulator {
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
            log,
        })
    }

    /// Requests served so far: moto logs one line per request.
    fn requests(&self) -> usize {
        std::fs::read_to_string(&self.log)
            .map(|log| log.lines().filter(|line| line.contains("\"POST ")).count())
            .unwrap_or(0)
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// Counts handled messages and wakes the bench when all are in.
#[derive(Clone)]
struct Progress {
    handled: Arc<AtomicUsize>,
    target: usize,
    done: Arc<Notify>,
}

impl Progress {
    fn add(&self, n: usize) {
        if self.handled.fetch_add(n, Ordering::SeqCst) + n >= self.target {
            self.done.notify_one();
        }
    }
}

async fn one(Json(order): Json<Order>, State(progress): State<Progress>) {
    std::hint::black_box(order.id + u64::from(order.qty));
    progress.add(1);
}

async fn many(orders: Batch<Json<Order>>, State(progress): State<Progress>) {
    std::hint::black_box(orders.iter().map(|Json(o)| o.id).sum::<u64>());
    progress.add(orders.len());
}

/// One measured run: what it cost and how fast it went.
struct Figures {
    requests: usize,
    elapsed: Duration,
}

/// Declares the queue `name`, publishes `messages` orders to it, and returns its URL.
async fn fill(broker: &SqsBroker, name: &str, messages: usize) -> Result<String, Box<dyn Error>> {
    broker.declare_queue(&QueueSpec::new(name)).await?;
    let orders: Vec<Message> = (0..messages as u64)
        .map(|id| Message::json(&Order { id, qty: 1 }))
        .collect::<Result<_, _>>()?;
    broker.publish_batch(name, orders).await?;
    Ok(broker.queue_url(name).await?)
}

async fn conveyor_run<D>(
    emulator: &Emulator,
    broker: &SqsBroker,
    name: &str,
    messages: usize,
    batch: bool,
    configure: fn(MountOptions) -> MountOptions<Identity, D>,
) -> Result<Figures, Box<dyn Error>> {
    fill(broker, name, messages).await?;
    let progress = Progress {
        handled: Arc::default(),
        target: messages,
        done: Arc::default(),
    };
    let before = emulator.requests();
    let started = Instant::now();
    let app = App::new("bench").with_state(progress.clone());
    let app = if batch {
        app.mount(broker.queue(name), many, configure)
    } else {
        app.mount(broker.queue(name), one, configure)
    };
    let running = app.start().await?;
    progress.done.notified().await;
    // Shutdown flushes the last deletes, so they are counted.
    running.shutdown().await?;
    let elapsed = started.elapsed();
    Ok(Figures {
        requests: emulator.requests() - before,
        elapsed,
    })
}

async fn raw_run(
    emulator: &Emulator,
    broker: &SqsBroker,
    name: &str,
    messages: usize,
) -> Result<Figures, Box<dyn Error>> {
    let url = fill(broker, name, messages).await?;
    let client = broker.client();
    let before = emulator.requests();
    let started = Instant::now();
    let mut handled = 0;
    while handled < messages {
        let received = client
            .receive_message()
            .queue_url(&url)
            .max_number_of_messages(10)
            .wait_time_seconds(1)
            .send()
            .await?;
        for message in received.messages() {
            let order: Order = serde_json::from_str(message.body().unwrap_or_default())?;
            std::hint::black_box(order.id + u64::from(order.qty));
            client
                .delete_message()
                .queue_url(&url)
                .receipt_handle(message.receipt_handle().unwrap_or_default())
                .send()
                .await?;
            handled += 1;
        }
    }
    Ok(Figures {
        requests: emulator.requests() - before,
        elapsed: started.elapsed(),
    })
}

fn row(label: &str, messages: usize, figures: &Figures) {
    println!(
        "{label:<34} {:>9.3} {:>9.0}",
        figures.requests as f64 / messages as f64,
        messages as f64 / figures.elapsed.as_secs_f64()
    );
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().collect();
    let benching = args.iter().any(|a| a == "--bench");
    let messages = args
        .windows(2)
        .find(|pair| pair[0] == "--messages")
        .map(|pair| pair[1].parse())
        .transpose()?
        .unwrap_or(if benching { 300 } else { 30 });

    let emulator = Emulator::start()?;
    let broker = SqsBroker::builder()
        .endpoint(&emulator.endpoint)
        .region("us-east-1")
        .static_credentials("bench", "bench")
        .receive_wait(Duration::from_secs(1))
        .build()
        .await?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while broker.client().list_queues().send().await.is_err() {
        if Instant::now() > deadline {
            return Err("the emulator did not answer within 20 s".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    println!("{messages} messages per run, moto at {}", emulator.endpoint);
    println!("{:<34} {:>9} {:>9}", "consumer", "req/msg", "msg/s");
    let raw = raw_run(&emulator, &broker, "bench-raw", messages).await?;
    row("raw loop (receive 10, delete each)", messages, &raw);
    let workers = conveyor_run(&emulator, &broker, "bench-workers", messages, false, |m| {
        m.workers(10)
    })
    .await?;
    row("conveyor workers(10)", messages, &workers);
    let batch = conveyor_run(&emulator, &broker, "bench-batch", messages, true, |m| {
        m.batch(10)
    })
    .await?;
    row("conveyor batch(10)", messages, &batch);
    let lanes = conveyor_run(&emulator, &broker, "bench-lanes", messages, false, |m| {
        m.workers(4).by_key()
    })
    .await?;
    row("conveyor workers(4).by_key()", messages, &lanes);
    let sequential = conveyor_run(
        &emulator,
        &broker,
        "bench-sequential",
        messages,
        false,
        |m| m,
    )
    .await?;
    row("conveyor sequential", messages, &sequential);
    Ok(())
}
