//! The copies a settlement republishes: a retry counting its attempt, a dead letter with
//! its reason, and a fresh copy for the command line's redrive. Each keeps the message's
//! properties but what RabbitMQ would refuse or misread in a copy.

use std::collections::BTreeMap;

use conveyor::REJECT_REASON_HEADER;
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};

use crate::headers::{ATTEMPTS_HEADER, DELIVERY_COUNT_HEADER};
use crate::publisher::PERSISTENT;

/// The received headers, as a map to edit.
fn header_map(properties: &BasicProperties) -> BTreeMap<ShortString, AMQPValue> {
    properties
        .headers()
        .as_ref()
        .map(|table| table.inner().clone())
        .unwrap_or_default()
}

/// The properties of a retried copy: the received ones, with the attempt count in place
/// of the queue's delivery count. The message's own TTL, if any, counts afresh (a delayed
/// retry's is replaced by the delay, and the delay queue's dead-lettering removes it).
pub(crate) fn retry_copy(properties: &BasicProperties, attempt: u32) -> BasicProperties {
    let mut headers = header_map(properties);
    headers.remove(DELIVERY_COUNT_HEADER);
    headers.insert(
        ATTEMPTS_HEADER.into(),
        AMQPValue::LongLongInt(attempt.into()),
    );
    copy_of(properties, headers, properties.expiration().clone())
}

/// The properties of a dead letter: a [`fresh_copy`] of the received ones, with the
/// reason.
pub(crate) fn dead_letter_copy(properties: &BasicProperties, reason: &str) -> BasicProperties {
    let copy = fresh_copy(properties);
    let mut headers = header_map(&copy);
    headers.insert(
        REJECT_REASON_HEADER.into(),
        AMQPValue::LongString(LongString::from(reason.as_bytes())),
    );
    copy.with_headers(FieldTable::from(headers))
}

/// The properties of a copy of a received message that starts afresh, as a dead letter
/// or a redriven message does: the received ones, typed header values included, but
/// without the broker's dead-lettering history (`x-death`, `x-first-death-*`,
/// `x-last-death-*`, left by a delay queue or by RabbitMQ's own dead-lettering) nor the
/// attempt counts, so the message is counted from its first attempt again. Without its TTL
/// either, as RabbitMQ's own dead-lettering does (a dead letter must not expire from the
/// dead-letter queue), nor its `user_id`, which RabbitMQ checks against the publishing
/// login. Persistent.
///
/// ```
/// use conveyor_lapin::lapin::BasicProperties;
///
/// let received = BasicProperties::default().with_user_id("another".into()).with_app_id("shop".into());
/// let copy = conveyor_lapin::fresh_copy(&received);
/// assert_eq!(copy.app_id().as_ref().map(|id| id.as_str()), Some("shop"));
/// assert_eq!(*copy.user_id(), None);
/// ```
pub fn fresh_copy(properties: &BasicProperties) -> BasicProperties {
    let mut headers = header_map(properties);
    headers.retain(|name, _| {
        let name = name.as_str();
        name != "x-death"
            && !name.starts_with("x-first-death-")
            && !name.starts_with("x-last-death-")
            && name != ATTEMPTS_HEADER
            && name != DELIVERY_COUNT_HEADER
    });
    copy_of(properties, headers, None)
}

/// A persistent copy of the received properties with `headers` and `expiration`, and
/// without `user_id`: RabbitMQ refuses a publish whose `user_id` is not the publishing
/// connection's login, so another producer's would have every copy refused (and their
/// channel closed).
fn copy_of(
    received: &BasicProperties,
    headers: BTreeMap<ShortString, AMQPValue>,
    expiration: Option<ShortString>,
) -> BasicProperties {
    let mut copy = BasicProperties::default()
        .with_headers(FieldTable::from(headers))
        .with_delivery_mode(PERSISTENT);
    if let Some(value) = received.content_type().clone() {
        copy = copy.with_content_type(value);
    }
    if let Some(value) = received.content_encoding().clone() {
        copy = copy.with_content_encoding(value);
    }
    if let Some(value) = *received.priority() {
        copy = copy.with_priority(value);
    }
    if let Some(value) = received.correlation_id().clone() {
        copy = copy.with_correlation_id(value);
    }
    if let Some(value) = received.reply_to().clone() {
        copy = copy.with_reply_to(value);
    }
    if let Some(value) = expiration {
        copy = copy.with_expiration(value);
    }
    if let Some(value) = received.message_id().clone() {
        copy = copy.with_message_id(value);
    }
    if let Some(value) = *received.timestamp() {
        copy = copy.with_timestamp(value);
    }
    if let Some(value) = received.kind().clone() {
        copy = copy.with_type(value);
    }
    if let Some(value) = received.app_id().clone() {
        copy = copy.with_app_id(value);
    }
    if let Some(value) = received.cluster_id().clone() {
        copy = copy.with_cluster_id(value);
    }
    copy
}

#[cfg(test)]
mod tests {
    use super::*;

    fn received(headers: &[(&str, AMQPValue)]) -> BasicProperties {
        let mut table = FieldTable::default();
        for (name, value) in headers {
            table.insert((*name).into(), value.clone());
        }
        BasicProperties::default()
            .with_headers(table)
            .with_message_id("m1".into())
            .with_content_type("application/json".into())
            .with_correlation_id("c1".into())
            .with_priority(3)
            .with_timestamp(1_700_000_000)
            .with_app_id("producer-app".into())
            .with_expiration("60000".into())
            .with_user_id("another-producer".into())
    }

    /// Asserts that `copy` kept the properties [`received`] sets, but for `user_id`.
    fn assert_kept_but_user_id(copy: &BasicProperties) {
        let text = |value: &Option<ShortString>| value.as_ref().map(|v| v.as_str().to_string());
        assert_eq!(text(copy.message_id()).as_deref(), Some("m1"));
        assert_eq!(
            text(copy.content_type()).as_deref(),
            Some("application/json")
        );
        assert_eq!(text(copy.correlation_id()).as_deref(), Some("c1"));
        assert_eq!(*copy.priority(), Some(3));
        assert_eq!(*copy.timestamp(), Some(1_700_000_000));
        assert_eq!(text(copy.app_id()).as_deref(), Some("producer-app"));
        assert_eq!(*copy.delivery_mode(), Some(PERSISTENT));
        assert_eq!(
            *copy.user_id(),
            None,
            "the broker would refuse another login's"
        );
    }

    fn text(value: &str) -> AMQPValue {
        AMQPValue::LongString(LongString::from(value.as_bytes()))
    }

    #[test]
    fn a_retried_copy_counts_the_attempt_instead_of_the_delivery_count_and_drops_user_id() {
        let copy = retry_copy(
            &received(&[
                (DELIVERY_COUNT_HEADER, AMQPValue::LongLongInt(4)),
                ("app", text("kept")),
            ]),
            3,
        );
        let headers = header_map(&copy);
        assert_eq!(
            headers.get(ATTEMPTS_HEADER),
            Some(&AMQPValue::LongLongInt(3))
        );
        assert!(!headers.contains_key(DELIVERY_COUNT_HEADER));
        assert_eq!(headers.get("app"), Some(&text("kept")));
        assert_kept_but_user_id(&copy);
        assert_eq!(
            copy.expiration().as_ref().map(ShortString::as_str),
            Some("60000"),
            "an immediate retry keeps the message's TTL"
        );
    }

    #[test]
    fn a_dead_letter_carries_the_reason_and_neither_death_history_nor_ttl_nor_user_id() {
        let copy = dead_letter_copy(
            &received(&[
                ("x-death", AMQPValue::FieldArray(Default::default())),
                ("x-first-death-reason", text("expired")),
                ("x-first-death-queue", text("q.delay")),
                ("x-last-death-reason", text("expired")),
                (ATTEMPTS_HEADER, AMQPValue::LongLongInt(2)),
                ("app", text("kept")),
            ]),
            "bad input",
        );
        let headers = header_map(&copy);
        let names: Vec<&str> = headers.keys().map(ShortString::as_str).collect();
        assert_eq!(names, vec!["app", REJECT_REASON_HEADER]);
        assert_eq!(headers.get(REJECT_REASON_HEADER), Some(&text("bad input")));
        assert_kept_but_user_id(&copy);
        assert_eq!(*copy.expiration(), None, "a dead letter does not expire");
    }
}
