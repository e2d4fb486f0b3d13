//! How a Conveyor message maps onto an SQS message: body, message attributes, group.
//!
//! Headers travel as message attributes: UTF-8 values as `String`, anything else as
//! `Binary`, so every header value comes back byte for byte. A body SQS cannot carry
//! (not UTF-8, or characters SQS refuses) goes base64-encoded, marked by the
//! [`BODY_ENCODING_ATTRIBUTE`] attribute, and is decoded on receipt.

use std::collections::HashMap;

use aws_sdk_sqs::primitives::Blob;
use aws_sdk_sqs::types::{
    Message as SqsMessage, MessageAttributeValue, MessageSystemAttributeName,
};
use conveyor::{Bytes, Headers, MessageParts, PartitionKey, REJECT_REASON_HEADER};

use crate::error::SqsError;

/// The header that holds a delivery's FIFO message group, which is also its partition
/// key. Standard queues have no groups, so their deliveries have no key.
pub const PARTITION_KEY_HEADER: &str = "MessageGroupId";

/// The message attribute that marks a base64-encoded body.
pub const BODY_ENCODING_ATTRIBUTE: &str = "conveyor-body-encoding";

/// SQS carries at most ten message attributes per message.
pub(crate) const MAX_ATTRIBUTES: usize = 10;

/// A message ready for `SendMessage`.
pub(crate) struct Outgoing {
    pub(crate) body: String,
    pub(crate) attributes: HashMap<String, MessageAttributeValue>,
    /// What SQS counts against its size limit: body plus attribute names, types, values.
    pub(crate) size: usize,
}

/// Maps a message's body and headers onto SQS, refusing what SQS would refuse.
pub(crate) fn encode(queue: &str, parts: &MessageParts) -> Result<Outgoing, SqsError> {
    let mut attributes = Attributes::new(queue);
    for (name, value) in parts.headers.iter() {
        if !name.eq_ignore_ascii_case(PARTITION_KEY_HEADER) {
            attributes.add(name, value)?;
        }
    }
    if let Some(content_type) = &parts.content_type {
        attributes.add("content-type", content_type.as_bytes())?;
    }
    if let Some(id) = &parts.correlation_id {
        attributes.add("correlation-id", id.as_bytes())?;
    }
    attributes.finish(&parts.payload)
}

/// A rejected message on its way to a dead-letter queue: its payload and headers as
/// received, and `reason` in the [`REJECT_REASON_HEADER`] attribute (replacing one an
/// earlier rejection left).
pub(crate) fn encode_dead_letter(
    queue: &str,
    payload: &[u8],
    headers: &Headers,
    reason: Option<&str>,
) -> Result<Outgoing, SqsError> {
    let mut attributes = Attributes::new(queue);
    for (name, value) in headers.iter() {
        if !name.eq_ignore_ascii_case(PARTITION_KEY_HEADER)
            && !name.eq_ignore_ascii_case(REJECT_REASON_HEADER)
        {
            attributes.add(name, value)?;
        }
    }
    if let Some(reason) = reason {
        attributes.add(REJECT_REASON_HEADER, reason.as_bytes())?;
    }
    attributes.finish(payload)
}

/// Message attributes being gathered for one message, with the size SQS counts.
struct Attributes<'q> {
    queue: &'q str,
    map: HashMap<String, MessageAttributeValue>,
    size: usize,
}

impl<'q> Attributes<'q> {
    fn new(queue: &'q str) -> Self {
        Attributes {
            queue,
            map: HashMap::new(),
            size: 0,
        }
    }

    fn invalid(&self, reason: String) -> SqsError {
        SqsError::InvalidMessage {
            queue: self.queue.to_string(),
            reason,
        }
    }

    /// Adds `value` as a `String` attribute where SQS takes it as text, else `Binary`.
    fn add(&mut self, name: &str, value: &[u8]) -> Result<(), SqsError> {
        check_attribute_name(name).map_err(|reason| self.invalid(reason))?;
        let (data_type, attribute) = match std::str::from_utf8(value) {
            Ok(text) if !text.is_empty() && text.chars().all(sqs_allows) => (
                "String",
                MessageAttributeValue::builder()
                    .data_type("String")
                    .string_value(text),
            ),
            _ => (
                "Binary",
                MessageAttributeValue::builder()
                    .data_type("Binary")
                    .binary_value(Blob::new(value.to_vec())),
            ),
        };
        let attribute = attribute
            .build()
            .map_err(|e| self.invalid(format!("header `{name}`: {e}")))?;
        self.size += name.len() + data_type.len() + value.len();
        self.map.insert(name.to_string(), attribute);
        Ok(())
    }

    /// The body (base64 where SQS cannot carry it as text), checked against SQS's limit
    /// on attributes.
    fn finish(mut self, payload: &[u8]) -> Result<Outgoing, SqsError> {
        let body = match std::str::from_utf8(payload) {
            Ok(text) if text.chars().all(sqs_allows) && !text.is_empty() => text.to_string(),
            _ => {
                self.add(BODY_ENCODING_ATTRIBUTE, b"base64")?;
                aws_smithy_types::base64::encode(payload)
            }
        };
        if self.map.len() > MAX_ATTRIBUTES {
            return Err(self.invalid(format!(
                "{} message attributes (headers and properties); SQS carries at most {MAX_ATTRIBUTES}",
                self.map.len()
            )));
        }
        Ok(Outgoing {
            size: self.size + body.len(),
            body,
            attributes: self.map,
        })
    }
}

/// What a received SQS message becomes: payload, headers and partition key.
pub(crate) fn decode(message: &SqsMessage) -> (Bytes, Headers, Option<PartitionKey>) {
    let mut headers = Headers::new();
    let mut base64 = false;
    for (name, value) in message.message_attributes().into_iter().flatten() {
        if name == BODY_ENCODING_ATTRIBUTE {
            base64 = value.string_value() == Some("base64");
            continue;
        }
        let bytes = match (value.binary_value(), value.string_value()) {
            (Some(binary), _) => Bytes::copy_from_slice(binary.as_ref()),
            (None, Some(text)) => Bytes::copy_from_slice(text.as_bytes()),
            (None, None) => Bytes::new(),
        };
        headers.insert(name.clone(), bytes);
    }
    let body = message.body().unwrap_or_default();
    let payload = if base64 {
        match aws_smithy_types::base64::decode(body) {
            Ok(decoded) => Bytes::from(decoded),
            Err(error) => {
                tracing::warn!(%error, "a body marked base64 is not; handing it over as received");
                Bytes::copy_from_slice(body.as_bytes())
            }
        }
    } else {
        Bytes::copy_from_slice(body.as_bytes())
    };
    let key = message
        .attributes()
        .and_then(|system| system.get(&MessageSystemAttributeName::MessageGroupId))
        .map(|group| PartitionKey::from(group.as_str()));
    if let Some(key) = &key {
        headers.insert(PARTITION_KEY_HEADER, key.as_str().to_string());
    }
    (payload, headers, key)
}

/// The characters SQS accepts in a body or string attribute.
fn sqs_allows(c: char) -> bool {
    matches!(c, '\u{9}' | '\u{A}' | '\u{D}' | '\u{20}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..='\u{10FFFF}')
}

/// SQS's rules for message attribute names.
fn check_attribute_name(name: &str) -> Result<(), String> {
    let lower = name.to_ascii_lowercase();
    let ok = !name.is_empty()
        && name.len() <= 256
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && !name.starts_with('.')
        && !name.ends_with('.')
        && !name.contains("..")
        && !lower.starts_with("aws.")
        && !lower.starts_with("amazon.");
    if ok {
        Ok(())
    } else {
        Err(format!(
            "header `{name}` cannot be an SQS message attribute (letters, digits, `-`, `_`, `.`; no `AWS.`/`Amazon.` prefix)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use conveyor::Message;

    fn sent_and_received(message: Message) -> (Bytes, Headers) {
        let outgoing = encode("q", &message.into_parts()).expect("encodable");
        let received = SqsMessage::builder()
            .body(outgoing.body)
            .set_message_attributes(Some(outgoing.attributes))
            .build();
        let (payload, headers, _) = decode(&received);
        (payload, headers)
    }

    #[test]
    fn headers_round_trip_byte_for_byte() {
        let (payload, headers) = sent_and_received(
            Message::new("hi")
                .header("x-text", "plain")
                .header("x-bin", vec![0u8, 255, 1]),
        );
        assert_eq!(payload.as_ref(), b"hi");
        assert_eq!(headers.get_str("x-text"), Some("plain"));
        assert_eq!(
            headers.get("x-bin").map(|v| v.as_ref()),
            Some(&[0u8, 255, 1][..])
        );
    }

    #[test]
    fn a_binary_body_travels_as_base64() {
        let (payload, headers) = sent_and_received(Message::new(vec![0u8, 1, 2, 0xff]));
        assert_eq!(payload.as_ref(), &[0u8, 1, 2, 0xff]);
        assert!(!headers.contains(BODY_ENCODING_ATTRIBUTE));
    }

    #[test]
    fn more_than_ten_attributes_are_refused() {
        let mut message = Message::new("x");
        for i in 0..11 {
            message = message.header(format!("h{i}"), "v");
        }
        let error = encode("q", &message.into_parts()).err().expect("refused");
        assert!(error.to_string().contains("at most 10"), "{error}");
    }

    #[test]
    fn a_dead_letter_carries_payload_headers_and_the_reason() {
        let mut headers = Headers::new();
        headers.insert("x-tenant", "acme");
        headers.insert(PARTITION_KEY_HEADER, "alice");
        headers.insert(REJECT_REASON_HEADER, "an earlier reason");
        let outgoing = encode_dead_letter("dead", &[0u8, 0xff], &headers, Some("bad input"))
            .expect("encodable");
        let received = SqsMessage::builder()
            .body(outgoing.body)
            .set_message_attributes(Some(outgoing.attributes))
            .build();
        let (payload, headers, _) = decode(&received);
        assert_eq!(payload.as_ref(), &[0u8, 0xff]);
        assert_eq!(headers.get_str("x-tenant"), Some("acme"));
        assert_eq!(headers.get_str(REJECT_REASON_HEADER), Some("bad input"));
        assert!(
            !headers.contains(PARTITION_KEY_HEADER),
            "the group travels as the FIFO group, not as an attribute"
        );
    }

    #[test]
    fn reserved_attribute_names_are_refused() {
        let error = encode(
            "q",
            &Message::new("x").header("AWS.trace", "1").into_parts(),
        )
        .err()
        .expect("refused");
        assert!(error.to_string().contains("AWS."), "{error}");
    }
}
