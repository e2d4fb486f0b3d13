//! What a handler decides about a delivery.

use std::time::Duration;

use crate::error::BoxError;

/// The header a dead-lettered message carries with the reason it was rejected, on every
/// transport: the handler's error, the decode failure, or "rejected by the handler".
pub const REJECT_REASON_HEADER: &str = "x-reject-reason";

/// The fate of a delivery once its handler has finished.
///
/// A handler returns an `Outcome` directly, or `()` (which means [`Outcome::Ack`]), or a
/// `Result` whose `Err` goes to the mount's failure policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Done: remove the message from the queue.
    Ack,
    /// Put the message back on the queue now, to be received again.
    Retry,
    /// Put the message back, to be received again after the delay (natively where the
    /// broker can: SQS visibility, a RabbitMQ delay queue, the in-process delay heap).
    RetryAfter(Duration),
    /// Give up: dead-letter the message where its queue has a dead-letter queue,
    /// otherwise discard it.
    Reject,
}

/// How a transport is asked to settle a delivery: an [`Outcome`], or a release of a
/// delivery that was received but never handed to a handler.
///
/// Not `#[non_exhaustive]`: a transport matches every variant, so a fate added here is a
/// compile error in each transport rather than a silent fall into a catch-all arm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settlement<'a> {
    /// Remove the message from the queue.
    Ack,
    /// Back on the queue now.
    Retry,
    /// Back on the queue after the delay.
    RetryAfter(Duration),
    /// Dead-letter (or discard), with the reason to record where the transport can.
    Reject {
        /// Why the message was rejected, for logs and the dead-letter queue.
        reason: &'a str,
    },
    /// Never handled (shutdown, or dropped unsettled): back on the queue at once.
    Release,
}

/// Turns what a handler returns into an [`Outcome`], or an error for the failure policy.
///
/// Implemented for `()` (ack), [`Outcome`], and `Result<T, E>` where `T: IntoOutcome` and
/// `E` converts into a boxed error.
pub trait IntoOutcome {
    /// The outcome, or the handler's error.
    ///
    /// # Errors
    ///
    /// The handler's error, for the mount's failure policy.
    fn into_outcome(self) -> Result<Outcome, BoxError>;
}

impl IntoOutcome for () {
    fn into_outcome(self) -> Result<Outcome, BoxError> {
        Ok(Outcome::Ack)
    }
}

impl IntoOutcome for Outcome {
    fn into_outcome(self) -> Result<Outcome, BoxError> {
        Ok(self)
    }
}

impl<T: IntoOutcome, E: Into<BoxError>> IntoOutcome for Result<T, E> {
    fn into_outcome(self) -> Result<Outcome, BoxError> {
        self.map_err(Into::into)?.into_outcome()
    }
}
