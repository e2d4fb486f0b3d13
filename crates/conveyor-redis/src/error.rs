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

#[cfg(test)]
mod tests {
    use super::*;

    /// One error of each variant, by variant. The match has no wildcard: a new variant
    /// does not compile until it is named there.
    fn every_variant() -> Vec<(&'static str, RedisError)> {
        [
            RedisError::Connect {
                url: "redis://:***@127.0.0.1:6379".into(),
                reason: "connection refused".into(),
            },
            call_error("XREADGROUP", "orders", "NOGROUP No such key"),
        ]
        .into_iter()
        .map(|error| {
            let variant = match &error {
                RedisError::Connect { .. } => "RedisError::Connect",
                RedisError::Call { .. } => "RedisError::Call",
            };
            (variant, error)
        })
        .collect()
    }

    /// Every error this crate makes, and every core error it wraps one in, says each
    /// cause once: by `Display`, by its sources walked as anyhow does, by
    /// [`conveyor::Report`], and as the reason a handler's message is rejected with.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_error_says_each_cause_once_however_it_is_shown() {
        conveyor_conformance::errors::assert_alone_and_wrapped_say_each_cause_once(every_variant)
            .await;
    }
}
