//! Settling SQS deliveries: acks become `DeleteMessageBatch`, retries and releases become
//! `ChangeMessageVisibilityBatch`, both flushed at ten entries or after a few
//! milliseconds, whichever comes first.

use std::sync::Arc;
use std::time::Duration;

use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::{
    BatchResultErrorEntry, ChangeMessageVisibilityBatchRequestEntry, DeleteMessageBatchRequestEntry,
};
use conveyor::{Settle, Settled, Settlement};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::error::SqsError;
use crate::extender::MAX_VISIBILITY;
use crate::inflight::InFlight;
use crate::queue::QueueInfo;

/// The most entries one SQS batch call takes.
pub(crate) const BATCH_LIMIT: usize = 10;

/// How often a failed batch entry is tried again before it is reported.
const ATTEMPTS: u32 = 3;

/// One settlement waiting for its batch call.
#[derive(Debug)]
pub(crate) enum Op {
    Delete { receipt: String },
    Hide { receipt: String, seconds: i32 },
}

/// Settles one subscription's deliveries. `settle` only queues the call; the flusher
/// task makes it.
pub(crate) struct Settler {
    queue: Arc<QueueInfo>,
    in_flight: Arc<InFlight>,
    ops: mpsc::UnboundedSender<Op>,
}

impl Settler {
    pub(crate) fn new(
        queue: Arc<QueueInfo>,
        in_flight: Arc<InFlight>,
        ops: mpsc::UnboundedSender<Op>,
    ) -> Self {
        Settler {
            queue,
            in_flight,
            ops,
        }
    }
}

impl Settle for Settler {
    fn settle(&self, settled: Settled<'_>) {
        let Settled {
            tag, settlement, ..
        } = settled;
        let Some(entry) = self.in_flight.remove(tag) else {
            return;
        };
        let receipt = entry.receipt;
        let op = match settlement {
            Settlement::Ack => Op::Delete { receipt },
            Settlement::RetryAfter(delay) => {
                // SQS hides a message at most 12 hours after it was received.
                let left = MAX_VISIBILITY.saturating_sub(entry.received_at.elapsed());
                Op::Hide {
                    receipt,
                    seconds: i32::try_from(delay.min(left).as_secs()).unwrap_or(i32::MAX),
                }
            }
            Settlement::Reject { reason } if self.queue.redrive => {
                // Visible again at once: the redrive policy moves it to the dead-letter
                // queue when its receive count passes the policy's maximum.
                tracing::info!(
                    queue = self.queue.name,
                    reason,
                    "rejected; the queue's redrive policy dead-letters it"
                );
                Op::Hide {
                    receipt,
                    seconds: 0,
                }
            }
            Settlement::Reject { reason } => {
                tracing::warn!(
                    queue = self.queue.name,
                    reason,
                    "rejected with no redrive policy on the queue: deleting it"
                );
                Op::Delete { receipt }
            }
            _ => Op::Hide {
                receipt,
                seconds: 0,
            },
        };
        if self.ops.send(op).is_err() {
            tracing::warn!(
                queue = self.queue.name,
                "settled after the subscription closed; SQS redelivers it after its visibility timeout"
            );
        }
    }
}

/// Makes the batch calls for queued settlements until every [`Settler`] is gone, then
/// flushes what is left.
pub(crate) async fn flush_settlements(
    client: Client,
    queue: Arc<QueueInfo>,
    mut ops: mpsc::UnboundedReceiver<Op>,
    interval: Duration,
) {
    let mut deletes: Vec<String> = Vec::with_capacity(BATCH_LIMIT);
    let mut hides: Vec<(String, i32)> = Vec::with_capacity(BATCH_LIMIT);
    let mut deadline: Option<Instant> = None;
    loop {
        let next = match deadline {
            None => ops.recv().await,
            Some(at) => tokio::select! {
                op = ops.recv() => op,
                () = tokio::time::sleep_until(at) => {
                    delete(&client, &queue, &mut deletes).await;
                    hide(&client, &queue, &mut hides).await;
                    deadline = None;
                    continue;
                }
            },
        };
        match next {
            Some(Op::Delete { receipt }) => deletes.push(receipt),
            Some(Op::Hide { receipt, seconds }) => hides.push((receipt, seconds)),
            None => break,
        }
        deadline.get_or_insert_with(|| Instant::now() + interval);
        if deletes.len() == BATCH_LIMIT {
            delete(&client, &queue, &mut deletes).await;
        }
        if hides.len() == BATCH_LIMIT {
            hide(&client, &queue, &mut hides).await;
        }
        if deletes.is_empty() && hides.is_empty() {
            deadline = None;
        }
    }
    delete(&client, &queue, &mut deletes).await;
    hide(&client, &queue, &mut hides).await;
}

/// Deletes the acked messages, retrying failed entries; reports what keeps failing.
async fn delete(client: &Client, queue: &QueueInfo, receipts: &mut Vec<String>) {
    for attempt in 1..=ATTEMPTS {
        if receipts.is_empty() {
            return;
        }
        let entries = receipts.iter().enumerate().filter_map(|(i, receipt)| {
            DeleteMessageBatchRequestEntry::builder()
                .id(i.to_string())
                .receipt_handle(receipt)
                .build()
                .ok()
        });
        let result = client
            .delete_message_batch()
            .queue_url(&queue.url)
            .set_entries(Some(entries.collect()))
            .send()
            .await
            .map(|output| failures(output.failed()))
            .map_err(|e| SqsError::call("DeleteMessageBatch", &queue.name, e));
        keep_failed(receipts, result, "DeleteMessageBatch", queue, attempt).await;
    }
}

/// Changes the visibility of retried and released messages, retrying failed entries.
async fn hide(client: &Client, queue: &QueueInfo, pending: &mut Vec<(String, i32)>) {
    for attempt in 1..=ATTEMPTS {
        if pending.is_empty() {
            return;
        }
        let result = change_visibility(client, queue, pending).await;
        keep_failed(
            pending,
            result,
            "ChangeMessageVisibilityBatch",
            queue,
            attempt,
        )
        .await;
    }
}

/// One `ChangeMessageVisibilityBatch` call; the failed entries' indices and reasons.
pub(crate) async fn change_visibility(
    client: &Client,
    queue: &QueueInfo,
    entries: &[(String, i32)],
) -> Result<Vec<(usize, String)>, SqsError> {
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
    client
        .change_message_visibility_batch()
        .queue_url(&queue.url)
        .set_entries(Some(request.collect()))
        .send()
        .await
        .map(|output| failures(output.failed()))
        .map_err(|e| SqsError::call("ChangeMessageVisibilityBatch", &queue.name, e))
}

/// The failed entries of a batch call, by the index used as their id.
fn failures(failed: &[BatchResultErrorEntry]) -> Vec<(usize, String)> {
    failed
        .iter()
        .filter_map(|f| {
            let reason = format!("{}: {}", f.code(), f.message().unwrap_or_default());
            Some((f.id().parse().ok()?, reason))
        })
        .collect()
}

/// After one attempt: keeps only the entries that failed for another try, pausing before
/// it; after the last attempt reports them and gives up (SQS redelivers those messages
/// once their visibility timeout lapses, so nothing is lost).
async fn keep_failed<T>(
    items: &mut Vec<T>,
    result: Result<Vec<(usize, String)>, SqsError>,
    call: &'static str,
    queue: &QueueInfo,
    attempt: u32,
) {
    let failed: Vec<(usize, String)> = match result {
        Ok(failed) => failed,
        Err(error) => (0..items.len()).map(|i| (i, error.to_string())).collect(),
    };
    let Some((_, first)) = failed.first() else {
        items.clear();
        return;
    };
    if attempt == ATTEMPTS {
        tracing::error!(
            queue = queue.name,
            call,
            failed = failed.len(),
            first,
            "settlement failed for good; SQS redelivers these messages after their visibility timeout"
        );
        items.clear();
        return;
    }
    tracing::warn!(
        queue = queue.name,
        call,
        failed = failed.len(),
        first,
        attempt,
        "settlement failed; trying again"
    );
    let failed_at: std::collections::HashSet<usize> = failed.iter().map(|(i, _)| *i).collect();
    let mut index = 0;
    items.retain(|_| {
        index += 1;
        failed_at.contains(&(index - 1))
    });
    tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
}

#[cfg(test)]
mod tests {
    //! moto never fails a batch entry, so the retry of failed entries is tested here on
    //! scripted results.
    use super::*;

    fn queue() -> QueueInfo {
        QueueInfo {
            name: "q".into(),
            url: "http://127.0.0.1:4566/123/q".into(),
            fifo: false,
            content_based_deduplication: false,
            redrive: false,
            max_message_size: 262_144,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn only_failed_entries_are_tried_again() {
        let mut receipts: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
        let failed = vec![
            (0, "InternalError: busy".to_string()),
            (2, "InternalError: busy".to_string()),
        ];
        keep_failed(&mut receipts, Ok(failed), "DeleteMessageBatch", &queue(), 1).await;
        assert_eq!(receipts, vec!["a", "c"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_call_retries_every_entry() {
        let mut receipts: Vec<String> = ["a", "b"].map(String::from).to_vec();
        let error = SqsError::Config("unreachable".into());
        keep_failed(&mut receipts, Err(error), "DeleteMessageBatch", &queue(), 1).await;
        assert_eq!(receipts, vec!["a", "b"]);
    }

    #[tokio::test(start_paused = true)]
    async fn entries_still_failing_after_the_last_attempt_are_given_up() {
        let mut receipts: Vec<String> = ["a"].map(String::from).to_vec();
        keep_failed(
            &mut receipts,
            Ok(vec![(0, "x".into())]),
            "DeleteMessageBatch",
            &queue(),
            ATTEMPTS,
        )
        .await;
        assert!(receipts.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_clean_call_leaves_nothing_to_retry() {
        let mut receipts: Vec<String> = ["a"].map(String::from).to_vec();
        keep_failed(
            &mut receipts,
            Ok(Vec::new()),
            "DeleteMessageBatch",
            &queue(),
            1,
        )
        .await;
        assert!(receipts.is_empty());
    }

    fn settled(redrive: bool, settlement: Settlement<'_>) -> Op {
        let in_flight = Arc::new(InFlight::default());
        let (ops, mut queued) = mpsc::unbounded_channel();
        let settler = Settler::new(
            Arc::new(QueueInfo { redrive, ..queue() }),
            in_flight.clone(),
            ops,
        );
        let tag = in_flight.insert("r".into(), Duration::from_secs(30));
        settler.settle(Settled::new(tag, settlement));
        settler.settle(Settled::new(tag, Settlement::Ack)); // a second settle of the same tag is ignored
        let op = queued.try_recv().expect("one op");
        assert!(queued.try_recv().is_err());
        op
    }

    #[test]
    fn each_settlement_becomes_its_sqs_call() {
        assert!(matches!(settled(false, Settlement::Ack), Op::Delete { .. }));
        assert!(matches!(
            settled(false, Settlement::Retry),
            Op::Hide { seconds: 0, .. }
        ));
        assert!(matches!(
            settled(false, Settlement::Release),
            Op::Hide { seconds: 0, .. }
        ));
        assert!(matches!(
            settled(false, Settlement::RetryAfter(Duration::from_secs(90))),
            Op::Hide { seconds: 90, .. }
        ));
    }

    #[test]
    fn a_reject_is_left_to_the_redrive_policy_or_deleted_without_one() {
        assert!(matches!(
            settled(true, Settlement::Reject { reason: "bad" }),
            Op::Hide { seconds: 0, .. }
        ));
        assert!(matches!(
            settled(false, Settlement::Reject { reason: "bad" }),
            Op::Delete { .. }
        ));
    }

    #[test]
    fn retry_after_never_hides_past_twelve_hours() {
        let op = settled(
            false,
            Settlement::RetryAfter(Duration::from_secs(13 * 3600)),
        );
        assert!(matches!(op, Op::Hide { seconds, .. } if seconds <= 12 * 3600));
    }
}
