//! What goes wrong talking to NATS, as the `source` of the core's errors.

/// A failure of a NATS or JetStream call, kept as the `source` of a [`conveyor::Error`]
/// (downcast it to tell them apart).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NatsError {
    /// The server could not be reached, or refused the connection.
    #[error("cannot connect to NATS at {url}: {reason}")]
    Connect {
        /// The server's URL, its password hidden.
        url: String,
        /// Why.
        reason: String,
    },
    /// A JetStream call failed.
    #[error("{call} on `{queue}` failed: {reason}")]
    Call {
        /// The call (`fetch`, `publish`, `stream info`, ...).
        call: &'static str,
        /// The queue (stream) it was for.
        queue: String,
        /// The server's or client's answer.
        reason: String,
    },
    /// A name NATS cannot take as a stream and its subject.
    #[error("`{name}` cannot name a NATS queue: {why}")]
    Name {
        /// The name, bounded.
        name: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// No answer came to a request in time.
    #[error("no reply from `{destination}` within {after:?}")]
    NoReply {
        /// Where the request went.
        destination: String,
        /// How long it waited.
        after: std::time::Duration,
    },
}

impl NatsError {
    /// A failed JetStream call on `queue`.
    pub(crate) fn call(call: &'static str, queue: &str, reason: impl std::fmt::Display) -> Self {
        NatsError::Call {
            call,
            queue: conveyor::kit::bounded(queue, 256).into_owned(),
            reason: reason.to_string(),
        }
    }
}
