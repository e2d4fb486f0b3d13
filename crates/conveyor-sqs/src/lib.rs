//! Amazon SQS transport for Conveyor.
//!
//! Mount handlers on [`SqsBroker::queue`]; publish with the broker, which implements
//! [`conveyor::Publisher`].
//!
//! - **One pump per subscription**, long-polling (20 s by default), at most one receive
//!   ahead of the handlers: it receives once the dispatcher has taken the last receive's
//!   messages and has room, asking for as many as the mount can hold (at most ten). A
//!   batch mount gets one receive per batch, once the last batch is settled.
//! - **A visibility extender** keeps every received, unsettled message hidden, running or
//!   waiting to be handed over, renewing ten per `ChangeMessageVisibilityBatch`, never
//!   past SQS's 12 hours.
//! - **FIFO**: the `MessageGroupId` is the delivery's partition key (also in the
//!   [`PARTITION_KEY_HEADER`] header), so `workers(n).by_key()` keeps each group in
//!   order. Publishing to a FIFO queue takes the group from the message's partition key
//!   and deduplicates by its message id, by content where the queue does, or by a
//!   generated id. Standard queues carry no groups: their deliveries have no key.
//! - **Settlement**: ack deletes (`DeleteMessageBatch`, ten at a time or after 5 ms);
//!   retry and release set visibility 0, retry-after sets it to the delay (both
//!   `ChangeMessageVisibilityBatch`); reject makes the message visible again and leaves
//!   dead-lettering to the queue's redrive policy, which moves it once its receive count
//!   passes `maxReceiveCount` (so set the mount's `max_attempts` to that count), and
//!   deletes it with a warning where the queue has no redrive policy. The receive count
//!   is `ApproximateReceiveCount`.
//! - **Shutdown**: the pump stops, messages received but not started are released at once
//!   (visibility 0), settlements are flushed.
//!
//! SQS bills per request: with a mount that can hold ten (`workers(10)`, `batch(10)`), a
//! message costs about a tenth of a receive and a tenth of a delete. A sequential mount
//! holds one, so it receives one at a time: about two requests per message.
#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]

mod attributes;
mod broker;
mod error;
mod extender;
mod inflight;
mod publisher;
mod pump;
mod queue;
mod settle;
mod subscriber;

pub use attributes::{BODY_ENCODING_ATTRIBUTE, PARTITION_KEY_HEADER};
pub use broker::{SqsBroker, SqsBrokerBuilder};
pub use error::SqsError;
pub use queue::QueueSpec;
pub use subscriber::{SqsQueue, SqsSubscriber};
