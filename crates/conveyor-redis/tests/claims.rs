//! What a dead consumer held is claimed by a live one once its lease lapses, and a
//! delayed message comes no sooner than its delay, even once the server forgot the scripts.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use conveyor::{App, Broker, Json, Message, Publisher, QueueSpec, State};
use conveyor_redis::{GROUP, RedisBroker};

const DEADLINE: Duration = Duration::from_secs(60);

fn unique(stem: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{stem}-{}-{nanos:x}", std::process::id())
}

async fn broker(visibility: Duration) -> RedisBroker {
    RedisBroker::builder()
        .visibility_timeout(visibility)
        .receive_wait(Duration::from_millis(500))
        .build()
        .await
        .expect("a broker on the local Redis (scripts/services/redis.sh)")
}

/// A new queue holding the messages 0 to 4.
async fn five_messages(broker: &RedisBroker, stem: &str) -> String {
    let queue = unique(stem);
    broker
        .declare_queue(&QueueSpec::new(queue.as_str()))
        .await
        .expect("declared");
    let messages = (0..5u64)
        .map(|id| Message::json(&id))
        .collect::<Result<Vec<_>, _>>()
        .expect("json");
    broker
        .publish_batch(&queue, messages)
        .await
        .expect("published");
    queue
}

type Seen = Arc<Mutex<Vec<(u64, u32, Instant)>>>;

async fn record(Json(id): Json<u64>, info: conveyor::DeliveryInfo, State(seen): State<Seen>) {
    if let Ok(mut seen) = seen.lock() {
        seen.push((id, info.attempt, Instant::now()));
    }
}

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let waited = tokio::time::timeout(DEADLINE, async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "timed out waiting for {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_a_dead_consumer_held_are_claimed_once_its_lease_lapses() {
    let broker = broker(Duration::from_secs(1)).await;
    let queue = five_messages(&broker, "claims").await;
    // A consumer that reads everything, then dies without a word.
    let client = redis::Client::open("redis://127.0.0.1:6379").expect("url");
    let mut dead = client
        .get_multiplexed_async_connection()
        .await
        .expect("connected");
    let _: redis::Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(GROUP)
        .arg("dead")
        .arg("COUNT")
        .arg(10)
        .arg("STREAMS")
        .arg(&queue)
        .arg(">")
        .query_async(&mut dead)
        .await
        .expect("read");
    drop(dead);
    let seen: Seen = Arc::default();
    let app = App::new("claims")
        .with_state(seen.clone())
        .mount(broker.queue(queue.as_str()), record, |m| m.workers(2))
        .start()
        .await
        .expect("started");
    until("the five claimed", || {
        seen.lock().map(|s| s.len()).unwrap_or(0) == 5
    })
    .await;
    app.shutdown().await.expect("shut down");
    let seen = seen.lock().map(|s| s.clone()).unwrap_or_default();
    assert!(
        seen.iter().all(|(_, attempt, _)| *attempt == 2),
        "the dead consumer's delivery counts as the first attempt: {seen:?}"
    );
    let depth = broker.queue_depth(&queue).await.expect("depth");
    assert_eq!((depth.ready, depth.in_flight), (0, Some(0)));
    broker.delete_queue(&queue).await.expect("deleted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_message_waits_in_the_delayed_set_and_comes_no_sooner_than_its_delay() {
    let broker = broker(Duration::from_secs(30)).await;
    let queue = unique("delayed");
    let delay = Duration::from_millis(1500);
    let published = Instant::now();
    broker
        .publish(
            &queue,
            Message::builder().delay(delay).json(&7u64).expect("json"),
        )
        .await
        .expect("published");
    let depth = broker.queue_depth(&queue).await.expect("depth");
    assert_eq!((depth.ready, depth.delayed), (0, Some(1)));
    let seen: Seen = Arc::default();
    let app = App::new("delayed")
        .with_state(seen.clone())
        .mount(broker.queue(queue.as_str()), record, |m| m)
        .start()
        .await
        .expect("started");
    until("the delayed message", || {
        seen.lock().map(|s| s.len()).unwrap_or(0) == 1
    })
    .await;
    app.shutdown().await.expect("shut down");
    let arrived = seen.lock().map(|s| s[0].2).expect("seen");
    assert!(
        arrived.duration_since(published) >= delay,
        "came after {:?}",
        arrived.duration_since(published)
    );
    broker.delete_queue(&queue).await.expect("deleted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receiving_goes_on_after_the_server_forgets_its_scripts() {
    let broker = broker(Duration::from_secs(30)).await;
    let queue = unique("flushed");
    broker
        .declare_queue(&QueueSpec::new(queue.as_str()))
        .await
        .expect("declared");
    let seen: Seen = Arc::default();
    let app = App::new("flushed")
        .with_state(seen.clone())
        .mount(broker.queue(queue.as_str()), record, |m| m)
        .start()
        .await
        .expect("started");
    broker
        .publish(&queue, Message::json(&1u64).expect("json"))
        .await
        .expect("published");
    until("the first message", || {
        seen.lock().map(|s| s.len()).unwrap_or(0) == 1
    })
    .await;
    // As after a restart: each receive's pipelined script call now fails with NOSCRIPT.
    let client = redis::Client::open("redis://127.0.0.1:6379").expect("url");
    let mut admin = client
        .get_multiplexed_async_connection()
        .await
        .expect("connected");
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut admin)
        .await
        .expect("flushed");
    broker
        .publish(
            &queue,
            Message::builder()
                .delay(Duration::from_millis(200))
                .json(&2u64)
                .expect("json"),
        )
        .await
        .expect("published");
    until(
        "the delayed message, moved in by the reloaded script",
        || seen.lock().map(|s| s.len()).unwrap_or(0) == 2,
    )
    .await;
    app.shutdown().await.expect("shut down");
    broker.delete_queue(&queue).await.expect("deleted");
}

/// The consumers of `queue`'s group, by name.
async fn consumers(queue: &str) -> Vec<String> {
    let client = redis::Client::open("redis://127.0.0.1:6379").expect("url");
    let mut admin = client
        .get_multiplexed_async_connection()
        .await
        .expect("connected");
    let info: redis::streams::StreamInfoConsumersReply = redis::cmd("XINFO")
        .arg("CONSUMERS")
        .arg(queue)
        .arg(GROUP)
        .query_async(&mut admin)
        .await
        .expect("XINFO CONSUMERS");
    info.consumers.into_iter().map(|c| c.name).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_subscription_leaves_the_group_and_what_it_released_goes_to_the_next() {
    use conveyor::{Settlement, Source, SubscribeSettings, Subscriber};

    let broker = broker(Duration::from_secs(30)).await;
    let queue = five_messages(&broker, "leave").await;
    // Reads all five at once; handles the first, releases the second (a retry), and
    // releases the three it read ahead as it closes.
    let mut subscriber = broker
        .queue(&queue)
        .subscribe(SubscribeSettings::new(5))
        .await
        .expect("subscribed");
    let first = tokio::time::timeout(DEADLINE, subscriber.recv())
        .await
        .expect("a delivery in time")
        .expect("open")
        .expect("a delivery");
    first.settle(Settlement::Ack);
    let second = tokio::time::timeout(DEADLINE, subscriber.recv())
        .await
        .expect("a delivery in time")
        .expect("open")
        .expect("a delivery");
    second.settle(Settlement::Retry);
    let before_close = consumers(&queue).await;
    assert_eq!(
        before_close
            .iter()
            .filter(|name| *name != "conveyor:released")
            .count(),
        1,
        "the subscription's own consumer, in {before_close:?}"
    );
    subscriber.close().await;
    assert_eq!(
        consumers(&queue).await,
        ["conveyor:released"],
        "the closed subscription left the group; its releases wait with conveyor:released"
    );
    // The released four go to the next subscription.
    let seen: Seen = Arc::default();
    let app = App::new("next")
        .with_state(seen.clone())
        .mount(broker.queue(queue.as_str()), record, |m| m)
        .start()
        .await
        .expect("started");
    until("the four released messages", || {
        seen.lock().map(|s| s.len()).unwrap_or(0) == 4
    })
    .await;
    app.shutdown().await.expect("shut down");
    let mut ids: Vec<u64> = seen.lock().expect("seen").iter().map(|s| s.0).collect();
    ids.sort_unstable();
    assert_eq!(ids, [1, 2, 3, 4]);
    assert_eq!(consumers(&queue).await, ["conveyor:released"]);
    broker.delete_queue(&queue).await.expect("deleted");
}
