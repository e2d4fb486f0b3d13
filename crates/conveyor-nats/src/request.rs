//! Request/reply: requests go to a queue with a reply inbox of NATS's own, one per
//! broker, that a task reads and matches to the waiting requests by correlation id (the
//! core's [`Requests`](conveyor::request::Requests)). The responder's reply is a plain
//! publish to that inbox; one that comes after its request gave up reaches no one.

use conveyor::request::{ReplyReader, Requester};
use conveyor::{Error, Message, Report};
use futures_util::StreamExt;

use crate::broker::NatsBroker;
use crate::error::NatsError;
use crate::headers;

/// A requester on a reply inbox of NATS's own, and the task reading it.
pub(crate) async fn open(broker: &NatsBroker) -> Result<Requester, Error> {
    let client = broker.client();
    let inbox = client.new_inbox();
    let mut replies = client
        .subscribe(inbox.clone())
        .await
        .map_err(|e| Error::Transport {
            transport: "nats",
            source: Box::new(NatsError::call("subscribe", &inbox, Report(&e))),
        })?;
    let reader = ReplyReader::spawn(|waiting| async move {
        while let Some(reply) = replies.next().await {
            let incoming = headers::incoming(reply.headers.as_ref()).headers;
            let Some(id) = incoming.get_str(conveyor::CORRELATION_ID_HEADER) else {
                tracing::debug!("dropping a reply with no correlation id");
                continue;
            };
            let id = id.to_string();
            waiting.deliver(&id, Message::received(reply.payload, incoming));
        }
    });
    Ok(Requester::new(inbox, reader))
}
