//! A handler's result as messages: published, and taken by the broker, before the
//! delivery that produced them is settled.
//!
//! A handler returns a [`Message`] (or an [`Output`], a message with its own
//! destination), an `Option` of one, a `Vec` of them, or a `Result` of any of these. They
//! go to the mount's [`publish_to`](crate::MountOptions::publish_to) destination (or,
//! on a mount without one, when the delivery is a request, to its reply address under
//! its correlation id: see [`crate::request`]; a reply that cannot be sent is dropped
//! with a warning, and the requester times out), through
//! the publisher of the broker the mount consumes from (or the one given to
//! [`publish_via`](crate::MountOptions::publish_via)), one after another, each confirmed
//! before the next. Only then is the input acked. If a publish fails, the run fails: the
//! input follows the mount's failure policy and is never acked. A message with nowhere to
//! go (no destination of its own, no `publish_to`, no reply address) fails the run before
//! any of the handler's messages is sent.
//!
//! That makes a pipeline at least once, end to end. A crash after the outputs were taken
//! and before the input's ack brings the input back, and its outputs are published again:
//! the next stage may see a duplicate. Each output carries the input's message id in
//! [`CAUSATION_ID_HEADER`] (and, unless it sets its own, the input's correlation id and
//! partition key), so the next stage can tell, and a keyed flow keeps its order across
//! services.
//!
//! ```
//! use conveyor::{App, Json, MemoryBroker, Message};
//!
//! #[derive(serde::Deserialize, serde::Serialize)]
//! struct Order { id: u64 }
//!
//! /// Every order becomes an invoice request, published before the order is acked.
//! async fn invoice(Json(order): Json<Order>) -> Result<Message, conveyor::Error> {
//!     Message::json(&order)
//! }
//!
//! let broker = MemoryBroker::new();
//! let app = App::new("billing")
//!     .mount(broker.queue("orders"), invoice, |m| m.publish_to("invoices"));
//! ```

use std::future::Future;

use crate::delivery::Delivery;
use crate::error::{BoxError, Error};
use crate::extract::Context;
use crate::message::{CORRELATION_ID_HEADER, Message, REPLY_TO_HEADER};
use crate::outcome::{IntoOutcome, Outcome};
use crate::route::Route;
use crate::transport::{Publisher, SharedPublisher};

/// The header an output carries the message id of the delivery that produced it in.
pub const CAUSATION_ID_HEADER: &str = "causation-id";

/// A message a handler returns, with where it goes: the mount's
/// [`publish_to`](crate::MountOptions::publish_to) destination, or its own.
///
/// ```
/// use conveyor::{Message, Output};
///
/// let audit = Output::to("audit", Message::new("order 7 paid"));
/// assert_eq!(audit.destination(), Some("audit"));
/// ```
#[derive(Clone, Debug)]
pub struct Output {
    destination: Option<String>,
    message: Message,
}

impl Output {
    /// `message`, to the mount's destination.
    pub fn new(message: Message) -> Self {
        Output {
            destination: None,
            message,
        }
    }

    /// `message`, to `destination` (a queue, or what the transport's publisher takes).
    pub fn to(destination: impl Into<String>, message: Message) -> Self {
        Output {
            destination: Some(destination.into()),
            message,
        }
    }

    /// Its own destination, if it has one.
    pub fn destination(&self) -> Option<&str> {
        self.destination.as_deref()
    }

    /// The message.
    pub fn message(&self) -> &Message {
        &self.message
    }
}

impl From<Message> for Output {
    fn from(message: Message) -> Self {
        Output::new(message)
    }
}

/// What a handler's run decided: its outcome, and the messages to publish before the
/// delivery is settled. Made by [`IntoReply`]; a handler returns it directly only to
/// publish messages with an outcome other than ack.
///
/// ```
/// use conveyor::{Message, Outcome, Reply};
///
/// // Tell the audit queue, and dead-letter the input.
/// let reply = Reply::new(Outcome::Reject).publish(conveyor::Output::to("audit", Message::new("refused")));
/// ```
#[derive(Debug)]
pub struct Reply {
    outcome: Outcome,
    outputs: Outputs,
}

/// No output, one, or several: one output needs no `Vec`.
#[derive(Debug, Default)]
enum Outputs {
    #[default]
    None,
    One(Output),
    Many(Vec<Output>),
}

impl Reply {
    /// `outcome`, with no message to publish.
    pub fn new(outcome: Outcome) -> Self {
        Reply {
            outcome,
            outputs: Outputs::None,
        }
    }

    /// Adds a message to publish (in the order added) before the delivery is settled.
    pub fn publish(mut self, output: impl Into<Output>) -> Self {
        let output = output.into();
        self.outputs = match self.outputs {
            Outputs::None => Outputs::One(output),
            Outputs::One(first) => Outputs::Many(vec![first, output]),
            Outputs::Many(mut all) => {
                all.push(output);
                Outputs::Many(all)
            }
        };
        self
    }

    fn with_outputs(outputs: impl IntoIterator<Item = impl Into<Output>>) -> Self {
        outputs
            .into_iter()
            .fold(Reply::new(Outcome::Ack), Reply::publish)
    }
}

/// What a handler returns: anything [`IntoOutcome`] (`()`, an [`Outcome`], a `Result`
/// of one), or messages to publish, then ack: a [`Message`], an [`Output`], an `Option`
/// or a `Vec` of either, a [`Reply`], or a `Result` of any of these (the error goes to
/// the failure policy, and nothing is published).
pub trait IntoReply: Sized {
    /// The outcome and the messages, or the handler's error.
    ///
    /// # Errors
    ///
    /// The handler's error, for the mount's failure policy.
    fn into_reply(self) -> Result<Reply, BoxError>;

    /// Runs `run` (the handler's call), publishes the messages it returns for
    /// `delivery`, then gives the outcome. For a type that never holds messages this is
    /// the run alone: a handler that returns one pays nothing for publishing.
    #[doc(hidden)]
    fn run_and_publish<'a>(
        run: impl Future<Output = Self> + Send + 'a,
        delivery: &'a Delivery,
        cx: &'a Context,
    ) -> impl Future<Output = Result<Outcome, BoxError>> + Send + 'a {
        async move {
            let reply = run.await.into_reply();
            publish(reply?, delivery, cx).await
        }
    }
}

impl<T: IntoOutcome> IntoReply for T {
    fn into_reply(self) -> Result<Reply, BoxError> {
        self.into_outcome().map(Reply::new)
    }

    // Not an `async fn`: that would keep the delivery and context, unused, in the state
    // of every handler's run.
    #[allow(clippy::manual_async_fn)]
    fn run_and_publish<'a>(
        run: impl Future<Output = Self> + Send + 'a,
        _: &'a Delivery,
        _: &'a Context,
    ) -> impl Future<Output = Result<Outcome, BoxError>> + Send + 'a {
        async move { run.await.into_outcome() }
    }
}

impl IntoReply for Reply {
    fn into_reply(self) -> Result<Reply, BoxError> {
        Ok(self)
    }
}

impl IntoReply for Message {
    fn into_reply(self) -> Result<Reply, BoxError> {
        Ok(Reply::new(Outcome::Ack).publish(self))
    }
}

impl IntoReply for Output {
    fn into_reply(self) -> Result<Reply, BoxError> {
        Ok(Reply::new(Outcome::Ack).publish(self))
    }
}

impl<M: Into<Output>> IntoReply for Option<M> {
    fn into_reply(self) -> Result<Reply, BoxError> {
        Ok(Reply::with_outputs(self))
    }
}

impl<M: Into<Output>> IntoReply for Vec<M> {
    fn into_reply(self) -> Result<Reply, BoxError> {
        Ok(Reply::with_outputs(self))
    }
}

/// `Result`s of the publishing types (`Result<T: IntoOutcome, E>` is [`IntoOutcome`]).
macro_rules! result_into_reply {
    ($($ty:ty $(, $m:ident)?);*) => {$(
        impl<$($m: Into<Output>,)? E: Into<BoxError>> IntoReply for Result<$ty, E> {
            fn into_reply(self) -> Result<Reply, BoxError> {
                self.map_err(Into::into)?.into_reply()
            }
        }
    )*};
}

result_into_reply!(Reply; Message; Output; Option<M>, M; Vec<M>, M);

/// Why a handler's outputs were not published.
#[derive(Debug, thiserror::Error)]
enum OutputError {
    #[error(
        "the handler returned a message with no destination: set `MountOptions::publish_to` or return an `Output::to`"
    )]
    NoDestination,
    #[error(
        "the handler returned messages, but this mount's source has no publisher: set `MountOptions::publish_via`"
    )]
    NoPublisher,
    #[error("publishing the handler's output to `{destination}`")]
    Publish {
        destination: String,
        #[source]
        source: Error,
    },
}

/// Publishes `reply`'s messages in order, for `delivery`, each taken by the broker before
/// the next (messages in a row to one destination go as one batch); gives the outcome
/// once all are. Nothing is sent unless every message has a destination and a publisher.
pub(crate) async fn publish(
    reply: Reply,
    delivery: &Delivery,
    cx: &Context,
) -> Result<Outcome, BoxError> {
    let Reply { outcome, outputs } = reply;
    let route = cx.route();
    match outputs {
        Outputs::None => {}
        Outputs::One(output) => {
            let (destination, message, reply) = prepare(output, delivery, route)?;
            let publisher = route.publisher(reply)?;
            let sent = publisher
                .publish(&destination, message)
                .await
                .map_err(|source| OutputError::publish(&destination, source));
            settle_send(sent, reply)?;
        }
        Outputs::Many(outputs) => {
            // Every output is routed, and its publisher found, before any is sent: a run
            // that cannot succeed (an output with nowhere to go) would otherwise send the
            // outputs before that one again at each attempt.
            let prepared = outputs
                .into_iter()
                .map(|output| {
                    let (destination, message, reply) = prepare(output, delivery, route)?;
                    Ok((destination, message, reply, route.publisher(reply)?))
                })
                .collect::<Result<Vec<_>, OutputError>>()?;
            // Consecutive messages to one destination go as one batch.
            let mut run: Vec<Message> = Vec::new();
            let mut run_to: Option<(String, bool, &SharedPublisher)> = None;
            for (destination, message, reply, publisher) in prepared {
                if let Some((to, reply, publisher)) = run_to.take_if(|(to, ..)| *to != destination)
                {
                    let sent = send_batch(publisher, &to, std::mem::take(&mut run)).await;
                    settle_send(sent, reply)?;
                }
                run_to = Some((destination, reply, publisher));
                run.push(message);
            }
            if let Some((to, reply, publisher)) = run_to {
                settle_send(send_batch(publisher, &to, run).await, reply)?;
            }
        }
    }
    Ok(outcome)
}

impl Route {
    /// The publisher for a message to `destination`, for `delivery`: a reply goes back
    /// through the broker the request came from, anything else through `publish_via`'s
    /// if there is one.
    fn publisher(&self, reply: bool) -> Result<&SharedPublisher, OutputError> {
        let (first, second) = if reply {
            (&self.own, &self.via)
        } else {
            (&self.via, &self.own)
        };
        first
            .as_ref()
            .or(second.as_ref())
            .ok_or(OutputError::NoPublisher)
    }
}

impl OutputError {
    fn publish(destination: &str, source: Error) -> Self {
        OutputError::Publish {
            destination: destination.to_string(),
            source,
        }
    }
}

/// What a failed send means for the run: an output's failure fails it; a reply's is
/// dropped with a warning (the requester may be gone, and its timeout stands for the
/// reply), so that a handled request is not run again for it.
fn settle_send(sent: Result<(), OutputError>, reply: bool) -> Result<(), OutputError> {
    match sent {
        Err(error) if reply => {
            tracing::warn!(error = %crate::Report(&error), "dropping a reply that could not be sent");
            Ok(())
        }
        sent => sent,
    }
}

async fn send_batch(
    publisher: &SharedPublisher,
    destination: &str,
    messages: Vec<Message>,
) -> Result<(), OutputError> {
    publisher
        .publish_batch(destination, messages)
        .await
        .map_err(|source| OutputError::publish(destination, source))
}

/// Where `output` goes, the message with what it inherits from `delivery` (its partition
/// key and correlation id unless it has its own, and its message id as the causation
/// id), and whether it is a reply.
fn prepare(
    output: Output,
    delivery: &Delivery,
    route: &Route,
) -> Result<(String, Message, bool), OutputError> {
    let Output {
        destination,
        mut message,
    } = output;
    let correlation_id = delivery.headers().get_str(CORRELATION_ID_HEADER);
    let reply_to = delivery.headers().get_str(REPLY_TO_HEADER);
    // The output's own destination, else the mount's: a reply address that a producer
    // set cannot divert a pipeline's outputs. A mount with neither answers requests.
    let (destination, reply) = match (destination, route.destination.as_deref(), reply_to) {
        (Some(destination), _, _) => (destination, false),
        (None, Some(destination), _) => (destination.to_string(), false),
        // A reply: to the requester, under the request's correlation id, which is how
        // the requester knows it.
        (None, None, Some(reply_to)) => {
            if let Some(id) = correlation_id {
                message.set_correlation_id(id);
            }
            (reply_to.to_string(), true)
        }
        (None, None, None) => return Err(OutputError::NoDestination),
    };
    message.inherit(delivery.partition_key(), correlation_id);
    if let Some(cause) = delivery.message_id() {
        if !message.headers().contains(CAUSATION_ID_HEADER) {
            message
                .headers_mut()
                .insert(CAUSATION_ID_HEADER, cause.to_string());
        }
    }
    Ok((destination, message, reply))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_that_cannot_be_sent_is_dropped_and_an_output_fails_the_run() {
        let failed = || Err(OutputError::publish("q", Error::config("away")));
        assert!(settle_send(failed(), true).is_ok());
        assert!(settle_send(failed(), false).is_err());
    }
}
