//! Mapping between AMQP header tables and the core's [`Headers`], and the headers this
//! transport reads and writes.

use conveyor::{Bytes, Headers, PartitionKey};
use lapin::BasicProperties;
use lapin::protocol::basic::gen_properties;
use lapin::types::{AMQPValue, FieldTable, LongString};

use crate::error::{LapinError, short};

/// The header that carries a message's partition key on RabbitMQ. The producer sets it
/// (the portable [`conveyor::MessageBuilder::partition_key`] writes it); AMQP itself ignores
/// it, and the consistent-hash helper hashes on it.
pub const PARTITION_KEY_HEADER: &str = "amqp-partition-key";

/// The header a retried message carries (a retry or retry-after republishes it with this
/// header): how many attempts have been made so far. It becomes the next delivery's
/// receive count (plus one), so attempts are counted on classic queues too, which keep no
/// count of their own. A dead letter leaves it behind.
pub const ATTEMPTS_HEADER: &str = "x-conveyor-attempts";

/// The header a quorum queue sets on redeliveries: how many times the message was
/// delivered before.
pub const DELIVERY_COUNT_HEADER: &str = "x-delivery-count";

/// The headers of a received message as the core sees them: its AMQP header table, plus
/// the AMQP properties content type, message id and correlation id under the core's
/// names for them ([`conveyor::MessageParts::property_headers`]), and `priority`. The same for a subscription's deliveries and the
/// dead letters a broker takes back.
pub(crate) fn received(properties: &BasicProperties) -> Headers {
    let mut headers = match properties.headers() {
        Some(table) => from_table(table),
        None => Headers::new(),
    };
    if let Some(v) = properties.content_type() {
        headers.insert(conveyor::CONTENT_TYPE_HEADER, v.as_str().to_string());
    }
    if let Some(v) = properties.message_id() {
        headers.insert(conveyor::MESSAGE_ID_HEADER, v.as_str().to_string());
    }
    if let Some(v) = properties.correlation_id() {
        headers.insert(conveyor::CORRELATION_ID_HEADER, v.as_str().to_string());
    }
    if let Some(v) = properties.reply_to() {
        headers.insert(conveyor::REPLY_TO_HEADER, v.as_str().to_string());
    }
    if let Some(v) = properties.priority() {
        headers.insert("priority", v.to_string());
    }
    headers
}

/// The core headers of an AMQP table. Text and byte values are kept as bytes; numbers
/// and booleans as their decimal text; nested tables and arrays are skipped.
pub(crate) fn from_table(table: &FieldTable) -> Headers {
    table
        .inner()
        .iter()
        .filter_map(|(name, value)| Some((name.as_str().to_string(), value_bytes(value)?)))
        .collect()
}

fn value_bytes(value: &AMQPValue) -> Option<Bytes> {
    Some(match value {
        AMQPValue::LongString(s) => Bytes::copy_from_slice(s.as_bytes()),
        AMQPValue::ShortString(s) => Bytes::copy_from_slice(s.as_str().as_bytes()),
        AMQPValue::ByteArray(b) => Bytes::copy_from_slice(b.as_slice()),
        AMQPValue::Boolean(b) => Bytes::from(b.to_string()),
        AMQPValue::ShortShortInt(i) => Bytes::from(i.to_string()),
        AMQPValue::ShortShortUInt(i) => Bytes::from(i.to_string()),
        AMQPValue::ShortInt(i) => Bytes::from(i.to_string()),
        AMQPValue::ShortUInt(i) => Bytes::from(i.to_string()),
        AMQPValue::LongInt(i) => Bytes::from(i.to_string()),
        AMQPValue::LongUInt(i) => Bytes::from(i.to_string()),
        AMQPValue::LongLongInt(i) => Bytes::from(i.to_string()),
        AMQPValue::Timestamp(t) => Bytes::from(t.to_string()),
        AMQPValue::Float(f) => Bytes::from(f.to_string()),
        AMQPValue::Double(f) => Bytes::from(f.to_string()),
        _ => return None,
    })
}

/// An integer header value, whatever integer type the producer used.
pub(crate) fn int_value(table: &FieldTable, name: &str) -> Option<u64> {
    match table.inner().get(name)? {
        AMQPValue::ShortShortInt(i) => u64::try_from(*i).ok(),
        AMQPValue::ShortShortUInt(i) => Some((*i).into()),
        AMQPValue::ShortInt(i) => u64::try_from(*i).ok(),
        AMQPValue::ShortUInt(i) => Some((*i).into()),
        AMQPValue::LongInt(i) => u64::try_from(*i).ok(),
        AMQPValue::LongUInt(i) => Some((*i).into()),
        AMQPValue::LongLongInt(i) => u64::try_from(*i).ok(),
        AMQPValue::LongString(s) => std::str::from_utf8(s.as_bytes()).ok()?.parse().ok(),
        _ => None,
    }
}

/// The partition key of an AMQP header table, if it carries one as text.
pub(crate) fn partition_key(table: &FieldTable) -> Option<PartitionKey> {
    let text = match table.inner().get(PARTITION_KEY_HEADER)? {
        AMQPValue::LongString(s) => std::str::from_utf8(s.as_bytes()).ok()?,
        AMQPValue::ShortString(s) => s.as_str(),
        _ => return None,
    };
    Some(PartitionKey::from(text))
}

/// An AMQP header table from the core headers (values as long strings) and an optional
/// partition key.
pub(crate) fn to_table(
    headers: &Headers,
    partition_key: Option<&PartitionKey>,
) -> Result<FieldTable, LapinError> {
    let mut table = FieldTable::default();
    for (name, value) in headers.iter() {
        table.insert(
            short("header name", name)?,
            AMQPValue::LongString(LongString::from(value.as_ref())),
        );
    }
    if let Some(key) = partition_key {
        table.insert(
            PARTITION_KEY_HEADER.into(),
            AMQPValue::LongString(LongString::from(key.as_str().as_bytes())),
        );
    }
    Ok(table)
}

/// The bytes of a frame besides its payload: type, channel and payload size (7), and
/// the frame-end octet.
const FRAME_OVERHEAD: usize = 8;
/// The bytes of a content header's payload before the properties: class id, weight and
/// body size.
const CONTENT_HEADER_PREFIX: usize = 12;

/// The size of the header frame lapin sends for a message with `properties`, if it is
/// over `frame_max`, the largest frame the connection takes (0: no limit). AMQP cannot
/// split a header frame as it splits a payload, and the broker answers an oversize one
/// by closing the whole connection (FRAME_ERROR), so a message whose properties and
/// headers do not fit must not be sent.
pub(crate) fn oversize_header_frame(properties: &BasicProperties, frame_max: u32) -> Option<usize> {
    if frame_max == 0 {
        return None;
    }
    // Encoded as lapin encodes them (amq-protocol's own serializer), so the size is
    // exact whatever the header values' types. Writing to a Vec cannot fail: if it did,
    // lapin would fail the same way and report it.
    let (_, written) = gen_properties::<Vec<u8>>(properties)(Vec::new().into())
        .ok()?
        .into_inner();
    let size = usize::try_from(written)
        .unwrap_or(usize::MAX)
        .saturating_add(FRAME_OVERHEAD + CONTENT_HEADER_PREFIX);
    (size > usize::try_from(frame_max).unwrap_or(usize::MAX)).then_some(size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_key_round_trips_through_a_table() {
        let table = to_table(&Headers::new(), Some(&PartitionKey::from("alice"))).unwrap();
        assert_eq!(partition_key(&table).as_deref(), Some("alice"));
        assert_eq!(
            from_table(&table).get_str(PARTITION_KEY_HEADER),
            Some("alice")
        );
    }

    #[test]
    fn received_headers_include_the_amqp_properties() {
        let properties = BasicProperties::default()
            .with_headers(to_table(&Headers::new(), Some(&PartitionKey::from("bob"))).unwrap())
            .with_content_type("application/json".into())
            .with_message_id("m-1".into())
            .with_correlation_id("c-1".into())
            .with_priority(4);
        let headers = received(&properties);
        assert_eq!(headers.get_str(PARTITION_KEY_HEADER), Some("bob"));
        assert_eq!(headers.get_str("content-type"), Some("application/json"));
        assert_eq!(headers.get_str("message-id"), Some("m-1"));
        assert_eq!(headers.get_str("correlation-id"), Some("c-1"));
        assert_eq!(headers.get_str("priority"), Some("4"));
        assert!(received(&BasicProperties::default()).is_empty());
    }

    #[test]
    fn the_header_frame_size_is_measured_as_lapin_encodes_it() {
        let mut headers = Headers::new();
        headers.insert("h", "v".repeat(100));
        let properties = BasicProperties::default()
            .with_delivery_mode(2)
            .with_headers(to_table(&headers, None).unwrap());
        // 8 (frame) + 12 (class, weight, body size) + 2 (flags) + 1 (delivery mode)
        // + 4 (table size) + 1 + 1 (name) + 1 (type) + 4 + 100 (long string): 134 bytes.
        assert_eq!(oversize_header_frame(&properties, 133), Some(134));
        assert_eq!(oversize_header_frame(&properties, 134), None);
        assert_eq!(oversize_header_frame(&properties, 0), None, "no limit");
    }

    #[test]
    fn integer_headers_are_read_whatever_their_width() {
        let mut table = FieldTable::default();
        table.insert(DELIVERY_COUNT_HEADER.into(), AMQPValue::LongLongInt(3));
        table.insert(ATTEMPTS_HEADER.into(), AMQPValue::ShortShortUInt(2));
        assert_eq!(int_value(&table, DELIVERY_COUNT_HEADER), Some(3));
        assert_eq!(int_value(&table, ATTEMPTS_HEADER), Some(2));
        assert_eq!(from_table(&table).get_str(ATTEMPTS_HEADER), Some("2"));
    }
}
