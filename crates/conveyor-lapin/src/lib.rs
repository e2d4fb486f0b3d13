//! The RabbitMQ transport of [Conveyor](conveyor), over [`lapin`].
//!
//! - [`LapinBroker`] connects from a URL (`amqp://`, `amqps://` through rustls), keeps
//!   passwords out of logs and errors, and recovers a lost connection by itself:
//!   channels, declarations, prefetch windows and consumers come back, and
//!   subscriptions resume.
//! - TLS: `amqps://` trusts the webpki roots; [`LapinBrokerBuilder::tls_ca_certificate`]
//!   adds a private CA (and [`LapinBrokerBuilder::tls_client_identity`] a client
//!   certificate).
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
//! What else to know:
//!
//! - Incoming AMQP properties appear among the delivery's headers as `content-type`,
//!   `message-id`, `correlation-id` and `priority`, beside the message's own headers
//!   (as on the in-process transport).
//! - The receive count is the quorum queue's `x-delivery-count` plus one, plus the
//!   attempts a message made through the delay queue; a classic queue only says whether
//!   a delivery is a redelivery.
//! - A reject's reason is logged; AMQP's nack cannot carry it to the dead-letter queue,
//!   which gets RabbitMQ's own `x-death` header instead.
//! - A [`Message`](conveyor::Message) with a delivery delay is refused: plain RabbitMQ has
//!   no per-message delay (retry-after uses the delay queue instead).
//! - `connect` fails with a clear error when no first connection comes within 30 s
//!   ([`LapinBrokerBuilder::first_connect_timeout`]), so a service started without its
//!   broker says so. After that, recovery is lapin's (`enable_auto_recover`, with
//!   unlimited reconnect attempts backing off from 100 ms to 30 s). Queues the broker deletes with the connection
//!   (exclusive ones) are declared again, empty.
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
mod tls;
mod topology;
mod url;

pub use broker::{
    DEFAULT_CONFIRM_TIMEOUT, DEFAULT_FIRST_CONNECT_TIMEOUT, LapinBroker, LapinBrokerBuilder,
};
pub use consistent_hash::ConsistentHash;
pub use error::LapinError;
pub use headers::{ATTEMPTS_HEADER, DELIVERY_COUNT_HEADER, PARTITION_KEY_HEADER};
pub use publisher::{LapinPublisher, PublishOptions};
pub use source::LapinSource;
pub use subscriber::LapinSubscriber;
pub use topology::{ArgumentValue, Binding, ExchangeSpec, ExchangeType, QueueSpec};
pub use url::redact_url;
