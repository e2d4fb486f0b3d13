//! NATS JetStream transport for [Conveyor](conveyor).
//!
//! A queue is the subject of its name and the JetStream stream that takes it (named
//! alike, each `.` as `~`, since a stream's name has no dots), with work-queue retention (a message is gone once acknowledged), read through one
//! durable pull consumer that every subscription to it shares. The subscription runs on
//! the core's kit ([`conveyor::kit::PullSubscriber`]):
//!
//! - **Receiving**: a pull request for up to what the mount can hold, which answers as
//!   soon as any message is there, on an inbox each subscription keeps for its life.
//! - **Leases**: a message is held for the consumer's ack wait; while its handler runs,
//!   the subscription renews it with `in_progress`.
//! - **Settling**: ack; retry and release are a nak (with the delay of a retry-after);
//!   a reject goes to the queue's dead-letter queue with its reason
//!   ([`conveyor::REJECT_REASON_HEADER`]) and is then acknowledged, or is a term (dropped)
//!   where the queue has none.
//! - **Dead letters**: [`QueueSpec::dead_letter_queue`](conveyor::QueueSpec::dead_letter_queue)
//!   is kept in the stream's description; a message delivered more often than its max
//!   receive count goes there unhandled.
//! - **Partition keys** travel in the [`PARTITION_KEY_HEADER`] header; a message id also
//!   as `Nats-Msg-Id`, which JetStream deduplicates by within the stream's duplicate
//!   window (two minutes by default).
//! - **Publishing** waits for JetStream's acknowledgement; a batch is sent whole before
//!   its acknowledgements are awaited. A delayed message carries the instant it is due,
//!   and a subscription that receives it early hands it back with the rest of its delay.
//! - **Request/reply** uses a reply inbox of NATS's own.
//! - **Reconnecting** is the client's: it reconnects by itself, and what a subscription
//!   held comes back after its ack wait if its settlement was lost.
//!
//! ```no_run
//! use conveyor::{App, Json, Publisher};
//! use conveyor_nats::NatsBroker;
//!
//! async fn greet(Json(name): Json<String>) {
//!     println!("hello, {name}");
//! }
//!
//! # async fn run() -> Result<(), conveyor::Error> {
//! let broker = NatsBroker::connect("nats://127.0.0.1:4222").await?;
//! broker.publish_json("greetings", "Ada").await?;
//! let app = App::new("greeter")
//!     .mount(broker.queue("greetings"), greet, |m| m)
//!     .start()
//!     .await?;
//! app.shutdown().await?;
//! # Ok(()) }
//! ```
//!
//! Depth: `ready` counts messages never delivered yet. JetStream's consumer info counts a
//! message released or retried, waiting to be delivered again, as pending acknowledgement
//! (`in_flight`) until it is.

mod admin;
mod broker;
mod error;
mod headers;
mod names;
mod queue;
mod receive;
mod request;
mod shards;

pub use async_nats;
pub use broker::{DEFAULT_CONSUMER, NatsBroker, NatsBrokerBuilder};
pub use error::NatsError;
pub use headers::PARTITION_KEY_HEADER;
pub use queue::NatsQueue;
pub use shards::Shards;

/// A NATS subscription: the kit's pulling subscriber.
pub type NatsSubscriber = conveyor::kit::PullSubscriber;
