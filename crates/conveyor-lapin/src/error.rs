//! The crate's error type, and how it maps onto the core's [`conveyor::Error`].

use std::borrow::Cow;
use std::time::Duration;

/// Everything that can go wrong talking to RabbitMQ, each variant naming what failed and
/// where. URLs in these errors have their password redacted.
///
/// `Display` shows this error alone, and [`conveyor::Error`]'s `Display` shows it with its
/// causes. A variant that only ever comes wrapped in an error that names the queue or
/// destination ([`conveyor::Error::Publish`], [`conveyor::Error::Refused`],
/// [`conveyor::Error::Subscribe`], or the
/// caller's own [`LapinPublisher::publish_to`](crate::LapinPublisher::publish_to)) says
/// why, and not again where: the field keeps the name. A name longer than AMQP allows
/// (255 bytes) is quoted by its first 64 characters and `…`; the fields keep it whole.
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
    /// The connection to the broker could not be opened. The source says why: the
    /// last attempt's error (`connection refused`, a TLS failure, the connection closed
    /// during the AMQP handshake, ...) or the broker's refusal of the handshake (bad
    /// credentials, a missing vhost).
    #[error("cannot connect to RabbitMQ at `{url}`")]
    Connect {
        /// The URL, password redacted.
        url: String,
        /// The client's error.
        #[source]
        source: lapin::Error,
    },
    /// The first connect's time ran out while an attempt was still waiting for the
    /// broker: no answer, as opposed to a refusal ([`LapinError::Connect`]).
    #[error("RabbitMQ at `{url}` did not answer within {after:?} (waiting for {waiting_for})")]
    ConnectTimeout {
        /// The URL, password redacted.
        url: String,
        /// How long it tried.
        after: std::time::Duration,
        /// What the last attempt was waiting for: `the connection to be accepted (TCP, and
        /// TLS for amqps://)`, or `an answer to the AMQP handshake on an accepted
        /// connection`.
        waiting_for: &'static str,
    },
    /// A channel could not be opened or configured.
    #[error("cannot open a channel for `{}`", shown(purpose))]
    Channel {
        /// What the channel was for (a queue name, `publisher`, `topology`, `consuming`,
        /// `republishing`).
        purpose: String,
        /// The client's error.
        #[source]
        source: lapin::Error,
    },
    /// The connection could not be closed cleanly.
    #[error("cannot close the connection")]
    Close {
        /// The client's error.
        #[source]
        source: lapin::Error,
    },
    /// A queue, exchange or binding could not be declared.
    // Not cut: AMQP took every name in it (a binding's name is three of them).
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
    #[error("queue `{}` does not exist on the broker", shown(queue))]
    MissingQueue {
        /// The missing queue.
        queue: String,
    },
    /// Passive mode: the exchange does not exist on the broker.
    #[error(
        "exchange `{}` does not exist on the broker (passive mode declares nothing)",
        shown(exchange)
    )]
    MissingExchange {
        /// The missing exchange.
        exchange: String,
    },
    /// A consumer could not be started on a queue (the subscription's error names it).
    #[error("basic.consume failed")]
    Consume {
        /// The queue.
        queue: String,
        /// The broker's error.
        #[source]
        source: lapin::Error,
    },
    /// A subscription's channel failed and did not recover.
    #[error("the channel consuming `{}` failed", shown(queue))]
    Receive {
        /// The queue.
        queue: String,
        /// The client's error.
        #[source]
        source: lapin::Error,
    },
    /// A message could not be sent, or its confirm awaited: the channel failed (closed by
    /// the broker over a missing exchange, say, or by a lost connection).
    #[error("the channel failed")]
    Publish {
        /// The exchange and routing key, or the queue.
        destination: String,
        /// The client's error.
        #[source]
        source: lapin::Error,
    },
    /// The broker refused a published message (basic.nack under publisher confirms).
    #[error("the broker refused the message (basic.nack)")]
    Nacked {
        /// The exchange and routing key, or the queue.
        destination: String,
    },
    /// A mandatory message could not be routed to any queue and came back.
    #[error("the message was returned unroutable: {code} {text}")]
    Returned {
        /// The exchange and routing key, or the queue.
        destination: String,
        /// The AMQP reply code (312 NO_ROUTE).
        code: u16,
        /// The broker's explanation.
        text: String,
    },
    /// The broker did not confirm a publish in time.
    #[error("no publisher confirm within {after:?}")]
    ConfirmTimeout {
        /// The exchange and routing key, or the queue.
        destination: String,
        /// How long the publisher waited.
        after: Duration,
    },
    /// The connection was lost and did not recover within the publisher's confirm
    /// timeout: the message was not sent.
    #[error("the connection was lost and did not recover within {after:?}")]
    Unavailable {
        /// The exchange and routing key, or the queue.
        destination: String,
        /// How long the publisher waited for the recovery.
        after: Duration,
    },
    /// RabbitMQ kept the publishing connection blocked (a memory or disk alarm) for the
    /// publisher's confirm timeout: the message was not sent (of a batch: this one and
    /// those after it; those before it may have been), or the channel it needed was not
    /// opened. A blocked connection writes nothing, so it would have waited there for the
    /// alarm's end.
    #[error("RabbitMQ blocked the publishing connection (a resource alarm) for {after:?}")]
    Blocked {
        /// The exchange and routing key, or the queue; for a channel not opened, what it
        /// was for (`publisher`, `requests`, `republishing`).
        destination: String,
        /// How long the publisher waited for the block to end.
        after: Duration,
    },
    /// A message's AMQP properties and headers do not fit in one frame of the connection:
    /// AMQP splits a payload over frames, but not a message's header frame, and the
    /// broker answers an oversize one by closing the connection (FRAME_ERROR), cutting
    /// every channel on it. Refused before it is sent.
    #[error(
        "its properties and headers make a {size}-byte header frame, over the connection's frame limit of {limit} bytes (frame_max)"
    )]
    HeadersTooLarge {
        /// The exchange and routing key, or the queue.
        destination: String,
        /// The size of the header frame the message needs, in bytes.
        size: usize,
        /// The largest frame the connection takes (frame_max, negotiated with the broker).
        limit: u32,
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
    /// The error's kind, for a metric's `error.type`: one short name per variant.
    pub fn kind(&self) -> &'static str {
        match self {
            LapinError::InvalidUrl { .. } => "invalid_url",
            LapinError::Connect { .. } => "connect",
            LapinError::ConnectTimeout { .. } => "connect_timeout",
            LapinError::Channel { .. } => "channel",
            LapinError::Close { .. } => "close",
            LapinError::Declare { .. } => "declare",
            LapinError::MissingQueue { .. } => "missing_queue",
            LapinError::MissingExchange { .. } => "missing_exchange",
            LapinError::Consume { .. } => "consume",
            LapinError::Receive { .. } => "receive",
            LapinError::Publish { .. } => "publish",
            LapinError::Nacked { .. } => "nacked",
            LapinError::Returned { .. } => "returned",
            LapinError::ConfirmTimeout { .. } => "confirm_timeout",
            LapinError::Unavailable { .. } => "unavailable",
            LapinError::Blocked { .. } => "blocked",
            LapinError::HeadersTooLarge { .. } => "headers_too_large",
            LapinError::Invalid { .. } => "invalid",
        }
    }

    /// Wraps this error as the core's [`conveyor::Error::Subscribe`] for `queue` (by its
    /// first 64 characters if it is longer than AMQP allows).
    pub fn into_subscribe(self, queue: &str) -> conveyor::Error {
        conveyor::Error::Subscribe {
            queue: shown(queue).into_owned(),
            source: Box::new(self),
        }
    }

    /// Wraps this error as the core's publish error for `destination` (by its first 64
    /// characters if it is longer than AMQP allows): [`conveyor::Error::Refused`] for a
    /// message refused before it was sent ([`LapinError::Invalid`],
    /// [`LapinError::HeadersTooLarge`]), [`conveyor::Error::Publish`] for anything else.
    pub fn into_publish(self, destination: &str) -> conveyor::Error {
        let destination = shown(destination).into_owned();
        let source = Box::new(self);
        match *source {
            LapinError::Invalid { .. } | LapinError::HeadersTooLarge { .. } => {
                conveyor::Error::Refused {
                    destination,
                    source,
                }
            }
            _ => conveyor::Error::Publish {
                destination,
                source,
            },
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

/// Whether `error` is the broker's PRECONDITION_FAILED: a declaration that contradicts
/// the existing one (another queue type, other arguments).
pub(crate) fn is_precondition_failed(error: &lapin::Error) -> bool {
    use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
    matches!(
        error.kind(),
        lapin::ErrorKind::ProtocolError(e) if matches!(e.kind(), AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED))
    )
}

/// An AMQP short string (at most 255 bytes), or a typed error naming `what` it was for.
pub(crate) fn short(
    what: &'static str,
    value: &str,
) -> Result<lapin::types::ShortString, LapinError> {
    lapin::types::ShortString::try_new(value).map_err(|_| LapinError::Invalid {
        what,
        reason: format!(
            "`{}` is {} bytes long, over AMQP's {SHORT_STRING_LIMIT}-byte limit",
            shown(value),
            value.len()
        ),
    })
}

/// The longest AMQP short string (a queue, exchange, header name ...), in bytes.
const SHORT_STRING_LIMIT: usize = 255;

/// How many characters of a name too long for AMQP an error text quotes.
const SHOWN_PREFIX_CHARS: usize = 64;

/// `name` (a queue, exchange or header name, a routing key ...) as an error text quotes
/// it: whole if AMQP can take it (at most 255 bytes), else its first 64 characters and
/// `…`, cut at a character boundary, so that a megabyte-long name does not make a
/// megabyte-long error. Control characters are escaped, so the name stays on its line.
pub(crate) fn shown(name: &str) -> Cow<'_, str> {
    let max = if name.len() > SHORT_STRING_LIMIT {
        SHOWN_PREFIX_CHARS
    } else {
        usize::MAX
    };
    conveyor::kit::bounded(name, max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_quoted_whole_up_to_the_amqp_limit_and_cut_beyond() {
        let valid = "q".repeat(SHORT_STRING_LIMIT);
        assert_eq!(shown(&valid), valid.as_str());
        assert_eq!(shown(&"q".repeat(256)), format!("{}…", "q".repeat(64)));
        // Cut at a character boundary: 64 characters of two bytes each, then `…`.
        assert_eq!(shown(&"é".repeat(200)), format!("{}…", "é".repeat(64)));
        assert_eq!(shown("a\nb\u{1b}"), "a\\nb\\u{1b}");
    }

    #[test]
    fn a_name_too_long_for_amqp_is_quoted_by_its_start_with_its_length() {
        let name = "n".repeat(100_000);
        let text = short("header name", &name).unwrap_err().to_string();
        assert_eq!(
            text,
            format!(
                "invalid header name: `{}…` is 100000 bytes long, over AMQP's 255-byte limit",
                "n".repeat(64)
            )
        );
    }

    /// The client's errors the variants carry: a socket's, and the broker's refusal.
    fn io_failure() -> lapin::Error {
        std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused").into()
    }

    fn not_found() -> lapin::Error {
        use lapin::protocol::{AMQPError, AMQPErrorKind, AMQPSoftError};
        lapin::ErrorKind::ProtocolError(AMQPError::new(
            AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND),
            "NOT_FOUND - no exchange 'orders' in vhost '/'".into(),
        ))
        .into()
    }

    /// One error of each variant, those with a client error as their source with a cause
    /// of its own where the client gives one, by variant. The match below has no
    /// wildcard: a new variant does not compile until it is named there, and fails the
    /// count until it is made here.
    fn every_variant() -> Vec<(&'static str, LapinError)> {
        let url = "amqp://guest:***@127.0.0.1:5672/%2f".to_string();
        let errors = vec![
            LapinError::InvalidUrl {
                url: url.clone(),
                reason: "invalid port number".into(),
            },
            LapinError::Connect {
                url: url.clone(),
                source: io_failure(),
            },
            LapinError::ConnectTimeout {
                url,
                after: Duration::from_secs(5),
                waiting_for: "the connection to be accepted (TCP, and TLS for amqps://)",
            },
            LapinError::Channel {
                purpose: "publisher".into(),
                source: lapin::ErrorKind::InvalidConnectionState(lapin::ConnectionState::Closed)
                    .into(),
            },
            LapinError::Close {
                source: io_failure(),
            },
            LapinError::Declare {
                what: "exchange",
                name: "orders".into(),
                source: not_found(),
            },
            LapinError::MissingQueue {
                queue: "orders".into(),
            },
            LapinError::MissingExchange {
                exchange: "orders".into(),
            },
            LapinError::Consume {
                queue: "orders".into(),
                source: not_found(),
            },
            LapinError::Receive {
                queue: "orders".into(),
                source: io_failure(),
            },
            LapinError::Publish {
                destination: "orders".into(),
                source: not_found(),
            },
            LapinError::Nacked {
                destination: "orders".into(),
            },
            LapinError::Returned {
                destination: "orders".into(),
                code: 312,
                text: "NO_ROUTE".into(),
            },
            LapinError::ConfirmTimeout {
                destination: "orders".into(),
                after: Duration::from_secs(30),
            },
            LapinError::Unavailable {
                destination: "orders".into(),
                after: Duration::from_secs(30),
            },
            LapinError::Blocked {
                destination: "orders".into(),
                after: Duration::from_secs(30),
            },
            LapinError::HeadersTooLarge {
                destination: "orders".into(),
                size: 140_000,
                limit: 131_072,
            },
            LapinError::Invalid {
                what: "header name",
                reason: "`x` is 300 bytes long, over AMQP's 255-byte limit".into(),
            },
        ];
        let named: Vec<(&'static str, LapinError)> = errors
            .into_iter()
            .map(|error| {
                let variant = match &error {
                    LapinError::InvalidUrl { .. } => "InvalidUrl",
                    LapinError::Connect { .. } => "Connect",
                    LapinError::ConnectTimeout { .. } => "ConnectTimeout",
                    LapinError::Channel { .. } => "Channel",
                    LapinError::Close { .. } => "Close",
                    LapinError::Declare { .. } => "Declare",
                    LapinError::MissingQueue { .. } => "MissingQueue",
                    LapinError::MissingExchange { .. } => "MissingExchange",
                    LapinError::Consume { .. } => "Consume",
                    LapinError::Receive { .. } => "Receive",
                    LapinError::Publish { .. } => "Publish",
                    LapinError::Nacked { .. } => "Nacked",
                    LapinError::Returned { .. } => "Returned",
                    LapinError::ConfirmTimeout { .. } => "ConfirmTimeout",
                    LapinError::Unavailable { .. } => "Unavailable",
                    LapinError::Blocked { .. } => "Blocked",
                    LapinError::HeadersTooLarge { .. } => "HeadersTooLarge",
                    LapinError::Invalid { .. } => "Invalid",
                };
                (variant, error)
            })
            .collect();
        let mut variants: Vec<&str> = named.iter().map(|(variant, _)| *variant).collect();
        variants.sort_unstable();
        variants.dedup();
        assert_eq!(variants.len(), 18, "a variant is missing: {variants:?}");
        named
    }

    /// Every variant alone, and as every core error this crate wraps one in: the
    /// subscribe error, the publish error (`Refused` or `Publish`), and `From` (`Config`
    /// or `Transport`), by label.
    fn every_error() -> Vec<(String, conveyor::BoxError)> {
        let mut all: Vec<(String, conveyor::BoxError)> = Vec::new();
        type Wrap = fn(LapinError) -> conveyor::Error;
        let ways: [(&str, Wrap); 3] = [
            ("into_subscribe", |error| error.into_subscribe("orders")),
            ("into_publish", |error| error.into_publish("orders")),
            ("conveyor::Error::from", conveyor::Error::from),
        ];
        for (how, wrap) in ways {
            for (variant, error) in every_variant() {
                all.push((
                    format!("LapinError::{variant} {how}"),
                    Box::new(wrap(error)),
                ));
            }
        }
        for (variant, error) in every_variant() {
            all.push((format!("LapinError::{variant}"), Box::new(error)));
        }
        all
    }

    /// Every error this crate makes, and every core error it wraps one in, says each
    /// cause once: by `Display`, by its sources walked as anyhow does, by
    /// [`conveyor::Report`], and as the reason a handler's
    /// message is rejected with when the handler fails with it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_error_says_each_cause_once_however_it_is_shown() {
        let again = every_error().into_iter().map(|(_, error)| error).collect();
        conveyor_conformance::errors::assert_each_cause_said_once(every_error(), again).await;
    }

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
