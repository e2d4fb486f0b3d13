//! `conveyor redrive DLQ --to QUEUE [--filter NAME=VALUE] [--limit N] [--dry-run]`.
//!
//! Each message is published to the target and confirmed by the broker before it is
//! removed from the dead-letter queue: a redrive stopped at any point loses nothing. A
//! Ctrl-C or SIGTERM is acted on between two messages, never between a message's publish
//! and its removal, and the removals reach the broker before the command exits, so a
//! redrive interrupted that way and run again moves each message once. Killed outright
//! (SIGKILL, a lost connection), the messages published whose removal had not reached
//! the broker yet stay in the dead-letter queue too, and a second run sends them again:
//! at least once.

use conveyor::{
    CONTENT_TYPE_HEADER, CORRELATION_ID_HEADER, Delivery, MESSAGE_ID_HEADER, Message,
    REPLY_TO_HEADER, Settlement,
};
use conveyor_lapin::LapinError;
use conveyor_lapin::lapin::BasicProperties;
use conveyor_lapin::lapin::types::{AMQPValue, FieldTable, ShortString};
use indicatif::ProgressBar;
use std::time::Duration;
use tokio::time::MissedTickBehavior;

use crate::interrupt::Interrupt;
use crate::pass::{open, ready};
use crate::target::Inspect;
use crate::{Failure, out, show};

/// The header a redriven message carries: how many times it was redriven.
pub const REDRIVEN_HEADER: &str = "x-conveyor-redriven";

/// The most messages a redrive holds at once: those it passes over (a filter's
/// non-matches, a dry run's) stay held until the end, so they are not received twice.
const WINDOW: u64 = 5_000;

/// What a redrive does.
#[derive(Debug)]
pub struct Plan {
    /// The dead-letter queue.
    pub from: String,
    /// The target queue.
    pub to: String,
    /// Only messages with this header value move.
    pub filter: Option<(String, String)>,
    /// At most this many move.
    pub limit: Option<u64>,
    /// Show, move nothing.
    pub dry_run: bool,
    /// The least time between two moves (`--rate`).
    pub pause: Option<Duration>,
}

impl Plan {
    fn takes(&self, delivery: &Delivery) -> bool {
        self.filter
            .as_ref()
            .is_none_or(|(name, value)| delivery.headers().get_str(name) == Some(value.as_str()))
    }
}

/// How a pass ended.
enum End {
    Done,
    /// Fewer came than were ready: held by another consumer, or behind what the pass
    /// holds (a window full of passed-over messages, an SQS FIFO group held back).
    Stalled,
    Interrupted,
    Failed(Failure),
}

/// Runs the redrive `plan` on `broker`.
pub async fn run<B: Inspect>(broker: &B, plan: &Plan) -> Result<(), Failure> {
    let ready_now = ready(broker, &plan.from).await?;
    // A missing target fails here, before any message is taken.
    ready(broker, &plan.to).await?;
    if ready_now == 0 {
        return out::print(&format!("`{}` has no message ready\n", plan.from));
    }
    // Before any message is held: a signal from here on ends the pass cleanly.
    let mut interrupt = Interrupt::listen()?;
    let window = usize::try_from(ready_now.min(WINDOW)).unwrap_or(1);
    let mut pass = open(broker, &plan.from, window).await?;
    let bar = ProgressBar::new(plan.limit.unwrap_or(ready_now).min(ready_now));
    let mut pace = plan.pause.map(|pause| {
        let mut pace = tokio::time::interval(pause);
        pace.set_missed_tick_behavior(MissedTickBehavior::Delay);
        pace
    });

    let (mut seen, mut moved) = (0u64, 0u64);
    let mut passed_over = Vec::new();
    // The messages the target refused in every form, and the first refusal.
    let (mut refused, mut unsent) = (0u64, None);
    let end = loop {
        if seen >= ready_now || plan.limit.is_some_and(|limit| moved >= limit) {
            break End::Done;
        }
        let next = tokio::select! {
            biased;
            () = interrupt.recv() => break End::Interrupted,
            next = pass.next() => next,
        };
        let delivery = match next {
            Ok(Some(delivery)) => delivery,
            Ok(None) => break End::Stalled,
            Err(failure) => break End::Failed(failure),
        };
        seen += 1;
        if !plan.takes(&delivery) {
            passed_over.push(delivery);
            continue;
        }
        if plan.dry_run {
            moved += 1;
            let shown = usize::try_from(moved).unwrap_or(usize::MAX);
            let shown = bar.suspend(|| out::print(&show::delivery(shown, &delivery)));
            passed_over.push(delivery);
            match shown {
                Ok(()) => continue,
                // Standard output gone (`| head`): stop, and hand back all that is held.
                Err(failure) => break End::Failed(failure),
            }
        }
        // Only moves are paced: what the filter passes over costs the target nothing.
        if let Some(pace) = &mut pace {
            tokio::select! {
                biased;
                () = interrupt.recv() => {
                    passed_over.push(delivery);
                    break End::Interrupted;
                }
                _ = pace.tick() => {}
            }
        }
        // Published and confirmed, then removed: never removed first. A delivery dropped
        // unsettled goes back to the dead-letter queue.
        match publish(broker, &plan.to, &delivery).await {
            Ok(()) => {
                delivery.settle(Settlement::Ack);
                moved += 1;
                bar.inc(1);
            }
            // Not sent in any form: it stays in the dead-letter queue (held to the end, so
            // not looked at twice), and the pass goes on with the rest.
            Err(Publish::Refused(error)) => {
                unsent.get_or_insert(error);
                refused += 1;
                passed_over.push(delivery);
            }
            Err(Publish::Failed(error)) => {
                let publishing = format!("publishing to `{}`", plan.to);
                break End::Failed(Failure::call(&publishing, &error));
            }
        }
    };
    bar.finish_and_clear();
    for delivery in passed_over {
        delivery.settle(Settlement::Release);
    }
    // The removals reach the broker before the command ends; only a second signal cuts
    // that short. Nothing is lost then either: what is held goes back to the dead-letter
    // queue when the connection ends (SQS: after the visibility timeout), and removals
    // not yet sent leave their messages to be sent again (at least once).
    let interrupted = matches!(end, End::Interrupted);
    if pass
        .close_unless_interrupted_twice(&mut interrupt, interrupted)
        .await
        .is_err()
    {
        return Err(Failure::interrupted(format!(
            "interrupted twice: moved {moved}; what was held goes back to `{}`",
            plan.from
        )));
    }

    let verb = if plan.dry_run { "would move" } else { "moved" };
    let summary = format!(
        "{verb} {moved} of {seen} looked at in `{}` to `{}`",
        plan.from, plan.to
    );
    let summary = match &unsent {
        Some(error) => format!(
            "{summary}; {refused} could not be sent and stay{} in `{}` ({})",
            if refused == 1 { "s" } else { "" },
            plan.from,
            conveyor::Report(error)
        ),
        None => summary,
    };
    match end {
        End::Done if unsent.is_none() => out::print(&format!("{summary}\n")),
        End::Done => Err(Failure::broker(format!("not all moved: {summary}"))),
        End::Stalled => Err(Failure::broker(format!(
            "stopped: {summary}, of {ready_now} ready; no more came within {} s (another consumer holds them, or they wait behind the {WINDOW} this redrive may hold); the rest stays in `{}`",
            crate::pass::IDLE.as_secs(),
            plan.from
        ))),
        End::Interrupted => Err(Failure::interrupted(format!(
            "interrupted: {summary}; the rest stays in `{}`",
            plan.from
        ))),
        End::Failed(failure) if failure.is_output_closed() => Err(failure),
        End::Failed(failure) => Err(Failure::broker(format!(
            "{failure} ({summary}; the rest stays in `{}`)",
            plan.from
        ))),
    }
}

/// Why a redriven message was not published.
enum Publish {
    /// Refused before it was sent, in every form: it can stay where it is.
    Refused(conveyor::Error),
    /// Anything else: it may or may not have reached the target.
    Failed(conveyor::Error),
}

/// Publishes `delivery` redriven to `to`: in full, or, where the target refuses that
/// before sending it (SQS carries at most ten message attributes, and the marker and the
/// id can be one or two more than the dead letter had), without the marker (the id's
/// `.redrive-N` still counts the redrives). Only a refusal that says nothing was sent
/// leads to the second form: never two sends. The id stays in both: without one, a FIFO
/// queue that deduplicates by content would drop a second dead letter of the same body.
async fn publish<B: Inspect>(broker: &B, to: &str, delivery: &Delivery) -> Result<(), Publish> {
    let sorted = |published: Result<(), conveyor::Error>| match published {
        Ok(()) => Ok(()),
        // Refused before it was sent: another form of it duplicates nothing.
        Err(error @ conveyor::Error::Refused { .. }) => Err(Publish::Refused(error)),
        Err(error) => Err(Publish::Failed(error)),
    };
    match sorted(broker.publish_redriven(to, delivery, Form::Full).await) {
        Err(Publish::Refused(_)) => {
            sorted(broker.publish_redriven(to, delivery, Form::Unmarked).await)
        }
        published => published,
    }
}

/// How much a redriven message adds to what the dead letter carried.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Form {
    /// The `x-conveyor-redriven` marker, and an id of its own.
    Full,
    /// An id of its own, no marker.
    Unmarked,
}

/// What a redrive adds to a dead letter: how many times it has been redriven, this time
/// included, and its message id: the original's with `.redrive-N` after it, N counting
/// the redrives (by the marker, or by the id's own `.redrive-N` where an earlier redrive
/// left the marker out).
///
/// A redrive is a send of its own: were it to keep the id, an SQS FIFO queue would take
/// it for the original's duplicate (its deduplication id) and drop it. Its own id is the
/// same in every try of one redrive, so a FIFO queue drops the second send of a redrive
/// killed between its send and its removal. A message without an id gets a new one, so
/// that a FIFO queue deduplicating by content does not drop it as the copy of another
/// with the same body.
struct Marks {
    times: u32,
    id: String,
}

impl Marks {
    fn of(delivery: &Delivery) -> Marks {
        let headers = delivery.headers();
        let marked = headers
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(REDRIVEN_HEADER))
            .and_then(|(_, value)| std::str::from_utf8(value).ok()?.parse::<u32>().ok());
        let mut times = marked.unwrap_or(0).saturating_add(1);
        let id = match delivery.message_id() {
            Some(id) => {
                let (original, before) = match id.rsplit_once(".redrive-") {
                    Some((base, count)) => match count.parse::<u32>() {
                        Ok(count) => (base, count),
                        Err(_) => (id, 0),
                    },
                    None => (id, 0),
                };
                // The id counts too: a redrive that left the marker out must not give the
                // next one the same id (a FIFO queue would drop it as a duplicate).
                times = times.max(before.saturating_add(1));
                format!("{original}.redrive-{times}")
            }
            None => fresh_id(),
        };
        Marks { times, id }
    }
}

/// The message that carries `delivery` back: its payload, key, properties and headers,
/// with its [`Marks`] (the marker only in the [`Form::Full`] form), and without the
/// transports' count of its attempts (which would send it straight back to the
/// dead-letter queue).
pub fn redriven(delivery: &Delivery, form: Form) -> Message {
    let marks = Marks::of(delivery);
    let mut builder = Message::builder();
    for (name, value) in delivery.headers().iter() {
        let name_lower = name.to_ascii_lowercase();
        let text = || String::from_utf8_lossy(value).into_owned();
        builder = match name_lower.as_str() {
            REDRIVEN_HEADER | MESSAGE_ID_HEADER => builder,
            CONTENT_TYPE_HEADER => builder.content_type(text()),
            CORRELATION_ID_HEADER => builder.correlation_id(text()),
            REPLY_TO_HEADER => builder.reply_to(text()),
            name if is_bookkeeping(name) => builder,
            _ => builder.header(name.to_string(), value.clone()),
        };
    }
    if let Some(key) = delivery.partition_key() {
        builder = builder.partition_key(key.clone());
    }
    builder = builder.message_id(marks.id);
    if form == Form::Full {
        builder = builder.header(REDRIVEN_HEADER, marks.times.to_string());
    }
    builder.payload(delivery.payload().clone())
}

/// The AMQP properties that carry back a dead letter `delivery` received with `received`:
/// all of them, typed header values included, less what starts the message afresh
/// ([`conveyor_lapin::fresh_copy`]), with its [`Marks`] (the marker only in the
/// [`Form::Full`] form). Refused, as nothing can be sent, where the id is over AMQP's
/// 255 bytes (an original's of 250, say, with its `.redrive-N`).
pub fn redriven_amqp(
    delivery: &Delivery,
    received: &BasicProperties,
    form: Form,
) -> Result<BasicProperties, LapinError> {
    let marks = Marks::of(delivery);
    let id = ShortString::try_new(marks.id).map_err(|_| LapinError::Invalid {
        what: "message id",
        reason: "the redriven message's id, the original's with `.redrive-N` after it, is over AMQP's 255 bytes".into(),
    })?;
    let copy = conveyor_lapin::fresh_copy(received);
    let mut headers = copy
        .headers()
        .as_ref()
        .map(|table| table.inner().clone())
        .unwrap_or_default();
    headers.retain(|name, _| !name.as_str().eq_ignore_ascii_case(REDRIVEN_HEADER));
    if form == Form::Full {
        headers.insert(
            REDRIVEN_HEADER.into(),
            AMQPValue::LongString(marks.times.to_string().into()),
        );
    }
    Ok(copy
        .with_headers(FieldTable::from(headers))
        .with_message_id(id))
}

/// An id no other message of this or another redrive has.
fn fresh_id() -> String {
    format!("redrive-{}", conveyor::kit::unique_id())
}

/// Headers a transport keeps for itself: attempt counts, death records, and where it
/// carries the partition key (set again from the delivery's key).
fn is_bookkeeping(lowercase_name: &str) -> bool {
    [
        conveyor_lapin::ATTEMPTS_HEADER,
        conveyor_lapin::DELIVERY_COUNT_HEADER,
        conveyor_lapin::PARTITION_KEY_HEADER,
        conveyor::memory::PARTITION_KEY_HEADER,
        "messagegroupid",
        "x-death",
    ]
    .contains(&lowercase_name)
        || lowercase_name.starts_with("x-first-death-")
        || lowercase_name.starts_with("x-last-death-")
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use conveyor::{Headers, PartitionKey, Settle, Settled};

    use super::*;

    struct Nowhere;
    impl Settle for Nowhere {
        fn settle(&self, _settled: Settled<'_>) {}
    }

    fn dead(headers: &[(&str, &str)]) -> Delivery {
        let mut all = Headers::new();
        for (name, value) in headers {
            all.insert(name.to_string(), value.to_string());
        }
        Delivery::new("{}".into(), "dead".into(), Arc::new(Nowhere), 1)
            .with_headers(all)
            .with_partition_key(Some(PartitionKey::new("alice")))
    }

    #[test]
    fn a_redriven_message_keeps_its_headers_key_and_properties_and_drops_its_attempts() {
        let delivery = dead(&[
            ("x-tenant", "acme"),
            (conveyor::REJECT_REASON_HEADER, "bad order"),
            ("content-type", "application/json"),
            ("message-id", "m-1"),
            (conveyor_lapin::ATTEMPTS_HEADER, "5"),
            ("x-first-death-reason", "rejected"),
            ("MessageGroupId", "alice"),
        ]);
        let message = redriven(&delivery, Form::Full);
        assert_eq!(message.headers().get_str("x-tenant"), Some("acme"));
        assert_eq!(
            message.headers().get_str(conveyor::REJECT_REASON_HEADER),
            Some("bad order")
        );
        assert_eq!(message.content_type(), Some("application/json"));
        assert_eq!(message.message_id(), Some("m-1.redrive-1"));
        assert_eq!(
            message.partition_key().map(PartitionKey::as_str),
            Some("alice")
        );
        assert_eq!(message.headers().get_str(REDRIVEN_HEADER), Some("1"));
        for gone in [
            conveyor_lapin::ATTEMPTS_HEADER,
            "x-first-death-reason",
            "MessageGroupId",
        ] {
            assert!(!message.headers().contains(gone), "{gone} kept");
        }
    }

    #[test]
    fn a_message_redriven_again_counts_its_redrives() {
        let message = redriven(
            &dead(&[(REDRIVEN_HEADER, "2"), ("message-id", "m-1.redrive-2")]),
            Form::Full,
        );
        assert_eq!(message.headers().get_str(REDRIVEN_HEADER), Some("3"));
        assert_eq!(message.message_id(), Some("m-1.redrive-3"));
        // An id that only looks alike keeps what follows.
        let message = redriven(&dead(&[("message-id", "a.redrive-x")]), Form::Full);
        assert_eq!(message.message_id(), Some("a.redrive-x.redrive-1"));
    }

    #[test]
    fn the_slimmer_form_leaves_out_the_marker_but_keeps_an_id() {
        let unmarked = redriven(&dead(&[("message-id", "m-1.redrive-2")]), Form::Unmarked);
        assert!(!unmarked.headers().contains(REDRIVEN_HEADER));
        // Without the marker, the id still counts the redrives.
        assert_eq!(unmarked.message_id(), Some("m-1.redrive-3"));
        assert!(redriven(&dead(&[]), Form::Unmarked).message_id().is_some());
    }

    #[test]
    fn an_amqp_redrive_keeps_typed_headers_and_properties_and_drops_the_death_history() {
        use conveyor_lapin::lapin::types::{FieldArray, LongString};

        let mut table = FieldTable::default();
        table.insert("count".into(), AMQPValue::LongLongInt(7));
        table.insert("list".into(), AMQPValue::FieldArray(FieldArray::default()));
        table.insert(
            "x-death".into(),
            AMQPValue::FieldArray(FieldArray::default()),
        );
        table.insert(
            "x-first-death-queue".into(),
            AMQPValue::LongString(LongString::from("q")),
        );
        table.insert("X-Conveyor-Redriven".into(), AMQPValue::LongInt(1));
        let received = BasicProperties::default()
            .with_headers(table)
            .with_type("order.created".into())
            .with_user_id("producer".into())
            .with_message_id("m-1.redrive-1".into());
        let delivery = dead(&[
            ("message-id", "m-1.redrive-1"),
            ("X-Conveyor-Redriven", "1"),
        ]);

        let sent = redriven_amqp(&delivery, &received, Form::Full).unwrap();
        assert_eq!(
            sent.kind().as_ref().map(|v| v.as_str()),
            Some("order.created")
        );
        assert_eq!(
            *sent.user_id(),
            None,
            "RabbitMQ refuses another login's user id"
        );
        assert_eq!(
            sent.message_id().as_ref().map(|v| v.as_str()),
            Some("m-1.redrive-2")
        );
        let headers = sent.headers().clone().unwrap_or_default();
        let headers = headers.inner();
        assert_eq!(headers.get("count"), Some(&AMQPValue::LongLongInt(7)));
        assert!(matches!(
            headers.get("list"),
            Some(AMQPValue::FieldArray(_))
        ));
        assert!(!headers.contains_key("x-death") && !headers.contains_key("x-first-death-queue"));
        assert!(!headers.contains_key("X-Conveyor-Redriven"), "{headers:?}");
        assert_eq!(
            headers.get(REDRIVEN_HEADER),
            Some(&AMQPValue::LongString("2".into()))
        );

        let unmarked = redriven_amqp(&delivery, &received, Form::Unmarked).unwrap();
        let headers = unmarked.headers().clone().unwrap_or_default();
        assert!(!headers.inner().contains_key(REDRIVEN_HEADER));
    }

    #[test]
    fn an_amqp_redrive_whose_id_would_be_over_255_bytes_is_refused_not_a_panic() {
        let long = "m".repeat(250);
        let delivery = dead(&[("message-id", long.as_str())]);
        let refused = redriven_amqp(&delivery, &BasicProperties::default(), Form::Full);
        assert!(
            matches!(
                refused,
                Err(LapinError::Invalid {
                    what: "message id",
                    ..
                })
            ),
            "{refused:?}"
        );
    }

    #[test]
    fn a_message_without_an_id_gets_one_of_its_own() {
        let first = redriven(&dead(&[]), Form::Full);
        let second = redriven(&dead(&[]), Form::Full);
        let (Some(first), Some(second)) = (first.message_id(), second.message_id()) else {
            panic!("each redriven message has an id");
        };
        assert!(
            first.starts_with("redrive-") && first != second,
            "{first} {second}"
        );
    }
}
