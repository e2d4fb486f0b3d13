//! Publishing to SQS: `SendMessage`, and `SendMessageBatch` split by ten entries and by
//! the queue's size limit.

use std::time::Duration;

use conveyor::{Error, Message, MessageParts, Publisher};
use tracing::Instrument;

use crate::attributes::{self, Outgoing};
use crate::broker::SqsBroker;
use crate::calls::{Calls, Failed, send_built, send_entry};
use crate::data_types::AttributeTypes;
use crate::error::{SqsError, redacted, shown};
use crate::queue::QueueInfo;
use crate::settle::{BATCH_LIMIT, BatchCall, whole_seconds_up, with_retries};

/// The longest delay SQS takes on a message (15 minutes).
const MAX_DELAY: Duration = Duration::from_secs(900);

/// A message checked against its queue and mapped onto SQS, ready to send.
struct Prepared {
    outgoing: Outgoing,
    group: Option<String>,
    deduplication: Option<String>,
    delay_seconds: Option<i32>,
}

fn prepare(queue: &QueueInfo, parts: MessageParts) -> Result<Prepared, SqsError> {
    prepare_typed(queue, parts, &AttributeTypes::new())
}

/// [`prepare`], the headers `types` names going as the types it gives.
fn prepare_typed(
    queue: &QueueInfo,
    parts: MessageParts,
    types: &AttributeTypes,
) -> Result<Prepared, SqsError> {
    let invalid = |reason: String| SqsError::InvalidMessage {
        queue: queue.name.clone(),
        reason,
    };
    let outgoing = attributes::encode(&queue.name, queue.fifo, &parts, types)?;
    if outgoing.size > queue.max_message_size {
        return Err(invalid(format!(
            "the message is {} bytes with its attributes; the queue takes at most {}",
            outgoing.size, queue.max_message_size
        )));
    }
    let delay_seconds = match parts.delay {
        None => None,
        Some(_) if queue.fifo => {
            return Err(invalid(
                "FIFO queues take no per-message delay; set the queue's DelaySeconds".into(),
            ));
        }
        Some(delay) if delay > MAX_DELAY => {
            return Err(invalid(format!(
                "a delay of {delay:?} is over SQS's 15 minutes"
            )));
        }
        // Rounded up: a message never comes sooner than asked (300 ms is 1 s).
        Some(delay) => Some(i32::try_from(whole_seconds_up(delay)).unwrap_or(i32::MAX)),
    };
    let (group, deduplication) = if queue.fifo {
        let group = parts.partition_key.as_ref().ok_or_else(|| {
            invalid("a FIFO queue needs a message group: set the message's partition_key".into())
        })?;
        let deduplication = match parts.message_id {
            Some(id) => Some(id),
            None if queue.content_based_deduplication => None,
            None => Some(unique_id()),
        };
        (Some(group.as_str().to_string()), deduplication)
    } else {
        // A standard queue has no message groups: the key does not travel.
        (None, None)
    };
    Ok(Prepared {
        outgoing,
        group,
        deduplication,
        delay_seconds,
    })
}

/// A deduplication id no other publish of this process, or (by its clock) of another
/// process, has used.
pub(crate) use conveyor::kit::unique_id;

/// `error` as the core's publish error ([`SqsError::into_publish`]). Its text quotes
/// `destination`, so an oversize one is cut there as in every error text (see [`shown`]).
fn publish_error(destination: &str, error: SqsError) -> Error {
    error.into_publish(shown(destination).into_owned())
}

impl Publisher for SqsBroker {
    /// Sends one message with `SendMessage`. `destination` is a queue name or URL. The
    /// message is checked first: a FIFO queue needs a partition key (its group), headers
    /// must fit in ten message attributes, with names SQS takes (headers with an empty
    /// value, which SQS takes in no attribute, share one that names them,
    /// [`EMPTY_HEADERS_ATTRIBUTE`](crate::EMPTY_HEADERS_ATTRIBUTE)), and on a FIFO queue a
    /// `MessageGroupId` header must be the partition key; the whole must fit the queue's
    /// size limit. A message that fails the check is
    /// [`Error::Refused`], any other failure [`Error::Publish`], saying why.
    async fn publish(&self, destination: &str, message: Message) -> Result<(), Error> {
        self.publish_typed(destination, message, &AttributeTypes::new())
            .await
    }

    /// Sends with `SendMessageBatch`, ten messages or the queue's size limit per call,
    /// whichever comes first. Every message is checked before the first call, so a bad
    /// one sends nothing. Entries SQS fails are tried again (up to three calls), except, on
    /// a FIFO queue, one of whose group SQS stored a later message in the same call (it
    /// would be stored out of order); if some are not sent, the error's source is
    /// [`SqsError::NotSent`], which names by index the messages not sent (the others
    /// were), so that resending those sends nothing twice.
    /// A call that fails as a whole is not made again (SQS may have stored its messages);
    /// `NotSent` names its messages as unconfirmed.
    async fn publish_batch(
        &self,
        destination: &str,
        mut messages: Vec<Message>,
    ) -> Result<(), Error> {
        let label = redacted(destination);
        let span = conveyor::trace::publish_span("aws_sqs", &label);
        for message in &mut messages {
            conveyor::trace::inject_context(&span, message.headers_mut());
        }
        let count = messages.len() as u64;
        let sent = self.send_all(destination, messages).instrument(span).await;
        record_sent(&label, count, &sent);
        sent
    }
}

/// Counts a publish of `count` messages in the publish metrics: of a batch that failed
/// part way, those sent as sent, and the others as `not_sent`.
fn record_sent(destination: &str, count: u64, sent: &Result<(), Error>) {
    if let Err(Error::Publish { source, .. }) = sent
        && let Some(SqsError::NotSent {
            not_sent,
            unconfirmed,
            ..
        }) = source.downcast_ref::<SqsError>()
    {
        let (refused, unknown) = (not_sent.len() as u64, unconfirmed.len() as u64);
        let went = count.saturating_sub(refused).saturating_sub(unknown);
        for (messages, error) in [
            (went, None),
            (refused, Some("not_sent")),
            (unknown, Some("unconfirmed")),
        ] {
            if messages > 0 {
                conveyor::telemetry::record_sent("aws_sqs", destination, messages, error);
            }
        }
        return;
    }
    let error = match sent {
        Ok(()) => None,
        Err(Error::Refused { .. }) => Some("invalid"),
        Err(Error::Publish { source, .. }) => Some(match source.downcast_ref::<SqsError>() {
            Some(SqsError::NoSuchQueue { .. }) => "no_such_queue",
            _ => "error",
        }),
        Err(_) => Some("error"),
    };
    conveyor::telemetry::record_sent("aws_sqs", destination, count, error);
}

impl SqsBroker {
    /// [`Publisher::publish`] with SQS data types for some of the message's headers:
    /// `Number` for one a subscription filter compares as a number, say, or the types a
    /// received message came with ([`attribute_types`](crate::attribute_types)). A header
    /// `types` does not name goes as [`publish`](Publisher::publish) sends it. A type SQS
    /// would refuse, or a value its type cannot carry (text for a `String` or `Number`
    /// type, a number for a `Number` one), is [`Error::Refused`] before any call.
    ///
    /// ```no_run
    /// # async fn f(broker: conveyor_sqs::SqsBroker) -> Result<(), conveyor::Error> {
    /// use conveyor::Message;
    /// use conveyor_sqs::AttributeTypes;
    ///
    /// let message = Message::builder().header("price", "12.50").json(&"order")?;
    /// let types = AttributeTypes::new().with("price", "Number");
    /// broker.publish_typed("orders", message, &types).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Publisher::publish`](conveyor::Publisher::publish): [`Error::Refused`] for a
    /// message SQS would refuse, before any call, else SQS's error.
    pub async fn publish_typed(
        &self,
        destination: &str,
        mut message: Message,
        types: &AttributeTypes,
    ) -> Result<(), Error> {
        // A queue URL's password stays out of the span and the metrics.
        let label = redacted(destination);
        let span = conveyor::trace::publish_span("aws_sqs", &label);
        conveyor::trace::inject_context(&span, message.headers_mut());
        let sent = self
            .send_one(destination, message, types)
            .instrument(span)
            .await;
        record_sent(&label, 1, &sent);
        sent
    }

    /// [`SqsBroker::publish_typed`], in its span.
    async fn send_one(
        &self,
        destination: &str,
        message: Message,
        types: &AttributeTypes,
    ) -> Result<(), Error> {
        let queue = self
            .resolve(destination)
            .await
            .map_err(|e| publish_error(destination, e))?;
        let prepared = prepare_typed(&queue, message.into_parts(), types)
            .map_err(|e| publish_error(destination, e))?;
        self.client()
            .send_message()
            .queue_url(&queue.url)
            .message_body(prepared.outgoing.body)
            .set_message_attributes(Some(prepared.outgoing.attributes).filter(|a| !a.is_empty()))
            .set_message_group_id(prepared.group)
            .set_message_deduplication_id(prepared.deduplication)
            .set_delay_seconds(prepared.delay_seconds)
            .send()
            .await
            .map_err(|e| {
                publish_error(destination, SqsError::call("SendMessage", &queue.name, e))
            })?;
        Ok(())
    }

    /// [`Publisher::publish_batch`], in its span.
    async fn send_all(&self, destination: &str, messages: Vec<Message>) -> Result<(), Error> {
        let queue = self
            .resolve(destination)
            .await
            .map_err(|e| publish_error(destination, e))?;
        let prepared = messages
            .into_iter()
            .map(|m| prepare(&queue, m.into_parts()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| publish_error(destination, e))?;
        send_in_batches(self, &queue, prepared)
            .await
            .map_err(|e| publish_error(destination, e))
    }
}

/// How many messages go in each `SendMessageBatch`, in order: at most ten, and at most
/// `limit` bytes together (each message alone already fits).
pub(crate) fn chunk_lengths(sizes: &[usize], limit: usize) -> Vec<usize> {
    let mut lengths = Vec::new();
    let (mut length, mut total) = (0, 0);
    for &size in sizes {
        if length == BATCH_LIMIT || (length > 0 && total + size > limit) {
            lengths.push(length);
            (length, total) = (0, 0);
        }
        length += 1;
        total += size;
    }
    if length > 0 {
        lengths.push(length);
    }
    lengths
}

/// `SendMessageBatch` of published messages, each with its index in the whole publish.
struct SendPublished<'a, C> {
    calls: &'a C,
    queue: &'a QueueInfo,
}

impl<C: Calls> BatchCall<(usize, Prepared)> for SendPublished<'_, C> {
    const NAME: &'static str = "SendMessageBatch";
    const REPEAT_FAILED_CALL: bool = false;

    fn queue(&self) -> &QueueInfo {
        self.queue
    }

    async fn call(&self, batch: &[(usize, Prepared)]) -> Result<Failed, SqsError> {
        let built = batch.iter().enumerate().map(|(i, (_, message))| {
            send_entry(i, &message.outgoing, &message.group, &message.deduplication)
                .set_delay_seconds(message.delay_seconds)
                .build()
        });
        send_built(self.calls, self.queue, built).await
    }

    /// On a FIFO queue, what [`out_of_order`] finds: sent again, those would be stored
    /// after messages of their group that come after them.
    fn hold_back(&self, batch: &[(usize, Prepared)], failed: &[bool]) -> Vec<Option<&'static str>> {
        if !self.queue.fifo {
            return Vec::new();
        }
        let groups: Vec<Option<&str>> = batch
            .iter()
            .map(|(_, message)| message.group.as_deref())
            .collect();
        out_of_order(&groups, failed)
    }
}

/// Of one `SendMessageBatch`'s entries on a FIFO queue (their message `groups`, those
/// SQS `failed`), the failed ones that sending again would store out of their group's
/// order, each with why: one that SQS stored a later message of its group after, and
/// every failed one of its group after it (so the rest of the group goes back to the
/// caller, in order, rather than around the gap).
fn out_of_order(groups: &[Option<&str>], failed: &[bool]) -> Vec<Option<&'static str>> {
    let mut held = vec![None; groups.len()];
    // From the end: the groups of which a later entry was stored.
    let mut stored_later = std::collections::HashSet::new();
    for (i, group) in groups.iter().enumerate().rev() {
        let Some(group) = group else { continue };
        if failed.get(i).copied().unwrap_or(false) {
            if stored_later.contains(group) {
                held[i] = Some(
                    "not sent again: SQS stored a later message of its message group in the same call, so it would now be stored out of order",
                );
            }
        } else {
            stored_later.insert(*group);
        }
    }
    // From the start: the groups with a gap, whose later failed entries stay behind it.
    let mut gap = std::collections::HashSet::new();
    for (i, group) in groups.iter().enumerate() {
        let Some(group) = group else { continue };
        if held[i].is_some() {
            gap.insert(*group);
        } else if failed.get(i).copied().unwrap_or(false) && gap.contains(group) {
            held[i] = Some(
                "not sent again: an earlier message of its message group was not sent, and it would be stored ahead of it",
            );
        }
    }
    held
}

/// Sends `prepared` to `queue` in batch calls, in order. The entries a call fails (SQS
/// throttling, an internal error) are tried again, as settlements are, but on a FIFO
/// queue not one whose group SQS stored a later message of meanwhile ([`out_of_order`]);
/// if some are not sent, the error names by index every message not sent: those, and
/// all after them. A call that fails as a whole is not made again: its messages are
/// named unconfirmed.
async fn send_in_batches<C: Calls>(
    calls: &C,
    queue: &QueueInfo,
    prepared: Vec<Prepared>,
) -> Result<(), SqsError> {
    let total = prepared.len();
    let sizes: Vec<usize> = prepared.iter().map(|m| m.outgoing.size).collect();
    let mut messages = prepared.into_iter().enumerate();
    for length in chunk_lengths(&sizes, queue.max_message_size) {
        let chunk: Vec<(usize, Prepared)> = messages.by_ref().take(length).collect();
        let failed = with_retries(&SendPublished { calls, queue }, chunk, |_| ()).await;
        let mut not_sent: Vec<(usize, String)> = failed
            .held_back
            .into_iter()
            .map(|((i, _), reason)| (i, reason))
            .collect();
        let mut unconfirmed = Vec::new();
        for ((i, _), reason) in failed.entries {
            if failed.call_failed {
                unconfirmed.push((i, reason));
            } else {
                not_sent.push((i, reason));
            }
        }
        not_sent.sort_by_key(|(i, _)| *i);
        // The first failure in the publish's order, not sent before unconfirmed.
        if let Some((_, first)) = not_sent.first().or(unconfirmed.first()) {
            let first = first.clone();
            let unconfirmed = unconfirmed.into_iter().map(|(i, _)| i).collect();
            let mut not_sent: Vec<usize> = not_sent.into_iter().map(|(i, _)| i).collect();
            not_sent.extend(messages.map(|(i, _)| i));
            return Err(SqsError::NotSent {
                queue: queue.name.clone(),
                not_sent,
                unconfirmed,
                total,
                first,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::DeadLetterTarget;
    use aws_sdk_sqs::types::SendMessageBatchRequestEntry;

    /// SQS as a test scripts it: each `SendMessageBatch` is noted (its bodies), and fails
    /// the entry whose body is in `failing` as many more times as it says.
    #[derive(Default)]
    struct Flaky {
        failing: std::sync::Mutex<std::collections::HashMap<String, u32>>,
        sent: std::sync::Mutex<Vec<Vec<String>>>,
        /// A call with an entry of this body fails as a whole (as when no answer comes).
        call_fails_on: Option<String>,
    }

    impl Flaky {
        fn failing(body: &str, times: u32) -> Self {
            let flaky = Flaky::default();
            flaky.failing.lock().unwrap().insert(body.into(), times);
            flaky
        }

        fn calls(&self) -> Vec<Vec<String>> {
            self.sent.lock().unwrap().clone()
        }
    }

    impl Calls for Flaky {
        async fn change_visibility(
            &self,
            _: &QueueInfo,
            _: &[(String, i32)],
        ) -> Result<Failed, SqsError> {
            unreachable!("publishing changes no visibility")
        }

        async fn delete(&self, _: &QueueInfo, _: &[String]) -> Result<Failed, SqsError> {
            unreachable!("publishing deletes nothing")
        }

        async fn send(
            &self,
            _: &QueueInfo,
            entries: Vec<SendMessageBatchRequestEntry>,
        ) -> Result<Failed, SqsError> {
            let mut failing = self.failing.lock().unwrap();
            let mut failed = Vec::new();
            let mut bodies = Vec::new();
            if let Some(body) = &self.call_fails_on
                && entries.iter().any(|entry| entry.message_body() == body)
            {
                let bodies = entries.iter().map(|e| e.message_body().to_string());
                self.sent.lock().unwrap().push(bodies.collect());
                return Err(SqsError::Config("no answer".into()));
            }
            for entry in &entries {
                let body = entry.message_body().to_string();
                if let Some(left) = failing.get_mut(&body).filter(|left| **left > 0) {
                    *left -= 1;
                    failed.push((entry.id().parse().unwrap(), "InternalError: busy".into()));
                }
                bodies.push(body);
            }
            self.sent.lock().unwrap().push(bodies);
            Ok(failed)
        }

        async fn dead_letter_queue(
            &self,
            _: &DeadLetterTarget,
        ) -> Result<std::sync::Arc<QueueInfo>, SqsError> {
            unreachable!("publishing dead-letters nothing")
        }
    }

    /// Messages whose bodies are `0`, `1`, ... `count - 1`, ready for `queue`.
    fn numbered(queue: &QueueInfo, count: usize) -> Vec<Prepared> {
        (0..count)
            .map(|i| prepare(queue, Message::json(&i).unwrap().into_parts()).unwrap())
            .collect()
    }

    fn bodies(range: std::ops::Range<usize>) -> Vec<String> {
        range.map(|i| i.to_string()).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn an_entry_sqs_fails_once_is_sent_again_and_the_publish_succeeds() {
        let (queue, sqs) = (queue(false, false), Flaky::failing("3", 1));
        send_in_batches(&sqs, &queue, numbered(&queue, 12))
            .await
            .unwrap();
        assert_eq!(
            sqs.calls(),
            vec![bodies(0..10), bodies(3..4), bodies(10..12)],
            "the failed entry again, on its own, before the next batch"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_entry_that_keeps_failing_is_named_with_every_message_after_it() {
        let (queue, sqs) = (queue(false, false), Flaky::failing("13", u32::MAX));
        let error = send_in_batches(&sqs, &queue, numbered(&queue, 25))
            .await
            .expect_err("message 13 is never sent");
        let SqsError::NotSent {
            not_sent, total, ..
        } = &error
        else {
            panic!("{error:?}");
        };
        let mut expected = vec![13];
        expected.extend(20..25);
        assert_eq!((not_sent, *total), (&expected, 25));
        assert!(matches!(&error, SqsError::NotSent { unconfirmed, .. } if unconfirmed.is_empty()));
        assert!(
            error.to_string().contains("6 of 25 messages not sent"),
            "{error}"
        );
        let sent: Vec<String> = sqs.calls().concat();
        assert!(sent.contains(&"19".to_string()) && !sent.contains(&"20".to_string()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_call_that_fails_as_a_whole_is_not_made_again_and_its_messages_are_unconfirmed()
    {
        let queue = queue(false, false);
        let sqs = Flaky {
            call_fails_on: Some("13".into()),
            ..Flaky::default()
        };
        let error = send_in_batches(&sqs, &queue, numbered(&queue, 25))
            .await
            .expect_err("the second call fails");
        assert_eq!(
            sqs.calls(),
            vec![bodies(0..10), bodies(10..20)],
            "the failed call once: SQS may have stored its messages"
        );
        let SqsError::NotSent {
            not_sent,
            unconfirmed,
            total,
            ..
        } = &error
        else {
            panic!("{error:?}");
        };
        assert_eq!(unconfirmed, &(10..20).collect::<Vec<_>>());
        assert_eq!(not_sent, &(20..25).collect::<Vec<_>>());
        assert_eq!(*total, 25);
        assert!(
            error
                .to_string()
                .contains("10 of 25 messages unconfirmed (their call failed as a whole; SQS may have stored them) and 5 not sent"),
            "{error}"
        );
    }

    /// Messages `0`, `1`, ... on a FIFO queue, each in the group `groups` gives it.
    fn grouped(queue: &QueueInfo, groups: &[&str]) -> Vec<Prepared> {
        groups
            .iter()
            .enumerate()
            .map(|(i, group)| {
                let message = Message::builder().partition_key(*group).json(&i).unwrap();
                prepare(queue, message.into_parts()).unwrap()
            })
            .collect()
    }

    /// SQS fails alice's first message and stores her second and third in the same call:
    /// sent again, the first would be stored after them. It is named not sent, saying
    /// why, and bob's failed message, with nothing of his stored after it, is sent again.
    #[tokio::test(start_paused = true)]
    async fn a_fifo_entry_failed_before_later_ones_of_its_group_were_stored_is_not_sent_again() {
        let queue = queue(true, false);
        let sqs = Flaky::failing("0", 1);
        sqs.failing.lock().unwrap().insert("3".into(), 1);
        let messages = grouped(&queue, &["alice", "alice", "alice", "bob", "carol"]);
        let error = send_in_batches(&sqs, &queue, messages)
            .await
            .expect_err("alice's first message is out of order now");
        assert_eq!(
            sqs.calls(),
            vec![bodies(0..5), bodies(3..4)],
            "bob's message again, alice's not"
        );
        let SqsError::NotSent {
            not_sent,
            unconfirmed,
            ..
        } = &error
        else {
            panic!("{error:?}");
        };
        assert_eq!((not_sent, unconfirmed), (&vec![0], &vec![]));
        assert!(
            error.to_string().contains("1 of 5 messages not sent")
                && error.to_string().contains("out of order"),
            "{error}"
        );
    }

    /// SQS fails alice's first and third messages and stores her second: neither is sent
    /// again, so that the third does not go ahead of the first.
    #[tokio::test(start_paused = true)]
    async fn a_fifo_entry_after_a_gap_in_its_group_is_not_sent_again_either() {
        let queue = queue(true, false);
        let sqs = Flaky::failing("0", 1);
        sqs.failing.lock().unwrap().insert("2".into(), 1);
        let error = send_in_batches(&sqs, &queue, grouped(&queue, &["alice"; 3]))
            .await
            .expect_err("alice's first and third messages are not sent");
        assert_eq!(sqs.calls(), vec![bodies(0..3)]);
        assert!(
            matches!(&error, SqsError::NotSent { not_sent, .. } if *not_sent == vec![0, 2]),
            "{error:?}"
        );
    }

    /// SQS fails alice's last message only: sent again, it still comes after the others.
    #[tokio::test(start_paused = true)]
    async fn a_fifo_entry_with_nothing_of_its_group_stored_after_it_is_sent_again() {
        let queue = queue(true, false);
        let sqs = Flaky::failing("2", 1);
        send_in_batches(&sqs, &queue, grouped(&queue, &["alice"; 3]))
            .await
            .unwrap();
        assert_eq!(sqs.calls(), vec![bodies(0..3), bodies(2..3)]);
    }

    fn queue(fifo: bool, content_based_deduplication: bool) -> QueueInfo {
        QueueInfo {
            content_based_deduplication,
            ..QueueInfo::for_tests(if fifo { "q.fifo" } else { "q" })
        }
    }

    fn refused(queue: &QueueInfo, message: Message) -> String {
        match prepare(queue, message.into_parts()) {
            Ok(_) => panic!("the message should be refused"),
            Err(error) => error.to_string(),
        }
    }

    #[test]
    fn batches_split_at_ten_messages_and_at_the_size_limit() {
        assert_eq!(chunk_lengths(&[1; 25], 1024), vec![10, 10, 5]);
        assert_eq!(chunk_lengths(&[400, 400, 400, 100], 1024), vec![2, 2]);
        assert_eq!(chunk_lengths(&[1024, 1, 1024], 1024), vec![1, 1, 1]);
        assert!(chunk_lengths(&[], 1024).is_empty());
    }

    #[test]
    fn an_oversize_message_is_refused_before_any_call() {
        let error = refused(&queue(false, false), Message::new(vec![b'x'; 1025]));
        assert!(
            error.contains("1025 bytes") && error.contains("at most 1024"),
            "{error}"
        );
    }

    #[test]
    fn headers_count_against_the_size_limit() {
        let error = refused(
            &queue(false, false),
            Message::builder()
                .header("x-pad", "y".repeat(30))
                .payload(vec![b'x'; 1000]),
        );
        assert!(error.contains("at most 1024"), "{error}");
    }

    #[test]
    fn a_fifo_queue_needs_a_partition_key() {
        let error = refused(&queue(true, true), Message::new("x"));
        assert!(error.contains("partition_key"), "{error}");
    }

    #[test]
    fn a_fifo_group_is_the_partition_key() {
        let prepared = prepare(
            &queue(true, true),
            Message::builder()
                .partition_key("alice")
                .payload("x")
                .into_parts(),
        )
        .unwrap();
        assert_eq!(prepared.group.as_deref(), Some("alice"));
        assert_eq!(
            prepared.deduplication, None,
            "content-based deduplication needs no id"
        );
    }

    #[test]
    fn without_content_deduplication_each_publish_gets_its_own_id() {
        let fifo = queue(true, false);
        let keyed = || Message::builder().partition_key("k").payload("x");
        let a = prepare(&fifo, keyed().into_parts()).unwrap();
        let b = prepare(&fifo, keyed().into_parts()).unwrap();
        assert!(a.deduplication.is_some() && a.deduplication != b.deduplication);
        let explicit = prepare(
            &fifo,
            Message::builder()
                .partition_key("k")
                .message_id("m-1")
                .payload("x")
                .into_parts(),
        )
        .unwrap();
        assert_eq!(explicit.deduplication.as_deref(), Some("m-1"));
    }

    #[test]
    fn a_standard_queue_sends_no_group() {
        let prepared = prepare(
            &queue(false, false),
            Message::builder()
                .partition_key("k")
                .payload("x")
                .into_parts(),
        )
        .unwrap();
        assert_eq!(prepared.group, None);
    }

    #[test]
    fn delays_are_checked() {
        assert!(
            refused(
                &queue(true, true),
                Message::builder()
                    .partition_key("k")
                    .delay(Duration::from_secs(1))
                    .payload("x")
            )
            .contains("FIFO")
        );
        assert!(
            refused(
                &queue(false, false),
                Message::builder()
                    .delay(Duration::from_secs(901))
                    .payload("x")
            )
            .contains("15 minutes")
        );
        let delayed = prepare(
            &queue(false, false),
            Message::builder()
                .delay(Duration::from_secs(30))
                .payload("x")
                .into_parts(),
        )
        .unwrap();
        assert_eq!(delayed.delay_seconds, Some(30));
    }

    #[test]
    fn publish_delays_round_up_to_whole_seconds() {
        let delay = |d: Duration| {
            prepare(
                &queue(false, false),
                Message::builder().delay(d).payload("x").into_parts(),
            )
            .unwrap()
            .delay_seconds
        };
        assert_eq!(delay(Duration::from_millis(1500)), Some(2));
        assert_eq!(delay(Duration::from_millis(300)), Some(1));
        assert_eq!(delay(Duration::from_secs(900)), Some(900));
        assert_eq!(delay(Duration::ZERO), Some(0));
    }
}
