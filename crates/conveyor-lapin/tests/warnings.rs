//! What the transport warns about, and the confirm timeout: a prefetch window smaller
//! than what the mount can hold makes workers and lanes take turns, and a publish whose
//! confirm does not come in time fails.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use conveyor::{App, Json, Message};
use conveyor_lapin::{LapinBroker, LapinError};

use common::proxy::Proxy;
use common::{URL, cleanup, unique};

/// Everything logged in this test binary, for assertions.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Write for Logs {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// Installs the capturing subscriber once for the whole binary.
fn logs() -> Logs {
    static LOGS: OnceLock<Logs> = OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = Logs::default();
        let writer = logs.clone();
        tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .init();
        logs
    })
    .clone()
}

async fn ignore(Json(_n): Json<u64>) {}

async fn count_batch(_batch: conveyor::Batch<Json<u64>>) {}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lanes_or_a_batch_wider_than_the_prefetch_log_a_warning_and_sequential_mounts_do_not() {
    let logs = logs();
    let broker = LapinBroker::connect(URL).await.unwrap();
    let lanes = unique("warn-lanes");
    let batches = unique("warn-batches");
    let sequential = unique("warn-sequential");
    let running = App::new("warnings")
        .mount(broker.queue(lanes.as_str()).prefetch(1), ignore, |m| {
            m.workers(2).by_key()
        })
        .mount(
            broker.queue(batches.as_str()).prefetch(4),
            count_batch,
            |m| m.batch(10),
        )
        .mount(broker.queue(sequential.as_str()).prefetch(1), ignore, |m| m)
        .start()
        .await
        .unwrap();
    running.shutdown().await.unwrap();
    let warnings: Vec<String> = logs
        .text()
        .lines()
        .filter(|line| line.contains("the prefetch window is smaller than what the mount can hold"))
        .map(str::to_string)
        .collect();
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(warnings.iter().any(|w| w.contains(&lanes)), "{warnings:?}");
    assert!(
        warnings.iter().any(|w| w.contains(&batches)),
        "{warnings:?}"
    );
    cleanup(&broker, &[&lanes, &batches, &sequential], &[]).await;
}

/// AMQP's `basic.qos` takes 0 for no limit: the broker would push the whole queue to one
/// consumer. It is refused, on the broker and on a queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefetch_of_zero_is_refused_not_taken_for_no_limit() {
    let refused = LapinBroker::builder(URL)
        .prefetch(0)
        .connect()
        .await
        .expect_err("a zero prefetch");
    assert!(
        matches!(
            refused,
            LapinError::Invalid {
                what: "prefetch",
                ..
            }
        ),
        "{refused:?}"
    );
    let broker = LapinBroker::connect(URL).await.unwrap();
    let queue = unique("zero-prefetch");
    let started = App::new("warnings")
        .mount(broker.queue(queue.as_str()).prefetch(0), ignore, |m| m)
        .start()
        .await;
    let Err(error) = started else {
        panic!("a queue with a zero prefetch does not start");
    };
    assert!(error.to_string().contains("prefetch"), "{error}");
    cleanup(&broker, &[&queue], &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_whose_confirm_does_not_come_in_time_is_an_error() {
    let _ = logs();
    // The confirm is held back by a proxy, so it never comes, however fast the broker is.
    let proxy = Proxy::start("127.0.0.1:5672").await;
    let broker = LapinBroker::builder(proxy.url())
        .confirm_timeout(Duration::from_secs(1))
        .connect()
        .await
        .unwrap();
    let queue = unique("confirm-timeout");
    broker.declare_queue(&queue.as_str().into()).await.unwrap();
    let publisher = broker.publisher().await.unwrap();
    proxy.stall_replies();
    let error = conveyor::Publisher::publish(&publisher, &queue, Message::json(&1u64).unwrap())
        .await
        .expect_err("the confirm never comes");
    let source = std::error::Error::source(&error).and_then(|e| e.downcast_ref::<LapinError>());
    assert!(
        matches!(source, Some(LapinError::ConfirmTimeout { .. })),
        "{error:?}"
    );
    let cleanup_broker = common::broker().await;
    cleanup(&cleanup_broker, &[&queue], &[]).await;
}
