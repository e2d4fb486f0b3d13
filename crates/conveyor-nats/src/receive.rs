//! The pump's receive: a pull request to the queue's durable consumer, answered on an
//! inbox the subscription keeps for its whole life.
//!
//! async-nats's `fetch` makes a fresh inbox per batch: a subscribe and an unsubscribe
//! around every pull request, which the server handles as changes to its subscription
//! lists. On a mount that handles one message at a time that is most of the work of a
//! receive; one inbox, subscribed once, takes a sequential mount from about the
//! throughput of a raw `fetch` loop to well above it (BENCHMARKS.md, the NATS section).
//!
//! Each pull request asks for up to the mount's read-ahead with `no_wait`: JetStream
//! answers at once with what it has, or waits up to the fetch wait for a first message,
//! and ends a request it answers with fewer by a status (`404`, `408`). One request is
//! out at a time, so what comes on the inbox belongs to it; a message that comes late
//! (the request's answer was cut short by a reconnect, say) is taken by the next receive
//! like any other: it is this consumer's, leased to it.

use std::sync::Arc;
use std::time::Duration;

use async_nats::{Client, StatusCode, Subject, Subscriber};
use conveyor::kit::{QueuePolicy, Receive, ReceiveFailed, Received, ReceivedMessage, Verdict};
use conveyor::{Bytes, Report};
use futures_util::StreamExt;

use crate::error::NatsError;
use crate::headers;
use crate::queue::Held;

/// How long past the fetch wait a receive waits for the server's answer before it gives
/// the request up (async-nats's `fetch` allows the same): a request lost to a reconnect
/// gets no answer.
pub(crate) const ANSWER_MARGIN: Duration = Duration::from_secs(5);

/// What a subscription's receive works with, from `NatsQueue::subscribe`.
pub(crate) struct ReceiveSetup {
    pub(crate) client: Client,
    /// The queue, as errors name it and deliveries carry it.
    pub(crate) name: Arc<str>,
    pub(crate) stream: String,
    pub(crate) consumer: String,
    /// The most messages one pull request asks for.
    pub(crate) wanted: usize,
    /// How long a pull request waits on the server for a first message.
    pub(crate) receive_wait: Duration,
    pub(crate) lease: Duration,
    pub(crate) policy: QueuePolicy,
}

/// The pump's receive on one queue.
pub(crate) struct NatsReceive {
    setup: ReceiveSetup,
    /// `$JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer>`.
    next_subject: Subject,
    /// The pull request, the same every time.
    request: Bytes,
    /// The inbox and its subscription, made at the first receive (and again after the
    /// client closed it).
    inbox: Option<(Subject, Subscriber)>,
}

impl NatsReceive {
    pub(crate) fn new(setup: ReceiveSetup) -> NatsReceive {
        let expires = u64::try_from(setup.receive_wait.as_nanos()).unwrap_or(u64::MAX);
        let request =
            serde_json::json!({ "batch": setup.wanted, "expires": expires, "no_wait": true });
        let next_subject = format!(
            "$JS.API.CONSUMER.MSG.NEXT.{}.{}",
            setup.stream, setup.consumer
        );
        NatsReceive {
            setup,
            next_subject: Subject::from(next_subject),
            request: Bytes::from(request.to_string()),
            inbox: None,
        }
    }
}

impl ReceiveSetup {
    fn failed(&self, reason: impl std::fmt::Display, for_good: bool) -> ReceiveFailed {
        ReceiveFailed {
            error: Box::new(NatsError::call("fetch", &self.name, reason)),
            for_good,
        }
    }

    /// Holds `message` and hands it over as a delivery, unless the receive settles it
    /// itself: one that came before its delay ended goes back with the rest of it; one
    /// delivered more often than the queue's max receive count goes to its dead-letter
    /// queue unhandled.
    fn deliver(&self, message: async_nats::Message, into: &mut Received<'_, Held>) {
        let Some(reply) = message.reply else {
            return;
        };
        let delivered = delivery_count(&reply).unwrap_or(1);
        let incoming = headers::incoming(message.headers.as_ref());
        let tag = into.hold(Held { reply }, self.lease);
        if let Some(left) = incoming.early_by {
            into.settle(tag, Verdict::Retry { after: Some(left) });
            return;
        }
        // A delayed message came early once before this delivery: that one was no
        // attempt.
        let early_once = incoming.delayed && delivered > 1;
        let attempts = delivered.saturating_sub(u32::from(early_once));
        let received = ReceivedMessage {
            payload: message.payload,
            headers: incoming.headers,
            partition_key: incoming.key,
        };
        into.deliver_or_dead_letter(tag, received, attempts, &self.policy);
    }
}

impl Receive for NatsReceive {
    type Data = Held;

    /// One pull request: answers as soon as any message is there, or after the fetch wait
    /// with none.
    async fn receive(&mut self, into: &mut Received<'_, Held>) -> Result<(), ReceiveFailed> {
        let setup = &self.setup;
        let (inbox, answers) = match &mut self.inbox {
            Some(inbox) => inbox,
            none => {
                let inbox = Subject::from(setup.client.new_inbox());
                let answers = setup
                    .client
                    .subscribe(inbox.clone())
                    .await
                    .map_err(|e| setup.failed(Report(&e), false))?;
                none.insert((inbox, answers))
            }
        };
        setup
            .client
            .publish_with_reply(
                self.next_subject.clone(),
                inbox.clone(),
                self.request.clone(),
            )
            .await
            .map_err(|e| setup.failed(Report(&e), false))?;
        let gave_up = tokio::time::sleep(setup.receive_wait.saturating_add(ANSWER_MARGIN));
        tokio::pin!(gave_up);
        let mut answered = 0;
        while answered < setup.wanted {
            let message = tokio::select! {
                biased;
                message = answers.next() => message,
                () = &mut gave_up => break,
            };
            let Some(message) = message else {
                // The client closed the subscription: a new inbox next time.
                self.inbox = None;
                if into.is_empty() {
                    return Err(setup.failed("the client closed the inbox subscription", false));
                }
                break;
            };
            match message.status {
                None | Some(StatusCode::OK) => {}
                Some(StatusCode::IDLE_HEARTBEAT) => continue,
                // No message (now, or within the fetch wait): the request is over.
                Some(StatusCode::NOT_FOUND | StatusCode::TIMEOUT) => break,
                Some(status) => {
                    let reason = format!(
                        "{status}: {}",
                        message.description.as_deref().unwrap_or("no description")
                    );
                    let for_good = reason.to_ascii_lowercase().contains("consumer deleted");
                    if into.is_empty() || for_good {
                        return Err(setup.failed(reason, for_good));
                    }
                    // What came is kept; the next request reports the error if it lasts.
                    break;
                }
            }
            answered += 1;
            setup.deliver(message, into);
        }
        Ok(())
    }
}

/// How many times JetStream has delivered a message, read off its ack subject (ADR-15):
/// `$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<time>.<pending>`,
/// or, from servers that know domains, `<domain>.<account hash>.` before the stream and
/// possibly tokens after the pending count. `None` if it is not such a subject.
///
/// async-nats's `Message::info` reads every token, the time into a date included: some
/// five times the work of this.
fn delivery_count(reply: &str) -> Option<u32> {
    let tokens = reply.strip_prefix("$JS.ACK.")?.as_bytes();
    // Where each of the first five tokens ends, and how many tokens there are, in one
    // plain pass: a `split` iterator costs several times as much on a subject this short.
    let mut ends = [0; 5];
    let mut count = 1;
    for (at, &byte) in tokens.iter().enumerate() {
        if byte == b'.' {
            if let Some(end) = ends.get_mut(count - 1) {
                *end = at;
            }
            count += 1;
        }
    }
    let token = match count {
        7 => 2,
        count if count >= 9 => 4,
        _ => return None,
    };
    // Tokens 1 to 5 all end in a dot here; token `token` starts past the one before.
    let digits = tokens.get(ends[token - 1] + 1..ends[token])?;
    let delivered: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(u32::try_from(delivered).unwrap_or(u32::MAX))
}

#[cfg(test)]
mod tests {
    use super::delivery_count;

    #[test]
    fn delivery_count_reads_both_ack_subject_formats() {
        // Before domains: stream, consumer, delivered, stream seq, consumer seq, time,
        // pending.
        assert_eq!(
            delivery_count("$JS.ACK.orders.conveyor.3.17.12.1733580000000000000.4"),
            Some(3)
        );
        // With a domain (`_` for none) and an account hash, with and without the trailing
        // token.
        assert_eq!(
            delivery_count("$JS.ACK._.ACCHASH.orders.conveyor.2.17.12.1733580000000000000.4"),
            Some(2)
        );
        assert_eq!(
            delivery_count("$JS.ACK.hub.ACCHASH.orders.conveyor.5.17.12.1733580000000000000.0.x1"),
            Some(5)
        );
    }

    #[test]
    fn delivery_count_is_none_for_what_is_not_an_ack_subject() {
        assert_eq!(delivery_count("_INBOX.abc.def"), None);
        assert_eq!(delivery_count("$JS.ACK.orders.conveyor.3"), None);
        assert_eq!(
            delivery_count("$JS.ACK.orders.conveyor.many.17.12.1.4"),
            None
        );
        assert_eq!(delivery_count("$JS.ACK.orders.conveyor..17.12.1.4"), None);
        assert_eq!(delivery_count("$JS.ACK.a.b.c.d.e.f.g.h"), None);
    }

    #[test]
    fn delivery_count_saturates_past_u32() {
        assert_eq!(
            delivery_count("$JS.ACK.orders.conveyor.99999999999.17.12.1.4"),
            Some(u32::MAX)
        );
    }
}
