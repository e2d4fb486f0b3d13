//! A message as a stream entry's fields, and back. Redis is binary-safe, so every value
//! travels as it is: the payload in `payload`, the partition key in `key`, each header
//! and property in `h:<name>`, and the attempts a message made before it was put back
//! for a later retry in `attempts`.

use std::collections::HashMap;

use conveyor::{Bytes, Headers, MessageParts, PartitionKey};
use redis::Value;

pub(crate) const PAYLOAD: &str = "payload";
pub(crate) const KEY: &str = "key";
pub(crate) const ATTEMPTS: &str = "attempts";
const HEADER: &str = "h:";

/// The header a delivery's partition key is described by in the AsyncAPI document; on
/// the wire it is the entry's `key` field.
pub const PARTITION_KEY_FIELD: &str = "key";

/// The fields of a message to add.
pub(crate) fn outgoing(parts: &MessageParts) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut fields = vec![(PAYLOAD.as_bytes().to_vec(), parts.payload.to_vec())];
    if let Some(key) = &parts.partition_key {
        fields.push((KEY.as_bytes().to_vec(), key.as_str().as_bytes().to_vec()));
    }
    let properties = parts
        .property_headers()
        .map(|(name, value)| (name, value.as_bytes()));
    let headers = parts
        .headers
        .iter()
        .map(|(name, value)| (name, value.as_ref()));
    for (name, value) in properties.chain(headers) {
        fields.push((format!("{HEADER}{name}").into_bytes(), value.to_vec()));
    }
    fields
}

/// A received entry's message.
pub(crate) struct Incoming {
    pub(crate) payload: Bytes,
    pub(crate) headers: Headers,
    pub(crate) key: Option<PartitionKey>,
    /// Attempts made before the entry was put back for a later retry.
    pub(crate) attempts_before: u32,
}

/// The message of an entry's fields; `None` for an entry deleted while pending.
pub(crate) fn incoming(map: HashMap<String, Value>) -> Option<Incoming> {
    if map.is_empty() {
        return None;
    }
    let mut incoming = Incoming {
        payload: Bytes::new(),
        headers: Headers::new(),
        key: None,
        attempts_before: 0,
    };
    for (name, value) in map {
        // Taken, not copied: the payload's buffer becomes the delivery's.
        let Some(bytes) = into_bytes(value) else {
            continue;
        };
        if name == PAYLOAD {
            incoming.payload = Bytes::from(bytes);
        } else if name == KEY {
            incoming.key = Some(PartitionKey::new(
                String::from_utf8_lossy(&bytes).into_owned(),
            ));
        } else if name == ATTEMPTS {
            incoming.attempts_before = std::str::from_utf8(&bytes)
                .ok()
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
        } else if let Some(header) = name.strip_prefix(HEADER) {
            incoming
                .headers
                .insert(header.to_string(), Bytes::from(bytes));
        }
    }
    Some(incoming)
}

fn into_bytes(value: Value) -> Option<Vec<u8>> {
    match value {
        Value::BulkString(bytes) => Some(bytes),
        Value::SimpleString(text) => Some(text.into_bytes()),
        Value::Int(n) => Some(n.to_string().into_bytes()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use conveyor::Message;

    #[test]
    fn payload_key_headers_and_properties_round_trip_binary_and_empty_included() {
        let binary = Bytes::from_static(&[0, 159, 255]);
        let parts = Message::builder()
            .partition_key("k0")
            .message_id("m-1")
            .header("x-binary", binary.clone())
            .header("x-empty", "")
            .payload(binary.clone())
            .into_parts();
        let map: HashMap<String, Value> = outgoing(&parts)
            .into_iter()
            .map(|(name, value)| {
                (
                    String::from_utf8(name).expect("name"),
                    Value::BulkString(value),
                )
            })
            .collect();
        let got = incoming(map).expect("an entry");
        assert_eq!(got.payload, binary);
        assert_eq!(got.key.as_ref().map(PartitionKey::as_str), Some("k0"));
        assert_eq!(got.headers.get("x-binary"), Some(&binary));
        assert_eq!(got.headers.get_str("x-empty"), Some(""));
        assert_eq!(
            got.headers.get_str(conveyor::MESSAGE_ID_HEADER),
            Some("m-1")
        );
        assert_eq!(got.attempts_before, 0);
    }

    #[test]
    fn an_entry_deleted_while_pending_has_no_message() {
        assert!(incoming(HashMap::new()).is_none());
    }
}
