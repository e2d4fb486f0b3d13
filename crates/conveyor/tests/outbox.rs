//! The outbox: messages added in a transaction exist only once it commits; the relay
//! publishes them after a crash as before one, each at least once, in order per key.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use conveyor::outbox::{Outbox, OutboxEntry, OutboxRelay, OutboxStore, decode, encode};
use conveyor::{Error, MemoryBroker, Message, Publisher};

/// A row of the outbox table: id, destination, encoded message, sent.
type Row = (u64, String, Vec<u8>, bool);

/// A database with an outbox table.
#[derive(Clone, Default)]
struct Database {
    table: Arc<Mutex<Vec<Row>>>,
    /// How many `mark_sent` calls fail before one succeeds (a crash after publishing).
    failing_marks: Arc<AtomicUsize>,
    /// Whether it keeps messages set aside (a `failed` column), and those it keeps.
    sets_aside: bool,
    aside: Arc<Mutex<Vec<(u64, String)>>>,
    /// Whether setting a message aside fails (the database is away).
    set_aside_fails: bool,
}

/// A transaction on the database: its writes are seen once it commits.
#[derive(Default)]
struct Transaction {
    database: Database,
    written: Mutex<Vec<(String, Vec<u8>)>>,
}

impl Database {
    fn begin(&self) -> Transaction {
        Transaction {
            database: self.clone(),
            written: Mutex::default(),
        }
    }
}

impl Transaction {
    fn commit(self) {
        let mut table = self.database.table.lock().unwrap();
        for (destination, bytes) in self.written.into_inner().unwrap() {
            let id = table.len() as u64;
            table.push((id, destination, bytes, false));
        }
    }
}

impl OutboxStore for Transaction {
    async fn add(&self, destination: &str, message: Message) -> Result<(), Error> {
        let row = (destination.to_string(), encode(&message));
        self.written.lock().unwrap().push(row);
        Ok(())
    }

    async fn pending(&self, _: usize) -> Result<Vec<OutboxEntry>, Error> {
        unreachable!("the relay reads the database, not a transaction")
    }

    async fn mark_sent(&self, _: &[u64]) -> Result<(), Error> {
        unreachable!("the relay reads the database, not a transaction")
    }
}

impl OutboxStore for Database {
    async fn add(&self, _: &str, _: Message) -> Result<(), Error> {
        unreachable!("messages are added in transactions")
    }

    async fn pending(&self, max: usize) -> Result<Vec<OutboxEntry>, Error> {
        let table = self.table.lock().unwrap();
        let aside = self.aside.lock().unwrap();
        table
            .iter()
            .filter(|(id, _, _, sent)| !sent && !aside.iter().any(|(a, _)| a == id))
            .take(max)
            .map(|(id, destination, bytes, _)| {
                Ok(OutboxEntry {
                    id: *id,
                    destination: destination.clone(),
                    message: decode(bytes)?,
                })
            })
            .collect()
    }

    async fn mark_sent(&self, ids: &[u64]) -> Result<(), Error> {
        let failed = self
            .failing_marks
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if failed {
            return Err(Error::config("the process died before marking them"));
        }
        for row in self.table.lock().unwrap().iter_mut() {
            row.3 |= ids.contains(&row.0);
        }
        Ok(())
    }

    async fn set_aside(&self, id: u64, reason: &str) -> Result<bool, Error> {
        if self.set_aside_fails {
            return Err(Error::config("the database is away"));
        }
        if self.sets_aside {
            self.aside.lock().unwrap().push((id, reason.to_string()));
        }
        Ok(self.sets_aside)
    }
}

fn order(key: &str, step: u32) -> Message {
    Message::builder()
        .partition_key(key)
        .json(&step)
        .expect("a step encodes")
}

#[tokio::test]
async fn a_crash_between_commit_and_publish_loses_nothing_and_a_rollback_sends_nothing() {
    let database = Database::default();
    let committed = database.begin();
    {
        let outbox = Outbox::new(committed);
        for step in 0..3 {
            outbox
                .publish("orders", order("alice", step))
                .await
                .unwrap();
        }
        outbox.into_inner().commit();
    }
    let rolled_back = database.begin();
    Outbox::new(rolled_back)
        .publish("orders", order("bob", 0))
        .await
        .unwrap();
    // The transaction is dropped: rolled back. Then the process dies before any relay
    // ran: the committed messages wait in the table for the next one.
    let broker = MemoryBroker::new();
    broker.record_history(true);
    let relay = OutboxRelay::new(database.clone(), broker.clone());
    assert_eq!(relay.relay_once().await.unwrap(), 3);
    assert_eq!(relay.relay_once().await.unwrap(), 0, "nothing twice");
    let steps: Vec<(String, u32)> = broker
        .published("orders")
        .iter()
        .map(|m| {
            (
                m.partition_key.as_deref().unwrap_or("").to_string(),
                m.json().unwrap(),
            )
        })
        .collect();
    let alice = |step| ("alice".to_string(), step);
    assert_eq!(steps, vec![alice(0), alice(1), alice(2)]);
}

/// In front of the broker: refuses every `every`-th publish.
#[derive(Clone)]
struct Flaky {
    broker: MemoryBroker,
    every: usize,
    calls: Arc<AtomicUsize>,
}

impl Publisher for Flaky {
    async fn publish(&self, destination: &str, message: Message) -> Result<(), Error> {
        let call = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if call % self.every == 0 {
            return Err(Error::config("the broker is away"));
        }
        self.broker.publish(destination, message).await
    }
}

#[tokio::test(start_paused = true)]
async fn the_relay_publishes_each_message_at_least_once_in_order_per_key() {
    let database = Database::default();
    for step in 0..10u32 {
        let transaction = database.begin();
        let outbox = Outbox::new(transaction);
        for key in ["alice", "bob", "carol", "dave"] {
            outbox.publish("orders", order(key, step)).await.unwrap();
        }
        outbox.into_inner().commit();
    }
    // Two passes publish and then die before marking what they published.
    database.failing_marks.store(2, Ordering::SeqCst);
    let broker = MemoryBroker::new();
    broker.record_history(true);
    let flaky = Flaky {
        broker: broker.clone(),
        every: 7,
        calls: Arc::default(),
    };
    let relay = OutboxRelay::new(database.clone(), flaky)
        .batch(6)
        .interval(Duration::from_millis(10));
    let all_marked = async {
        while database.table.lock().unwrap().iter().any(|row| !row.3) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    relay.run_until(all_marked).await;

    let mut by_key: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for message in broker.published("orders") {
        let key = message.partition_key.as_deref().unwrap_or("").to_string();
        by_key.entry(key).or_default().push(message.json().unwrap());
    }
    let mut replays = 0;
    for (key, steps) in &by_key {
        let mut next = 0;
        for &step in steps {
            if step == next {
                next += 1;
            } else {
                assert!(step < next, "{key} skipped ahead to {step}: {steps:?}");
                replays += 1;
            }
        }
        assert_eq!(next, 10, "{key}: every step: {steps:?}");
    }
    assert_eq!(by_key.len(), 4);
    assert!(
        replays > 0,
        "the passes that died before marking published again"
    );
}

/// A publisher whose every publish fails, counting them.
#[derive(Clone, Default)]
struct Away {
    calls: Arc<AtomicUsize>,
}

impl Publisher for Away {
    async fn publish(&self, _: &str, _: Message) -> Result<(), Error> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Err(Error::config("the broker refuses this message"))
    }
}

/// A message the broker keeps refusing (or a broker that stays away) is tried again
/// after a pause that doubles up to 30 s, not at every interval: a minute gives about ten
/// tries, not 600. (It was tried every 100 ms, with a warning each time.)
#[tokio::test(start_paused = true)]
async fn a_relay_whose_publishes_keep_failing_tries_again_after_longer_and_longer_pauses() {
    let database = Database::default();
    let outbox = Outbox::new(database.begin());
    outbox.publish("orders", order("alice", 0)).await.unwrap();
    outbox.into_inner().commit();
    let away = Away::default();
    OutboxRelay::new(database.clone(), away.clone())
        .run_until(tokio::time::sleep(Duration::from_secs(60)))
        .await;
    let tries = away.calls.load(Ordering::SeqCst);
    // 100 ms, 200 ms, ... 25.6 s, then 30 s: 10 tries within the minute.
    assert!((9..=11).contains(&tries), "{tries} tries in a minute");
}

/// A broker that takes a second to confirm each publish.
#[derive(Clone, Default)]
struct Slow {
    published: Arc<AtomicUsize>,
}

impl Publisher for Slow {
    async fn publish(&self, _: &str, _: Message) -> Result<(), Error> {
        tokio::time::sleep(Duration::from_secs(1)).await;
        self.published.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// A relay told to stop in the middle of a pass ends after the publish under way, marks
/// what it sent, and leaves the rest for the next run: it does not first publish the
/// other 99 of its batch, a second each.
#[tokio::test(start_paused = true)]
async fn a_relay_told_to_stop_mid_pass_ends_after_the_publish_under_way() {
    let database = Database::default();
    let outbox = Outbox::new(database.begin());
    for step in 0..100 {
        outbox
            .publish("orders", order("alice", step))
            .await
            .unwrap();
    }
    outbox.into_inner().commit();
    let slow = Slow::default();
    let started = tokio::time::Instant::now();
    OutboxRelay::new(database.clone(), slow.clone())
        .run_until(tokio::time::sleep(Duration::from_millis(2_500)))
        .await;
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(3),
        "stopped after the third"
    );
    assert_eq!(slow.published.load(Ordering::SeqCst), 3);
    assert_eq!(database.pending(usize::MAX).await.unwrap().len(), 97);
}

/// In front of the broker: refuses for good every message to `refusing`, as a broker
/// refuses one too large for it.
#[derive(Clone)]
struct Refusing(MemoryBroker);

impl Publisher for Refusing {
    async fn publish(&self, destination: &str, message: Message) -> Result<(), Error> {
        if destination == "refusing" {
            return Err(Error::Refused {
                destination: destination.into(),
                source: "over the broker's size limit".into(),
            });
        }
        self.0.publish(destination, message).await
    }
}

/// Alice's steps 0 and 2 to `orders`, and between them one to `refusing`, committed.
async fn three_with_a_refused_one_between(database: &Database) {
    let outbox = Outbox::new(database.begin());
    outbox.publish("orders", order("alice", 0)).await.unwrap();
    outbox.publish("refusing", order("alice", 1)).await.unwrap();
    outbox.publish("orders", order("alice", 2)).await.unwrap();
    outbox.into_inner().commit();
}

fn steps(broker: &MemoryBroker) -> Vec<u32> {
    broker
        .published("orders")
        .iter()
        .map(|message| message.json().unwrap())
        .collect()
}

/// A message the broker refuses for good is set aside by a store that can, with the
/// reason, and the relay publishes what follows it. (It held back everything after it
/// for ever.)
#[tokio::test]
async fn a_message_refused_for_good_is_set_aside_and_the_rest_go_on() {
    let database = Database {
        sets_aside: true,
        ..Database::default()
    };
    three_with_a_refused_one_between(&database).await;
    let broker = MemoryBroker::new();
    broker.record_history(true);
    let relay = OutboxRelay::new(database.clone(), Refusing(broker.clone()));

    assert_eq!(relay.relay_once().await.unwrap(), 2);
    assert_eq!(steps(&broker), vec![0, 2]);
    let aside = database.aside.lock().unwrap().clone();
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert_eq!(aside[0].0, 1);
    assert!(
        aside[0].1.contains("over the broker's size limit"),
        "{aside:?}"
    );
    assert_eq!(database.pending(10).await.unwrap().len(), 0);
}

/// A store that cannot set messages aside (the default) keeps the order: the relay
/// stops at the refused message, with its error.
#[tokio::test]
async fn a_store_that_cannot_set_aside_stops_at_a_message_refused_for_good() {
    let database = Database::default();
    three_with_a_refused_one_between(&database).await;
    let broker = MemoryBroker::new();
    broker.record_history(true);
    let relay = OutboxRelay::new(database.clone(), Refusing(broker.clone()));

    let error = relay.relay_once().await.unwrap_err();
    assert!(matches!(error, Error::Refused { .. }), "{error}");
    assert_eq!(steps(&broker), vec![0]);
    assert_eq!(database.pending(10).await.unwrap().len(), 2);
}

/// Refuses one publish in fifty, for a moment, as a throttling broker does.
#[derive(Clone, Default)]
struct Hiccups {
    calls: Arc<AtomicUsize>,
    taken: Arc<AtomicUsize>,
}

impl Publisher for Hiccups {
    async fn publish(&self, _: &str, _: Message) -> Result<(), Error> {
        let call = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if call % 50 == 0 {
            return Err(Error::config("throttled, try again"));
        }
        self.taken.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// Passes that publish some messages before one fails do not back off as if the broker
/// were away: a thousand messages go within the minute. (Every failed pass doubled the
/// pause, up to 30 s: 490 went.)
#[tokio::test(start_paused = true)]
async fn passes_that_publish_some_before_failing_do_not_back_off() {
    let database = Database::default();
    let outbox = Outbox::new(database.begin());
    for step in 0..1000 {
        outbox
            .publish("orders", order("alice", step))
            .await
            .unwrap();
    }
    outbox.into_inner().commit();
    let broker = Hiccups::default();
    OutboxRelay::new(database.clone(), broker.clone())
        .run_until(tokio::time::sleep(Duration::from_secs(60)))
        .await;
    let taken = broker.taken.load(Ordering::SeqCst);
    assert_eq!(taken, 1000, "relayed {taken} of 1000 in a minute");
}

/// A store that fails to set a message aside stops the pass there, but the messages
/// published before it are marked sent, so they are not published again. (They were
/// left unmarked.)
#[tokio::test]
async fn a_failed_set_aside_still_marks_what_went_before_it() {
    let database = Database {
        sets_aside: true,
        set_aside_fails: true,
        ..Database::default()
    };
    three_with_a_refused_one_between(&database).await;
    let broker = MemoryBroker::new();
    broker.record_history(true);
    let relay = OutboxRelay::new(database.clone(), Refusing(broker.clone()));

    let error = relay.relay_once().await.unwrap_err();
    assert!(
        error.to_string().contains("the database is away"),
        "{error}"
    );
    assert_eq!(steps(&broker), vec![0]);
    let pending: Vec<u64> = database
        .pending(10)
        .await
        .unwrap()
        .iter()
        .map(|entry| entry.id)
        .collect();
    assert_eq!(pending, vec![1, 2]);
}
