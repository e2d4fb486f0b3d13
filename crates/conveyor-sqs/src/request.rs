//! Request/reply on SQS: one reply queue per requester (a broker), made by its first
//! request (again once found gone) and deleted when the broker closes (in the background
//! when it is dropped unclosed). Each request carries the queue's URL as
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
use std::sync::atomic::{AtomicBool, Ordering};
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
    /// To delete the reply queue when dropped without [`close`](Self::close).
    client: Client,
    closed: AtomicBool,
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
        let reader = ReplyReader::spawn({
            let client = client.clone();
            |replies| read(client, settings, queue.clone(), replies)
        });
        Ok(Requester {
            queue,
            reader,
            client,
            closed: AtomicBool::new(false),
        })
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
        self.closed.store(true, Ordering::Relaxed);
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

/// A requester dropped without [`Requester::close`] (its broker dropped unclosed, or the
/// reply queue found gone) deletes its reply queue in the background, as best it can: a
/// runtime shutting down may not run it, and `close` is the way to be sure.
impl Drop for Requester {
    fn drop(&mut self) {
        if self.closed.load(Ordering::Relaxed) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (client, queue) = (self.client.clone(), self.queue.clone());
        runtime.spawn(async move {
            if let Err(error) = client.delete_queue().queue_url(&queue.url).send().await {
                let error = SqsError::from_sdk("DeleteQueue", &queue.name, error);
                tracing::debug!(error = %conveyor::Report(&error), "deleting a dropped requester's reply queue failed");
            }
        });
    }
}

/// How many receives in a row must find the reply queue missing, a second apart, before
/// the reader takes it for gone.
const GONE_AFTER: u32 = 3;

/// Receives replies until the requester closes, or its reply queue is found gone (the
/// next request makes another): each goes to its request (or, late, is dropped), and what
/// a receive brought is deleted in one call.
async fn read(client: Client, settings: Settings, queue: Arc<QueueInfo>, replies: Arc<Replies>) {
    // Receives in a row SQS answered with "no such queue": AWS may say so, for a moment,
    // of a queue just made, so one is not taken for the queue being gone.
    let mut missing = 0u32;
    loop {
        let received = client
            .receive_message()
            .queue_url(&queue.url)
            .max_number_of_messages(10)
            .wait_time_seconds(i32::try_from(settings.receive_wait.as_secs()).unwrap_or(20))
            .message_attribute_names("All")
            .customize()
            .config_override(settings.long_poll())
            .send()
            .await;
        let messages = match received {
            Ok(output) => output.messages.unwrap_or_default(),
            Err(error) => {
                let error = SqsError::from_sdk("ReceiveMessage", &queue.name, error);
                if let SqsError::NoSuchQueue { .. } = error {
                    missing = missing.saturating_add(1);
                    if missing >= GONE_AFTER {
                        tracing::warn!(queue = %queue.name, "the reply queue is gone; the next request makes another");
                        return;
                    }
                } else {
                    missing = 0;
                }
                tracing::warn!(error = %conveyor::Report(&error), "receiving replies failed; trying again");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        missing = 0;
        let mut receipts = Vec::with_capacity(messages.len());
        for message in &messages {
            let decoded = attributes::decode(message);
            let reply = Message::received(decoded.payload, decoded.headers);
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

#[cfg(test)]
mod tests {
    use std::future::{Future, poll_fn};
    use std::task::Poll;
    use std::time::Duration;

    use conveyor::{App, Broker, Bytes, Message, QueueSpec};

    use crate::SqsBroker;
    use crate::testing::emulator;

    async fn echo(payload: Bytes) -> Result<Message, conveyor::Error> {
        Ok(Message::new(payload))
    }

    /// Declares the queue `conveyor-test-<name>-<pid>` on `broker`; returns its name.
    async fn destination(broker: &SqsBroker, name: &str) -> String {
        let queue = format!("conveyor-test-{name}-{}", std::process::id());
        broker
            .declare_queue(&QueueSpec::new(queue.as_str()))
            .await
            .unwrap();
        queue
    }

    /// Checks `done` every 20 ms until it holds; fails with `what` after a minute.
    async fn eventually<F: Future<Output = bool>>(what: &str, mut done: impl FnMut() -> F) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while !done().await {
            assert!(tokio::time::Instant::now() < deadline, "{what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Live (the SQS emulator): a reply queue deleted under its requester is made again
    /// by the next request. (The reader tried to receive from it for ever, and every
    /// later request of the broker timed out.)
    #[tokio::test]
    async fn a_reply_queue_deleted_under_its_requester_is_made_again_by_the_next_request() {
        let broker = emulator()
            // The reader sees its queue gone at its next receive: soon.
            .receive_wait(Duration::from_secs(1))
            .build()
            .await
            .unwrap();
        let destination = destination(&broker, "reply-gone").await;
        let responder = App::new("echo")
            .mount(broker.queue(&destination), echo, |m| m)
            .start()
            .await
            .unwrap();
        let ask = |text: &'static str| {
            broker.request(&destination, Message::new(text), Duration::from_secs(30))
        };
        assert_eq!(&ask("one").await.unwrap().payload()[..], b"one");

        let first = broker.requester().await.unwrap();
        broker
            .client()
            .delete_queue()
            .queue_url(&first.queue.url)
            .send()
            .await
            .unwrap();
        eventually("the reader never saw its queue gone", || async {
            !first.reader.is_reading()
        })
        .await;
        assert_eq!(&ask("two").await.unwrap().payload()[..], b"two");
        assert_ne!(broker.requester().await.unwrap().queue.url, first.queue.url);

        responder.shutdown().await.unwrap();
        broker.close().await.unwrap();
        broker.delete_queue(&destination).await.unwrap();
    }

    /// A request given up while its reply queue is being made (dropped, as its timeout
    /// drops it) leaves the queue to its broker, which deletes it when it closes. (The
    /// making was dropped half-way: a queue made, and known to no one.)
    #[tokio::test]
    async fn a_request_given_up_while_its_reply_queue_is_made_leaves_it_to_the_broker() {
        let broker = emulator().build().await.unwrap();
        let destination = destination(&broker, "given-up").await;
        // Polled once, the request has begun making the reply queue (its first call
        // waits for SQS), and is dropped there: no clock decides when.
        // Boxed, so that dropping it drops the request (a pinned local would live on).
        let mut request =
            Box::pin(broker.request(&destination, Message::new("x"), Duration::from_secs(60)));
        let first_poll = poll_fn(|cx| Poll::Ready(request.as_mut().poll(cx).is_pending())).await;
        assert!(
            first_poll,
            "the reply queue cannot be made without waiting for SQS"
        );
        drop(request);
        eventually(
            "the reply queue was never made: the making was dropped with the request",
            || async { broker.open_requester().await.is_some() },
        )
        .await;
        broker.close().await.unwrap();
        broker.delete_queue(&destination).await.unwrap();
    }

    /// A broker dropped without `close()` deletes the reply queue its requests made.
    /// (It stayed, with the replies sent to it, for the queue's 4-day retention.)
    #[tokio::test]
    async fn a_broker_dropped_unclosed_deletes_its_reply_queue() {
        let broker = emulator().build().await.unwrap();
        let destination = destination(&broker, "dropped-requester").await;
        // Nothing answers: the request times out, and leaves its reply queue made.
        let unanswered = broker
            .request(&destination, Message::new("x"), Duration::from_millis(200))
            .await;
        assert!(matches!(unanswered, Err(conveyor::Error::Timeout { .. })));
        let reply_queue = broker.requester().await.unwrap().queue.name.clone();
        drop(broker);

        let other = emulator().build().await.unwrap();
        eventually(
            &format!("the reply queue `{reply_queue}` is still there"),
            || async {
                let found = other
                    .client()
                    .get_queue_url()
                    .queue_name(&reply_queue)
                    .send()
                    .await;
                found.is_err()
            },
        )
        .await;
        other.delete_queue(&destination).await.unwrap();
    }
}
