//! SQS's settlement calls, in batches of ten with their failed entries tried again: acks
//! become `DeleteMessageBatch`, retries and releases `ChangeMessageVisibilityBatch`, rejects
//! a `SendMessageBatch` to the dead-letter queue followed by a delete.

use std::future::Future;
use std::time::Duration;

use aws_sdk_sqs::types::BatchResultErrorEntry;
use conveyor::Report;
use tokio::time::Instant;

use crate::calls::{Calls, Failed};
use crate::error::SqsError;
use crate::queue::QueueInfo;

/// The most entries one SQS batch call takes.
pub(crate) const BATCH_LIMIT: usize = 10;

/// SQS hides a message for at most 12 hours from its receipt.
pub(crate) const MAX_VISIBILITY: Duration = Duration::from_secs(12 * 60 * 60);

/// How much sooner than [`MAX_VISIBILITY`], counted from when a receive's answer came, a
/// renewal or a retry-after stops: SQS counts from its own receipt, a little earlier, and
/// refuses a visibility change past the limit; the call itself takes time to reach it too.
pub(crate) const RECEIPT_SLACK: Duration = Duration::from_secs(5);

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

/// `duration` in the whole seconds SQS takes, rounded down, with the duration those
/// seconds are: what a call asks for and what the transport records of it must be one
/// value, or renewals are timed for a visibility SQS does not apply.
pub(crate) fn whole_seconds_down(duration: Duration) -> (i32, Duration) {
    let seconds = i32::try_from(duration.as_secs()).unwrap_or(i32::MAX);
    (
        seconds,
        Duration::from_secs(u64::from(seconds.unsigned_abs())),
    )
}

/// The visibility timeout, in seconds, that hides a message for `delay`, rounded up,
/// but never past 12 hours from its receipt (`elapsed` ago), less [`RECEIPT_SLACK`].
pub(crate) fn retry_after_seconds(delay: Duration, elapsed: Duration) -> i32 {
    let left = MAX_VISIBILITY
        .saturating_sub(RECEIPT_SLACK)
        .saturating_sub(elapsed)
        .as_secs();
    i32::try_from(whole_seconds_up(delay).min(left)).unwrap_or(i32::MAX)
}

/// A batch call that [`with_retries`] makes and repeats for the entries that failed.
pub(crate) trait BatchCall<T>: Sync {
    /// The API operation, for the logs.
    const NAME: &'static str;

    /// Whether a call that failed as a whole (no answer, or an error for the call) is made
    /// again. It may have been carried out all the same: that is harmless for a delete or
    /// a visibility change, not for a send, whose messages would then be stored twice.
    const REPEAT_FAILED_CALL: bool = true;

    /// The queue the call goes to.
    fn queue(&self) -> &QueueInfo;

    /// Of one call's entries (`batch`, of which those that failed are `failed`), the failed
    /// ones not to try again, each with why (`None`: tried again). By default every failed
    /// entry is tried again; an empty answer says so too.
    fn hold_back(&self, _batch: &[T], _failed: &[bool]) -> Vec<Option<&'static str>> {
        Vec::new()
    }

    /// One call for `batch` (ten entries at most, each entry's id its index); answers with
    /// the entries that failed.
    fn call(&self, batch: &[T]) -> impl Future<Output = Result<Failed, SqsError>> + Send;
}

/// `DeleteMessageBatch`: one receipt per entry.
pub(crate) struct Delete<'a, C> {
    pub(crate) calls: &'a C,
    pub(crate) queue: &'a QueueInfo,
}

impl<C: Calls> BatchCall<String> for Delete<'_, C> {
    const NAME: &'static str = "DeleteMessageBatch";

    fn queue(&self) -> &QueueInfo {
        self.queue
    }

    fn call(&self, batch: &[String]) -> impl Future<Output = Result<Failed, SqsError>> + Send {
        self.calls.delete(self.queue, batch)
    }
}

/// A message to hide for `delay` (zero: visible again now), counted from when its call
/// is made.
#[derive(Debug)]
pub(crate) struct Hide {
    pub(crate) receipt: String,
    pub(crate) delay: Duration,
    /// When the receive's answer came: SQS refuses to hide it past 12 hours from there.
    pub(crate) received_at: Instant,
}

impl Hide {
    /// A message to make visible again now (its receipt time does not matter then).
    pub(crate) fn visible_now(receipt: String) -> Hide {
        Hide {
            receipt,
            delay: Duration::ZERO,
            received_at: Instant::now(),
        }
    }

    /// The seconds to ask for in a call made now. Worked out for each call, a retried one
    /// included, not when the message was settled: a settlement may wait behind other
    /// calls, and the 12 h cap counts to when SQS takes this one.
    fn seconds(&self) -> i32 {
        retry_after_seconds(self.delay, self.received_at.elapsed())
    }
}

/// `ChangeMessageVisibilityBatch`: a receipt and the seconds to hide it for, per entry.
pub(crate) struct ChangeVisibility<'a, C> {
    pub(crate) calls: &'a C,
    pub(crate) queue: &'a QueueInfo,
}

impl<C: Calls> BatchCall<Hide> for ChangeVisibility<'_, C> {
    const NAME: &'static str = "ChangeMessageVisibilityBatch";

    fn queue(&self) -> &QueueInfo {
        self.queue
    }

    async fn call(&self, batch: &[Hide]) -> Result<Failed, SqsError> {
        let entries: Vec<(String, i32)> = batch
            .iter()
            .map(|hide| (hide.receipt.clone(), hide.seconds()))
            .collect();
        self.calls.change_visibility(self.queue, &entries).await
    }
}

/// Makes `call` for `entries`, ten per batch call, and tries the entries that fail again;
/// reports those that keep failing (SQS redelivers their messages once their visibility
/// timeout lapses, so nothing is lost). Whether SQS carried out every entry it could (one
/// whose receipt it no longer takes aside).
pub(crate) async fn settle_all<T: Send, B: BatchCall<T>>(call: &B, entries: Vec<T>) -> bool {
    let mut entries = entries.into_iter();
    let mut took_all = true;
    loop {
        let batch: Vec<T> = entries.by_ref().take(BATCH_LIMIT).collect();
        if batch.is_empty() {
            return took_all;
        }
        let failures = with_retries(call, batch, |_| {}).await;
        took_all &= failures.entries.is_empty();
        let failed = failures.all();
        if let Some((_, first)) = failed.first() {
            tracing::error!(
                queue = call.queue().name,
                call = B::NAME,
                failed = failed.len(),
                first,
                "settlement failed for good; SQS redelivers these messages after their visibility timeout"
            );
        }
    }
}

/// What [`with_retries`] could not do.
pub(crate) struct Failures<T> {
    /// The entries still failing after the last call, each with its last reason.
    pub(crate) entries: Vec<(T, String)>,
    /// Whether that last call failed as a whole, so that SQS may have carried it out.
    pub(crate) call_failed: bool,
    /// Entries that failed and were not tried again ([`BatchCall::hold_back`]), each
    /// with why: SQS did not carry them out.
    pub(crate) held_back: Vec<(T, String)>,
}

impl<T> Failures<T> {
    /// Every entry not carried out, held back or still failing.
    pub(crate) fn all(self) -> Vec<(T, String)> {
        let mut all = self.held_back;
        all.extend(self.entries);
        all
    }
}

/// One batch call (`batch` is ten entries at most), and the entries that failed tried
/// again, up to [`ATTEMPTS`] calls in all, pausing 200 ms then 400 ms before each retry.
/// A call that fails as a whole fails each of its entries (and is the last call unless
/// [`BatchCall::REPEAT_FAILED_CALL`]). Every entry that succeeds goes to `done`; those
/// still failing after the last call come back, each with its last reason, and so do
/// those the call holds back from a retry ([`BatchCall::hold_back`]).
pub(crate) async fn with_retries<T: Send, B: BatchCall<T>>(
    call: &B,
    mut batch: Vec<T>,
    mut done: impl FnMut(T),
) -> Failures<T> {
    let mut attempt = 1;
    let mut held_back = Vec::new();
    loop {
        let mut reasons: Vec<Option<String>> = vec![None; batch.len()];
        let mut call_failed = false;
        match call.call(&batch).await {
            Ok(failed) => {
                for (index, reason) in failed {
                    if let Some(slot) = reasons.get_mut(index) {
                        *slot = Some(reason);
                    }
                }
            }
            Err(error) => {
                reasons.fill(Some(Report(&error).to_string()));
                call_failed = true;
            }
        }
        let failing: Vec<bool> = reasons.iter().map(Option::is_some).collect();
        let mut holding = call.hold_back(&batch, &failing).into_iter();
        let mut failed = Vec::new();
        for (entry, reason) in batch.into_iter().zip(reasons) {
            let hold = holding.next().flatten();
            match (reason, hold) {
                (Some(reason), Some(why)) => {
                    held_back.push((entry, format!("{why} (it failed: {reason})")));
                }
                (Some(reason), None) if stale_receipt(&reason) => held_back.push((entry, reason)),
                (Some(reason), None) => failed.push((entry, reason)),
                (None, _) => done(entry),
            }
        }
        if failed.is_empty() || attempt == ATTEMPTS || (call_failed && !B::REPEAT_FAILED_CALL) {
            return Failures {
                entries: failed,
                call_failed,
                held_back,
            };
        }
        tracing::warn!(
            queue = call.queue().name,
            call = B::NAME,
            failed = failed.len(),
            first = failed[0].1,
            attempt,
            "entries of a batch call failed; trying them again"
        );
        tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
        batch = failed.into_iter().map(|(entry, _)| entry).collect();
        attempt += 1;
    }
}

/// Whether an entry failed because SQS no longer takes its receipt handle: the message
/// was handed out again (its visibility timeout lapsed) or is gone. Trying the same
/// receipt again fails again.
pub(crate) fn stale_receipt(reason: &str) -> bool {
    let code = reason.split(':').next().unwrap_or_default();
    code.ends_with("ReceiptHandleIsInvalid") || code.ends_with("MessageNotInflight")
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

#[cfg(test)]
mod tests {
    //! moto never fails a batch entry, so the retry of failed entries is tested here on
    //! scripted results.
    use std::collections::VecDeque;
    use std::sync::Mutex;

    use super::*;

    /// A batch call answering with scripted results (then success), recording each batch.
    struct Scripted {
        queue: QueueInfo,
        results: Mutex<VecDeque<Result<Failed, SqsError>>>,
        batches: Mutex<Vec<Vec<String>>>,
    }

    impl Scripted {
        fn new(results: impl IntoIterator<Item = Result<Failed, SqsError>>) -> Scripted {
            Scripted {
                queue: QueueInfo::for_tests("q"),
                results: Mutex::new(results.into_iter().collect()),
                batches: Mutex::default(),
            }
        }

        fn batches(&self) -> Vec<Vec<String>> {
            self.batches.lock().unwrap().clone()
        }
    }

    impl BatchCall<String> for Scripted {
        const NAME: &'static str = "DeleteMessageBatch";

        fn queue(&self) -> &QueueInfo {
            &self.queue
        }

        async fn call(&self, batch: &[String]) -> Result<Failed, SqsError> {
            self.batches.lock().unwrap().push(batch.to_vec());
            self.results
                .lock()
                .unwrap()
                .pop_front()
                .unwrap_or(Ok(Vec::new()))
        }
    }

    fn receipts(names: &[&str]) -> Vec<String> {
        names.iter().map(|name| (*name).to_string()).collect()
    }

    /// Runs `with_retries`; answers the entries done and those that kept failing.
    async fn retried(call: &Scripted, batch: &[&str]) -> (Vec<String>, Vec<(String, String)>) {
        let mut done = Vec::new();
        let failed = with_retries(call, receipts(batch), |entry| done.push(entry))
            .await
            .entries;
        (done, failed)
    }

    #[tokio::test(start_paused = true)]
    async fn only_failed_entries_are_tried_again() {
        let busy = || "InternalError: busy".to_string();
        let call = Scripted::new([Ok(vec![(0, busy()), (2, busy())])]);
        let (done, failed) = retried(&call, &["a", "b", "c"]).await;
        assert_eq!(
            call.batches(),
            vec![receipts(&["a", "b", "c"]), receipts(&["a", "c"])]
        );
        assert_eq!(done, receipts(&["b", "a", "c"]));
        assert!(failed.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_call_retries_every_entry() {
        let call = Scripted::new([Err(SqsError::Config("unreachable".into()))]);
        let (done, failed) = retried(&call, &["a", "b"]).await;
        assert_eq!(
            call.batches(),
            vec![receipts(&["a", "b"]), receipts(&["a", "b"])]
        );
        assert_eq!(done, receipts(&["a", "b"]));
        assert!(failed.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn entries_still_failing_after_the_last_attempt_are_given_up() {
        let call = Scripted::new((1..=ATTEMPTS).map(|n| Ok(vec![(0, format!("x{n}"))])));
        let (done, failed) = retried(&call, &["a", "b"]).await;
        assert_eq!(
            call.batches().len(),
            ATTEMPTS as usize,
            "no call after the last attempt"
        );
        assert_eq!(done, receipts(&["b"]));
        assert_eq!(
            failed,
            vec![("a".to_string(), format!("x{ATTEMPTS}"))],
            "with its last reason"
        );
    }

    /// A receipt SQS no longer takes (the message was handed out again, or is gone)
    /// fails the same way every time: it is not tried again, and holds up nothing.
    #[tokio::test(start_paused = true)]
    async fn an_entry_whose_receipt_sqs_no_longer_takes_is_not_tried_again() {
        let call = Scripted::new([Ok(vec![
            (
                0,
                "ReceiptHandleIsInvalid: The input receipt handle is invalid.".into(),
            ),
            (
                1,
                "AWS.SimpleQueueService.MessageNotInflight: not in flight".into(),
            ),
            (2, "InternalError: busy".into()),
        ])]);
        let mut done = Vec::new();
        let failures = with_retries(&call, receipts(&["a", "b", "c"]), |e| done.push(e)).await;
        assert_eq!(
            call.batches(),
            vec![receipts(&["a", "b", "c"]), receipts(&["c"])]
        );
        assert_eq!(done, receipts(&["c"]));
        let given_up: Vec<String> = failures.all().into_iter().map(|(e, _)| e).collect();
        assert_eq!(given_up, receipts(&["a", "b"]));
    }

    #[tokio::test(start_paused = true)]
    async fn a_clean_call_leaves_nothing_to_retry() {
        let call = Scripted::new([]);
        let (done, failed) = retried(&call, &["a"]).await;
        assert_eq!(call.batches(), vec![receipts(&["a"])]);
        assert_eq!(done, receipts(&["a"]));
        assert!(failed.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn settle_all_calls_ten_entries_at_a_time_and_retries_each_batch() {
        let names: Vec<String> = (0..23).map(|i| format!("r{i}")).collect();
        // The first batch's first entry fails once.
        let call = Scripted::new([Ok(vec![(0, "InternalError: busy".to_string())])]);
        settle_all(&call, names.clone()).await;
        let sizes: Vec<usize> = call.batches().iter().map(Vec::len).collect();
        assert_eq!(sizes, vec![10, 1, 10, 3]);
        assert_eq!(call.batches()[1], receipts(&["r0"]));
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
        assert_eq!(retry_after_seconds(ms(1500), Duration::ZERO), 2);
        assert_eq!(retry_after_seconds(ms(300), Duration::ZERO), 1);
    }

    #[test]
    fn retry_after_never_hides_past_twelve_hours() {
        let limit = MAX_VISIBILITY - RECEIPT_SLACK;
        for delay in [Duration::from_secs(13 * 3600), Duration::MAX] {
            let seconds = retry_after_seconds(delay, Duration::ZERO);
            assert_eq!(u64::try_from(seconds).unwrap(), limit.as_secs());
        }
        // Half a second short of the cap, it rounds down to 0 rather than past it.
        let elapsed = limit - Duration::from_millis(500);
        assert_eq!(retry_after_seconds(Duration::from_secs(5), elapsed), 0);
        assert_eq!(
            retry_after_seconds(Duration::from_secs(5), MAX_VISIBILITY),
            0
        );
    }

    /// SQS counts 12 h from its own receipt, a little before the receive's answer came,
    /// and the call takes time to reach it: a capped retry-after asked 999 ms after receipt
    /// leaves that room, as renewals do, instead of asking for 12 h less 1 ms.
    #[test]
    fn a_capped_retry_after_leaves_room_for_the_calls_latency() {
        let elapsed = Duration::from_millis(999);
        let seconds = retry_after_seconds(Duration::from_secs(24 * 3600), elapsed);
        let hidden_until = elapsed + Duration::from_secs(u64::try_from(seconds).unwrap());
        assert!(
            hidden_until <= MAX_VISIBILITY - RECEIPT_SLACK,
            "{seconds} s asked {elapsed:?} after receipt: hidden until {hidden_until:?} after receipt"
        );
    }
}
