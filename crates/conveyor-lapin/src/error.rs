//! The crate's error type, and how it maps onto the core's [`conveyor::Error`].

use std::time::Duration;

/// Everything that can go wrong talking to RabbitMQ, each variant naming what failed and
/// where. URLs in these errors have their password redacted.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LapinError {
    /// The broker URL cannot be parsed.
    #[error("invalid RabbitMQ URL `{url}`: {reason}")]
    InvalidUrl {
        /// The URL, password redacted.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The connection to the broker could not be opened.
    #[error("cannot connect to RabbitMQ at `{url}`")]
    Connect {
        /// The URL, password redacted.
        url: String,
        /// The client's error.
        #[source]
        source: lapin::Error,
    },
    /// No connection could be made within the first-connect timeout.
    #[error("RabbitMQ at `{url}` did not accept a connection within {after:?}")]
    ConnectTimeout {
        /// The URL, password redacted.
        url: String,
        /// How long it tried.
        after: std::time::Duration,
    },
    /// A channel could not be opened or configured.
    #[error("cannot open a channel for `{purpose}`")]
    Channel {
        /// What the channel was for (a queue name, `publisher`, `topology`).
        purpose: String,
        /// The client's error.
        #[source]
        source: lapin::Error,
    },
    /// A queue, exchange or binding could not be declared.
    #[error("cannot declare {what} `{name}`")]
    Declare {
        /// `queue`, `exchange` or `binding`.
        what: &'static str,
        /// Its name.
        name: String,
        /// The broker's error.
        #[source]
        source: lapin::Error,
    },
    /// The queue does not exist on the broker (found by a passive check, or a get).
    #[error("queue `{queue}` does not exist on the broker")]
    MissingQueue {
        /// The missing queue.
        queue: String,
    },
    /// Passive mode: the exchange does not exist on the broker.
    #[error("exchange `{exchange}` does not exist on the broker (passive mode declares nothing)")]
    MissingExchange {
        /// The missing exchange.
        exchange: String,
    },
    /// A consumer could not be started on a queue.
    #[error("cannot consume from queue `{queue}`")]
    Consume {
        /// The queue.
        queue: String,
        /// The broker's error.
        #[source]
        source: lapin::Error,
    },
    /// A subscription's channel failed and did not recover.
    #[error("the channel consuming `{queue}` failed")]
    Receive {
        /// The queue.
        queue: String,
        /// The client's error.
        #[source]
        source: lapin::Error,
    },
    /// A message could not be sent.
    #[error("cannot publish to `{destination}`")]
    Publish {
        /// The exchange and routing key, or the queue.
        destination: String,
        /// The client's error.
        #[source]
        source: lapin::Error,
    },
    /// The broker refused a published message (basic.nack under publisher confirms).
    #[error("the broker refused (nacked) a message published to `{destination}`")]
    Nacked {
        /// The exchange and routing key, or the queue.
        destination: String,
    },
    /// A mandatory message could not be routed to any queue and came back.
    #[error("message to `{destination}` was returned unroutable: {code} {text}")]
    Returned {
        /// The exchange and routing key, or the queue.
        destination: String,
        /// The AMQP reply code (312 NO_ROUTE).
        code: u16,
        /// The broker's explanation.
        text: String,
    },
    /// The broker did not confirm a publish in time.
    #[error("no publisher confirm for a message to `{destination}` within {after:?}")]
    ConfirmTimeout {
        /// The exchange and routing key, or the queue.
        destination: String,
        /// How long the publisher waited.
        after: Duration,
    },
    /// A name or value is not acceptable to AMQP (a short string over 255 bytes, ...).
    #[error("invalid {what}: {reason}")]
    Invalid {
        /// What was invalid (`queue name`, `header name`, ...).
        what: &'static str,
        /// Why.
        reason: String,
    },
}

impl LapinError {
    /// Wraps this error as the core's [`conveyor::Error::Subscribe`] for `queue`.
    pub fn into_subscribe(self, queue: &str) -> conveyor::Error {
        conveyor::Error::Subscribe {
            queue: queue.to_string(),
            source: Box::new(self),
        }
    }

    /// Wraps this error as the core's [`conveyor::Error::Publish`] for `destination`.
    pub fn into_publish(self, destination: &str) -> conveyor::Error {
        conveyor::Error::Publish {
            destination: destination.to_string(),
            source: Box::new(self),
        }
    }
}

/// Bad input (a URL, a name or a certificate the transport cannot take) becomes
/// [`conveyor::Error::Config`] with the error's text; anything else, a failure of the
/// broker or the connection, [`conveyor::Error::Transport`] with the error as its source.
impl From<LapinError> for conveyor::Error {
    fn from(error: LapinError) -> Self {
        match error {
            LapinError::InvalidUrl { .. } | LapinError::Invalid { .. } => {
                conveyor::Error::Config(error.to_string())
            }
            error => conveyor::Error::Transport {
                transport: "rabbitmq",
                source: Box::new(error),
            },
        }
    }
}

/// Whether a broker error says the named queue or exchange does not exist (404).
pub(crate) fn is_not_found(error: &lapin::Error) -> bool {
    use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
    matches!(
        error.kind(),
        lapin::ErrorKind::ProtocolError(e) if matches!(e.kind(), AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND))
    )
}

/// An AMQP short string (at most 255 bytes), or a typed error naming `what` it was for.
pub(crate) fn short(
    what: &'static str,
    value: &str,
) -> Result<lapin::types::ShortString, LapinError> {
    lapin::types::ShortString::try_new(value).map_err(|_| LapinError::Invalid {
        what,
        reason: format!("`{value}` is longer than AMQP's 255-byte limit"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_input_is_a_configuration_error_and_a_broker_failure_keeps_its_source() {
        let invalid = conveyor::Error::from(LapinError::Invalid {
            what: "queue name",
            reason: "too long".into(),
        });
        assert!(
            matches!(&invalid, conveyor::Error::Config(text) if text.contains("invalid queue name")),
            "{invalid:?}"
        );
        let missing = conveyor::Error::from(LapinError::MissingQueue { queue: "q".into() });
        let source =
            std::error::Error::source(&missing).and_then(|e| e.downcast_ref::<LapinError>());
        assert!(
            matches!(source, Some(LapinError::MissingQueue { .. })),
            "{missing:?}"
        );
    }
}
