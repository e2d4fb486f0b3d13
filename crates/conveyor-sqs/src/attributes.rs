//! How a Conveyor message maps onto an SQS message: body, message attributes, group.
//!
//! Headers travel as message attributes: UTF-8 values as `String`, anything else as
//! `Binary`, so every header value comes back byte for byte; a type given in an
//! [`AttributeTypes`] (a received message's own, or a publisher's) replaces that choice.
//! A body SQS cannot carry
//! (not UTF-8, or characters SQS refuses) goes base64-encoded, marked by the
//! [`BODY_ENCODING_ATTRIBUTE`] attribute, and is decoded on receipt. An empty payload,
//! which SQS refuses as a body (it takes at least one character), goes as a placeholder
//! body marked by the same attribute, and comes back empty. Headers with an empty value,
//! which SQS refuses as an attribute value, travel by name in one attribute,
//! [`EMPTY_HEADERS_ATTRIBUTE`], and come back empty.

use std::collections::HashMap;

use aws_sdk_sqs::primitives::Blob;
use aws_sdk_sqs::types::{
    Message as SqsMessage, MessageAttributeValue, MessageSystemAttributeName,
};
use conveyor::{Bytes, Headers, MessageParts, PartitionKey, REJECT_REASON_HEADER};

use crate::data_types::{self, AttributeTypes, Carried, as_sqs_text, sqs_allows};
use crate::error::{SqsError, shown};

/// The header that holds a delivery's FIFO message group, which is also its partition
/// key. Standard queues have no groups, so their deliveries have no key.
pub const PARTITION_KEY_HEADER: &str = "MessageGroupId";

/// The message attribute that marks a body that is not the payload as it is: `base64`
/// for a base64-encoded one, `empty` for the placeholder an empty payload travels as
/// (SQS takes no empty body). Like any attribute, it counts against SQS's ten.
pub const BODY_ENCODING_ATTRIBUTE: &str = "conveyor-body-encoding";

/// The message attribute that names the headers whose value is empty, which SQS takes no
/// attribute value of: a `String` of their names, each followed by `,` (names SQS takes
/// have no `,`). One attribute for all of them, so that however many headers are empty,
/// they take one of SQS's ten attributes between them (a header with a value takes one
/// of its own). A receive takes it out of the headers, and gives each name back as a
/// header with an empty value.
pub const EMPTY_HEADERS_ATTRIBUTE: &str = "conveyor-empty-headers";

/// What follows each name in the [`EMPTY_HEADERS_ATTRIBUTE`] value.
const EMPTY_HEADERS_SEPARATOR: char = ',';

/// The [`BODY_ENCODING_ATTRIBUTE`] value of a base64-encoded body.
const BASE64_ENCODING: &str = "base64";

/// The [`BODY_ENCODING_ATTRIBUTE`] value of an empty payload, sent as [`EMPTY_BODY`].
const EMPTY_ENCODING: &str = "empty";

/// The body an empty payload travels as: SQS refuses a body of less than one character.
/// Only the marker makes it empty again, so a payload `(empty)` stays what it is.
const EMPTY_BODY: &str = "(empty)";

/// SQS carries at most ten message attributes per message. The message's headers and
/// properties count, and so do the attributes this transport adds for them: the body's
/// marker ([`BODY_ENCODING_ATTRIBUTE`]) where the body needs one, and the list of empty
/// headers ([`EMPTY_HEADERS_ATTRIBUTE`]), one for all of them, where there is any. So a
/// message carries up to ten headers whatever their values, and more only where two or
/// more are empty.
pub const MAX_ATTRIBUTES: usize = 10;

/// A message ready for `SendMessage`.
pub(crate) struct Outgoing {
    pub(crate) body: String,
    pub(crate) attributes: HashMap<String, MessageAttributeValue>,
    /// What SQS counts against its size limit: body plus attribute names, types, values.
    pub(crate) size: usize,
}

/// Maps a message's body and headers onto SQS, refusing what SQS would refuse and what
/// would not come back as it was sent.
///
/// On a FIFO queue (`fifo`) a [`PARTITION_KEY_HEADER`] header must hold the message's
/// partition key: that travels as the message group, and a delivery gets it back in that
/// header. A standard queue has no groups: there the header is an ordinary attribute.
/// The message's properties (content type, message id, correlation id) travel as
/// attributes under the core's header names for them, so they come back as those
/// headers; a header of the same name must hold the same value.
///
/// A header named in `types` goes as the type given there.
pub(crate) fn encode(
    queue: &str,
    fifo: bool,
    parts: &MessageParts,
    types: &AttributeTypes,
) -> Result<Outgoing, SqsError> {
    let group = parts.partition_key.as_ref().map(PartitionKey::as_str);
    let mut attributes = Attributes::new(queue, types);
    attributes.add_headers(&parts.headers, fifo.then_some(group))?;
    for (name, value) in parts.property_headers() {
        attributes.add_property(name, value.as_bytes())?;
    }
    attributes.finish(&parts.payload)
}

/// A rejected message on its way to a dead-letter queue: its payload and headers as
/// received, and `reason` in the [`REJECT_REASON_HEADER`] attribute (replacing one an
/// earlier rejection left; an empty reason is left out, since SQS takes no empty value).
/// `group` is the message group on a FIFO dead-letter queue, `None` on a standard one.
/// The headers keep the types they were received with (`types`); the reason is a `String`.
pub(crate) fn encode_dead_letter(
    queue: &str,
    group: Option<&str>,
    payload: &[u8],
    headers: &Headers,
    types: &AttributeTypes,
    reason: Option<&str>,
) -> Result<Outgoing, SqsError> {
    let mut attributes = Attributes::new(queue, types);
    let mut kept = headers.clone();
    kept.remove(REJECT_REASON_HEADER);
    attributes.add_headers(&kept, group.map(Some))?;
    if let Some(reason) = reason.filter(|reason| !reason.is_empty()) {
        // Not `add`: the reason goes as its value says, whatever type an earlier one had.
        attributes.insert(REJECT_REASON_HEADER, reason.as_bytes(), None)?;
    }
    attributes.finish(payload)
}

/// The longest message attribute name SQS takes, in characters.
const MAX_ATTRIBUTE_NAME_CHARS: usize = 256;

/// Message attributes being gathered for one message, with the size SQS counts.
struct Attributes<'q> {
    queue: &'q str,
    /// The types headers go as where their value alone would not say it.
    types: &'q AttributeTypes,
    map: HashMap<String, MessageAttributeValue>,
    /// The headers with an empty value, by name: they travel in the
    /// [`EMPTY_HEADERS_ATTRIBUTE`] list.
    empty: Vec<String>,
    size: usize,
}

impl<'q> Attributes<'q> {
    fn new(queue: &'q str, types: &'q AttributeTypes) -> Self {
        Attributes {
            queue,
            types,
            map: HashMap::new(),
            empty: Vec::new(),
            size: 0,
        }
    }

    fn invalid(&self, reason: String) -> SqsError {
        SqsError::InvalidMessage {
            queue: self.queue.to_string(),
            reason,
        }
    }

    /// Every header as an attribute. `fifo_group` is `Some(group)` on a FIFO queue: there
    /// a [`PARTITION_KEY_HEADER`] header is the group's own and travels as the group, so
    /// it must hold it; on a standard queue (`None`) it is an ordinary attribute.
    fn add_headers(
        &mut self,
        headers: &Headers,
        fifo_group: Option<Option<&str>>,
    ) -> Result<(), SqsError> {
        for (name, value) in headers.iter() {
            match fifo_group {
                Some(group) if name.eq_ignore_ascii_case(PARTITION_KEY_HEADER) => {
                    if group.map(str::as_bytes) != Some(value.as_ref()) {
                        return Err(self.invalid(format!(
                            "header `{}` is not the partition key: on a FIFO queue the message group is the partition key, which a delivery carries in that header; set `partition_key` rather than the header",
                            shown(name)
                        )));
                    }
                }
                _ => self.add(name, value)?,
            }
        }
        Ok(())
    }

    /// A message property that travels as the attribute `name`: a header of that name
    /// (in any case) holding the same value already carries it; one holding another value
    /// is refused, since only one of them could come back.
    fn add_property(&mut self, name: &str, value: &[u8]) -> Result<(), SqsError> {
        let header = self
            .map
            .iter()
            .find(|(known, _)| known.eq_ignore_ascii_case(name))
            .map(|(known, attribute)| (known, attribute_bytes(attribute)))
            .or_else(|| {
                self.empty
                    .iter()
                    .find(|known| known.eq_ignore_ascii_case(name))
                    .map(|known| (known, Some(&[][..])))
            });
        match header {
            None => self.add(name, value),
            Some((_, carried)) if carried == Some(value) => Ok(()),
            Some((known, _)) => Err(self.invalid(format!(
                "header `{}` differs from the message's {}, which travels as the attribute `{name}`: only one of them could come back; drop the header or give it the same value",
                shown(known),
                name.replace('-', " ")
            ))),
        }
    }

    /// Adds the header `name` as the type [`Attributes::types`] gives it, else as a
    /// `String` attribute where SQS takes it as text, else `Binary`. An empty value,
    /// which SQS takes in no attribute, goes by name in the [`EMPTY_HEADERS_ATTRIBUTE`]
    /// list instead, without a type: one given that says more than `String` or `Binary`
    /// (`Number`, a custom type) is refused, since it would not come back.
    fn add(&mut self, name: &str, value: &[u8]) -> Result<(), SqsError> {
        check_attribute_name(name).map_err(|reason| self.invalid(reason))?;
        if value.is_empty() {
            if let Some(data_type) = self
                .types
                .get(name)
                .filter(|data_type| !matches!(*data_type, "String" | "Binary"))
            {
                return Err(self.invalid(format!(
                    "header `{}` is empty, and an empty value travels without its type `{}` (SQS takes no empty attribute value): send it as `String` or `Binary`",
                    shown(name),
                    data_type.escape_debug()
                )));
            }
            if !self.empty.iter().any(|known| known == name) {
                self.empty.push(name.to_string());
            }
            return Ok(());
        }
        self.insert(name, value, self.types.get(name))
    }

    /// Adds an attribute whose name is known to be valid, as `data_type` (`None`: as
    /// [`data_types::sent_as`] chooses).
    fn insert(
        &mut self,
        name: &str,
        value: &[u8],
        data_type: Option<&str>,
    ) -> Result<(), SqsError> {
        let data_type = data_type.unwrap_or_else(|| data_types::sent_as(value));
        let invalid = |reason: String| self.invalid(format!("header `{}`: {reason}", shown(name)));
        let builder = MessageAttributeValue::builder().data_type(data_type);
        let attribute = match data_types::carried(data_type).map_err(invalid)? {
            Carried::Bytes => builder.binary_value(Blob::new(value.to_vec())),
            Carried::Text => {
                let text = std::str::from_utf8(value)
                    .ok()
                    .filter(|text| as_sqs_text(text))
                    .ok_or_else(|| {
                        invalid(format!(
                            "type `{}` carries text, and the value is not text SQS takes",
                            data_type.escape_debug()
                        ))
                    })?;
                if data_types::is_number(data_type) && !data_types::is_numeric(text) {
                    return Err(invalid(format!(
                        "type `{}` carries a number, and the value is not one",
                        data_type.escape_debug()
                    )));
                }
                builder.string_value(text)
            }
        };
        let attribute = attribute.build().map_err(|e| invalid(e.to_string()))?;
        self.size = self
            .size
            .saturating_add(name.len())
            .saturating_add(data_type.len())
            .saturating_add(value.len());
        self.map.insert(name.to_string(), attribute);
        Ok(())
    }

    /// The body (base64 where SQS cannot carry it as text, a placeholder for an empty
    /// payload), checked against SQS's limit on attributes.
    fn finish(mut self, payload: &[u8]) -> Result<Outgoing, SqsError> {
        // What the marker says of the body, if it needs one, for the error below.
        let mut marked = None;
        let body = match std::str::from_utf8(payload) {
            // Base64 of nothing is nothing, and SQS takes no empty body.
            _ if payload.is_empty() => {
                self.insert(BODY_ENCODING_ATTRIBUTE, EMPTY_ENCODING.as_bytes(), None)?;
                marked = Some("an empty");
                EMPTY_BODY.to_string()
            }
            Ok(text) if text.chars().all(sqs_allows) => text.to_string(),
            _ => {
                self.insert(BODY_ENCODING_ATTRIBUTE, BASE64_ENCODING.as_bytes(), None)?;
                marked = Some("a binary");
                aws_smithy_types::base64::encode(payload)
            }
        };
        if !self.empty.is_empty() {
            let mut names = String::new();
            for name in &self.empty {
                names.push_str(name);
                names.push(EMPTY_HEADERS_SEPARATOR);
            }
            self.insert(EMPTY_HEADERS_ATTRIBUTE, names.as_bytes(), Some("String"))?;
        }
        if self.map.len() > MAX_ATTRIBUTES {
            return Err(self.invalid(format!(
                "{} message attributes (headers and properties{}); SQS carries at most {MAX_ATTRIBUTES}",
                self.map.len(),
                self.not_set_as_headers(marked)
            )));
        }
        Ok(Outgoing {
            size: self.size.saturating_add(body.len()),
            body,
            attributes: self.map,
        })
    }

    /// The attributes counted that the sender may not know it set, for the error that
    /// refuses an eleventh: the body's marker (`marked` says of what body), the list of
    /// empty headers, and the trace context that tracing adds to the headers. Empty when
    /// there are none.
    fn not_set_as_headers(&self, marked: Option<&str>) -> String {
        let mut counted = Vec::new();
        if let Some(body) = marked {
            counted.push(format!(
                "`{BODY_ENCODING_ATTRIBUTE}`, which marks {body} body"
            ));
        }
        match self.empty.len() {
            0 => {}
            1 => counted.push(format!(
                "`{EMPTY_HEADERS_ATTRIBUTE}`, which names the empty header"
            )),
            n => counted.push(format!(
                "`{EMPTY_HEADERS_ATTRIBUTE}`, which names the {n} empty headers"
            )),
        }
        let trace: Vec<&str> = [
            conveyor::trace::TRACEPARENT_HEADER,
            conveyor::trace::TRACESTATE_HEADER,
        ]
        .into_iter()
        .filter(|header| {
            self.map
                .keys()
                .any(|name| name.eq_ignore_ascii_case(header))
        })
        .collect();
        match trace.as_slice() {
            [] => {}
            [one] => counted.push(format!("`{one}`, the trace context")),
            [one, two, ..] => counted.push(format!("`{one}` and `{two}`, the trace context")),
        }
        if counted.is_empty() {
            String::new()
        } else {
            format!(", counting {}", counted.join(" and "))
        }
    }
}

/// The bytes an attribute carries, as [`decode`] hands them over.
fn attribute_bytes(attribute: &MessageAttributeValue) -> Option<&[u8]> {
    match (attribute.binary_value(), attribute.string_value()) {
        (Some(binary), _) => Some(binary.as_ref()),
        (None, Some(text)) => Some(text.as_bytes()),
        (None, None) => None,
    }
}

/// What a received SQS message becomes.
pub(crate) struct Decoded {
    pub(crate) payload: Bytes,
    pub(crate) headers: Headers,
    pub(crate) key: Option<PartitionKey>,
    /// The types of the headers whose value alone does not say theirs.
    pub(crate) types: AttributeTypes,
}

/// What a received SQS message becomes: payload, headers, partition key, and the types of
/// its attributes where their value alone would go out as another. A message an SNS topic
/// delivered without raw delivery comes wrapped in SNS's JSON envelope: it is unwrapped,
/// so that body and headers come out as with raw delivery.
pub(crate) fn decode(message: &SqsMessage) -> Decoded {
    let mut headers = Headers::new();
    let mut types = AttributeTypes::new();
    let mut encoding = None;
    let mut empty = None;
    let mut add = |name: &str, data_type: &str, bytes: Bytes| {
        if name == BODY_ENCODING_ATTRIBUTE {
            encoding = Some(bytes);
        } else if name == EMPTY_HEADERS_ATTRIBUTE {
            empty = Some(bytes);
        } else {
            types.note_received(name, data_type, &bytes);
            headers.insert(name.to_string(), bytes);
        }
    };
    let received = message.body().unwrap_or_default();
    let envelope = match message.message_attributes() {
        Some(attributes) if !attributes.is_empty() => None,
        _ => SnsEnvelope::of(received),
    };
    let body = match &envelope {
        Some(envelope) => {
            for (name, data_type, value) in envelope.attributes() {
                add(name, data_type, value);
            }
            envelope.message.as_str()
        }
        None => {
            for (name, value) in message.message_attributes().into_iter().flatten() {
                let bytes = attribute_bytes(value).map_or_else(Bytes::new, Bytes::copy_from_slice);
                add(name, value.data_type(), bytes);
            }
            received
        }
    };
    let payload = match encoding.as_deref() {
        Some(marker) if marker == BASE64_ENCODING.as_bytes() => {
            match aws_smithy_types::base64::decode(body) {
                Ok(decoded) => Bytes::from(decoded),
                Err(error) => {
                    tracing::warn!(error = %conveyor::Report(&error), "a body marked base64 is not; handing it over as received");
                    Bytes::copy_from_slice(body.as_bytes())
                }
            }
        }
        Some(marker) if marker == EMPTY_ENCODING.as_bytes() => Bytes::new(),
        _ => Bytes::copy_from_slice(body.as_bytes()),
    };
    // An attribute of the same name, which a sender of its own may have set, wins.
    let empty = empty.as_deref().map(String::from_utf8_lossy);
    for name in empty
        .iter()
        .flat_map(|names| names.split(EMPTY_HEADERS_SEPARATOR))
    {
        if !name.is_empty() && !headers.contains(name) {
            headers.insert(name.to_string(), Bytes::new());
        }
    }
    let key = message
        .attributes()
        .and_then(|system| system.get(&MessageSystemAttributeName::MessageGroupId))
        .map(|group| PartitionKey::from(group.as_str()));
    if let Some(key) = &key {
        headers.insert(PARTITION_KEY_HEADER, key.as_str().to_string());
    }
    Decoded {
        payload,
        headers,
        key,
        types,
    }
}

/// The JSON envelope SNS wraps a message in when it delivers it to a queue without raw
/// delivery. Besides the message, SNS always sends its message id and the unsubscribe
/// link, and from a standard topic its signature and the URL of its certificate (a FIFO
/// topic's notifications are not signed), which a payload of the user's has no reason to
/// carry: they are required, so that a published payload that only resembles a
/// notification (an archived one, a relay's) is not taken for one and cut down to its
/// `Message`.
#[derive(serde::Deserialize)]
struct SnsEnvelope {
    #[serde(rename = "Type")]
    kind: String,
    #[serde(rename = "TopicArn")]
    topic_arn: String,
    #[serde(rename = "Message")]
    message: String,
    #[serde(rename = "MessageAttributes", default)]
    attributes: HashMap<String, SnsAttribute>,
    #[serde(rename = "MessageId")]
    message_id: String,
    #[serde(rename = "UnsubscribeURL")]
    unsubscribe_url: String,
    #[serde(rename = "Signature", default)]
    signature: String,
    #[serde(rename = "SignatureVersion", default)]
    signature_version: String,
    #[serde(rename = "SigningCertURL", default)]
    signing_cert_url: String,
}

#[derive(serde::Deserialize)]
struct SnsAttribute {
    #[serde(rename = "Type")]
    kind: String,
    #[serde(rename = "Value")]
    value: String,
}

impl SnsEnvelope {
    /// The envelope `body` is, if it is one: a notification from a topic.
    fn of(body: &str) -> Option<SnsEnvelope> {
        // Most bodies are not: a cheap look before parsing.
        if !body.trim_start().starts_with('{') || !body.contains("\"TopicArn\"") {
            return None;
        }
        let envelope: SnsEnvelope = serde_json::from_str(body).ok()?;
        let present = |fields: &[&String]| fields.iter().all(|field| !field.is_empty());
        let sent_by_sns = present(&[&envelope.message_id, &envelope.unsubscribe_url])
            && (envelope.topic_arn.ends_with(".fifo")
                || present(&[
                    &envelope.signature,
                    &envelope.signature_version,
                    &envelope.signing_cert_url,
                ]));
        (envelope.kind == "Notification" && envelope.topic_arn.starts_with("arn:") && sent_by_sns)
            .then_some(envelope)
    }

    /// Its message attributes: name, type, and value as header bytes (a `Binary` one
    /// base64-decoded).
    fn attributes(&self) -> impl Iterator<Item = (&str, &str, Bytes)> {
        self.attributes.iter().map(|(name, attribute)| {
            let bytes = match attribute.kind.as_str() {
                "Binary" => aws_smithy_types::base64::decode(&attribute.value)
                    .map(Bytes::from)
                    .unwrap_or_else(|_| Bytes::copy_from_slice(attribute.value.as_bytes())),
                _ => Bytes::copy_from_slice(attribute.value.as_bytes()),
            };
            (name.as_str(), attribute.kind.as_str(), bytes)
        })
    }
}

/// SQS's rules for message attribute names, and the names this transport keeps for
/// itself ([`BODY_ENCODING_ATTRIBUTE`] and [`EMPTY_HEADERS_ATTRIBUTE`], which a receive
/// takes out of the headers).
fn check_attribute_name(name: &str) -> Result<(), String> {
    let prefixed = |prefix: &str| {
        name.get(..prefix.len())
            .is_some_and(|start| start.eq_ignore_ascii_case(prefix))
    };
    let problem = if name.is_empty() {
        "is empty".to_string()
    } else if name.chars().nth(MAX_ATTRIBUTE_NAME_CHARS).is_some() {
        format!("is longer than the {MAX_ATTRIBUTE_NAME_CHARS} characters SQS takes")
    } else if let Some(c) = name
        .chars()
        .find(|c| !c.is_ascii_alphanumeric() && !matches!(c, '-' | '_' | '.'))
    {
        format!(
            "has `{}`, which SQS refuses (only letters A-Z and a-z, digits, `-`, `_` and `.`)",
            c.escape_debug()
        )
    } else if prefixed("aws.") || prefixed("amazon.") {
        "starts with `AWS.` or `Amazon.` (in any case), which SQS reserves".to_string()
    } else if name.starts_with('.') || name.ends_with('.') {
        "starts or ends with `.`, which SQS refuses".to_string()
    } else if name.contains("..") {
        "has `..`, which SQS refuses".to_string()
    } else if name.eq_ignore_ascii_case(BODY_ENCODING_ATTRIBUTE) {
        "is the attribute this transport marks a base64 or empty body with".to_string()
    } else if name.eq_ignore_ascii_case(EMPTY_HEADERS_ATTRIBUTE) {
        "is the attribute this transport names the empty headers in".to_string()
    } else {
        return Ok(());
    };
    Err(format!(
        "header `{}` cannot be an SQS message attribute: its name {problem}",
        shown(name)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use conveyor::Message;

    /// What a receive makes of `outgoing`, on a FIFO queue when `group` is given.
    fn received(outgoing: Outgoing, group: Option<&str>) -> (Bytes, Headers, Option<PartitionKey>) {
        let mut message = SqsMessage::builder()
            .body(outgoing.body)
            .set_message_attributes(Some(outgoing.attributes));
        if let Some(group) = group {
            message = message.attributes(MessageSystemAttributeName::MessageGroupId, group);
        }
        let decoded = decode(&message.build());
        (decoded.payload, decoded.headers, decoded.key)
    }

    fn sent_and_received(message: Message) -> (Bytes, Headers) {
        let outgoing =
            encode("q", false, &message.into_parts(), &AttributeTypes::new()).expect("encodable");
        let (payload, headers, _) = received(outgoing, None);
        (payload, headers)
    }

    /// Why `message` cannot go to a queue (FIFO when `fifo`).
    fn refused(fifo: bool, message: Message) -> String {
        match encode("q", fifo, &message.into_parts(), &AttributeTypes::new()) {
            Ok(_) => panic!("the message should be refused"),
            Err(error) => error.to_string(),
        }
    }

    /// What SNS adds to every notification it delivers, and a payload has no reason to.
    const SIGNED: &str = r#""MessageId":"m-1","SignatureVersion":"1","Signature":"EXAMPLE","SigningCertURL":"https://sns.us-east-1.amazonaws.com/c.pem","UnsubscribeURL":"https://sns.us-east-1.amazonaws.com/?Action=Unsubscribe""#;

    #[test]
    fn only_an_sns_notification_is_unwrapped() {
        let envelope = format!(
            r#"{{"Type":"Notification","TopicArn":"arn:aws:sns:us-east-1:1:t","Message":"hi","MessageAttributes":{{"a":{{"Type":"String","Value":"v"}},"b":{{"Type":"Binary","Value":"AQI="}}}},{SIGNED}}}"#
        );
        let envelope = envelope.as_str();
        let unwrapped = SnsEnvelope::of(envelope).expect("a notification");
        assert_eq!(unwrapped.message, "hi");
        let mut attributes: Vec<(&str, &str, Bytes)> = unwrapped.attributes().collect();
        attributes.sort();
        assert_eq!(
            attributes,
            vec![
                ("a", "String", Bytes::from_static(b"v")),
                ("b", "Binary", Bytes::from_static(&[1, 2]))
            ]
        );
        // A payload of the user's that looks alike, but is no notification from a topic.
        for body in [
            format!(r#"{{"Type":"Notification","Message":"hi",{SIGNED}}}"#),
            format!(
                r#"{{"Type":"Order","TopicArn":"arn:aws:sns:us-east-1:1:t","Message":"hi",{SIGNED}}}"#
            ),
            format!(r#"{{"TopicArn":"not an arn","Type":"Notification","Message":"hi",{SIGNED}}}"#),
            "plain text".to_string(),
        ] {
            assert!(SnsEnvelope::of(&body).is_none(), "{body}");
        }
    }

    /// A service that publishes an SNS notification it holds (an archive, a replay, a
    /// relay's copy without the signature) as a plain message's payload gets the whole
    /// notification back, not its `Message`.
    #[test]
    fn a_published_payload_that_looks_like_an_sns_notification_comes_back_whole() {
        let notification = r#"{"Type":"Notification","MessageId":"m-1","TopicArn":"arn:aws:sns:us-east-1:123456789012:orders","Message":"hi","Timestamp":"2026-01-01T00:00:00.000Z"}"#;
        let (payload, headers) = sent_and_received(Message::new(notification));
        assert_eq!(
            payload.as_ref(),
            notification.as_bytes(),
            "headers {headers:?}"
        );
        // One field short of what SNS sends is still no envelope.
        let unsigned = format!(
            r#"{{"Type":"Notification","TopicArn":"arn:aws:sns:us-east-1:1:t","Message":"hi",{}}}"#,
            SIGNED.replace(r#""Signature":"EXAMPLE","#, "")
        );
        assert!(SnsEnvelope::of(&unsigned).is_none(), "{unsigned}");
    }

    /// A FIFO topic's notification carries no signature (aws/aws-sdk-net#3000): it is an
    /// envelope all the same, and its message comes out. (It came through whole.)
    #[test]
    fn an_sns_fifo_topics_unsigned_notification_is_unwrapped() {
        let body = r#"{"Type":"Notification","MessageId":"19848d6e","SequenceNumber":"10000000000000003000","TopicArn":"arn:aws:sns:us-east-1:123456789012:orders.fifo","Message":"{\"id\":1}","Timestamp":"2023-07-06T13:24:10.934Z","UnsubscribeURL":"https://sns.us-east-1.amazonaws.com/?Action=Unsubscribe","MessageAttributes":{"x-tenant":{"Type":"String","Value":"acme"}}}"#;
        let message = SqsMessage::builder()
            .body(body)
            .attributes(MessageSystemAttributeName::MessageGroupId, "alice")
            .build();
        let Decoded {
            payload, headers, ..
        } = decode(&message);
        assert_eq!(payload.as_ref(), br#"{"id":1}"#);
        assert_eq!(headers.get_str("x-tenant"), Some("acme"));
        // A standard topic's notification without its signature is no envelope.
        let unsigned = body.replace("orders.fifo", "orders");
        assert!(SnsEnvelope::of(&unsigned).is_none(), "{unsigned}");
    }

    #[test]
    fn headers_round_trip_byte_for_byte() {
        let (payload, headers) = sent_and_received(
            Message::builder()
                .header("x-text", "plain")
                .header("x-bin", vec![0u8, 255, 1])
                .payload("hi"),
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

    /// SQS refuses an empty body (at least one character; AWS answers `MissingParameter`),
    /// and base64 of an empty payload is still empty.
    #[test]
    fn an_empty_payload_travels_as_a_marked_placeholder_and_comes_back_empty() {
        let outgoing = encode(
            "q",
            false,
            &Message::new(Vec::<u8>::new()).into_parts(),
            &AttributeTypes::new(),
        )
        .expect("an empty payload is a valid message");
        assert!(!outgoing.body.is_empty());
        assert_eq!(
            outgoing
                .attributes
                .get(BODY_ENCODING_ATTRIBUTE)
                .and_then(attribute_bytes),
            Some(EMPTY_ENCODING.as_bytes())
        );
        let (payload, headers, _) = received(outgoing, None);
        assert!(payload.is_empty(), "{payload:?}");
        assert!(!headers.contains(BODY_ENCODING_ATTRIBUTE));
        // The placeholder sent as a payload of its own is that payload.
        let (payload, _) = sent_and_received(Message::new(EMPTY_BODY));
        assert_eq!(payload.as_ref(), EMPTY_BODY.as_bytes());
    }

    /// Ten headers and a body that needs the marker: the error says the marker is the
    /// eleventh, which the sender never set as a header.
    #[test]
    fn at_the_limit_the_error_names_the_body_marker_that_took_a_slot() {
        for (payload, body) in [
            (vec![0u8, 0xff], "a binary body"),
            (Vec::new(), "an empty body"),
        ] {
            let mut message = Message::builder();
            for i in 0..10 {
                message = message.header(format!("h{i}"), "v");
            }
            let error = refused(false, message.payload(payload));
            assert_eq!(
                error,
                format!(
                    "11 message attributes (headers and properties, counting `{BODY_ENCODING_ATTRIBUTE}`, which marks {body}); SQS carries at most 10"
                )
            );
        }
    }

    /// Nine headers, the trace context tracing added, and a binary body: both named.
    #[test]
    fn at_the_limit_the_error_names_the_trace_context_that_took_a_slot() {
        let mut message = Message::builder().header(
            conveyor::trace::TRACEPARENT_HEADER,
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        );
        for i in 0..9 {
            message = message.header(format!("h{i}"), "v");
        }
        let error = refused(false, message.payload(vec![0u8, 0xff]));
        assert!(
            error.contains("counting `conveyor-body-encoding`, which marks a binary body and `traceparent`, the trace context)"),
            "{error}"
        );
    }

    #[test]
    fn more_than_ten_attributes_are_refused() {
        let mut message = Message::builder();
        for i in 0..11 {
            message = message.header(format!("h{i}"), "v");
        }
        let error = refused(false, message.payload("x"));
        assert!(error.contains("at most 10"), "{error}");
    }

    #[test]
    fn a_dead_letter_carries_payload_headers_and_the_reason() {
        let mut headers = Headers::new();
        headers.insert("x-tenant", "acme");
        headers.insert(PARTITION_KEY_HEADER, "alice");
        headers.insert(REJECT_REASON_HEADER, "an earlier reason");
        let outgoing = encode_dead_letter(
            "dead",
            Some("alice"),
            &[0u8, 0xff],
            &headers,
            &AttributeTypes::new(),
            Some("bad input"),
        )
        .expect("encodable");
        assert!(
            !outgoing.attributes.contains_key(PARTITION_KEY_HEADER),
            "the group travels as the FIFO group, not as an attribute"
        );
        let (payload, headers, key) = received(outgoing, Some("alice"));
        assert_eq!(payload.as_ref(), &[0u8, 0xff]);
        assert_eq!(headers.get_str("x-tenant"), Some("acme"));
        assert_eq!(headers.get_str(REJECT_REASON_HEADER), Some("bad input"));
        assert_eq!(headers.get_str(PARTITION_KEY_HEADER), Some("alice"));
        assert_eq!(key.as_deref(), Some("alice"));
    }

    #[test]
    fn an_empty_reject_reason_is_left_out_not_sent_empty() {
        let outgoing = encode_dead_letter(
            "dead",
            None,
            b"x",
            &Headers::new(),
            &AttributeTypes::new(),
            Some(""),
        )
        .expect("encodable");
        assert!(outgoing.attributes.is_empty());
    }

    /// A received type goes out again, and counts in the size as SQS counts it; the
    /// reason is always text, whatever type an earlier one had.
    #[test]
    fn a_dead_letter_keeps_its_headers_types_and_its_reason_is_a_string() {
        let mut headers = Headers::new();
        headers.insert("price", "7");
        headers.insert(REJECT_REASON_HEADER, "12");
        let types = AttributeTypes::new()
            .with("price", "Number")
            .with(REJECT_REASON_HEADER, "Number");
        let outgoing = encode_dead_letter("dead", None, b"x", &headers, &types, Some("bad input"))
            .expect("encodable");
        let data_type = |name: &str| outgoing.attributes[name].data_type().to_string();
        assert_eq!(data_type("price"), "Number");
        assert_eq!(data_type(REJECT_REASON_HEADER), "String");
        let reason = REJECT_REASON_HEADER.len() + "String".len() + "bad input".len();
        assert_eq!(
            outgoing.size,
            "price".len() + "Number".len() + 1 + reason + 1
        );
    }

    #[test]
    fn names_sqs_refuses_are_refused_with_the_reason() {
        for (name, why) in [
            ("AWS.trace", "`AWS.` or `Amazon.`"),
            ("aws.trace", "`AWS.` or `Amazon.`"),
            ("Amazon.x", "`AWS.` or `Amazon.`"),
            ("aMaZoN.x", "`AWS.` or `Amazon.`"),
            ("a..b", "`..`"),
            (".a", "starts or ends with `.`"),
            ("a.", "starts or ends with `.`"),
            ("has space", "has ` `"),
            ("tenant:id", "has `:`"),
            ("naïve", "has `ï`"),
            ("line\nbreak", "has `\\n`"),
            ("", "is empty"),
            (&"x".repeat(257), "longer than the 256 characters"),
            (BODY_ENCODING_ATTRIBUTE, "marks a base64 or empty body"),
            ("Conveyor-Body-Encoding", "marks a base64 or empty body"),
            (EMPTY_HEADERS_ATTRIBUTE, "names the empty headers in"),
            ("Conveyor-Empty-Headers", "names the empty headers in"),
        ] {
            let error = refused(
                false,
                Message::builder()
                    .header(name.to_string(), "1")
                    .payload("x"),
            );
            assert!(
                error.contains("cannot be an SQS message attribute") && error.contains(why),
                "{name:?}: {error}"
            );
        }
    }

    #[test]
    fn names_sqs_takes_are_taken() {
        for name in [
            "a",
            "x-tenant",
            "A.b-c_D9",
            "AWS",
            "AWSTraceHeader",
            "amazon-x",
            "my.AWS.x",
            &"x".repeat(256),
        ] {
            let (_, headers) = sent_and_received(
                Message::builder()
                    .header(name.to_string(), "1")
                    .payload("x"),
            );
            assert_eq!(headers.get_str(name), Some("1"), "{name}");
        }
    }

    #[test]
    fn an_oversize_name_is_quoted_only_in_part() {
        let name = "x".repeat(10_000);
        let error = refused(
            false,
            Message::builder().header(name.clone(), "1").payload("x"),
        );
        assert!(
            error.contains(&format!("`{}…`", "x".repeat(80))) && !error.contains(&"x".repeat(81)),
            "{error}"
        );
    }

    /// SQS takes no empty attribute value: empty headers travel by name in one attribute
    /// between them, and come back empty, among headers with values.
    #[test]
    fn empty_header_values_travel_in_one_attribute_and_come_back_empty() {
        let message = Message::builder()
            .header("x-h00", "")
            .header("x-tenant", "acme")
            .header("X-Other.Empty_1", Vec::<u8>::new())
            .header("x-bin", vec![0u8, 255])
            .payload("x");
        let outgoing = encode("q", false, &message.into_parts(), &AttributeTypes::new())
            .expect("empty values are carried");
        let mut names: Vec<&str> = outgoing.attributes.keys().map(String::as_str).collect();
        names.sort_unstable();
        assert_eq!(names, [EMPTY_HEADERS_ATTRIBUTE, "x-bin", "x-tenant"]);
        let list = &outgoing.attributes[EMPTY_HEADERS_ATTRIBUTE];
        assert_eq!(list.data_type(), "String");
        assert_eq!(list.string_value(), Some("x-h00,X-Other.Empty_1,"));
        // The list counts in the size as SQS counts it.
        let size =
            |name: &str, data_type: &str, value: &str| name.len() + data_type.len() + value.len();
        assert_eq!(
            outgoing.size,
            size(EMPTY_HEADERS_ATTRIBUTE, "String", "x-h00,X-Other.Empty_1,")
                + size("x-tenant", "String", "acme")
                + size("x-bin", "Binary", "..")
                + 1
        );
        let (payload, headers, _) = received(outgoing, None);
        assert_eq!(payload.as_ref(), b"x");
        assert_eq!(headers.get("x-h00").map(|v| v.as_ref()), Some(&b""[..]));
        assert_eq!(
            headers.get("X-Other.Empty_1").map(|v| v.as_ref()),
            Some(&b""[..])
        );
        assert_eq!(headers.get_str("x-tenant"), Some("acme"));
        assert_eq!(headers.len(), 4, "{headers:?}");
        assert!(!headers.contains(EMPTY_HEADERS_ATTRIBUTE));
        // Alone, with an empty body too.
        let (payload, headers) = sent_and_received(
            Message::builder()
                .header("x-h00", "")
                .payload(Vec::<u8>::new()),
        );
        assert!(payload.is_empty());
        assert_eq!(headers.get("x-h00").map(|v| v.len()), Some(0));
        assert_eq!(headers.len(), 1, "{headers:?}");
    }

    /// However many headers are empty, they take one attribute: ten empty headers fit,
    /// and so do nine with values and one empty; one more with a value does not, and the
    /// error names the list among what it counted.
    #[test]
    fn empty_headers_take_one_attribute_between_them() {
        let mut all_empty = Message::builder();
        for i in 0..10 {
            all_empty = all_empty.header(format!("x-h{i:02}"), "");
        }
        let (_, headers) = sent_and_received(all_empty.payload("x"));
        assert_eq!(headers.len(), 10);
        assert!(headers.iter().all(|(_, value)| value.is_empty()));

        let mut at_the_limit = Message::builder().header("x-h00", "");
        for i in 1..10 {
            at_the_limit = at_the_limit.header(format!("x-h{i:02}"), "v");
        }
        let (_, headers) = sent_and_received(at_the_limit.clone().payload("x"));
        assert_eq!(headers.len(), 10);
        assert_eq!(headers.get("x-h00").map(|v| v.len()), Some(0));

        let error = refused(false, at_the_limit.header("x-h10", "v").payload("x"));
        assert_eq!(
            error,
            format!(
                "11 message attributes (headers and properties, counting `{EMPTY_HEADERS_ATTRIBUTE}`, which names the empty header); SQS carries at most 10"
            )
        );
        let mut two_empty = Message::builder().header("x-e1", "").header("x-e2", "");
        for i in 0..10 {
            two_empty = two_empty.header(format!("x-h{i:02}"), "v");
        }
        let error = refused(false, two_empty.payload(Vec::<u8>::new()));
        assert!(
            error.contains(&format!("counting `{BODY_ENCODING_ATTRIBUTE}`, which marks an empty body and `{EMPTY_HEADERS_ATTRIBUTE}`, which names the 2 empty headers")),
            "{error}"
        );
    }

    /// An empty value travels without a type, so a type that says more than its value
    /// (`Number`, a custom one) is refused rather than lost; `String` and `Binary` are
    /// what it comes back as anyway.
    #[test]
    fn an_empty_header_with_a_type_it_cannot_keep_is_refused() {
        for data_type in ["Number", "String.json", "Binary.gzip"] {
            let types = AttributeTypes::new().with("x-h00", data_type);
            let message = Message::builder().header("x-h00", "").payload("x");
            let Err(error) = encode("q", false, &message.into_parts(), &types) else {
                panic!("{data_type}: refused");
            };
            assert!(
                error
                    .to_string()
                    .contains(&format!("travels without its type `{data_type}`")),
                "{error}"
            );
        }
        for data_type in ["String", "Binary"] {
            let types = AttributeTypes::new().with("x-h00", data_type);
            let message = Message::builder().header("x-h00", "").payload("x");
            let outgoing = encode("q", false, &message.into_parts(), &types).expect(data_type);
            let (_, headers, _) = received(outgoing, None);
            assert_eq!(headers.get("x-h00").map(|v| v.len()), Some(0));
        }
    }

    /// A message property that is empty travels as an empty header, and a header that
    /// carries it must hold the same, empty, value.
    #[test]
    fn an_empty_property_and_its_header_must_agree() {
        let (_, headers) = sent_and_received(
            Message::builder()
                .correlation_id("")
                .header("correlation-id", "")
                .payload("x"),
        );
        assert_eq!(headers.get("correlation-id").map(|v| v.len()), Some(0));
        let error = refused(
            false,
            Message::builder()
                .correlation_id("a")
                .header("correlation-id", "")
                .payload("x"),
        );
        assert!(error.contains("correlation id"), "{error}");
    }

    /// A dead-lettered message keeps its empty headers, alongside the reason.
    #[test]
    fn a_dead_letter_keeps_its_empty_headers() {
        let mut headers = Headers::new();
        headers.insert("x-h00", Bytes::new());
        headers.insert("x-tenant", "acme");
        let outgoing = encode_dead_letter(
            "dead",
            None,
            b"x",
            &headers,
            &AttributeTypes::new(),
            Some("bad input"),
        )
        .expect("encodable");
        let (_, headers, _) = received(outgoing, None);
        assert_eq!(headers.get("x-h00").map(|v| v.len()), Some(0));
        assert_eq!(headers.get_str("x-tenant"), Some("acme"));
        assert_eq!(headers.get_str(REJECT_REASON_HEADER), Some("bad input"));
    }

    /// Through SNS without raw delivery the list comes in the envelope's attributes, and
    /// is undone as from a queue.
    #[test]
    fn empty_headers_come_back_from_an_sns_envelope() {
        let body = format!(
            r#"{{"Type":"Notification","TopicArn":"arn:aws:sns:us-east-1:1:t","Message":"hi","MessageAttributes":{{"{EMPTY_HEADERS_ATTRIBUTE}":{{"Type":"String","Value":"x-h00,"}},"x-tenant":{{"Type":"String","Value":"acme"}}}},{SIGNED}}}"#
        );
        let Decoded {
            payload, headers, ..
        } = decode(&SqsMessage::builder().body(body).build());
        assert_eq!(payload.as_ref(), b"hi");
        assert_eq!(headers.get("x-h00").map(|v| v.len()), Some(0));
        assert_eq!(headers.len(), 2, "{headers:?}");
    }

    #[test]
    fn on_a_fifo_queue_the_group_header_must_be_the_partition_key() {
        // The partition key's own header, as a delivery carries it: it travels as the group.
        let message = Message::builder()
            .partition_key("alice")
            .header(PARTITION_KEY_HEADER, "alice")
            .payload("x");
        let outgoing = encode(
            "q.fifo",
            true,
            &message.into_parts(),
            &AttributeTypes::new(),
        )
        .expect("encodable");
        assert!(outgoing.attributes.is_empty());
        let (_, headers, key) = received(outgoing, Some("alice"));
        assert_eq!(headers.get_str(PARTITION_KEY_HEADER), Some("alice"));
        assert_eq!(key.as_deref(), Some("alice"));
        // Any other value would be lost: the group would overwrite it on receipt.
        for message in [
            Message::builder()
                .partition_key("alice")
                .header(PARTITION_KEY_HEADER, "bob")
                .payload("x"),
            Message::builder()
                .partition_key("alice")
                .header("messagegroupid", "bob")
                .payload("x"),
            Message::builder()
                .header(PARTITION_KEY_HEADER, "bob")
                .payload("x"),
        ] {
            let error = refused(true, message);
            assert!(
                error.contains("is not the partition key") && error.contains("set `partition_key`"),
                "{error}"
            );
        }
    }

    #[test]
    fn on_a_standard_queue_the_group_header_is_an_ordinary_attribute() {
        let (_, headers) = sent_and_received(
            Message::builder()
                .partition_key("alice")
                .header(PARTITION_KEY_HEADER, "bob")
                .payload("x"),
        );
        assert_eq!(headers.get_str(PARTITION_KEY_HEADER), Some("bob"));
    }

    #[test]
    fn a_deduplication_id_header_is_an_ordinary_attribute_on_either_kind_of_queue() {
        for fifo in [false, true] {
            let message = Message::builder()
                .partition_key("k")
                .message_id("m-1")
                .header("MessageDeduplicationId", "d-9")
                .payload("x");
            let outgoing = encode("q", fifo, &message.into_parts(), &AttributeTypes::new())
                .expect("encodable");
            let (_, headers, _) = received(outgoing, fifo.then_some("k"));
            assert_eq!(headers.get_str("MessageDeduplicationId"), Some("d-9"));
        }
    }

    #[test]
    fn a_header_named_like_a_property_must_hold_the_same_value() {
        // The same value: carried once.
        let outgoing = encode(
            "q",
            false,
            &Message::builder()
                .content_type("text/plain")
                .header("Content-Type", "text/plain")
                .payload("x")
                .into_parts(),
            &AttributeTypes::new(),
        )
        .expect("encodable");
        assert_eq!(outgoing.attributes.len(), 1);
        // Another value: only one could come back.
        let error = refused(
            false,
            Message::builder()
                .content_type("text/plain")
                .header("Content-Type", "application/json")
                .payload("x"),
        );
        assert!(
            error.contains("`Content-Type` differs from the message's content type"),
            "{error}"
        );
        let error = refused(
            false,
            Message::builder()
                .correlation_id("a")
                .header("correlation-id", "b")
                .payload("x"),
        );
        assert!(error.contains("correlation id"), "{error}");
        // Alone, it is an ordinary header.
        let (_, headers) = sent_and_received(
            Message::builder()
                .header("content-type", "text/csv")
                .payload("x"),
        );
        assert_eq!(headers.get_str("content-type"), Some("text/csv"));
    }
}
