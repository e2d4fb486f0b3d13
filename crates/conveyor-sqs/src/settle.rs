//! Settling SQS deliveries: a settlement is recorded on its message's in-flight entry at
//! once (settling never blocks), and the subscription's keeper makes the call: acks become
//! `DeleteMessageBatch`, retries and releases `ChangeMessageVisibilityBatch`, rejects a
//! `SendMessageBatch` to the dead-letter queue followed by a delete.

use std::sync::Arc;
use std::time::Duration;

use aws_sdk_sqs::types::BatchResultErrorEntry;
use conveyor::{Settle, Settled, Settlement};
use tokio::sync::watch;

use crate::calls::Calls;
use crate::error::SqsError;
use crate::inflight::{InFlight, Op, Rejected};
use crate::queue::QueueInfo;

/// The most entries one SQS batch call takes.
pub(crate) const BATCH_LIMIT: usize = 10;

/// SQS hides a message for at most 12 hours from its receipt.
pub(crate) const MAX_VISIBILITY: Duration = Duration::from_secs(12 * 60 * 60);

/// How often a failed batch entry is tried again before it is reported.
pub(crate) const ATTEMPTS: u32 = 3;

/// A delay in whole seconds, rounded up: SQS counts delays and visibility timeouts in
/// seconds, and a delay must never come back sooner than asked (1.5 s is 2 s, 300 ms is
/// 1 s; only zero is zero).
pub(crate) fn whole_seconds_up(delay: Duration) -> u64 {
    delay
        .as_secs()
        .saturating_add(u64::from(delay.subsec_nanos() > 0))
}

/// The visibility timeout, in seconds, that hides a message for `delay`, rounded up,
/// but never past 12 hours from its receipt (`elapsed` ago).
pub(crate) fn retry_after_seconds(delay: Duration, elapsed: Duration) -> i32 {
    let left = MAX_VISIBILITY.saturating_sub(elapsed).as_secs();
    i32::try_from(whole_seconds_up(delay).min(left)).unwrap_or(i32::MAX)
}

/// Settles one subscription's deliveries. `settle` records the settlement on the
/// message's in-flight entry and wakes the keeper, which makes the call.
pub(crate) struct Settler {
    in_flight: Arc<InFlight>,
    /// Dropped with the last settler (the pump's and the deliveries'), telling the keeper
    /// that nothing more will be settled.
    _alive: watch::Sender<()>,
}

impl Settler {
    pub(crate) fn new(in_flight: Arc<InFlight>, alive: watch::Sender<()>) -> Self {
        Settler {
            in_flight,
            _alive: alive,
        }
    }
}

impl Settle for Settler {
    fn settle(&self, settled: Settled<'_>) {
        let Settled {
            tag,
            settlement,
            attempt,
            payload,
            headers,
            partition_key,
            ..
        } = settled;
        let known = self.in_flight.settle(tag, |entry| match settlement {
            Settlement::Ack => Op::Delete,
            Settlement::RetryAfter(delay) => Op::Hide {
                seconds: retry_after_seconds(delay, entry.received_at.elapsed()),
            },
            Settlement::Reject { reason } => Op::Reject(Box::new(Rejected {
                reason: reason.to_string(),
                attempt,
                payload,
                headers,
                partition_key,
            })),
            // Retry, Release, and whatever a later core adds: visible again now.
            _ => Op::Hide { seconds: 0 },
        });
        if !known {
            tracing::debug!(tag, "settled a message this subscription no longer holds");
        }
    }
}

/// Deletes the messages, ten per `DeleteMessageBatch`, retrying failed entries; reports
/// what keeps failing.
pub(crate) async fn delete_all<C: Calls>(calls: &C, queue: &QueueInfo, receipts: Vec<String>) {
    for chunk in receipts.chunks(BATCH_LIMIT) {
        let mut left = chunk.to_vec();
        for attempt in 1..=ATTEMPTS {
            if left.is_empty() {
                break;
            }
            let result = calls.delete(queue, &left).await;
            keep_failed(&mut left, result, "DeleteMessageBatch", queue, attempt).await;
        }
    }
}

/// Changes the messages' visibility, ten per `ChangeMessageVisibilityBatch`, retrying
/// failed entries; reports what keeps failing.
pub(crate) async fn hide_all<C: Calls>(calls: &C, queue: &QueueInfo, entries: Vec<(String, i32)>) {
    for chunk in entries.chunks(BATCH_LIMIT) {
        let mut left = chunk.to_vec();
        for attempt in 1..=ATTEMPTS {
            if left.is_empty() {
                break;
            }
            let result = calls.change_visibility(queue, &left).await;
            keep_failed(
                &mut left,
                result,
                "ChangeMessageVisibilityBatch",
                queue,
                attempt,
            )
            .await;
        }
    }
}

/// The failed entries of a batch call, by the index used as their id.
pub(crate) fn failures(failed: &[BatchResultErrorEntry]) -> Vec<(usize, String)> {
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
pub(crate) async fn keep_failed<T>(
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
        QueueInfo::for_tests("q")
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

    fn settled(settlement: Settlement<'_>) -> Op {
        let in_flight = Arc::new(InFlight::default());
        let (alive, _) = watch::channel(());
        let settler = Settler::new(in_flight.clone(), alive);
        let tag = in_flight.insert("r".into(), None, Duration::from_secs(30));
        settler.settle(Settled::new(tag, settlement));
        settler.settle(Settled::new(tag, Settlement::Ack)); // a second settle of the same tag is ignored
        let mut taken = in_flight.take_settled();
        assert_eq!(taken.len(), 1);
        taken.remove(0).op
    }

    #[test]
    fn each_settlement_becomes_its_sqs_call() {
        assert!(matches!(settled(Settlement::Ack), Op::Delete));
        assert!(matches!(
            settled(Settlement::Retry),
            Op::Hide { seconds: 0 }
        ));
        assert!(matches!(
            settled(Settlement::Release),
            Op::Hide { seconds: 0 }
        ));
        assert!(matches!(
            settled(Settlement::RetryAfter(Duration::from_secs(90))),
            Op::Hide { seconds: 90 }
        ));
        assert!(matches!(
            settled(Settlement::Reject { reason: "bad" }),
            Op::Reject(rejected) if rejected.reason == "bad" && rejected.attempt == 1
        ));
    }

    #[test]
    fn delays_round_up_to_whole_seconds() {
        let ms = Duration::from_millis;
        assert_eq!(whole_seconds_up(ms(1500)), 2);
        assert_eq!(whole_seconds_up(ms(300)), 1);
        assert_eq!(whole_seconds_up(ms(1)), 1);
        assert_eq!(whole_seconds_up(Duration::from_nanos(1)), 1);
        assert_eq!(whole_seconds_up(ms(2000)), 2);
        assert_eq!(whole_seconds_up(Duration::ZERO), 0);
        assert_eq!(whole_seconds_up(Duration::MAX), u64::MAX);
        assert!(matches!(
            settled(Settlement::RetryAfter(ms(1500))),
            Op::Hide { seconds: 2 }
        ));
        assert!(matches!(
            settled(Settlement::RetryAfter(ms(300))),
            Op::Hide { seconds: 1 }
        ));
    }

    #[test]
    fn retry_after_never_hides_past_twelve_hours() {
        assert!(matches!(
            settled(Settlement::RetryAfter(Duration::from_secs(13 * 3600))),
            Op::Hide { seconds } if seconds <= 12 * 3600
        ));
        assert!(matches!(
            settled(Settlement::RetryAfter(Duration::MAX)),
            Op::Hide { seconds } if seconds <= 12 * 3600
        ));
        // 11 h 59 min 59.5 s after receipt, half a second is left: it rounds down to 0
        // rather than past the cap.
        let elapsed = MAX_VISIBILITY - Duration::from_millis(500);
        assert_eq!(retry_after_seconds(Duration::from_secs(5), elapsed), 0);
        assert_eq!(
            retry_after_seconds(Duration::from_millis(1500), Duration::ZERO),
            2
        );
    }
}
