//! Amazon SQS transport for Conveyor.
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
//! - **Queues** are declared from the portable [`conveyor::QueueSpec`] (FIFO by a `.fifo`
//!   name, a redrive policy from its dead-letter queue, `VisibilityTimeout` and
//!   `DelaySeconds` rounded up to whole seconds), with SQS's own attributes from the
//!   [`SqsQueueSpec`] extension trait; a spec outside SQS's limits is
//!   [`conveyor::Error::Config`] before any call. A queue that exists with other values
//!   gets the spec's attributes set on it. A queue mounted by a name that does not exist is
//!   created plainly when the app starts.
//! - **One pump per subscription**, long-polling (20 s by default), at most one receive
//!   ahead of the handlers: it receives once the dispatcher has taken every message of the
//!   last receive, asking for ten (SQS's maximum) for every mount, sequential included;
//!   [`SqsQueue::receive_batch`] lowers that per queue. What the mount cannot run yet
//!   waits in a hand-over, hidden. A batch mount asks for its batch size (at most ten), so
//!   each batch is one receive. The pump also stops receiving while more messages than the
//!   mount holds plus one receive are in flight, counting settlements whose call has not
//!   been made yet: if SQS stops taking deletes, the pump stops taking messages.
//! - **One keeper per subscription**, the visibility extender, keeps every received,
//!   unsettled message hidden, running or waiting to be handed over (renewing ten per
//!   `ChangeMessageVisibilityBatch`, never past SQS's 12 hours from receipt: a message
//!   whose handler still runs then is handed out again, and a warning says so; a renewal
//!   that failed, or got no answer within a twelfth of the visibility timeout, is tried
//!   again after 100 ms, doubling, for up to half a tick, rather than a tick later), and
//!   makes the settlement calls. Renewals go out beside settlements, and a settled
//!   message stays renewed until its call goes out (ten at a time; a reject's delete
//!   waits for its dead letter's send), so a settlement call that hangs exposes only its
//!   own messages. A settlement waits for a renewal under way
//!   that covers its message, so the visibility a settlement sets always has the last
//!   word.
//! - **FIFO**: the `MessageGroupId` is the delivery's partition key (also in the
//!   [`PARTITION_KEY_HEADER`] header), so `workers(n).by_key()` keeps each group in
//!   order. Publishing to a FIFO queue takes the group from the message's partition key
//!   and deduplicates by its message id, by content where the queue does, or by a
//!   generated id. Standard queues carry no groups: their deliveries have no key.
//! - **Settlement**: ack deletes (`DeleteMessageBatch`, ten at a time or after 5 ms).
//!   Retry and release set visibility 0; retry-after sets it to the delay rounded *up* to
//!   whole seconds (1.5 s hides for 2 s, 300 ms for 1 s), capped, as renewals are, 5 s
//!   short of 12 hours from receipt when its call is made (SQS counts from its own receipt
//!   and refuses more) (both `ChangeMessageVisibilityBatch`). Reject ends the message's
//!   life at once: it is
//!   sent (`SendMessageBatch`) to the dead-letter queue the queue's redrive policy names,
//!   with its payload and headers (each attribute of the type it came with) and the
//!   reason in the
//!   [`REJECT_REASON_HEADER`](conveyor::REJECT_REASON_HEADER) attribute (a FIFO
//!   dead-letter queue gets the message's group, deduplicated by its SQS message id), and
//!   deleted once that send succeeded; the handler never runs again for it. Without a
//!   redrive policy a rejected message is deleted, with an error log naming the queue and
//!   the reason. If the dead-letter queue cannot be reached, or refuses the message, it is
//!   made visible again rather than lost (the redrive policy still moves it after
//!   `maxReceiveCount` receives). A send that gets no answer is not repeated (it may have
//!   been stored, and a standard queue would keep each copy): the message is made visible
//!   again too. The reason is cut to 1 KiB, and left out (with a
//!   warning) where the message already carries ten attributes.
//! - **Attempts** are SQS's `ApproximateReceiveCount` plus the retries a sequential or lane
//!   mount makes in place (the delivery stays held and hidden meanwhile; SQS's count does
//!   not grow). A delivery handed back at shutdown after retries in place continues, when
//!   received again, from SQS's count, so across a restart a message can be tried a few
//!   more times than `max_attempts`. `workers(n)` and batch mounts hand retries back to
//!   SQS, which counts every receive.
//! - **Shutdown**: when the app starts draining, the pump makes no new receive, a receive
//!   under way completes and its messages are released (visibility 0) as it returns, and
//!   every message waiting in the hand-over is released at once (its call made without
//!   waiting for the flush interval), while the handlers already running go on. Closing
//!   the subscription waits for that receive (bounded by
//!   the long poll plus the request timeout), then for every settlement's call.
//! - **Errors that cannot heal** end the subscription: a receive that fails because the
//!   queue does not exist, access is denied, the credentials are refused, or SQS refuses
//!   the request for good (any other 4xx but throttling) makes the mount fail with
//!   [`conveyor::Error::Subscribe`] naming the queue, which stops the app. Timeouts,
//!   connection failures, throttling and 5xx are retried, after a pause that doubles from
//!   100 ms up to 30 s ([`conveyor::kit::RetryPause`]).
//!
//! SQS bills per request: a message costs about a tenth of a receive and a tenth of a
//! delete with every mount, sequential included (0.2 requests per message in
//! `benches/sqs.rs`).
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

pub use attributes::{BODY_ENCODING_ATTRIBUTE, PARTITION_KEY_HEADER};
pub use broker::{SqsBroker, SqsBrokerBuilder};
pub use data_types::{AttributeTypes, attribute_types};
pub use error::SqsError;
#[cfg(feature = "sns")]
pub use sns::{SnsPublisher, TopicSubscription};
pub use spec::SqsQueueSpec;
pub use subscriber::{SqsQueue, SqsSubscriber};
