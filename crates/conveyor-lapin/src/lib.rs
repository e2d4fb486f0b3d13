//! The RabbitMQ transport of [Conveyor](conveyor), over [`lapin`].
//!
//! - [`LapinBroker`] connects from a URL (`amqp://`, `amqps://` through rustls), keeps
//!   passwords out of logs and errors, and recovers a lost connection by itself:
//!   channels, declarations, prefetch windows and consumers come back, and
//!   subscriptions resume.
//! - [`LapinSource`] (from [`LapinBroker::queue`]) is what a handler is mounted on; its
//!   [`LapinSubscriber`] consumes on its own channel with a prefetch window (basic.qos)
//!   and manual acks, in the order the queue pushed.
//! - The partition key travels in the [`PARTITION_KEY_HEADER`] (`amqp-partition-key`),
//!   which [`conveyor::Message::partition_key`] writes and lanes read.
//! - [`QueueSpec`], [`ExchangeSpec`] and [`Binding`] declare topology (or check it, in
//!   passive mode); [`ConsistentHash`] spreads keys over several queues on the server.
//! - Settlement: ack is `basic.ack`; retry and release requeue; reject nacks without
//!   requeue (to the dead-letter exchange, if the queue has one); retry-after goes
//!   through a delay queue and counts attempts in [`ATTEMPTS_HEADER`].
//! - [`LapinPublisher`] publishes with confirms, persistent and mandatory by default.
//!
//! Prefetch: a mount's `prefetch(..)` wins, then the source's, then the broker's; without
//! any, the window is twice what the mount can hold (at least 16). Lanes or workers with
//! a window of 1 take turns, and the subscriber warns about it. A batch mount gets what
//! the channel has already pushed, so its window must be at least the batch size.
//!
//! ```no_run
//! use conveyor::{App, Json, PartitionKey};
//! use conveyor_lapin::{LapinBroker, QueueSpec};
//!
//! #[derive(serde::Deserialize)]
//! struct Order { id: u64 }
//!
//! async fn place(Json(order): Json<Order>, key: PartitionKey) {
//!     println!("{key}: {}", order.id);
//! }
//!
//! # async fn f() -> Result<(), conveyor::Error> {
//! let broker = LapinBroker::connect("amqp://guest:guest@127.0.0.1:5672/%2f").await?;
//! App::new("orders")
//!     .mount(broker.queue(QueueSpec::new("orders").quorum()), place, |m| m.workers(4).by_key())
//!     .run()
//!     .await
//! # }
//! ```
#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]

mod broker;
mod consistent_hash;
mod error;
mod headers;
mod publisher;
mod settle;
mod source;
mod subscriber;
mod topology;
mod url;

pub use broker::{DEFAULT_CONFIRM_TIMEOUT, LapinBroker, LapinBrokerBuilder};
pub use consistent_hash::ConsistentHash;
pub use error::LapinError;
pub use headers::{ATTEMPTS_HEADER, DELIVERY_COUNT_HEADER, PARTITION_KEY_HEADER};
pub use publisher::{LapinPublisher, PublishOptions};
pub use source::LapinSource;
pub use subscriber::LapinSubscriber;
pub use topology::{ArgumentValue, Binding, ExchangeSpec, ExchangeType, QueueSpec};
pub use url::redact_url;
