//! What goes wrong talking to Redis, as the `source` of the core's errors.

/// A failure of a Redis call, kept as the `source` of a [`conveyor::Error`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RedisError {
    /// The server could not be reached, or refused the connection.
    #[error("cannot connect to Redis at {url}: {reason}")]
    Connect {
        /// The server's URL, its password hidden.
        url: String,
        /// Why.
        reason: String,
    },
    /// A command failed.
    #[error("{call} on `{queue}` failed: {reason}")]
    Call {
        /// The command (`XREADGROUP`, `XADD`, ...).
        call: &'static str,
        /// The queue (stream) it was for.
        queue: String,
        /// The server's or client's answer.
        reason: String,
    },
}

/// A failed command on `queue`, as the core's transport error.
pub(crate) fn failed(
    call: &'static str,
    queue: &str,
    error: impl std::fmt::Display,
) -> conveyor::Error {
    conveyor::Error::Transport {
        transport: "redis",
        source: Box::new(call_error(call, queue, error)),
    }
}

pub(crate) fn call_error(
    call: &'static str,
    queue: &str,
    error: impl std::fmt::Display,
) -> RedisError {
    RedisError::Call {
        call,
        queue: conveyor::kit::bounded(queue, 256).into_owned(),
        reason: error.to_string(),
    }
}
