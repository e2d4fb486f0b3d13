//! Amazon SQS transport for Conveyor, over `aws-sdk-sqs`.
//!
//! Mount handlers on [`SqsBroker::queue`]; publish with the broker, which implements
//! [`conveyor::Publisher`]; declare, measure, empty and delete queues with it too, through
//! [`conveyor::Broker`], the API every transport shares.
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use conveyor::{Broker, QueueSpec};
//! use conveyor_sqs::{SqsBroker, SqsQueueSpec};
//!
//! # async fn run() -> Result<(), conveyor::Error> {
//! let broker = SqsBroker::builder().build().await?;
//! broker.declare_queue(&QueueSpec::new("orders-dead.fifo")).await?;
//! broker
//!     .declare_queue(
//!         &QueueSpec::new("orders.fifo")
//!             .dead_letter_queue("orders-dead.fifo", 5)
//!             .visibility_timeout(Duration::from_secs(60))
//!             .content_based_deduplication(),
//!     )
//!     .await?;
//! let depth = broker.queue_depth("orders.fifo").await?;
//! println!("{} ready, {:?} in flight", depth.ready, depth.in_flight);
//! for dead in broker.take_dead_letters("orders-dead.fifo", 100).await? {
//!     println!("{:?}: {:?}", dead.partition_key, dead.reason);
//! }
//! # Ok(())
//! # }
//! ```
//!
//! - Queues: the portable [`conveyor::QueueSpec`], with SQS's own attributes from
//!   [`SqsQueueSpec`]; [`SqsBrokerBuilder`] for the endpoint, credentials, visibility
//!   timeout and long-poll wait.
//! - Receiving: each subscription ([`SqsQueue`], [`SqsSubscriber`]) has one pump that
//!   long-polls ten at a time ([`SqsQueue::receive_batch`] lowers it), and one keeper
//!   that keeps what it received hidden and batches the settlements. A FIFO queue's
//!   message group is the partition key ([`PARTITION_KEY_HEADER`]).
//! - Publishing: headers become message attributes; binary and empty bodies are marked
//!   by [`BODY_ENCODING_ATTRIBUTE`], and headers with an empty value are named in
//!   [`EMPTY_HEADERS_ATTRIBUTE`]; [`AttributeTypes`] and [`attribute_types`] keep
//!   attribute data types. Errors are [`SqsError`].
//! - SNS fan-out (feature `sns`): `SnsPublisher` and `TopicSubscription`.
//!
//! SQS bills per request: a message costs about a tenth of a receive and a tenth of a
//! delete with every mount, sequential included (0.2 requests per message in
//! `benches/sqs.rs`). How each piece behaves (declarations, the pump and the keeper,
//! settlement, attempts, shutdown, errors that end a subscription, what a publish
//! refuses, SNS) is in the guide's SQS page, `docs/sqs.md` in the repository.
#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]

mod admin;
mod attributes;
mod broker;
mod call_metrics;
mod calls;
mod data_types;
mod error;
mod inflight;
mod keeper;
mod publisher;
mod pump;
mod queue;
mod request;
mod settle;
#[cfg(feature = "sns")]
mod sns;
mod spec;
mod subscriber;
#[cfg(test)]
mod testing;

pub use attributes::{
    BODY_ENCODING_ATTRIBUTE, EMPTY_HEADERS_ATTRIBUTE, MAX_ATTRIBUTES, PARTITION_KEY_HEADER,
};
pub use broker::{SqsBroker, SqsBrokerBuilder};
pub use data_types::{AttributeTypes, attribute_types};
pub use error::SqsError;
#[cfg(feature = "sns")]
pub use sns::{SnsPublisher, TopicSubscription};
pub use spec::SqsQueueSpec;
pub use subscriber::{SqsQueue, SqsSubscriber};
