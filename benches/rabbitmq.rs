//! Consume throughput on a live RabbitMQ (127.0.0.1:5672): Conveyor's subscriber and
//! dispatch against a raw lapin loop doing the same work (prefetch 256, 512-byte JSON
//! messages decoded, one ack per message), on the same broker in the same run.
//!
//! Every measured run, the raw loop included, runs in a task spawned on the runtime's
//! worker threads, as the framework's dispatch does: `main` runs on the thread that
//! blocks on the runtime, where the same loop is markedly slower, and measuring the raw
//! loop there would handicap the baseline.
//!
//! The orders and Conveyor's run are the harness it shares with the `nats` and `redis`
//! benches (`pairs.rs`).
//!
//! Run: `scripts/services/rabbitmq.sh && cargo bench -p conveyor-benches --bench rabbitmq`
//! (`CONSUME_BENCH_MESSAGES` and `CONSUME_BENCH_ROUNDS` change the size;
//! `CONSUME_BENCH_MODES=lanes`, say, runs only the modes listed, comma-separated, to
//! count one mode's system calls with `strace -f -c`).

use std::time::{Duration, Instant};

use conveyor_lapin::LapinBroker;
use futures_util::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;

#[path = "pairs.rs"]
#[allow(
    dead_code,
    reason = "its rounds are the nats and redis benches' four modes"
)]
mod pairs;
use pairs::{Order, conveyor_run, fill, median};

const URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
const PREFETCH: u16 = 256;

async fn raw_loop(broker: &LapinBroker, queue: &str, n: u64) -> Duration {
    let connection = lapin::Connection::connect(URL, lapin::ConnectionProperties::default())
        .await
        .expect("connect");
    let channel = connection.create_channel().await.expect("channel");
    let _ = broker;
    let start = Instant::now();
    channel
        .basic_qos(PREFETCH, BasicQosOptions::default())
        .await
        .expect("qos");
    let mut consumer = channel
        .basic_consume(
            queue.into(),
            "raw".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("consume");
    let mut done = 0;
    while done < n {
        let delivery = consumer.next().await.expect("stream").expect("delivery");
        let order: Order = serde_json::from_slice(&delivery.data).expect("decode");
        std::hint::black_box(order);
        delivery
            .acker
            .ack(BasicAckOptions::default())
            .await
            .expect("ack");
        done += 1;
    }
    let elapsed = start.elapsed();
    let _ = connection.close(200, "done".into()).await;
    elapsed
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n = conveyor_benches::env_or("CONSUME_BENCH_MESSAGES", 50_000);
    let rounds = conveyor_benches::env_or("CONSUME_BENCH_ROUNDS", 3);
    let broker = LapinBroker::connect(URL)
        .await
        .expect("RabbitMQ on 127.0.0.1:5672");
    let (mut raw, mut seq, mut lanes) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let modes = std::env::var("CONSUME_BENCH_MODES")
            .unwrap_or_else(|_| "raw,sequential,lanes".to_string());
        for mode in ["raw", "sequential", "lanes"] {
            if !modes.split(',').any(|m| m.trim() == mode) {
                continue;
            }
            let queue = format!("conveyor-bench.{}.{round}.{mode}", std::process::id());
            fill(&broker, &queue, n).await;
            let run = {
                let (broker, queue) = (broker.clone(), queue.clone());
                async move {
                    match mode {
                        "raw" => raw_loop(&broker, &queue, n).await,
                        "sequential" => {
                            conveyor_run(broker.queue(&queue).prefetch(PREFETCH), n, false).await
                        }
                        _ => conveyor_run(broker.queue(&queue).prefetch(PREFETCH), n, true).await,
                    }
                }
            };
            let elapsed = tokio::spawn(run).await.expect("the run");
            let r = n as f64 / elapsed.as_secs_f64();
            println!("round {round} {mode:>10}: {n} messages in {elapsed:?} = {r:.0} msg/s");
            match mode {
                "raw" => raw.push(r),
                "sequential" => seq.push(r),
                _ => lanes.push(r),
            }
            // Its delay queue too.
            let _ = broker.delete_queue(&queue).await;
        }
    }
    let (Some(raw), Some(seq), Some(lanes)) = (median(raw), median(seq), median(lanes)) else {
        return;
    };
    println!("median raw lapin loop        : {raw:.0} msg/s");
    println!(
        "median conveyor sequential   : {seq:.0} msg/s ({:+.1}% vs raw)",
        (seq / raw - 1.0) * 100.0
    );
    println!(
        "median conveyor workers(4).by_key(): {lanes:.0} msg/s ({:+.1}% vs raw)",
        (lanes / raw - 1.0) * 100.0
    );
}
