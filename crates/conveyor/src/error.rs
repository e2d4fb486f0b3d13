//! The crate's error type.

use std::fmt;

/// A boxed error from a transport, codec or handler, kept as the `source` of an [`Error`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can go wrong in Conveyor itself, each variant naming what failed and where.
///
/// Transports wrap their broker's errors in [`Error::Transport`], [`Error::Subscribe`] or
/// [`Error::Publish`], keeping the broker error as the `source`.
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

/// A `Result` whose error is Conveyor's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
