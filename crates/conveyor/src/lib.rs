//! Conveyor: message-driven services on RabbitMQ, Amazon SQS and an in-process transport.
//!
//! A service mounts handlers, plain async functions over typed payloads, on queues, and
//! chooses at each mount site how deliveries are dispatched:
//!
//! - sequentially (the default): one at a time, in queue order;
//! - `workers(n)`: up to `n` at once, in any order, reading nothing more while `n` run;
//! - `workers(n).by_key()`: `n` ordered lanes; the partition key picks the lane by a
//!   stable hash, so each key is handled in order, and keyless deliveries rotate;
//! - `workers(n).by_key().any_worker()`: each key in order, one delivery at a time, on
//!   whichever worker is free;
//! - batches: a handler that takes a [`Batch`] gets what the subscriber already has, up
//!   to the mount's `batch(size)`.
//!
//! Every delivery is settled exactly once, after its handler has finished: acked, retried
//! now or later, or rejected to a dead-letter queue. A payload that cannot be decoded is
//! rejected with its reason; a handler error or panic goes to the mount's
//! [`FailurePolicy`]. At shutdown, in-flight handlers finish and settle, and deliveries
//! not yet started go straight back to the broker.
//!
//! ```
//! use conveyor::{App, Json, MemoryBroker, PartitionKey, Publisher, Message};
//!
//! #[derive(serde::Deserialize, serde::Serialize)]
//! struct Order { id: u64 }
//!
//! async fn place(Json(order): Json<Order>, key: PartitionKey) {
//!     println!("{key}: order {}", order.id);
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), conveyor::Error> {
//! let broker = MemoryBroker::new(); // or a RabbitMQ or SQS broker
//! broker.publish("orders.fifo", Message::builder().partition_key("alice").json(&Order { id: 1 })?).await?;
//! let idle = broker.clone();
//! App::new("orders")
//!     .mount(broker.queue("orders.fifo"), place, |m| m.workers(2).by_key())
//!     .run_until(async move { idle.wait_idle().await }) // `.run()` waits for SIGINT/SIGTERM
//!     .await
//! # }
//! ```
//!
//! # Cargo features
//!
//! None is on by default; each compiles nothing when off.
//!
//! - `metrics`: mount and publish metrics through the `metrics` facade ([`telemetry`]).
//! - `otel`: W3C trace context across services through OpenTelemetry ([`trace`]).
//! - `msgpack`, `cbor`: MessagePack and CBOR payloads ([`codec`]).
//! - `schemars`: payload schemas in the app's AsyncAPI document ([`asyncapi`]).
#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]

mod admin;
mod app;
pub mod asyncapi;
mod batch;
mod clock;
pub mod codec;
mod delivery;
pub mod dispatch;
mod encode;
mod error;
mod extract;
mod handler;
mod headers;
mod health;
pub mod kit;
pub mod lanes_view;
pub mod layer;
pub mod memory;
mod message;
mod mount;
pub mod outbox;
mod outcome;
pub mod output;
mod payload;
mod policy;
pub mod request;
mod route;
pub mod shards;
mod state;
pub mod telemetry;
pub mod testing;
pub mod trace;
mod transport;

pub use admin::{DeadLetter, DeadLetterPolicy, QueueDepth, QueueSpec};
pub use app::{App, DEFAULT_SHUTDOWN_TIMEOUT, RunningApp, shutdown_signal};
pub use batch::{Batch, IntoBatchOutcome};
pub use bytes::Bytes;
#[cfg(feature = "cbor")]
pub use codec::Cbor;
#[cfg(feature = "msgpack")]
pub use codec::MsgPack;
pub use delivery::{Delivery, Settle, Settled};
pub use error::{BoxError, Error, Report, Result};
pub use extract::{Context, DeliveryInfo, FromContext, FromDelivery, Rejection, State};
pub use handler::Handler;
pub use headers::{HeaderName, Headers};
pub use health::{Health, MountHealth, MountState};
pub use lanes_view::{HotKey, LaneView, MountLanes};
pub use layer::{Identity, Layer, Stack};
pub use memory::{MemoryBroker, MemoryQueue, MemorySubscriber};
pub use message::{
    CONTENT_TYPE_HEADER, CORRELATION_ID_HEADER, MESSAGE_ID_HEADER, Message, MessageBuilder,
    MessageParts, PartitionKey, REPLY_TO_HEADER,
};
pub use mount::{DEFAULT_BATCH_SIZE, Dispatch, MountOptions, mode};
pub use outcome::{IntoOutcome, Outcome, REJECT_REASON_HEADER, Settlement};
pub use output::{CAUSATION_ID_HEADER, IntoReply, Output, Reply};
pub use payload::{DecodeError, FromPayload, Json, PayloadFormat};
pub use policy::{Backoff, FailurePolicy, OnError};
pub use state::StateMap;
pub use transport::{
    Background, Broker, ConnectionHealth, ConnectionProbe, ConnectionState, Publisher, ShardsProbe,
    SharedPublisher, Source, SubscribeSettings, Subscriber,
};
