//! A transactional outbox over SQLite: each order is saved, and its message added to the
//! outbox table, in one transaction; a relay publishes what was committed, in order, and
//! marks it sent.
//!
//! `cargo run --example outbox` does both in one run. `cargo run --example outbox --
//! write orders.db` saves three orders and exits without publishing anything, as a
//! process that crashes after its commit; `cargo run --example outbox -- relay
//! orders.db` then publishes them (to an in-process queue, whose handler prints each),
//! and nothing is lost.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use conveyor::outbox::{Outbox, OutboxEntry, OutboxRelay, OutboxStore, decode, encode};
use conveyor::{App, Error, Json, MemoryBroker, Message, PartitionKey, Publisher};
use rusqlite::{Connection, params};
use tokio::sync::mpsc;

/// An outbox table in SQLite, on one connection: the writer's is the connection its
/// transaction is open on; the relay opens one of its own.
#[derive(Clone)]
struct Sqlite(Arc<Mutex<Connection>>);

fn failed(error: rusqlite::Error) -> Error {
    Error::Transport {
        transport: "sqlite",
        source: Box::new(error),
    }
}

impl Sqlite {
    fn open(path: &str) -> Result<Sqlite, Error> {
        let connection = Connection::open(path).map_err(failed)?;
        connection
            .execute_batch(
                "CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, customer TEXT, item TEXT);
                 CREATE TABLE IF NOT EXISTS outbox (
                     id INTEGER PRIMARY KEY AUTOINCREMENT,
                     destination TEXT NOT NULL,
                     message BLOB NOT NULL,
                     sent INTEGER NOT NULL DEFAULT 0);
                 CREATE TABLE IF NOT EXISTS outbox_set_aside (id INTEGER PRIMARY KEY, reason TEXT);",
            )
            .map_err(failed)?;
        Ok(Sqlite(Arc::new(Mutex::new(connection))))
    }

    fn execute(&self, sql: &str, values: impl rusqlite::Params) -> Result<(), Error> {
        let connection = self
            .0
            .lock()
            .map_err(|_| Error::config("a poisoned lock"))?;
        connection.execute(sql, values).map(|_| ()).map_err(failed)
    }
}

impl OutboxStore for Sqlite {
    async fn add(&self, destination: &str, message: Message) -> Result<(), Error> {
        self.execute(
            "INSERT INTO outbox (destination, message) VALUES (?1, ?2)",
            params![destination, encode(&message)],
        )
    }

    async fn pending(&self, max: usize) -> Result<Vec<OutboxEntry>, Error> {
        let connection = self
            .0
            .lock()
            .map_err(|_| Error::config("a poisoned lock"))?;
        let mut query = connection
            .prepare(
                "SELECT id, destination, message FROM outbox
                 WHERE sent = 0 AND id NOT IN (SELECT id FROM outbox_set_aside)
                 ORDER BY id LIMIT ?1",
            )
            .map_err(failed)?;
        let rows = query
            .query_map(params![i64::try_from(max).unwrap_or(i64::MAX)], |row| {
                Ok((
                    row.get::<_, i64>(0)?,
                    row.get::<_, String>(1)?,
                    row.get::<_, Vec<u8>>(2)?,
                ))
            })
            .map_err(failed)?;
        let mut pending = Vec::new();
        for row in rows {
            let (id, destination, bytes) = row.map_err(failed)?;
            let id = u64::try_from(id).map_err(|_| Error::config("a negative outbox id"))?;
            pending.push(OutboxEntry {
                id,
                destination,
                message: decode(&bytes)?,
            });
        }
        Ok(pending)
    }

    async fn mark_sent(&self, ids: &[u64]) -> Result<(), Error> {
        for id in ids {
            let id = i64::try_from(*id).map_err(|_| Error::config("an outbox id too large"))?;
            self.execute("UPDATE outbox SET sent = 1 WHERE id = ?1", params![id])?;
        }
        Ok(())
    }

    /// Keeps a message the broker refuses for good, with why, for someone to look at:
    /// the relay goes on without it.
    async fn set_aside(&self, id: u64, reason: &str) -> Result<bool, Error> {
        let id = i64::try_from(id).map_err(|_| Error::config("an outbox id too large"))?;
        self.execute(
            "INSERT OR REPLACE INTO outbox_set_aside (id, reason) VALUES (?1, ?2)",
            params![id, reason],
        )?;
        Ok(true)
    }
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Order {
    id: u64,
    item: String,
}

/// Saves an order and adds its message to the outbox, in one transaction.
async fn place(db: &Sqlite, id: u64, customer: &str, item: &str) -> Result<(), Error> {
    db.execute("BEGIN", [])?;
    let saved = async {
        db.execute(
            "INSERT INTO orders (id, customer, item) VALUES (?1, ?2, ?3)",
            params![i64::try_from(id).unwrap_or(i64::MAX), customer, item],
        )?;
        let order = Order {
            id,
            item: item.into(),
        };
        let message = Message::builder().partition_key(customer).json(&order)?;
        Outbox::new(db.clone()).publish("orders", message).await
    };
    match saved.await {
        Ok(()) => db.execute("COMMIT", []),
        Err(error) => {
            db.execute("ROLLBACK", [])?;
            Err(error)
        }
    }
}

async fn write(path: &str) -> Result<(), Error> {
    let db = Sqlite::open(path)?;
    for (id, customer, item) in [
        (1, "alice", "tea"),
        (2, "bob", "cake"),
        (3, "alice", "scone"),
    ] {
        place(&db, id, customer, item).await?;
        println!("saved order {id}");
    }
    Ok(())
}

#[derive(Clone)]
struct Done(mpsc::UnboundedSender<()>);

async fn ship(
    Json(order): Json<Order>,
    key: PartitionKey,
    conveyor::State(done): conveyor::State<Done>,
) {
    println!("{key}: order {} ({}) published", order.id, order.item);
    let _ = done.0.send(());
}

/// Relays the outbox to an in-process queue until three orders are handled.
async fn relay(path: &str) -> Result<(), Error> {
    let broker = MemoryBroker::new();
    let (done, mut handled) = mpsc::unbounded_channel();
    let app = App::new("shipping")
        .with_state(Done(done))
        .mount(broker.queue("orders"), ship, |m| m.workers(2).by_key())
        .start()
        .await?;
    let relay = OutboxRelay::new(Sqlite::open(path)?, broker).interval(Duration::from_millis(20));
    let three = async {
        for _ in 0..3 {
            handled.recv().await;
        }
    };
    relay.run_until(three).await;
    app.shutdown().await
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["write", path] => write(path).await,
        ["relay", path] => relay(path).await,
        [] => {
            let path =
                std::env::temp_dir().join(format!("conveyor-outbox-{}.db", std::process::id()));
            let path = path.to_string_lossy().into_owned();
            write(&path).await?;
            let relayed = relay(&path).await;
            let _ = std::fs::remove_file(&path);
            relayed
        }
        _ => Err(Error::config("usage: outbox [write PATH | relay PATH]")),
    }
}
