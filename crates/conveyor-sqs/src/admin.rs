//! The portable queue administration on SQS: [`conveyor::Broker`] for [`SqsBroker`].

use std::collections::{HashMap, HashSet};

use aws_sdk_sqs::types::{Message as SqsMessage, MessageSystemAttributeName, QueueAttributeName};
use conveyor::{DeadLetter, Error, QueueDepth, QueueSpec};

use crate::attributes;
use crate::broker::{Created, SqsBroker, transport};
use crate::calls::Calls;
use conveyor::Report;

use crate::error::{SqsError, no_such_queue, redacted, shown};
use crate::queue::QueueInfo;
use crate::settle::{BATCH_LIMIT, Delete, with_retries};
use crate::spec::Declaration;
use crate::subscriber::SqsQueue;

/// The portable shapes on SQS. Every method takes a queue's name or its URL, but
/// `declare_queue`, whose spec names the queue. Errors from SQS are [`Error::Transport`]
/// with an [`SqsError`] as the source, which keeps the SDK's error as its own source; a
/// spec SQS cannot take is [`Error::Config`].
impl conveyor::Broker for SqsBroker {
    type Queue = SqsQueue;

    /// [`SqsBroker::queue`]: a queue named that does not exist is created plainly when the
    /// app starts; one that exists keeps its attributes.
    fn queue(&self, name: &str) -> SqsQueue {
        SqsBroker::queue(self, name)
    }

    /// Creates the queue with the spec's attributes (see
    /// [`SqsQueueSpec`](crate::SqsQueueSpec) for the mapping), or, where it exists with
    /// other values for them, sets them on it (`SetQueueAttributes`; SQS may take up to a
    /// minute to apply them everywhere). Attributes the spec leaves unset keep the values
    /// the queue has. The dead-letter queue must exist: declare it first; a missing one is
    /// [`Error::Config`]. A queue SQS deleted less than a minute ago cannot be made again
    /// yet (`QueueDeletedRecently`).
    async fn declare_queue(&self, spec: &QueueSpec) -> Result<(), Error> {
        let declaration = Declaration::check(spec)?;
        let dead_letter_arn = match &declaration.dead_letter {
            Some(policy) => Some(self.dead_letter_arn(spec.name(), &policy.queue).await?),
            None => None,
        };
        let attributes = declaration.attributes(dead_letter_arn.as_deref());
        let declared = self.declare(spec.name(), attributes).await;
        // Whatever happened, what the cache knows of the queue may be out of date.
        self.forget(spec.name());
        declared.map_err(transport)
    }

    /// `DeleteQueue`. A queue that does not exist is no error. SQS takes up to a minute to
    /// delete it everywhere, and to let a queue of its name be made again.
    async fn delete_queue(&self, name: &str) -> Result<(), Error> {
        // The URL alone: resolving would cache what is about to go.
        let url = match self.url(name).await {
            Ok(url) => url,
            Err(SqsError::NoSuchQueue { .. }) => return Ok(()),
            Err(error) => return Err(transport(error)),
        };
        let deleted = self.client().delete_queue().queue_url(&url).send().await;
        self.forget(name);
        self.forget(&url);
        match deleted {
            Ok(_) => Ok(()),
            Err(e) if no_such_queue(&e) => Ok(()),
            Err(e) => Err(transport(SqsError::call("DeleteQueue", name, e))),
        }
    }

    /// SQS's approximate counts (`GetQueueAttributes`): `ApproximateNumberOfMessages` is
    /// ready, `...NotVisible` in flight, `...Delayed` delayed. A count SQS leaves out or
    /// that is not a number is an error ([`SqsError::Unexpected`]).
    async fn queue_depth(&self, name: &str) -> Result<QueueDepth, Error> {
        let queue = self.resolve(name).await.map_err(transport)?;
        let answer = self
            .client()
            .get_queue_attributes()
            .queue_url(&queue.url)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesDelayed)
            .send()
            .await
            .map_err(|e| {
                let error = SqsError::from_sdk("GetQueueAttributes", name, e);
                if matches!(error, SqsError::NoSuchQueue { .. }) {
                    // Deleted since it was cached: look it up afresh next time.
                    self.forget(name);
                    self.forget(&queue.url);
                }
                transport(error)
            })?;
        depth(answer.attributes()).map_err(|detail| {
            transport(SqsError::Unexpected {
                call: "GetQueueAttributes",
                queue: redacted(name).into_owned(),
                detail,
            })
        })
    }

    /// Receives (up to ten per `ReceiveMessage`, without waiting) and deletes
    /// (`DeleteMessageBatch`) until a receive brings nothing or `max` are taken. Each
    /// message's headers and partition key are those a subscriber's delivery of it would
    /// have (its FIFO group is the key); the reason is the
    /// [`REJECT_REASON_HEADER`](conveyor::REJECT_REASON_HEADER) attribute the transport's
    /// reject sets (none for a message SQS's redrive policy moved).
    ///
    /// SQS's short poll asks a sample of its servers, so on a standard queue a receive can
    /// come back empty while messages remain: call again to be sure the queue is empty. A
    /// message whose delete fails is made visible again and not returned, so it is taken
    /// by a later call rather than lost or returned twice; a failure after some messages
    /// were taken ends the call with those (and a warning), since they are deleted.
    async fn take_dead_letters(
        &self,
        dead_letter_queue: &str,
        max: usize,
    ) -> Result<Vec<DeadLetter>, Error> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let queue = self.resolve(dead_letter_queue).await.map_err(transport)?;
        let mut taken = Vec::new();
        while taken.len() < max {
            let wanted = max.saturating_sub(taken.len()).min(BATCH_LIMIT);
            let batch = match self.take(&queue, wanted).await {
                Ok(batch) => batch,
                Err(error) if taken.is_empty() => return Err(transport(error)),
                Err(error) => {
                    tracing::warn!(
                        queue = queue.name,
                        taken = taken.len(),
                        error = %Report(&error),
                        "taking dead letters failed; returning those taken"
                    );
                    break;
                }
            };
            if batch.is_empty() {
                break;
            }
            taken.extend(batch);
        }
        Ok(taken)
    }

    /// SQS speaks HTTP: there is no connection to close, so an app that owns this broker
    /// (`App::broker`) has nothing to wait for.
    /// Deletes the reply queue its requests made, if any: SQS keeps no connection.
    async fn close(&self) -> Result<(), Error> {
        self.close_requester().await.map_err(transport)
    }

    /// Through a reply queue of this broker's own, made by the first request (see the
    /// module `request` for what it costs); the request goes with `SendMessage` as any
    /// publish does.
    async fn request(
        &self,
        destination: &str,
        message: conveyor::Message,
        timeout: std::time::Duration,
    ) -> Result<conveyor::Message, Error> {
        // What a timeout's error quotes: a queue URL's password stays out of it.
        let label = redacted(destination);
        // The timeout covers making the reply queue: a stalled SQS holds no one past it.
        conveyor::request::within(&label, timeout, async {
            let requester = self.requester().await.map_err(transport)?;
            requester
                .reader
                .replies()
                .exchange(&label, timeout, |correlation_id| {
                    requester.send(self, destination, message, correlation_id)
                })
                .await
        })
        .await
    }
}

impl SqsBroker {
    /// The ARN of `dead_letter_queue`, looked up afresh: it must exist now.
    async fn dead_letter_arn(&self, queue: &str, dead_letter_queue: &str) -> Result<String, Error> {
        self.forget(dead_letter_queue);
        let info = match self.resolve(dead_letter_queue).await {
            Ok(info) => info,
            Err(SqsError::NoSuchQueue { .. }) => {
                return Err(Error::config(format!(
                    "the dead-letter queue `{}` of SQS queue `{}` does not exist: declare it first",
                    shown(dead_letter_queue),
                    shown(queue)
                )));
            }
            Err(error) => return Err(transport(error)),
        };
        info.arn.clone().ok_or_else(|| {
            transport(SqsError::Unexpected {
                call: "GetQueueAttributes",
                queue: redacted(dead_letter_queue).into_owned(),
                detail: "no QueueArn".into(),
            })
        })
    }

    /// Creates the queue `name` with `attributes`, or sets them on the queue of that name
    /// where it exists with other values for them.
    async fn declare(
        &self,
        name: &str,
        attributes: Vec<(QueueAttributeName, String)>,
    ) -> Result<(), SqsError> {
        if self.create(name, &attributes).await? == Created::Matches {
            return Ok(());
        }
        // SQS cannot turn a queue FIFO or back, and refuses the attribute on a change; the
        // name decides it anyway, so the queue is already of the kind asked for.
        let changed: HashMap<QueueAttributeName, String> = attributes
            .into_iter()
            .filter(|(attribute, _)| *attribute != QueueAttributeName::FifoQueue)
            .collect();
        if changed.is_empty() {
            return Ok(());
        }
        tracing::info!(
            queue = name,
            "the queue exists with other attributes; setting those of its spec"
        );
        let url = self.url(name).await?;
        self.client()
            .set_queue_attributes()
            .queue_url(url)
            .set_attributes(Some(changed))
            .send()
            .await
            .map_err(|e| SqsError::call("SetQueueAttributes", name, e))?;
        Ok(())
    }

    /// One receive of up to `wanted` ready messages, deleted before they are returned.
    async fn take(&self, queue: &QueueInfo, wanted: usize) -> Result<Vec<DeadLetter>, SqsError> {
        let visibility = self.settings().visibility_timeout;
        let received = self
            .client()
            .receive_message()
            .queue_url(&queue.url)
            .max_number_of_messages(i32::try_from(wanted).unwrap_or(10))
            .wait_time_seconds(0)
            // Hidden while they are deleted; back for a later call if the deletes fail.
            .visibility_timeout(i32::try_from(visibility.as_secs()).unwrap_or(i32::MAX))
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .message_attribute_names("All")
            .send()
            .await
            .map_err(|e| SqsError::call("ReceiveMessage", &queue.name, e))?;
        let messages: Vec<(String, SqsMessage)> = received
            .messages
            .unwrap_or_default()
            .into_iter()
            .filter_map(|message| Some((message.receipt_handle.clone()?, message)))
            .collect();
        if messages.is_empty() {
            return Ok(Vec::new());
        }
        let receipts: Vec<String> = messages
            .iter()
            .map(|(receipt, _)| receipt.clone())
            .collect();
        let mut deleted = HashSet::new();
        let delete = Delete { calls: self, queue };
        let failed = with_retries(&delete, receipts, |receipt| {
            deleted.insert(receipt);
        })
        .await
        .all();
        if let Some((_, first)) = failed.first() {
            let error = SqsError::BatchEntries {
                call: "DeleteMessageBatch",
                queue: queue.name.clone(),
                failed: failed.len(),
                total: messages.len(),
                first: first.clone(),
            };
            tracing::warn!(
                queue = queue.name,
                error = %error,
                "dead letters not deleted are made visible again, for a later call"
            );
            let release: Vec<(String, i32)> = failed
                .into_iter()
                .map(|(receipt, _)| (receipt, 0))
                .collect();
            if let Err(error) = self.change_visibility(queue, &release).await {
                tracing::warn!(queue = queue.name, error = %Report(&error), "cannot make them visible again; SQS will after their visibility timeout");
            }
            if deleted.is_empty() {
                return Err(error);
            }
        }
        Ok(messages
            .into_iter()
            .filter(|(receipt, _)| deleted.contains(receipt))
            .map(|(_, message)| {
                // The subscriber's own mapping, so a dead letter reads as its delivery did.
                let decoded = attributes::decode(&message);
                DeadLetter::new(decoded.payload, decoded.headers, decoded.key)
            })
            .collect())
    }
}

/// The depth in a `GetQueueAttributes` answer; what is missing or not a count is an error.
fn depth(attributes: Option<&HashMap<QueueAttributeName, String>>) -> Result<QueueDepth, String> {
    let count = |name: QueueAttributeName| -> Result<u64, String> {
        let value = attributes
            .and_then(|attributes| attributes.get(&name))
            .ok_or_else(|| format!("no {}", name.as_str()))?;
        value
            .trim()
            .parse()
            .map_err(|_| format!("{} is `{value}`, not a count", name.as_str()))
    };
    Ok(
        QueueDepth::new(count(QueueAttributeName::ApproximateNumberOfMessages)?)
            .in_flight(count(
                QueueAttributeName::ApproximateNumberOfMessagesNotVisible,
            )?)
            .delayed(count(
                QueueAttributeName::ApproximateNumberOfMessagesDelayed,
            )?),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(pairs: &[(QueueAttributeName, &str)]) -> HashMap<QueueAttributeName, String> {
        pairs
            .iter()
            .map(|(name, value)| (name.clone(), (*value).to_string()))
            .collect()
    }

    #[test]
    fn depth_reads_ready_in_flight_and_delayed() {
        let attributes = answer(&[
            (QueueAttributeName::ApproximateNumberOfMessages, "3"),
            (
                QueueAttributeName::ApproximateNumberOfMessagesNotVisible,
                "2",
            ),
            (QueueAttributeName::ApproximateNumberOfMessagesDelayed, "1"),
        ]);
        assert_eq!(
            depth(Some(&attributes)),
            Ok(QueueDepth::new(3).in_flight(2).delayed(1))
        );
    }

    #[test]
    fn a_missing_or_malformed_count_is_an_error_not_a_panic() {
        assert!(depth(None).is_err());
        let missing = answer(&[
            (QueueAttributeName::ApproximateNumberOfMessages, "3"),
            (
                QueueAttributeName::ApproximateNumberOfMessagesNotVisible,
                "2",
            ),
        ]);
        let error = depth(Some(&missing)).expect_err("a count is missing");
        assert!(
            error.contains("ApproximateNumberOfMessagesDelayed"),
            "{error}"
        );
        for bad in ["", "-1", "many", "18446744073709551616", "1.5"] {
            let malformed = answer(&[
                (QueueAttributeName::ApproximateNumberOfMessages, bad),
                (
                    QueueAttributeName::ApproximateNumberOfMessagesNotVisible,
                    "0",
                ),
                (QueueAttributeName::ApproximateNumberOfMessagesDelayed, "0"),
            ]);
            let error = depth(Some(&malformed)).expect_err(bad);
            assert!(error.contains("not a count"), "{error}");
        }
    }
}
