//! The crate's error type.

use std::fmt;

/// A boxed error from a transport, codec or handler, kept as the `source` of an [`Error`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can go wrong in Conveyor itself, each variant naming what failed and where.
///
/// Transports wrap their broker's errors in [`Error::Transport`], [`Error::Subscribe`],
/// [`Error::Publish`] or [`Error::Refused`], keeping the broker error as the `source`, so
/// it can be downcast.
///
/// As the Rust error convention has it, `Display` says what failed and where ("cannot
/// publish to `q`"), and the cause is the [`source`](std::error::Error::source), never
/// both, so a reporter that walks the sources (anyhow's `{:#}`, eyre, `tracing`'s error
/// recording, [`Report`]) shows each cause once: "cannot publish to `q`: 24 message
/// attributes; SQS carries at most 10". To log one whole, use `%Report(&error)`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A subscription could not start (queue missing, broker unreachable, bad settings).
    #[error("cannot subscribe to queue `{queue}`")]
    Subscribe {
        /// The queue the subscription was for.
        queue: String,
        /// Why it failed.
        #[source]
        source: BoxError,
    },
    /// A message could not be published.
    #[error("cannot publish to `{destination}`")]
    Publish {
        /// The queue, exchange or topic the message was for.
        destination: String,
        /// Why it failed.
        #[source]
        source: BoxError,
    },
    /// A message the transport refused before sending it, because the broker cannot carry
    /// it as it is: too large where the transport can tell (SQS's size limit, AMQP's
    /// frame limit on headers), too many headers or attributes, a delay the broker cannot
    /// do, a name too long. It was not sent (nor, on RabbitMQ and SQS, which check a
    /// whole batch first, any message of its batch; a publisher that sends a batch one
    /// message at a time, as SNS's does, may have sent those before it), and sending it
    /// again as it is fails the same way, so code that retries publishes can set it
    /// aside instead (the outbox relay does,
    /// [`OutboxStore::set_aside`](crate::outbox::OutboxStore::set_aside)). A failure of
    /// the broker or the connection is [`Error::Publish`], and so is what only the broker
    /// can refuse, after the message was sent: a body over RabbitMQ's `max_message_size`,
    /// which AMQP does not negotiate, say.
    ///
    /// ```
    /// # async fn f(broker: conveyor::MemoryBroker) {
    /// use conveyor::{Error, Publisher};
    ///
    /// match broker.publish_json("orders", &7u64).await {
    ///     Ok(()) => {}
    ///     Err(Error::Refused { .. }) => { /* fix the message: it never goes as it is */ }
    ///     Err(_) => { /* try again later */ }
    /// }
    /// # }
    /// ```
    #[error("cannot publish to `{destination}`")]
    Refused {
        /// The queue, exchange or topic the message was for.
        destination: String,
        /// Why the transport cannot send it.
        #[source]
        source: BoxError,
    },
    /// A payload could not be encoded before publishing.
    #[error("cannot encode payload as {format}")]
    Encode {
        /// The format that was asked for (`json`, ...).
        format: &'static str,
        /// The codec's error.
        #[source]
        source: BoxError,
    },
    /// A broker connection or channel failed outside a subscribe or publish call.
    #[error("transport `{transport}` failed")]
    Transport {
        /// Which transport (`memory`, `rabbitmq`, `sqs`).
        transport: &'static str,
        /// The broker's error.
        #[source]
        source: BoxError,
    },
    /// A subscription ended while the app was still running (its queue was deleted, or
    /// its transport gave up).
    #[error("the subscription to queue `{queue}` ended while the app was running")]
    SubscriptionEnded {
        /// The queue.
        queue: String,
    },
    /// A mount's task died outside any handler (a panic in a transport, say).
    #[error("a mount's task failed: {0}")]
    MountTask(String),
    /// The app or a mount was configured in a way that cannot work; the message says how.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A handler needs `State<T>` that the app was never given with `with_state`.
    #[error(
        "the handler mounted on `{queue}` needs `State<{type_name}>`, but the app has no such state; add it with `App::with_state`"
    )]
    MissingState {
        /// The queue the handler is mounted on.
        queue: String,
        /// The Rust type of the missing state.
        type_name: &'static str,
    },
    /// The harness waited for a condition that did not come true in time.
    #[error("timed out after {after:?} waiting for {what}")]
    Timeout {
        /// What was being waited for.
        what: String,
        /// How long it waited.
        after: std::time::Duration,
    },
}

impl Error {
    /// Shorthand for [`Error::Config`].
    pub fn config(message: impl fmt::Display) -> Self {
        Error::Config(message.to_string())
    }
}

/// Shows an error and its causes on one line, joined by `: `, as anyhow's `{:#}` does.
/// A cause whose text is already shown after the causes before it is skipped, so an
/// error of another crate that quotes its own source is still shown once. For logging
/// any error whole: `tracing::warn!(error = %Report(&error), ...)`.
///
/// ```
/// use conveyor::Report;
///
/// let io = std::io::Error::other("refused");
/// let error = conveyor::Error::Transport { transport: "x", source: Box::new(io) };
/// assert_eq!(Report(&error).to_string(), "transport `x` failed: refused");
/// ```
pub struct Report<'a>(pub &'a (dyn std::error::Error + 'static));

impl fmt::Display for Report<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut shown = self.0.to_string();
        // Where the next cause's text is looked for: from the start of the last one found
        // or written, since a chain is shown in order and a cause may quote its source.
        let mut searched_from = 0;
        let mut next = self.0.source();
        while let Some(cause) = next {
            let text = cause.to_string();
            match shown.get(searched_from..).and_then(|rest| rest.find(&text)) {
                Some(at) => searched_from += at,
                None => {
                    shown.push_str(": ");
                    searched_from = shown.len();
                    shown.push_str(&text);
                }
            }
            next = cause.source();
        }
        f.write_str(&shown)
    }
}

/// A `Result` whose error is Conveyor's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("connection refused")]
    struct Refused;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot connect")]
    struct Connect(#[source] Refused);

    #[derive(Debug, thiserror::Error)]
    #[error("io: connection refused")]
    struct Quoting(#[source] Refused);

    #[test]
    fn display_says_what_failed_and_source_keeps_the_cause() {
        let error = Error::Publish {
            destination: "q".into(),
            source: Box::new(Connect(Refused)),
        };
        assert_eq!(error.to_string(), "cannot publish to `q`");
        let source = std::error::Error::source(&error).expect("a source");
        assert!(source.downcast_ref::<Connect>().is_some());
    }

    #[test]
    fn a_report_shows_each_cause_once_even_one_its_error_quotes() {
        let error = Error::Publish {
            destination: "q".into(),
            source: Box::new(Connect(Refused)),
        };
        assert_eq!(
            Report(&error).to_string(),
            "cannot publish to `q`: cannot connect: connection refused"
        );
        // An error of another crate that quotes its source: the source is shown once.
        let error = Error::Transport {
            transport: "rabbitmq",
            source: Box::new(Quoting(Refused)),
        };
        assert_eq!(
            Report(&error).to_string(),
            "transport `rabbitmq` failed: io: connection refused"
        );
    }

    /// One error of each variant, those with a source with a cause of its own. The
    /// match has no wildcard: a new variant does not compile until it is named there.
    fn every_variant() -> Vec<(&'static str, Error)> {
        let cause = || -> BoxError { Box::new(Connect(Refused)) };
        let errors = vec![
            Error::Subscribe {
                queue: "q".into(),
                source: cause(),
            },
            Error::Publish {
                destination: "q".into(),
                source: cause(),
            },
            Error::Refused {
                destination: "q".into(),
                source: cause(),
            },
            Error::Encode {
                format: "json",
                source: cause(),
            },
            Error::Transport {
                transport: "x",
                source: cause(),
            },
            Error::SubscriptionEnded { queue: "q".into() },
            Error::MountTask("the task panicked".into()),
            Error::config("a zero batch size"),
            Error::MissingState {
                queue: "q".into(),
                type_name: "Db",
            },
            Error::Timeout {
                what: "the queue to drain".into(),
                after: std::time::Duration::from_secs(1),
            },
        ];
        errors
            .into_iter()
            .map(|error| {
                let variant = match &error {
                    Error::Subscribe { .. } => "Subscribe",
                    Error::Publish { .. } => "Publish",
                    Error::Refused { .. } => "Refused",
                    Error::Encode { .. } => "Encode",
                    Error::Transport { .. } => "Transport",
                    Error::SubscriptionEnded { .. } => "SubscriptionEnded",
                    Error::MountTask(_) => "MountTask",
                    Error::Config(_) => "Config",
                    Error::MissingState { .. } => "MissingState",
                    Error::Timeout { .. } => "Timeout",
                };
                (variant, error)
            })
            .collect()
    }

    /// Panics if a part of `text` (between `: `) comes twice.
    fn assert_each_part_once(label: &str, text: &str) {
        let parts: Vec<&str> = text.split(": ").collect();
        for (i, part) in parts.iter().enumerate() {
            assert!(
                !parts[i + 1..].contains(part),
                "{label}: `{part}` twice in: {text}"
            );
        }
    }

    #[test]
    fn every_error_shows_its_cause_by_source_alone_and_each_cause_once() {
        let decode = crate::DecodeError::new("json", Connect(Refused));
        let mut all: Vec<(&str, &(dyn std::error::Error + 'static))> = Vec::new();
        let variants = every_variant();
        for (variant, error) in &variants {
            all.push((variant, error));
        }
        all.push(("DecodeError", &decode));
        for (label, error) in all {
            // The sources walked one by one, as anyhow's `{:#}` does.
            let mut walked = error.to_string();
            let mut next = error.source();
            while let Some(cause) = next {
                assert!(
                    !walked.contains(&cause.to_string()),
                    "{label} shows its source in `Display` too: {walked}"
                );
                walked = format!("{walked}: {cause}");
                next = cause.source();
            }
            assert_each_part_once(label, &walked);
            assert_eq!(Report(error).to_string(), walked, "{label}");
        }
    }
}
