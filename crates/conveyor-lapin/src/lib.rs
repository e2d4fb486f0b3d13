//! The RabbitMQ transport of [Conveyor](conveyor), over [`lapin`].
//!
//! [`LapinBroker`] is this transport's [`conveyor::Broker`]: code written against
//! `B: Broker` (declare queues, publish, mount handlers, read depths and dead letters)
//! runs on RabbitMQ unchanged. It connects from a URL ([`LapinBrokerBuilder`] for TLS,
//! prefetch and timeouts), consumes on one connection and publishes on another, and
//! recovers a lost connection by itself. The `lapin` it re-exports is lapin 4.12.3 with
//! the fixes this crate needs (package `conveyor-amqp-lapin`), so no patching is needed.
//!
//! - Queues: the portable [`conveyor::QueueSpec`], with RabbitMQ's own settings from
//!   [`RabbitQueueSpec`]; [`ExchangeSpec`], [`Binding`] and [`ConsistentHash`] for the
//!   rest of the topology.
//! - Consuming: [`LapinQueue`] (from [`LapinBroker::queue`]) is what a handler is mounted
//!   on; its [`LapinSubscriber`] reads the partition key from [`PARTITION_KEY_HEADER`].
//! - Publishing: the broker, or a [`LapinPublisher`] with [`PublishOptions`];
//!   [`amqp_properties`] and [`LapinBroker::publish_amqp`] for raw AMQP properties.
//! - Settling: retries republish with [`ATTEMPTS_HEADER`]; rejects carry their reason.
//! - Errors: [`LapinError`]. Logs: lapin's, at any level, print the frames and commands
//!   that carry credentials with those hidden (`***`), so no subscriber needs a filter.
//!
//! How each piece behaves (declarations, recovery, alarms, acks, retries, dead letters,
//! order across a shutdown, limits) is in the guide's RabbitMQ page, `docs/rabbitmq.md`
//! in the repository.
//!
//! ```no_run
//! use conveyor::{App, Json, PartitionKey, QueueSpec};
//! use conveyor_lapin::{LapinBroker, RabbitQueueSpec};
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
//! broker.declare_queue(&QueueSpec::new("orders.dead").quorum()).await?;
//! broker
//!     .declare_queue(&QueueSpec::new("orders").dead_letter_queue("orders.dead", 10).quorum())
//!     .await?;
//! App::new("orders")
//!     .broker(broker.clone())
//!     .mount(broker.queue("orders"), place, |m| m.workers(4).by_key())
//!     .run()
//!     .await
//! # }
//! ```
#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]

mod ack_window;
mod amqp;
mod broker;
mod consistent_hash;
mod copy;
mod dialer;
mod error;
mod headers;
mod nodes;
mod publisher;
mod queue;
mod redeclare;
mod replicas;
mod request;
mod settle;
mod spec;
mod subscriber;
mod tls;
mod topology;
mod url;

pub use amqp::amqp_properties;
pub use broker::{
    DEFAULT_CONFIRM_TIMEOUT, DEFAULT_FIRST_CONNECT_TIMEOUT, DEFAULT_RECONNECT_HANDSHAKE_TIMEOUT,
    LapinBroker, LapinBrokerBuilder,
};
pub use consistent_hash::ConsistentHash;
pub use copy::fresh_copy;
pub use error::LapinError;
pub use headers::{ATTEMPTS_HEADER, DELIVERY_COUNT_HEADER, PARTITION_KEY_HEADER};
pub use publisher::{LapinPublisher, PublishOptions};
pub use queue::LapinQueue;
pub use replicas::{DEFAULT_HEARTBEAT, MISSED_HEARTBEATS, ReplicaGroup, ReplicaGroupBuilder};
pub use spec::RabbitQueueSpec;
pub use subscriber::LapinSubscriber;
pub use topology::{ArgumentValue, Binding, ExchangeSpec, ExchangeType};
pub use url::redact_url;

/// The `lapin` this crate is built on, for the AMQP types of [`amqp_properties`] and
/// [`LapinBroker::publish_amqp`].
pub use lapin;
