//! The RabbitMQ transport of [Conveyor](conveyor), over [`lapin`].
//!
//! [`LapinBroker`] is this transport's [`conveyor::Broker`]: code written against
//! `B: Broker` (declare queues, publish, mount handlers, read depths and dead letters)
//! runs on RabbitMQ unchanged.
//!
//! - [`LapinBroker`] connects from a URL (`amqp://`, `amqps://` through rustls), keeps
//!   passwords out of logs and errors, and recovers a lost connection by itself:
//!   channels, declarations, prefetch windows and consumers come back, and
//!   subscriptions resume. It consumes on one connection and publishes on another, so
//!   a resource alarm that blocks publishing never stalls the acks.
//! - TLS: `amqps://` trusts the webpki roots; [`LapinBrokerBuilder::tls_ca_certificate`]
//!   adds a private CA (and [`LapinBrokerBuilder::tls_client_identity`] a client
//!   certificate).
//! - Queues are declared from the portable [`conveyor::QueueSpec`]; RabbitMQ's own
//!   settings (quorum queues, single active consumer, any argument, durability) go on
//!   it through the [`RabbitQueueSpec`] extension trait, which also says how the
//!   portable settings map (a `.fifo` name is a single-active-consumer queue; a
//!   dead-letter queue goes through the default exchange, and is a quorum queue's
//!   delivery limit; the visibility timeout is `x-consumer-timeout`; a queue-level delay
//!   is refused). [`ExchangeSpec`] and [`Binding`] declare the rest of the topology;
//!   [`ConsistentHash`] spreads keys over several queues on the server.
//! - [`LapinQueue`] (from [`LapinBroker::queue`], by name) is what a handler is mounted
//!   on. Subscribing checks the queue passively, so one declared with arguments keeps
//!   them, and declares it (durable, no arguments) only where it is missing. Its
//!   [`LapinSubscriber`] consumes on its own channel with a prefetch window (basic.qos)
//!   and manual acks, in the order the queue pushed.
//! - The partition key travels in the [`PARTITION_KEY_HEADER`] (`amqp-partition-key`),
//!   which [`conveyor::MessageBuilder::partition_key`] writes and lanes read.
//! - Publishing: the broker is a [`conveyor::Publisher`] to queues (through the default
//!   exchange), persistent, mandatory and confirmed, on a channel it opens on the first
//!   publish. [`LapinPublisher`] adds exchanges, routing keys and per-publish AMQP
//!   options ([`PublishOptions`]).
//! - Settlement: ack is `basic.ack`; release (a delivery never handled) is `basic.nack`
//!   with requeue. Retry republishes the message to its own queue with the attempt that
//!   just ended in [`ATTEMPTS_HEADER`], waits for the broker's confirm, then acks the
//!   original; retry-after does the same through the queue's delay queue (a per-message
//!   TTL that dead-letters back), or to the queue itself without one. Reject sends the
//!   message to the queue's dead-letter queue with its reason (see below). Only the
//!   republished message's own ack waits for the confirm: the acks and nacks of other
//!   deliveries go out meanwhile (with up to 1024 republishes of a subscription awaiting
//!   confirms at once), so a slow confirm never stalls the prefetch window, and closing
//!   the subscription waits for the confirms under way.
//!
//! Prefetch: the queue's ([`LapinQueue::prefetch`]) wins, then the broker's
//! ([`LapinBrokerBuilder::prefetch`]); without either, the window is twice what the
//! mount can hold (at least 16). Lanes or workers with a window of 1 take turns, and the subscriber warns
//! about it. A batch mount gets what the channel has already pushed, so its window must
//! be at least the batch size.
//!
//! What else to know:
//!
//! - Incoming AMQP properties appear among the delivery's headers as `content-type`,
//!   `message-id`, `correlation-id` and `priority`, beside the message's own headers
//!   (as on the in-process transport); so do a dead letter's.
//! - Attempts are counted on classic and quorum queues alike, so `max_attempts(n)`
//!   always ends in a reject: the receive count is the attempts a message already made
//!   ([`ATTEMPTS_HEADER`], written by retries) plus the queue's own count of this copy
//!   (a quorum queue's `x-delivery-count`, a classic queue's `redelivered` flag) plus
//!   one. A retried copy goes to the tail of the queue. A dead-letter queue's max
//!   receive count is enforced by the broker on quorum queues only (`x-delivery-limit`);
//!   a classic queue cannot count receives.
//! - **A key's order does not survive a shutdown mid-retry.** Sequential and lane mounts
//!   retry in place (the delivery stays unacked), so a key keeps its order across
//!   retries while the app runs. But a retry that draining hands back mid-retry (or one
//!   that would be held longer than the core's `MAX_IN_PLACE_HOLD`) is republished like
//!   any other, to the tail of the queue (through the delay queue, for what is left of
//!   its backoff): later messages of its key, already in the queue, are handled before
//!   it. RabbitMQ cannot hold a key's later messages back while one of them is away,
//!   as an SQS FIFO group does.
//! - A release may count as an attempt: the broker cannot tell a delivery released
//!   unhandled (draining, a connection loss) from one whose handler ran, so each release
//!   counts on a quorum queue; on a classic queue, a redelivered message (the
//!   `redelivered` flag) counts one attempt more however often it was released.
//! - Dead letters carry their reason when the subscription knows where the queue
//!   dead-letters: when this broker declared the queue with
//!   [`declare_queue`](LapinBroker::declare_queue) and a dead-letter queue (or a
//!   [`dead_letter_exchange`](RabbitQueueSpec::dead_letter_exchange)), a reject
//!   republishes the message there with the handler's or the policy's reason in
//!   [`conveyor::REJECT_REASON_HEADER`], without RabbitMQ's `x-death` /
//!   `x-first-death-*` / `x-last-death-*` headers (which a trip through the delay queue
//!   leaves saying `expired`) and without the attempt count, then acks the original.
//!   Otherwise (a queue declared by another process or another broker handle, or
//!   dead-lettering set by a policy) a reject is `basic.nack` without requeue: the
//!   broker dead-letters the message with its own `x-death` header and no reason (the
//!   reason is logged).
//! - A delivery whose channel died (a lost connection) is never republished: the broker
//!   delivers the original again, so a copy would be a duplicate. Its settlement is
//!   dropped.
//! - Draining (`RunningApp::stop_receiving`, or the start of a shutdown) cancels the
//!   consumer and hands every delivery waiting in the prefetch window back to the queue
//!   at once, while handlers in flight finish and are settled on the same channel.
//! - A [`Message`](conveyor::Message) with a delivery delay is refused: plain RabbitMQ has
//!   no per-message delay (retry-after uses the delay queue instead).
//! - Checking for a queue that does not exist (a subscription to a queue not declared
//!   yet, a missing dead-letter queue) closes the channel it was checked on, which lapin
//!   logs as an error; Conveyor checks on a channel of its own, then carries on.
//! - `connect` keeps trying for 30 s ([`LapinBrokerBuilder::first_connect_timeout`]),
//!   then fails with the cause, so a service started without its broker says why:
//!   [`LapinError::Connect`] with the last refusal (`connection refused`, a TLS failure,
//!   a refused login, which fails at once) or [`LapinError::ConnectTimeout`] when the
//!   broker did not answer (no TCP connection, or no answer to the AMQP handshake). A
//!   failed first connect stops everything it started: no attempt, connection or lapin
//!   thread outlives it. After that, a lost connection is reconnected for as long as it
//!   takes, backing off from 100 ms to 30 s, and lapin recovers the channels
//!   (`enable_auto_recover`). One limit: lapin gives recovery up after 500 reconnects in
//!   a row whose AMQP handshake failed once the TCP connection was open (a load balancer
//!   or sidecar that accepts connections while the broker is down, a refused login),
//!   which at the dialer's pace takes some hours; the connection then stays down, and
//!   the mounts on it end with an error, stopping the app for its supervisor to
//!   restart. A reconnect whose AMQP handshake gets no answer within 10 s (RabbitMQ's
//!   own `handshake_timeout`;
//!   [`reconnect_handshake_timeout`](LapinBrokerBuilder::reconnect_handshake_timeout))
//!   is cut and tried again: a load balancer may accept the connection with no broker
//!   behind it. Queues the broker deletes with
//!   the connection (exclusive ones this broker declared) are declared again, empty. A
//!   publish waits for the recovery at most its confirm timeout, then fails with
//!   [`LapinError::Unavailable`].
//! - **lapin 4.12.3 does not always reconnect**: its I/O loop spins for ever on frames
//!   left unsent by a cut (most cuts under load), or sleeps through a skipped internal
//!   command, and a reconnect whose handshake was closed early makes the next one fail;
//!   and when one confirm covers several publishes, it can give one publish another's
//!   return. This workspace builds lapin with small fixes through `[patch.crates-io]`
//!   (`vendor/lapin/PATCHED.md` in the repository); a service using this crate needs
//!   the same patch until a lapin release has them.
//! - A message whose AMQP properties and headers are over the connection's frame limit
//!   (`frame_max`, 128 KiB by default) is refused at publish time with
//!   [`LapinError::HeadersTooLarge`]: AMQP cannot split a header frame, and the broker
//!   would close the whole connection over it, every delivery in flight on it coming
//!   again. (A retry or dead letter whose headers grew over the limit is requeued, or
//!   nacked to the broker's dead-lettering, instead of republished.)
//! - A body over the broker's `max_message_size` (128 MiB by default, 16 MiB from
//!   RabbitMQ 4.0) fails its publish with the broker's reason; the limit is not
//!   negotiated, so only the broker can tell. The next publish goes through on a new
//!   channel.
//! - **lapin prints the password at TRACE**: its I/O loop logs each frame it writes, the
//!   login (`Connection.StartOk`, whose SASL response holds the password as a list of
//!   bytes) included. It logs from its own thread, through the global subscriber, so
//!   only the subscriber you install can filter it: give its layers
//!   `hide_credentials()` (a per-layer filter, with the `tracing-filter` feature), which
//!   drops just the events that can hold a credential, or add the
//!   [`HIDE_CREDENTIALS_DIRECTIVES`] to an `EnvFilter` (`RUST_LOG`), which drops every
//!   outgoing frame. Below TRACE, nothing needs filtering.
//!
//! ```no_run
//! use conveyor::{App, Json, PartitionKey, QueueSpec};
//! use conveyor_lapin::{LapinBroker, RabbitQueueSpec};
//!
//! #[derive(serde::Deserialize)]
//! struct Order { id: u64 }
//!
//! async fn place(Json(order): Json<Order>, key: PartitionKey) {
//!     println!("{key}: {}", order.id);
//! }
//!
//! # async fn f() -> Result<(), conveyor::Error> {
//! let broker = LapinBroker::connect("amqp://guest:guest@127.0.0.1:5672/%2f").await?;
//! broker.declare_queue(&QueueSpec::new("orders.dead").quorum()).await?;
//! broker
//!     .declare_queue(&QueueSpec::new("orders").dead_letter_queue("orders.dead", 10).quorum())
//!     .await?;
//! App::new("orders")
//!     .broker(broker.clone())
//!     .mount(broker.queue("orders"), place, |m| m.workers(4).by_key())
//!     .run()
//!     .await
//! # }
//! ```
#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]

mod ack_window;
mod amqp;
mod broker;
mod consistent_hash;
mod copy;
mod dialer;
mod error;
mod headers;
mod publisher;
mod queue;
mod redeclare;
mod request;
mod settle;
mod spec;
mod subscriber;
mod tls;
mod topology;
mod trace_filter;
mod url;

pub use amqp::amqp_properties;
pub use broker::{
    DEFAULT_CONFIRM_TIMEOUT, DEFAULT_FIRST_CONNECT_TIMEOUT, DEFAULT_RECONNECT_HANDSHAKE_TIMEOUT,
    LapinBroker, LapinBrokerBuilder,
};
pub use consistent_hash::ConsistentHash;
pub use copy::fresh_copy;
pub use error::LapinError;
pub use headers::{ATTEMPTS_HEADER, DELIVERY_COUNT_HEADER, PARTITION_KEY_HEADER};
pub use publisher::{LapinPublisher, PublishOptions};
pub use queue::LapinQueue;
pub use spec::RabbitQueueSpec;
pub use subscriber::LapinSubscriber;
pub use topology::{ArgumentValue, Binding, ExchangeSpec, ExchangeType};
pub use trace_filter::HIDE_CREDENTIALS_DIRECTIVES;
#[cfg(feature = "tracing-filter")]
pub use trace_filter::{HideCredentials, hide_credentials};
pub use url::redact_url;

/// The `lapin` this crate is built on, for the AMQP types of [`amqp_properties`] and
/// [`LapinBroker::publish_amqp`].
pub use lapin;
