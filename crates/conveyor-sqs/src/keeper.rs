//! SQS's settle side for the kit's keeper ([`conveyor::kit::Keep`]): renewals are
//! `ChangeMessageVisibilityBatch` calls, ten messages each, never past 12 hours from
//! receipt; settlements are `DeleteMessageBatch` for acks, `ChangeMessageVisibilityBatch`
//! for retries and releases (0, or the retry-after delay), and for rejects a
//! `SendMessageBatch` to the dead-letter queue (made while the message is still renewed)
//! followed by the delete.

use std::sync::Arc;
use std::time::Duration;

use conveyor::Report;
use conveyor::kit::{Keep, LeaseTimes, Rejected, Renewed, Taken, Verdict};
use tokio::sync::OnceCell;
use tokio::time::Instant;

use crate::attributes::{self, Outgoing};
use crate::calls::{Calls, Failed, send_built, send_entry};
use crate::data_types::AttributeTypes;
use crate::error::SqsError;
use crate::inflight::{Held, renewal};
use crate::publisher::{chunk_lengths, unique_id};
use crate::queue::{DeadLetter, QueueInfo};
use crate::settle::{
    BatchCall, ChangeVisibility, Delete, Hide, MAX_VISIBILITY, RECEIPT_SLACK, settle_all,
    stale_receipt, whole_seconds_down, with_retries,
};

/// The longest reject reason a dead letter carries; a longer one is cut (at a character
/// boundary) and ends with `…`.
const MAX_REASON_BYTES: usize = 1024;

/// What a subscription's keeper needs of SQS.
pub(crate) struct SqsKeep<C> {
    pub(crate) calls: C,
    pub(crate) queue: Arc<QueueInfo>,
    /// The visibility timeout the pump receives with and the keeper renews to.
    pub(crate) visibility: Duration,
    /// The dead-letter queue, once resolved.
    pub(crate) dead_letter_queue: OnceCell<Arc<QueueInfo>>,
}

/// A renewal due: the receipt, and how long to hide the message for.
pub(crate) struct Renewal {
    receipt: String,
    renew: Duration,
}

/// A settlement taken: the receipt, and what a dead letter needs: the message id (a FIFO
/// dead-letter queue deduplicates by it) and the types of its attributes.
pub(crate) struct Drawn {
    receipt: String,
    message_id: Option<String>,
    types: AttributeTypes,
}

/// A rejected message taken for its dead-letter queue.
struct Reject {
    receipt: String,
    message_id: Option<String>,
    types: AttributeTypes,
    rejected: Box<Rejected>,
}

/// A batch of settlements ready for their calls.
#[derive(Default)]
pub(crate) struct SettleCalls {
    deletes: Vec<String>,
    hides: Vec<Hide>,
}

/// A rejected message, ready for its dead-letter queue.
struct DeadLetterMessage {
    receipt: String,
    outgoing: Outgoing,
    group: Option<String>,
    deduplication: Option<String>,
    rejected: Box<Rejected>,
}

/// `SendMessageBatch` of rejected messages to their dead-letter queue.
struct SendDeadLetters<'a, C> {
    calls: &'a C,
    queue: &'a QueueInfo,
}

impl<C: Calls> BatchCall<DeadLetterMessage> for SendDeadLetters<'_, C> {
    const NAME: &'static str = "SendMessageBatch";
    // A send that got no answer may have stored its messages: sent again, a standard
    // dead-letter queue (which deduplicates nothing) would hold each up to three times.
    // Its messages are made visible again instead, as for any send that fails.
    const REPEAT_FAILED_CALL: bool = false;

    fn queue(&self) -> &QueueInfo {
        self.queue
    }

    async fn call(&self, batch: &[DeadLetterMessage]) -> Result<Failed, SqsError> {
        let built = batch.iter().enumerate().map(|(i, message)| {
            send_entry(i, &message.outgoing, &message.group, &message.deduplication).build()
        });
        send_built(self.calls, self.queue, built).await
    }
}

impl<C: Calls> Keep for SqsKeep<C> {
    type Data = Held;
    type Renewal = Renewal;
    type Drawn = Drawn;
    type Prepared = SettleCalls;

    fn renewal(&self, _: u64, held: &Held, times: LeaseTimes) -> Option<Renewal> {
        let cap = MAX_VISIBILITY.saturating_sub(RECEIPT_SLACK);
        let renew = renewal(times, self.visibility, cap)?;
        Some(Renewal {
            receipt: held.receipt.clone(),
            renew,
        })
    }

    /// One `ChangeMessageVisibilityBatch`; a receipt SQS no longer takes is lost.
    async fn renew(&self, due: &[&Renewal], _retry: bool) -> Result<Vec<Renewed>, String> {
        // Each renewal as the whole seconds SQS applies, sent and recorded alike.
        let seconds: Vec<(i32, Duration)> = due
            .iter()
            .map(|renewal| whole_seconds_down(renewal.renew))
            .collect();
        let entries: Vec<(String, i32)> = due
            .iter()
            .zip(&seconds)
            .map(|(renewal, (seconds, _))| (renewal.receipt.clone(), *seconds))
            .collect();
        // SQS hides each from when it takes the call, no sooner than now.
        let sent = Instant::now();
        // The keeper marks the queue's call health by the outcome.
        let failed = self
            .calls
            .change_visibility(&self.queue, &entries)
            .await
            .map_err(|error| Report(&error).to_string())?;
        let renewed = seconds.iter().enumerate().map(|(index, (_, renew))| {
            match failed.iter().find(|(i, _)| *i == index) {
                Some((_, reason)) if stale_receipt(reason) => Renewed::Lost(reason.clone()),
                Some((_, reason)) => Renewed::Failed(reason.clone()),
                None => {
                    if *renew < self.visibility {
                        tracing::warn!(
                            queue = self.queue.name,
                            visible_in = ?renew,
                            "a message has been held for as long as SQS allows (12 h from its receipt): it will be handed out again while its handler runs"
                        );
                    }
                    Renewed::Until(sent + *renew)
                }
            }
        });
        Ok(renewed.collect())
    }

    /// Its renewals need the receipt alone: the rest is taken, not copied.
    fn draw(held: &mut Held) -> Drawn {
        Drawn {
            receipt: held.receipt.clone(),
            message_id: held.message_id.take(),
            types: std::mem::take(&mut held.types),
        }
    }

    /// The types its attributes came with ([`crate::attribute_types`]).
    fn record(held: &Held) -> Option<Box<dyn std::any::Any + Send>> {
        Some(Box::new(held.types.clone()))
    }

    /// Sorts the settlements by call (an ack is a delete, a retry a change of visibility,
    /// capped at 12 h from receipt when its call is made), and sends the rejects' dead
    /// letters.
    async fn prepare(&self, taken: Vec<Taken<Drawn>>) -> SettleCalls {
        let mut calls = SettleCalls::default();
        let mut rejects = Vec::new();
        for Taken {
            data:
                Drawn {
                    receipt,
                    message_id,
                    types,
                },
            received_at,
            verdict,
            ..
        } in taken
        {
            match verdict {
                Verdict::Ack => calls.deletes.push(receipt),
                Verdict::Retry { after } => calls.hides.push(Hide {
                    receipt,
                    delay: after.unwrap_or_default(),
                    received_at,
                }),
                Verdict::Reject(rejected) => rejects.push(Reject {
                    receipt,
                    message_id,
                    types,
                    rejected,
                }),
            }
        }
        if !rejects.is_empty() {
            self.dead_letter(rejects, &mut calls.deletes, &mut calls.hides)
                .await;
        }
        calls
    }

    async fn settle(&self, calls: SettleCalls) -> bool {
        let (client, queue) = (&self.calls, &*self.queue);
        let deleted = settle_all(
            &Delete {
                calls: client,
                queue,
            },
            calls.deletes,
        )
        .await;
        let hidden = settle_all(
            &ChangeVisibility {
                calls: client,
                queue,
            },
            calls.hides,
        )
        .await;
        deleted && hidden
    }
}

impl<C: Calls> SqsKeep<C> {
    /// Sends rejected messages to the dead-letter queue (`SendMessageBatch`); those sent
    /// are then deleted with the acks. Without a redrive policy they are deleted with an
    /// error log. One that cannot be dead-lettered is made visible again, so that it is
    /// not lost (the queue's redrive policy still moves it after `maxReceiveCount`).
    async fn dead_letter(
        &self,
        rejects: Vec<Reject>,
        deletes: &mut Vec<String>,
        hides: &mut Vec<Hide>,
    ) {
        let queue = self.queue.clone();
        let dead_letter_queue = match self.dead_letter_queue().await {
            Ok(Some(dead_letter_queue)) => dead_letter_queue,
            Ok(None) => {
                for Reject {
                    receipt, rejected, ..
                } in rejects
                {
                    tracing::error!(
                        queue = queue.name,
                        reason = rejected.reason,
                        attempt = rejected.attempt,
                        "rejected, and the queue has no dead-letter queue (no redrive policy): deleting the message"
                    );
                    deletes.push(receipt);
                }
                return;
            }
            Err(error) => {
                for Reject {
                    receipt, rejected, ..
                } in rejects
                {
                    tracing::error!(
                        queue = queue.name,
                        reason = rejected.reason,
                        attempt = rejected.attempt,
                        error = %Report(&error),
                        "rejected, but the dead-letter queue cannot be reached: the message is visible again"
                    );
                    hides.push(Hide::visible_now(receipt));
                }
                return;
            }
        };
        let mut ready = Vec::with_capacity(rejects.len());
        for reject in rejects {
            match dead_letter_message(&queue, &dead_letter_queue, reject) {
                Ok(message) => ready.push(message),
                Err((receipt, rejected, error)) => {
                    tracing::error!(
                        queue = queue.name,
                        dead_letter_queue = dead_letter_queue.name,
                        reason = rejected.reason,
                        attempt = rejected.attempt,
                        error = %Report(&error),
                        "rejected, but the message cannot go to the dead-letter queue: it is visible again"
                    );
                    hides.push(Hide::visible_now(receipt));
                }
            }
        }
        let sizes: Vec<usize> = ready.iter().map(|m| m.outgoing.size).collect();
        let mut ready = ready.into_iter();
        for length in chunk_lengths(&sizes, dead_letter_queue.max_message_size) {
            let chunk: Vec<DeadLetterMessage> = ready.by_ref().take(length).collect();
            self.send_dead_letters(&dead_letter_queue, chunk, deletes, hides)
                .await;
        }
    }

    /// One `SendMessageBatch` to the dead-letter queue, retrying failed entries; those sent
    /// are deleted, those that keep failing made visible again.
    async fn send_dead_letters(
        &self,
        dead_letter_queue: &QueueInfo,
        chunk: Vec<DeadLetterMessage>,
        deletes: &mut Vec<String>,
        hides: &mut Vec<Hide>,
    ) {
        let sent = |message: DeadLetterMessage| {
            tracing::info!(
                queue = self.queue.name,
                dead_letter_queue = dead_letter_queue.name,
                reason = message.rejected.reason,
                attempt = message.rejected.attempt,
                "rejected: moved to the dead-letter queue"
            );
            conveyor::telemetry::record_dead_lettered("aws_sqs", &self.queue.name);
            deletes.push(message.receipt);
        };
        let send = SendDeadLetters {
            calls: &self.calls,
            queue: dead_letter_queue,
        };
        let failed = with_retries(&send, chunk, sent).await.all();
        for (message, error) in failed {
            tracing::error!(
                queue = self.queue.name,
                dead_letter_queue = dead_letter_queue.name,
                reason = message.rejected.reason,
                attempt = message.rejected.attempt,
                error,
                "rejected, but sending to the dead-letter queue failed for good: the message is visible again"
            );
            hides.push(Hide::visible_now(message.receipt));
        }
    }

    /// The queue's dead-letter queue (resolved once), `None` without a redrive policy.
    async fn dead_letter_queue(&self) -> Result<Option<Arc<QueueInfo>>, SqsError> {
        match &self.queue.dead_letter {
            DeadLetter::None => Ok(None),
            DeadLetter::Unreadable(policy) => Err(SqsError::Config(format!(
                "the queue's redrive policy names no dead-letter queue this transport can read: {policy}"
            ))),
            DeadLetter::Target(target) => self
                .dead_letter_queue
                .get_or_try_init(|| self.calls.dead_letter_queue(target))
                .await
                .map(|resolved| Some(resolved.clone())),
        }
    }
}

type Refused = (String, Box<Rejected>, Box<SqsError>);

/// A rejected message as its dead-letter queue takes it: payload and headers as received,
/// the reason in the `x-reject-reason` attribute (left out, with a warning, where it does
/// not fit in SQS's ten attributes or the queue's size limit), and for a FIFO queue the
/// message's group and its SQS message id as deduplication id.
fn dead_letter_message(
    queue: &QueueInfo,
    dead_letter_queue: &QueueInfo,
    reject: Reject,
) -> Result<DeadLetterMessage, Refused> {
    let Reject {
        receipt,
        message_id,
        types,
        rejected,
    } = reject;
    let reason = cut(&rejected.reason, MAX_REASON_BYTES);
    let (group, deduplication) = if dead_letter_queue.fifo {
        let group = rejected
            .partition_key
            .as_ref()
            .map_or_else(|| queue.name.clone(), |key| key.as_str().to_string());
        (Some(group), Some(message_id.unwrap_or_else(unique_id)))
    } else {
        (None, None)
    };
    let encode = |reason: Option<&str>| {
        attributes::encode_dead_letter(
            &dead_letter_queue.name,
            group.as_deref(),
            &rejected.payload,
            &rejected.headers,
            &types,
            reason,
        )
    };
    let outgoing = match encode(Some(&reason)) {
        Ok(outgoing) if outgoing.size <= dead_letter_queue.max_message_size => outgoing,
        _ => {
            let outgoing = match encode(None) {
                Ok(outgoing) if outgoing.size <= dead_letter_queue.max_message_size => outgoing,
                Ok(outgoing) => {
                    let error = SqsError::InvalidMessage {
                        queue: dead_letter_queue.name.clone(),
                        reason: format!(
                            "the message is {} bytes; the dead-letter queue takes at most {}",
                            outgoing.size, dead_letter_queue.max_message_size
                        ),
                    };
                    return Err((receipt, rejected, Box::new(error)));
                }
                Err(error) => return Err((receipt, rejected, Box::new(error))),
            };
            tracing::warn!(
                queue = queue.name,
                reason = rejected.reason,
                "the reject reason does not fit in the message's attributes; dead-lettering it without"
            );
            outgoing
        }
    };
    Ok(DeadLetterMessage {
        receipt,
        outgoing,
        group,
        deduplication,
        rejected,
    })
}

/// `text` cut to at most `max` bytes at a character boundary, marked with `…` if cut.
fn cut(text: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if text.len() <= max {
        return text.into();
    }
    let mut end = max.saturating_sub('…'.len_utf8());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end]).into()
}

#[cfg(test)]
mod tests {
    //! What SQS's side of the keeper adds to the kit's (whose own tests prove how the
    //! keeper renews and settles): the calls each settlement becomes, what SQS's answers
    //! to a renewal mean, the 12-hour limit, and dead letters.
    use std::collections::VecDeque;
    use std::sync::Mutex;

    use aws_sdk_sqs::types::SendMessageBatchRequestEntry;

    use conveyor::kit::{Alive, CallHealth, Keeper, KeeperSignals, Leases, PullOptions};
    use conveyor::{Headers, PartitionKey, REJECT_REASON_HEADER, Settled, Settlement};
    use tokio::sync::watch;

    use super::*;
    use crate::queue::DeadLetterTarget;
    use crate::settle::{ATTEMPTS, BATCH_LIMIT};

    /// One call the keeper made.
    #[derive(Clone, Debug, PartialEq, Eq)]
    enum Call {
        Visibility(Vec<(String, i32)>),
        Delete(Vec<String>),
        /// The queue, and per entry its body, group and reject reason.
        Send(String, Vec<(String, Option<String>, Option<String>)>),
    }

    /// Records calls, each with the time it returned, `latency` after it was made.
    #[derive(Clone, Default)]
    struct Script {
        calls: Arc<Mutex<Vec<(Instant, Call)>>>,
        latency: Duration,
        dead_letter_queue: Option<Arc<QueueInfo>>,
        fail_sends: bool,
        /// Sends fail as a whole, as when no answer comes.
        send_calls_fail: bool,
        /// How long a send takes, beyond `latency`.
        send_latency: Duration,
        /// The entries the next renewal calls fail, then none.
        renewal_answers: Arc<Mutex<VecDeque<Failed>>>,
    }

    impl Script {
        async fn call(&self, call: Call) {
            tokio::time::sleep(self.latency).await;
            self.calls.lock().unwrap().push((Instant::now(), call));
        }

        fn calls(&self) -> Vec<Call> {
            self.timed_calls()
                .into_iter()
                .map(|(_, call)| call)
                .collect()
        }

        fn timed_calls(&self) -> Vec<(Instant, Call)> {
            self.calls.lock().unwrap().clone()
        }
    }

    impl Calls for Script {
        async fn change_visibility(
            &self,
            _: &QueueInfo,
            entries: &[(String, i32)],
        ) -> Result<Vec<(usize, String)>, SqsError> {
            self.call(Call::Visibility(entries.to_vec())).await;
            Ok(self
                .renewal_answers
                .lock()
                .unwrap()
                .pop_front()
                .unwrap_or_default())
        }

        async fn delete(
            &self,
            _: &QueueInfo,
            receipts: &[String],
        ) -> Result<Vec<(usize, String)>, SqsError> {
            self.call(Call::Delete(receipts.to_vec())).await;
            Ok(Vec::new())
        }

        async fn send(
            &self,
            queue: &QueueInfo,
            entries: Vec<SendMessageBatchRequestEntry>,
        ) -> Result<Vec<(usize, String)>, SqsError> {
            let seen = entries
                .iter()
                .map(|e| {
                    let reason = e
                        .message_attributes()
                        .and_then(|a| a.get(REJECT_REASON_HEADER))
                        .and_then(|v| v.string_value())
                        .map(str::to_string);
                    (
                        e.message_body().to_string(),
                        e.message_group_id().map(str::to_string),
                        reason,
                    )
                })
                .collect();
            tokio::time::sleep(self.send_latency).await;
            self.call(Call::Send(queue.name.clone(), seen)).await;
            if self.send_calls_fail {
                return Err(SqsError::Config("no answer".into()));
            }
            if self.fail_sends {
                Ok((0..entries.len())
                    .map(|i| (i, "InternalError".into()))
                    .collect())
            } else {
                Ok(Vec::new())
            }
        }

        async fn dead_letter_queue(
            &self,
            target: &DeadLetterTarget,
        ) -> Result<Arc<QueueInfo>, SqsError> {
            self.dead_letter_queue
                .clone()
                .ok_or_else(|| SqsError::NoSuchQueue {
                    queue: target.arn.clone(),
                    source: None,
                })
        }
    }

    struct Running {
        in_flight: Arc<Leases<Held>>,
        /// The deliveries' settler, in the keeper's eyes.
        alive: Alive,
        closing: watch::Sender<bool>,
        /// Kept: a dropped sender would mean the subscription drains.
        _draining: watch::Sender<bool>,
        keeper: tokio::task::JoinHandle<()>,
    }

    const VISIBILITY: Duration = Duration::from_secs(30);

    fn sqs_keep(script: &Script, queue: QueueInfo) -> SqsKeep<Script> {
        SqsKeep {
            calls: script.clone(),
            queue: Arc::new(queue),
            visibility: VISIBILITY,
            dead_letter_queue: OnceCell::new(),
        }
    }

    fn start(script: &Script, queue: QueueInfo) -> Running {
        let in_flight = Arc::new(Leases::default());
        let (alive, alive_rx) = Alive::new();
        let (closing, closing_rx) = watch::channel(false);
        let (draining, draining_rx) = watch::channel(false);
        let options = PullOptions {
            queue: queue.name.clone(),
            lease: VISIBILITY,
            receive_batch: BATCH_LIMIT,
            receive_bound: Duration::from_secs(25),
            settle_linger: Duration::from_millis(5),
            settle_batch: BATCH_LIMIT,
        };
        let keep = sqs_keep(script, queue);
        let keeper = Keeper::new(keep, in_flight.clone(), &options, CallHealth::default());
        let keeper = tokio::spawn(keeper.run(KeeperSignals {
            closing: closing_rx,
            draining: draining_rx,
            alive: alive_rx,
        }));
        Running {
            alive,
            in_flight,
            closing,
            _draining: draining,
            keeper,
        }
    }

    impl Running {
        fn receive(&self, receipt: &str) -> u64 {
            let held = Held {
                receipt: receipt.into(),
                message_id: Some(format!("id-{receipt}")),
                types: AttributeTypes::new(),
            };
            self.in_flight.insert(held, VISIBILITY)
        }

        fn settle(&self, tag: u64, settlement: Settlement<'_>) {
            self.settle_as(Settled::new(tag, settlement));
        }

        /// Settles as the subscription's settler does.
        fn settle_as(&self, settled: Settled<'_>) {
            assert!(self.in_flight.settle(settled.tag, Verdict::of(settled)));
        }

        async fn close(self) {
            self.closing.send_replace(true);
            drop(self.alive);
            self.keeper.await.unwrap();
        }
    }

    /// When the renewals of `script` were made, counted from `start`.
    fn renewals_at(script: &Script, start: Instant) -> Vec<Duration> {
        script
            .timed_calls()
            .into_iter()
            .filter(|(_, call)| matches!(call, Call::Visibility(_)))
            .map(|(at, _)| at - start)
            .collect()
    }

    /// Acks are deleted; retries and releases made visible now; a retry-after hidden for
    /// its delay in whole seconds, rounded up so that it never comes back sooner; a
    /// reject, without a dead-letter queue, deleted.
    #[tokio::test(start_paused = true)]
    async fn each_settlement_goes_out_in_its_sqs_call() {
        let script = Script::default();
        let running = start(&script, QueueInfo::for_tests("q"));
        let tags = ["acked", "retried", "released", "retried after", "rejected"]
            .map(|receipt| running.receive(receipt));
        running.settle(tags[0], Settlement::Ack);
        running.settle(tags[1], Settlement::Retry);
        running.settle(tags[2], Settlement::Release);
        running.settle(tags[3], Settlement::RetryAfter(Duration::from_millis(1500)));
        running.settle(tags[4], Settlement::Reject { reason: "bad" });
        running.close().await;
        assert_eq!(
            script.calls(),
            vec![
                Call::Delete(vec!["acked".into(), "rejected".into()]),
                Call::Visibility(vec![
                    ("retried".into(), 0),
                    ("released".into(), 0),
                    ("retried after".into(), 2)
                ]),
            ]
        );
    }

    /// SQS hides a message from when it takes a renewal: the lapse a renewal answers
    /// counts from when its call was sent, not from when a slow answer came back.
    #[tokio::test(start_paused = true)]
    async fn a_renewal_counts_its_visibility_from_when_its_call_was_sent() {
        let script = Script {
            latency: Duration::from_secs(2),
            ..Script::default()
        };
        let keep = sqs_keep(&script, QueueInfo::for_tests("q"));
        let renewal = Renewal {
            receipt: "a".into(),
            renew: VISIBILITY,
        };
        let sent = Instant::now();
        let renewed = keep.renew(&[&renewal], false).await.unwrap();
        assert_eq!(sent.elapsed(), script.latency, "a slow call");
        assert_eq!(renewed, [Renewed::Until(sent + VISIBILITY)]);
    }

    /// A receipt SQS no longer takes is a lease lost (renewing it again would fail
    /// again); an entry that failed for any other reason is tried again.
    #[tokio::test(start_paused = true)]
    async fn a_renewal_refused_for_a_stale_receipt_is_lost_and_for_another_reason_failed() {
        let script = Script::default();
        let stale = "ReceiptHandleIsInvalid: The input receipt handle is invalid.";
        let busy = "InternalError: busy";
        script
            .renewal_answers
            .lock()
            .unwrap()
            .push_back(vec![(0, stale.into()), (1, busy.into())]);
        let keep = sqs_keep(&script, QueueInfo::for_tests("q"));
        let renewals = ["stale", "busy"].map(|receipt| Renewal {
            receipt: receipt.into(),
            renew: VISIBILITY,
        });
        let renewed = keep
            .renew(&[&renewals[0], &renewals[1]], false)
            .await
            .unwrap();
        assert_eq!(
            renewed,
            [Renewed::Lost(stale.into()), Renewed::Failed(busy.into())]
        );
    }

    /// A receipt SQS no longer takes for a renewal is not renewed again (it would fail
    /// again, at every tick until the handler ends).
    #[tokio::test(start_paused = true)]
    async fn a_message_whose_receipt_sqs_no_longer_takes_is_not_renewed_again() {
        let script = Script::default();
        script.renewal_answers.lock().unwrap().push_back(vec![(
            0,
            "ReceiptHandleIsInvalid: The input receipt handle is invalid.".into(),
        )]);
        let began = Instant::now();
        let running = start(&script, QueueInfo::for_tests("q"));
        let tag = running.receive("a");
        tokio::time::sleep(Duration::from_secs(120)).await;
        running.settle(tag, Settlement::Ack);
        running.close().await;
        assert_eq!(renewals_at(&script, began), [Duration::from_secs(20)]);
    }

    /// What a test logged, for assertions.
    #[derive(Clone, Default)]
    struct Logs(Arc<Mutex<Vec<u8>>>);

    thread_local! {
        /// Where this thread's log lines go while a test captures them.
        static CAPTURING: std::cell::RefCell<Option<Logs>> = const { std::cell::RefCell::new(None) };
    }

    impl Logs {
        /// Captures what this thread logs at INFO and up until the guard is dropped; a
        /// paused-clock test's runtime has one thread, so the keeper's task logs here.
        ///
        /// One global subscriber writes each thread's lines to that thread's capture. A
        /// scoped subscriber per test (`set_default`) lost an event now and then with
        /// tests running side by side: `tracing` caches whether a callsite is wanted for
        /// every thread at once.
        fn capture() -> (Logs, Capturing) {
            static INSTALLED: std::sync::Once = std::sync::Once::new();
            INSTALLED.call_once(|| {
                let subscriber = tracing_subscriber::fmt()
                    .with_ansi(false)
                    .with_writer(|| ThisThread)
                    .finish();
                tracing::subscriber::set_global_default(subscriber)
                    .expect("no other global subscriber in these tests");
            });
            let logs = Logs::default();
            CAPTURING.with(|capturing| *capturing.borrow_mut() = Some(logs.clone()));
            (logs, Capturing)
        }
    }

    /// Ends this thread's capture when dropped.
    struct Capturing;

    impl Drop for Capturing {
        fn drop(&mut self) {
            CAPTURING.with(|capturing| capturing.borrow_mut().take());
        }
    }

    /// Writes to this thread's capture, if any.
    struct ThisThread;

    impl std::io::Write for ThisThread {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            CAPTURING.with(|capturing| {
                if let Some(logs) = capturing.borrow().as_ref() {
                    logs.0.lock().unwrap().extend_from_slice(bytes);
                }
            });
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_message_held_for_twelve_hours_is_renewed_up_to_the_limit_once_and_a_warning_says_so()
    {
        let (logs, _logging) = Logs::capture();
        let script = Script::default();
        let running = start(&script, QueueInfo::for_tests("q"));
        let received = Instant::now();
        let held = running.receive("held");
        tokio::time::sleep(MAX_VISIBILITY + VISIBILITY).await;
        running.settle(held, Settlement::Ack);
        running.close().await;

        let renewals: Vec<(Instant, i32)> = script
            .timed_calls()
            .into_iter()
            .filter_map(|(at, call)| match call {
                Call::Visibility(entries) => Some((at, entries[0].1)),
                _ => None,
            })
            .collect();
        let short: Vec<i32> = renewals
            .iter()
            .map(|&(_, seconds)| seconds)
            .filter(|&seconds| seconds < 30)
            .collect();
        assert_eq!(short.len(), 1, "one renewal up to the limit: {short:?}");
        let &(last_at, last) = renewals.last().unwrap();
        assert_eq!(
            last_at + Duration::from_secs(u64::try_from(last).unwrap()),
            received + MAX_VISIBILITY - RECEIPT_SLACK,
            "the last renewal hides it up to (just short of) 12 h from its receipt, and is the short one"
        );
        let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
        assert_eq!(
            text.matches("held for as long as SQS allows").count(),
            1,
            "{text}"
        );
    }

    /// A retry-after settled a minute short of 12 h from receipt waits behind its ack
    /// neighbour's slow delete. The seconds it asks for are worked out when its own call is
    /// made, not when it was settled, so it still stops short of SQS's limit.
    #[tokio::test(start_paused = true)]
    async fn a_retry_after_waiting_behind_a_slow_call_still_stops_short_of_twelve_hours() {
        let script = Script {
            latency: Duration::from_secs(20),
            ..Script::default()
        };
        let running = start(&script, QueueInfo::for_tests("q"));
        let received = Instant::now();
        let acked = running.receive("acked");
        let retried = running.receive("retried");
        tokio::time::sleep(MAX_VISIBILITY - Duration::from_secs(60)).await;
        running.settle(acked, Settlement::Ack);
        running.settle(
            retried,
            Settlement::RetryAfter(Duration::from_secs(24 * 3600)),
        );
        running.close().await;

        let calls = script.timed_calls();
        let delete = calls
            .iter()
            .position(|(_, call)| *call == Call::Delete(vec!["acked".into()]))
            .expect("the ack's delete");
        let (returned, seconds) = calls[delete..]
            .iter()
            .find_map(|(at, call)| match call {
                Call::Visibility(entries) if entries[0].0 == "retried" => Some((*at, entries[0].1)),
                _ => None,
            })
            .expect("the retry-after's call, after the delete");
        let sent = returned - script.latency;
        let hidden_until = sent + Duration::from_secs(u64::try_from(seconds).unwrap());
        assert!(
            hidden_until <= received + MAX_VISIBILITY - RECEIPT_SLACK,
            "{seconds} s asked {:?} after receipt",
            sent - received
        );
    }

    fn with_dead_letter_queue(name: &str, fifo: bool) -> (Script, QueueInfo) {
        let mut script = Script::default();
        let dead = if fifo {
            format!("{name}-dead.fifo")
        } else {
            format!("{name}-dead")
        };
        script.dead_letter_queue = Some(Arc::new(QueueInfo::for_tests(&dead)));
        let mut queue = QueueInfo::for_tests(name);
        queue.dead_letter = DeadLetter::Target(DeadLetterTarget {
            arn: format!("arn:aws:sqs:us-east-1:123456789012:{dead}"),
            name: dead,
            account: "123456789012".into(),
        });
        (script, queue)
    }

    fn reject(running: &Running, tag: u64, body: &str, key: Option<&str>, reason: &str) {
        let mut settled = Settled::new(tag, Settlement::Reject { reason });
        settled.payload = conveyor::Bytes::copy_from_slice(body.as_bytes());
        settled.headers = Headers::new();
        settled.partition_key = key.map(PartitionKey::from);
        running.settle_as(settled);
    }

    /// A rejected message stays renewed while its dead letter is sent, however long that
    /// takes: rejected with 26 s left and sent for 30 s, it would show (and run again)
    /// before its delete.
    #[tokio::test(start_paused = true)]
    async fn a_reject_stays_renewed_while_its_dead_letter_is_sent() {
        let (mut script, queue) = with_dead_letter_queue("orders", false);
        script.send_latency = Duration::from_secs(30);
        let began = Instant::now();
        let running = start(&script, queue);
        let tag = running.receive("r");
        // Renewed at 20 s and 40 s, to show at 70 s; rejected at 44 s.
        tokio::time::sleep(Duration::from_secs(44)).await;
        reject(&running, tag, "{}", None, "bad input");
        running.close().await;
        let calls: Vec<(u64, &str)> = script
            .timed_calls()
            .into_iter()
            .map(|(at, call)| {
                let kind = match call {
                    Call::Visibility(_) => "renew",
                    Call::Send(..) => "send",
                    Call::Delete(_) => "delete",
                };
                ((at - began).as_secs(), kind)
            })
            .collect();
        // Renewed at 60 s too, while the send is under way: hidden until 90 s.
        assert_eq!(
            calls,
            [
                (20, "renew"),
                (40, "renew"),
                (60, "renew"),
                (74, "send"),
                (74, "delete")
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_reject_goes_to_the_dead_letter_queue_with_its_reason_then_is_deleted() {
        let (script, queue) = with_dead_letter_queue("orders.fifo", true);
        let running = start(&script, queue);
        let tag = running.receive("r");
        reject(&running, tag, "{\"id\":1}", Some("alice"), "bad input");
        running.close().await;
        assert_eq!(
            script.calls(),
            vec![
                Call::Send(
                    "orders.fifo-dead.fifo".into(),
                    vec![(
                        "{\"id\":1}".into(),
                        Some("alice".into()),
                        Some("bad input".into())
                    )]
                ),
                Call::Delete(vec!["r".into()]),
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_reject_that_cannot_be_dead_lettered_is_not_deleted() {
        let (mut script, queue) = with_dead_letter_queue("orders", false);
        script.fail_sends = true;
        let running = start(&script, queue);
        let tag = running.receive("r");
        reject(&running, tag, "x", None, "bad input");
        running.close().await;
        let calls = script.calls();
        assert_eq!(
            calls.iter().filter(|c| matches!(c, Call::Send(..))).count(),
            ATTEMPTS as usize
        );
        assert!(!calls.iter().any(|c| matches!(c, Call::Delete(_))));
        assert_eq!(
            calls.last(),
            Some(&Call::Visibility(vec![("r".into(), 0)])),
            "visible again, for the redrive policy to take"
        );
    }

    /// A send to the dead-letter queue that gets no answer may have stored the message:
    /// it is not made again (a standard queue would store it up to three times); the
    /// message is made visible again, as for a send that failed.
    #[tokio::test(start_paused = true)]
    async fn a_dead_letter_send_that_fails_as_a_whole_is_not_made_again() {
        let (mut script, queue) = with_dead_letter_queue("orders", false);
        script.send_calls_fail = true;
        let running = start(&script, queue);
        let tag = running.receive("r");
        reject(&running, tag, "x", None, "bad input");
        running.close().await;
        assert_eq!(
            script.calls(),
            vec![
                Call::Send(
                    "orders-dead".into(),
                    vec![("x".into(), None, Some("bad input".into()))]
                ),
                Call::Visibility(vec![("r".into(), 0)]),
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_reject_without_a_dead_letter_queue_is_deleted() {
        let script = Script::default();
        let running = start(&script, QueueInfo::for_tests("q"));
        let tag = running.receive("r");
        reject(&running, tag, "x", None, "bad input");
        running.close().await;
        assert_eq!(script.calls(), vec![Call::Delete(vec!["r".into()])]);
    }

    #[test]
    fn long_reasons_are_cut_at_a_character_boundary() {
        assert_eq!(cut("short", 10), "short");
        let long = "é".repeat(600);
        let cut = cut(&long, MAX_REASON_BYTES);
        assert!(
            cut.len() <= MAX_REASON_BYTES && cut.ends_with('…'),
            "{}",
            cut.len()
        );
    }
}
