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

#[cfg(test)]
mod tests {
    use super::*;

    /// One error of each variant, by variant. The match has no wildcard: a new variant
    /// does not compile until it is named there.
    fn every_variant() -> Vec<(&'static str, NatsError)> {
        [
            NatsError::Connect {
                url: "nats://user:***@127.0.0.1:4222".into(),
                reason: "connection refused".into(),
            },
            NatsError::call("fetch", "orders", "timed out"),
            NatsError::Name {
                name: "a b".into(),
                why: "a space",
            },
            NatsError::NoReply {
                destination: "prices".into(),
                after: std::time::Duration::from_secs(5),
            },
        ]
        .into_iter()
        .map(|error| {
            let variant = match &error {
                NatsError::Connect { .. } => "NatsError::Connect",
                NatsError::Call { .. } => "NatsError::Call",
                NatsError::Name { .. } => "NatsError::Name",
                NatsError::NoReply { .. } => "NatsError::NoReply",
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
