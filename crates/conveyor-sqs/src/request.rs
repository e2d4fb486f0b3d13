//! Request/reply on SQS: one reply queue per requester (a broker), made by its first
//! request and deleted when the broker closes. Each request carries the queue's URL as
//! its reply address and a correlation id; one task long-polls the reply queue, hands
//! each reply to its request, and deletes what it received in one batch call.
//!
//! What a request costs, in SQS requests: its `SendMessage`; the responder's share of a
//! `ReceiveMessage` and a `DeleteMessageBatch` (up to ten messages each) and its reply's
//! `SendMessage`; and the requester's share of a `ReceiveMessage` and a
//! `DeleteMessageBatch` on the reply queue. Under load that is about 2.4 requests per
//! request; one at a time, about 6, plus the reply queue's empty long polls while it is
//! idle (one per wait time, 20 s by default: about 4,300 a day).

use std::sync::Arc;
use std::time::Duration;

use aws_sdk_sqs::Client;
use conveyor::request::{Replies, ReplyReader};
use conveyor::{Message, Publisher};

use crate::attributes;
use crate::broker::{Settings, SqsBroker};
use crate::calls::delete_batch;
use crate::error::SqsError;
use crate::queue::QueueInfo;

/// A broker's requests: its reply queue, and the task reading it.
pub(crate) struct Requester {
    queue: Arc<QueueInfo>,
    pub(crate) reader: ReplyReader,
}

impl Requester {
    /// Makes the reply queue and starts reading it.
    pub(crate) async fn open(broker: &SqsBroker) -> Result<Requester, SqsError> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_nanos());
        let name = format!("conveyor-replies-{:x}-{nanos:x}", std::process::id());
        broker
            .client()
            .create_queue()
            .queue_name(&name)
            .send()
            .await
            .map_err(|e| SqsError::call("CreateQueue", &name, e))?;
        let queue = broker.resolve(&name).await?;
        // The task holds the client, not the broker: the broker holds this requester,
        // whose drop stops the task.
        let (client, settings) = (broker.client().clone(), broker.settings().clone());
        let reader = ReplyReader::spawn(|replies| read(client, settings, queue.clone(), replies));
        Ok(Requester { queue, reader })
    }

    /// Publishes `message` to `destination` with the reply queue as its reply address.
    pub(crate) async fn send(
        &self,
        broker: &SqsBroker,
        destination: &str,
        mut message: Message,
        correlation_id: String,
    ) -> Result<(), conveyor::Error> {
        message.set_correlation_id(correlation_id);
        message.set_reply_to(self.queue.url.as_str());
        broker.publish(destination, message).await
    }

    /// Stops reading and deletes the reply queue.
    pub(crate) async fn close(&self, broker: &SqsBroker) -> Result<(), SqsError> {
        self.reader.stop();
        broker
            .client()
            .delete_queue()
            .queue_url(&self.queue.url)
            .send()
            .await
            .map(|_| ())
            .map_err(|e| SqsError::call("DeleteQueue", &self.queue.name, e))
    }
}

/// Receives replies until the requester closes: each goes to its request (or, late, is
/// dropped), and what a receive brought is deleted in one call.
async fn read(client: Client, settings: Settings, queue: Arc<QueueInfo>, replies: Arc<Replies>) {
    loop {
        let received = client
            .receive_message()
            .queue_url(&queue.url)
            .max_number_of_messages(10)
            .wait_time_seconds(i32::try_from(settings.wait_time.as_secs()).unwrap_or(20))
            .message_attribute_names("All")
            .customize()
            .config_override(settings.long_poll())
            .send()
            .await;
        let messages = match received {
            Ok(output) => output.messages.unwrap_or_default(),
            Err(error) => {
                let error = SqsError::call("ReceiveMessage", &queue.name, error);
                tracing::warn!(error = %conveyor::Report(&error), "receiving replies failed; trying again");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let mut receipts = Vec::with_capacity(messages.len());
        for message in &messages {
            let (payload, headers, _) = attributes::decode(message);
            let reply = Message::received(payload, headers);
            let correlation_id = reply.correlation_id().unwrap_or_default().to_string();
            replies.deliver(&correlation_id, reply);
            receipts.extend(message.receipt_handle.clone());
        }
        // Undeleted replies come again after the visibility timeout, and find no
        // request waiting.
        if !receipts.is_empty()
            && let Err(error) = delete_batch(&client, &queue, &receipts).await
        {
            tracing::debug!(error = %conveyor::Report(&error), "deleting replies failed");
        }
    }
}
