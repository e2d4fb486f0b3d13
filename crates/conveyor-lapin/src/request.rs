//! Request/reply on RabbitMQ, through direct reply-to: a requester consumes the
//! pseudo-queue `amq.rabbitmq.reply-to` (no queue is declared, per request or at all) on
//! the channel it publishes its requests on, and RabbitMQ routes each reply, published to
//! the address the request carries, straight to that channel.

use conveyor::request::ReplyReader;
use conveyor::{Message, Publisher};
use futures_util::StreamExt;
use lapin::options::BasicConsumeOptions;
use lapin::types::FieldTable;

use crate::broker::LapinBroker;
use crate::error::LapinError;
use crate::headers;
use crate::publisher::LapinPublisher;

/// The reply address a requester gives (RabbitMQ hands the responder a longer one, which
/// names the requester's channel).
pub(crate) const DIRECT_REPLY_TO: &str = "amq.rabbitmq.reply-to";

/// Whether `destination` is a direct reply-to address: a reply published there goes to
/// a requester's channel, or nowhere if it has gone.
pub(crate) fn is_reply_address(destination: &str) -> bool {
    destination.starts_with(DIRECT_REPLY_TO)
}

/// A broker's requests: a confirm-mode channel on the publishing connection that
/// publishes them and consumes their replies.
pub(crate) struct Requester {
    publisher: LapinPublisher,
    /// Hands each reply to its request, until the channel ends.
    pub(crate) reader: ReplyReader,
}

impl Requester {
    pub(crate) async fn open(broker: &LapinBroker) -> Result<Requester, LapinError> {
        let publisher = LapinPublisher::open_for(broker.clone(), "requests").await?;
        let mut consumer = publisher
            .channel
            .basic_consume(
                DIRECT_REPLY_TO.into(),
                format!("conveyor.replies.{}", std::process::id()).into(),
                // Direct reply-to takes no acks.
                BasicConsumeOptions {
                    no_ack: true,
                    ..BasicConsumeOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(|source| LapinError::Consume {
                queue: DIRECT_REPLY_TO.to_string(),
                source,
            })?;
        let channel = publisher.channel.clone();
        let reader = ReplyReader::spawn(|replies| async move {
            loop {
                match consumer.next().await {
                    Some(Ok(delivery)) => {
                        let headers = headers::received(&delivery.properties);
                        let reply = Message::received(delivery.data.into(), headers);
                        let correlation_id = reply.correlation_id().unwrap_or_default().to_string();
                        replies.deliver(&correlation_id, reply);
                    }
                    // Lapin recovers the channel (and this consumer) with the
                    // connection; requests waiting meanwhile time out.
                    Some(Err(error)) => {
                        if channel.wait_for_recovery(error).await.is_err() {
                            return;
                        }
                    }
                    None => return,
                }
            }
        });
        Ok(Requester { publisher, reader })
    }

    /// Closes its channel (a replaced requester's, which may be closed already).
    pub(crate) async fn close(&self) {
        let _ = self
            .publisher
            .channel
            .close(200, "requester replaced".into())
            .await;
    }

    /// Whether it can still carry requests and their replies.
    pub(crate) fn is_open(&self) -> bool {
        self.publisher.is_open() && self.reader.is_reading()
    }

    /// Publishes `message` to the queue `destination` with its reply address.
    pub(crate) async fn send(
        &self,
        destination: &str,
        mut message: Message,
        correlation_id: String,
    ) -> Result<(), conveyor::Error> {
        message.set_correlation_id(correlation_id);
        message.set_reply_to(DIRECT_REPLY_TO);
        self.publisher.publish(destination, message).await
    }
}
