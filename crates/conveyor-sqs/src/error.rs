//! The SQS transport's errors.

use aws_sdk_sqs::error::{DisplayErrorContext, SdkError};

/// What can go wrong talking to SQS, each naming the queue it concerns.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SqsError {
    /// An SQS call failed; `call` names the API operation.
    #[error("SQS {call} on `{queue}` failed: {message}")]
    Call {
        /// The API operation (`ReceiveMessage`, `DeleteMessageBatch`, ...).
        call: &'static str,
        /// The queue name or URL.
        queue: String,
        /// The SDK's error with its context (never credentials).
        message: String,
    },
    /// The queue does not exist.
    #[error("SQS queue `{0}` does not exist")]
    NoSuchQueue(String),
    /// A message cannot be sent as it is; the text says why.
    #[error("cannot send to `{queue}`: {reason}")]
    InvalidMessage {
        /// The queue.
        queue: String,
        /// What is wrong with the message.
        reason: String,
    },
    /// Some entries of a batch call failed.
    #[error("SQS {call} on `{queue}`: {failed} of {total} entries failed: {first}")]
    BatchEntries {
        /// The API operation.
        call: &'static str,
        /// The queue.
        queue: String,
        /// How many entries failed.
        failed: usize,
        /// How many entries were sent.
        total: usize,
        /// The first failure's code and message.
        first: String,
    },
    /// The broker's settings cannot work; the text says why.
    #[error("invalid SQS configuration: {0}")]
    Config(String),
}

impl SqsError {
    /// An SDK error from `call` on `queue`, with the SDK's full context.
    pub(crate) fn call<E, R>(call: &'static str, queue: &str, error: SdkError<E, R>) -> Self
    where
        E: std::error::Error + 'static,
        R: std::fmt::Debug,
    {
        SqsError::Call {
            call,
            queue: queue.to_string(),
            message: DisplayErrorContext(&error).to_string(),
        }
    }
}
