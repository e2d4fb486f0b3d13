//! A consumer waiting on an empty stream is woken for what its own subscription puts back
//! (a retry-after comes when it is due, not once the read's wait ends) and by a shutdown
//! (which does not wait the read out). Alone in its file: it watches the server for the
//! one blocked read, which other tests' reads would blur.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use conveyor::{App, Broker, DeliveryInfo, Json, Message, Outcome, Publisher, QueueSpec, State};
use conveyor_redis::RedisBroker;
use tokio::sync::Semaphore;

const DEADLINE: Duration = Duration::from_secs(60);

#[derive(Clone)]
struct Scenario {
    /// Each attempt: its number and when it ran.
    attempts: Arc<Mutex<Vec<(u32, Instant)>>>,
    /// The first attempt returns once given a permit.
    first_may_return: Arc<Semaphore>,
}

impl Scenario {
    fn attempts(&self) -> Vec<(u32, Instant)> {
        self.attempts.lock().map(|a| a.clone()).unwrap_or_default()
    }
}

async fn retry_once_after_200_ms(
    Json(_): Json<u64>,
    info: DeliveryInfo,
    State(scenario): State<Scenario>,
) -> Outcome {
    if let Ok(mut attempts) = scenario.attempts.lock() {
        attempts.push((info.attempt, Instant::now()));
    }
    if info.attempt > 1 {
        return Outcome::Ack;
    }
    if let Ok(permit) = scenario.first_may_return.acquire().await {
        permit.forget();
    }
    Outcome::RetryAfter(Duration::from_millis(200))
}

/// How many clients of the server wait in a blocking command.
async fn blocked_clients(admin: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("clients")
        .query_async(admin)
        .await
        .expect("INFO clients");
    info.lines()
        .find_map(|line| line.strip_prefix("blocked_clients:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_consumer_is_woken_from_its_read_for_its_own_retry_after_and_by_its_shutdown() {
    // The read waits two minutes for new entries; the test gives up long before.
    let broker = RedisBroker::builder()
        .receive_wait(Duration::from_secs(120))
        .build()
        .await
        .expect("a broker on the local Redis (scripts/services/redis.sh)");
    let client = redis::Client::open("redis://127.0.0.1:6379").expect("url");
    let mut admin = client
        .get_multiplexed_async_connection()
        .await
        .expect("connected");
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let queue = format!("idle-{}-{nanos:x}", std::process::id());
    broker
        .declare_queue(&QueueSpec::new(queue.as_str()))
        .await
        .expect("declared");
    let scenario = Scenario {
        attempts: Arc::default(),
        first_may_return: Arc::new(Semaphore::new(0)),
    };
    // workers(2): a retry-after goes back to Redis (an ordered mount retries in place).
    let app = App::new("idle")
        .with_state(scenario.clone())
        .mount(broker.queue(queue.as_str()), retry_once_after_200_ms, |m| {
            m.workers(2)
        })
        .start()
        .await
        .expect("started");
    broker
        .publish(&queue, Message::json(&1u64).expect("json"))
        .await
        .expect("published");
    // The first attempt runs while the consumer reads again, finds nothing and blocks.
    let blocked = tokio::time::timeout(DEADLINE, async {
        while scenario.attempts().is_empty() || blocked_clients(&mut admin).await == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(blocked.is_ok(), "the consumer never blocked in its read");
    scenario.first_may_return.add_permits(1);
    // Far longer than a busy machine needs for a 200 ms delay, far shorter than the read.
    let retried = tokio::time::timeout(Duration::from_secs(30), async {
        while scenario.attempts().len() < 2 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let attempts = scenario.attempts();
    assert!(
        retried.is_ok(),
        "the retry did not come while the consumer's read waited: {attempts:?}"
    );
    assert_eq!((attempts[0].0, attempts[1].0), (1, 2));
    // Idle again, blocked in a read of two minutes: shutting down cuts it short.
    let blocked = tokio::time::timeout(DEADLINE, async {
        while blocked_clients(&mut admin).await == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(blocked.is_ok(), "the consumer never blocked again");
    tokio::time::timeout(Duration::from_secs(20), app.shutdown())
        .await
        .expect("the shutdown did not wait out the read")
        .expect("shut down");
    broker.delete_queue(&queue).await.expect("deleted");
}
