//! App start to first delivery on a live RabbitMQ (127.0.0.1:5672): a queue holds one
//! message; the time is from `App::start` to the handler's first call. Median of
//! `STARTUP_BENCH_TRIALS` (default 30) trials, each on a fresh queue.
//!
//! Run: `scripts/services/rabbitmq.sh && cargo bench -p conveyor-benches --bench startup`

use std::time::{Duration, Instant};

use conveyor::{App, Bytes, Publisher, QueueSpec, State};
use conveyor_lapin::LapinBroker;
use tokio::sync::mpsc;

const URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

async fn first(_: Bytes, State(arrived): State<mpsc::UnboundedSender<Instant>>) {
    let _ = arrived.send(Instant::now());
}

async fn trial(broker: &LapinBroker, queue: &str) -> Duration {
    broker
        .declare_queue(&QueueSpec::new(queue))
        .await
        .expect("declare");
    broker
        .publish(queue, conveyor::Message::new("x"))
        .await
        .expect("publish");
    let (arrived, mut first_call) = mpsc::unbounded_channel::<Instant>();
    let start = Instant::now();
    let running = App::new("startup")
        .with_state(arrived)
        .mount(broker.queue(queue), first, |m| m)
        .start()
        .await
        .expect("start");
    let at = first_call.recv().await.expect("a delivery");
    let took = at - start;
    running.shutdown().await.expect("shutdown");
    let _ = broker.delete_queue(queue).await;
    took
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let trials = conveyor_benches::env_or("STARTUP_BENCH_TRIALS", 30).max(1);
    let broker = LapinBroker::connect(URL)
        .await
        .expect("RabbitMQ on 127.0.0.1:5672");
    let mut times = Vec::new();
    for n in 0..trials {
        let queue = format!("conveyor-bench-startup.{}.{n}", std::process::id());
        let run = {
            let broker = broker.clone();
            async move { trial(&broker, &queue).await }
        };
        times.push(tokio::spawn(run).await.expect("the trial"));
    }
    times.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "app start to first delivery over {trials} trials: median {:.1} ms, min {:.1} ms, max {:.1} ms",
        ms(times[times.len() / 2]),
        ms(times[0]),
        ms(times[times.len() - 1])
    );
}
