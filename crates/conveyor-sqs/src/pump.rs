//! SQS's receive side for the kit's pulling subscription: one `ReceiveMessage` long poll,
//! its messages leased (hidden for the visibility timeout) and made deliveries.

use std::sync::Arc;

use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::MessageSystemAttributeName;
use conveyor::kit::{Receive, ReceiveFailed, Received};

use crate::attributes;
use crate::broker::Settings;
use crate::error::{SqsError, cannot_heal};
use crate::inflight::Held;
use crate::queue::QueueInfo;
use crate::settle::whole_seconds_down;

/// What a receive needs.
pub(crate) struct SqsReceive {
    pub(crate) client: Client,
    pub(crate) queue: Arc<QueueInfo>,
    pub(crate) settings: Settings,
    /// How many messages each receive asks for (1 to 10).
    pub(crate) wanted: usize,
}

impl Receive for SqsReceive {
    type Data = Held;

    /// One `ReceiveMessage`; its messages become deliveries, recorded as held first so
    /// that they stay hidden while they wait. An error known never to succeed (the queue
    /// is gone, access or credentials refused: [`cannot_heal`]) is for good; one this
    /// transport does not recognise is tried again.
    async fn receive(&mut self, into: &mut Received<'_, Held>) -> Result<(), ReceiveFailed> {
        // The whole seconds SQS hides them for, and what the keeper records: one value, so
        // that its renewals are timed by the visibility SQS applies.
        let (seconds, visibility) = whole_seconds_down(self.settings.visibility_timeout);
        let output = self
            .client
            .receive_message()
            .queue_url(&self.queue.url)
            .max_number_of_messages(i32::try_from(self.wanted).unwrap_or(10))
            .wait_time_seconds(i32::try_from(self.settings.receive_wait.as_secs()).unwrap_or(20))
            .visibility_timeout(seconds)
            .message_system_attribute_names(MessageSystemAttributeName::ApproximateReceiveCount)
            .message_system_attribute_names(MessageSystemAttributeName::MessageGroupId)
            .message_attribute_names("All")
            .customize()
            .config_override(self.settings.long_poll())
            .send()
            .await
            .map_err(|e| ReceiveFailed {
                for_good: cannot_heal(&e),
                error: Box::new(SqsError::call("ReceiveMessage", &self.queue.name, e)),
            })?;
        let messages = output.messages.unwrap_or_default();
        for message in messages {
            let attributes::Decoded {
                payload,
                headers,
                key,
                types,
            } = attributes::decode(&message);
            let receive_count = message
                .attributes()
                .and_then(|a| a.get(&MessageSystemAttributeName::ApproximateReceiveCount))
                .and_then(|n| n.parse().ok())
                .unwrap_or(1);
            let Some(receipt) = message.receipt_handle else {
                continue;
            };
            let held = Held {
                receipt,
                message_id: message.message_id,
                types,
            };
            let tag = into.hold(held, visibility);
            into.push(
                into.delivery(tag, payload)
                    .with_headers(headers)
                    .with_partition_key(key)
                    .with_receive_count(receive_count)
                    // Read ahead: it may wait here before its handler starts.
                    .arrived_now(),
            );
        }
        Ok(())
    }
}
