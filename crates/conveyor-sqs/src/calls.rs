//! The SQS calls a subscription's keeper (and a batch publish) makes, behind a trait so that
//! the order of its calls can be tested without SQS.

use std::future::Future;
use std::sync::Arc;

use aws_sdk_sqs::types::builders::SendMessageBatchRequestEntryBuilder;
use aws_sdk_sqs::types::{
    ChangeMessageVisibilityBatchRequestEntry, DeleteMessageBatchRequestEntry,
    SendMessageBatchRequestEntry,
};

use crate::attributes::Outgoing;
use crate::broker::SqsBroker;
use crate::error::SqsError;
use crate::queue::{DeadLetterTarget, QueueInfo};
use crate::settle::failures;

/// Each batch call answers with the entries that failed: their index in the request (the
/// entry's id) and SQS's reason.
pub(crate) type Failed = Vec<(usize, String)>;

/// The `SendMessageBatch` entry `id` (its index in the call) for a message encoded as
/// `outgoing`, with its FIFO group and deduplication id; the caller adds what else it
/// sets, then builds it.
pub(crate) fn send_entry(
    id: usize,
    outgoing: &Outgoing,
    group: &Option<String>,
    deduplication: &Option<String>,
) -> SendMessageBatchRequestEntryBuilder {
    SendMessageBatchRequestEntry::builder()
        .id(id.to_string())
        .message_body(outgoing.body.clone())
        .set_message_attributes(Some(outgoing.attributes.clone()).filter(|a| !a.is_empty()))
        .set_message_group_id(group.clone())
        .set_message_deduplication_id(deduplication.clone())
}

/// One `SendMessageBatch` of `built`, each entry at its index in the call (its id), or
/// why it could not be built: what failed, the building and the call's entries together.
pub(crate) async fn send_built<C: Calls, E: std::fmt::Display>(
    calls: &C,
    queue: &QueueInfo,
    built: impl ExactSizeIterator<Item = Result<SendMessageBatchRequestEntry, E>>,
) -> Result<Failed, SqsError> {
    let mut entries = Vec::with_capacity(built.len());
    let mut failed: Failed = Vec::new();
    for (i, entry) in built.enumerate() {
        match entry {
            Ok(entry) => entries.push(entry),
            Err(error) => failed.push((i, error.to_string())),
        }
    }
    if !entries.is_empty() {
        failed.extend(calls.send(queue, entries).await?);
    }
    Ok(failed)
}

/// What the keeper asks of SQS.
pub(crate) trait Calls: Send + Sync + 'static {
    /// One `ChangeMessageVisibilityBatch`: (receipt, seconds) per entry, ten at most.
    fn change_visibility(
        &self,
        queue: &QueueInfo,
        entries: &[(String, i32)],
    ) -> impl Future<Output = Result<Failed, SqsError>> + Send;

    /// One `DeleteMessageBatch`, ten receipts at most.
    fn delete(
        &self,
        queue: &QueueInfo,
        receipts: &[String],
    ) -> impl Future<Output = Result<Failed, SqsError>> + Send;

    /// One `SendMessageBatch`, each entry's id its index.
    fn send(
        &self,
        queue: &QueueInfo,
        entries: Vec<SendMessageBatchRequestEntry>,
    ) -> impl Future<Output = Result<Failed, SqsError>> + Send;

    /// The dead-letter queue a redrive policy names.
    fn dead_letter_queue(
        &self,
        target: &DeadLetterTarget,
    ) -> impl Future<Output = Result<Arc<QueueInfo>, SqsError>> + Send;
}

impl Calls for SqsBroker {
    async fn change_visibility(
        &self,
        queue: &QueueInfo,
        entries: &[(String, i32)],
    ) -> Result<Failed, SqsError> {
        let request = entries
            .iter()
            .enumerate()
            .filter_map(|(i, (receipt, seconds))| {
                ChangeMessageVisibilityBatchRequestEntry::builder()
                    .id(i.to_string())
                    .receipt_handle(receipt)
                    .visibility_timeout(*seconds)
                    .build()
                    .ok()
            });
        self.client()
            .change_message_visibility_batch()
            .queue_url(&queue.url)
            .set_entries(Some(request.collect()))
            .send()
            .await
            .map(|output| failures(output.failed()))
            .map_err(|e| SqsError::call("ChangeMessageVisibilityBatch", &queue.name, e))
    }

    async fn delete(&self, queue: &QueueInfo, receipts: &[String]) -> Result<Failed, SqsError> {
        delete_batch(self.client(), queue, receipts).await
    }

    async fn send(
        &self,
        queue: &QueueInfo,
        entries: Vec<SendMessageBatchRequestEntry>,
    ) -> Result<Failed, SqsError> {
        self.client()
            .send_message_batch()
            .queue_url(&queue.url)
            .set_entries(Some(entries))
            .send()
            .await
            .map(|output| failures(output.failed()))
            .map_err(|e| SqsError::call("SendMessageBatch", &queue.name, e))
    }

    async fn dead_letter_queue(
        &self,
        target: &DeadLetterTarget,
    ) -> Result<Arc<QueueInfo>, SqsError> {
        self.resolve_dead_letter(target).await
    }
}

/// One `DeleteMessageBatch` of up to ten receipts, through `client` (for a task that
/// holds the client and not the broker).
pub(crate) async fn delete_batch(
    client: &aws_sdk_sqs::Client,
    queue: &QueueInfo,
    receipts: &[String],
) -> Result<Failed, SqsError> {
    let request = receipts.iter().enumerate().filter_map(|(i, receipt)| {
        DeleteMessageBatchRequestEntry::builder()
            .id(i.to_string())
            .receipt_handle(receipt)
            .build()
            .ok()
    });
    client
        .delete_message_batch()
        .queue_url(&queue.url)
        .set_entries(Some(request.collect()))
        .send()
        .await
        .map(|output| failures(output.failed()))
        .map_err(|e| SqsError::call("DeleteMessageBatch", &queue.name, e))
}
