//! A message as a stream entry's fields, and back. Redis is binary-safe, so every value
//! travels as it is: the payload in `payload`, the partition key in `key`, each header
//! and property in `h:<name>`, and the attempts a message made before it was put back
//! for a later retry in `attempts`.

use conveyor::{Bytes, Headers, MessageParts, PartitionKey};
use redis::{FromRedisValue, ParsingError, Value};

pub(crate) const PAYLOAD: &str = "payload";
pub(crate) const KEY: &str = "key";
pub(crate) const ATTEMPTS: &str = "attempts";
const HEADER: &str = "h:";

/// Where a message's partition key travels, named as every transport names it: on the
/// wire it is the entry's `key` field, and the AsyncAPI document describes it by this.
pub const PARTITION_KEY_HEADER: &str = KEY;

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

/// A stream entry as a read, a claim or a range hands it over: its id and, unless it
/// was deleted while pending, its message.
pub(crate) struct Entry {
    pub(crate) id: String,
    pub(crate) message: Option<Incoming>,
}

/// The entries of an `XRANGE` or `XCLAIM` reply: a list of `[id, fields]`.
///
/// Decoded from the reply as it came, each value's buffer taken rather than copied.
/// (redis-rs's typed replies copy the whole reply first and put each entry's fields in
/// a map of their own; per message that is most of a receive's work.)
pub(crate) struct Entries(pub(crate) Vec<Entry>);

/// The entries of an `XREAD` or `XREADGROUP` reply: each stream's, in order (a list of
/// `[stream, entries]`, or a map of them on RESP3); none when the read timed out.
pub(crate) struct ReadEntries(pub(crate) Vec<Entry>);

impl FromRedisValue for Entries {
    fn from_redis_value(value: Value) -> Result<Self, ParsingError> {
        let mut entries = Vec::new();
        push_entries(value, &mut entries)?;
        Ok(Entries(entries))
    }
}

impl FromRedisValue for ReadEntries {
    fn from_redis_value(value: Value) -> Result<Self, ParsingError> {
        let mut entries = Vec::new();
        match value {
            Value::Nil => {}
            Value::Array(streams) => {
                for stream in streams {
                    let Value::Array(stream) = stream else {
                        return Err(unexpected("a stream's entries"));
                    };
                    // `[name, entries]`: the name is the one read.
                    if let Some(stream_entries) = stream.into_iter().nth(1) {
                        push_entries(stream_entries, &mut entries)?;
                    }
                }
            }
            Value::Map(streams) => {
                for (_, stream_entries) in streams {
                    push_entries(stream_entries, &mut entries)?;
                }
            }
            _ => return Err(unexpected("a read's streams")),
        }
        Ok(ReadEntries(entries))
    }
}

/// Adds the entries of a list of `[id, fields]` to `entries`.
fn push_entries(value: Value, entries: &mut Vec<Entry>) -> Result<(), ParsingError> {
    let list = match value {
        Value::Nil => return Ok(()),
        Value::Array(list) => list,
        _ => return Err(unexpected("a list of entries")),
    };
    entries.reserve(list.len());
    for entry in list {
        match entry {
            // `XCLAIM` answers nil for an entry deleted meanwhile: nothing to hand over.
            Value::Nil => {}
            Value::Array(entry) => {
                let mut parts = entry.into_iter();
                let id = match parts.next() {
                    Some(Value::BulkString(id)) => String::from_utf8(id)?,
                    Some(Value::SimpleString(id)) => id,
                    _ => return Err(unexpected("an entry's id")),
                };
                let message = match parts.next() {
                    Some(Value::Array(fields)) => incoming(pairs(fields)),
                    Some(Value::Map(fields)) => incoming(fields),
                    // Deleted while pending: the entry comes with no fields.
                    _ => None,
                };
                entries.push(Entry { id, message });
            }
            _ => return Err(unexpected("an entry")),
        }
    }
    Ok(())
}

/// A flat `[name, value, name, value, ...]` as pairs.
fn pairs(fields: Vec<Value>) -> impl Iterator<Item = (Value, Value)> {
    let mut fields = fields.into_iter();
    std::iter::from_fn(move || Some((fields.next()?, fields.next()?)))
}

/// What did not parse, without the value: it may hold a message's payload.
fn unexpected(what: &str) -> ParsingError {
    ParsingError::from(format!("expected {what} in the reply"))
}

/// The message of an entry's fields; `None` for an entry deleted while pending (it has
/// none).
fn incoming(fields: impl IntoIterator<Item = (Value, Value)>) -> Option<Incoming> {
    let mut incoming = Incoming {
        payload: Bytes::new(),
        headers: Headers::new(),
        key: None,
        attempts_before: 0,
    };
    let mut any = false;
    for (name, value) in fields {
        any = true;
        // Taken, not copied: the payload's buffer becomes the delivery's.
        let (Some(name), Some(bytes)) = (into_bytes(name), into_bytes(value)) else {
            continue;
        };
        if name == PAYLOAD.as_bytes() {
            incoming.payload = Bytes::from(bytes);
        } else if name == KEY.as_bytes() {
            let key = String::from_utf8(bytes)
                .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
            incoming.key = Some(PartitionKey::new(key));
        } else if name == ATTEMPTS.as_bytes() {
            incoming.attempts_before = std::str::from_utf8(&bytes)
                .ok()
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
        } else if name.starts_with(HEADER.as_bytes()) {
            let mut header = name;
            header.drain(..HEADER.len());
            // A name that is not text was not written by Conveyor: not part of the message.
            if let Ok(header) = String::from_utf8(header) {
                incoming.headers.insert(header, Bytes::from(bytes));
            }
        }
    }
    any.then_some(incoming)
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

    fn bulk(bytes: impl Into<Vec<u8>>) -> Value {
        Value::BulkString(bytes.into())
    }

    /// An entry as the server sends it: `[id, [name, value, ...]]`.
    fn entry(id: &str, parts: &MessageParts) -> Value {
        let fields = outgoing(parts)
            .into_iter()
            .flat_map(|(name, value)| [bulk(name), bulk(value)])
            .collect();
        Value::Array(vec![bulk(id), Value::Array(fields)])
    }

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
        let read = Value::Array(vec![Value::Array(vec![
            bulk("orders"),
            Value::Array(vec![entry("1-0", &parts)]),
        ])]);
        let ReadEntries(entries) = ReadEntries::from_redis_value(read).expect("a read");
        let [Entry { id, message }] = <[Entry; 1]>::try_from(entries).ok().expect("one entry");
        assert_eq!(id, "1-0");
        let got = message.expect("a message");
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
    fn a_read_keeps_the_order_of_streams_and_entries_in_either_protocol() {
        let parts = |payload: &'static str| Message::builder().payload(payload).into_parts();
        let resp2 = Value::Array(vec![
            Value::Array(vec![
                bulk("a"),
                Value::Array(vec![
                    entry("1-0", &parts("one")),
                    entry("2-0", &parts("two")),
                ]),
            ]),
            Value::Array(vec![
                bulk("b"),
                Value::Array(vec![entry("3-0", &parts("three"))]),
            ]),
        ]);
        let resp3 = Value::Map(vec![
            (
                bulk("a"),
                Value::Array(vec![
                    entry("1-0", &parts("one")),
                    entry("2-0", &parts("two")),
                ]),
            ),
            (bulk("b"), Value::Array(vec![entry("3-0", &parts("three"))])),
        ]);
        for read in [resp2, resp3] {
            let ReadEntries(entries) = ReadEntries::from_redis_value(read).expect("a read");
            let got: Vec<(String, Bytes)> = entries
                .into_iter()
                .map(|e| (e.id, e.message.expect("a message").payload))
                .collect();
            assert_eq!(
                got,
                [("1-0", "one"), ("2-0", "two"), ("3-0", "three")]
                    .map(|(id, payload)| (id.to_string(), Bytes::from(payload)))
            );
        }
    }

    #[test]
    fn a_read_that_timed_out_has_no_entries() {
        let ReadEntries(entries) = ReadEntries::from_redis_value(Value::Nil).expect("a read");
        assert!(entries.is_empty());
    }

    #[test]
    fn an_entry_deleted_while_pending_has_an_id_and_no_message() {
        let claimed = Value::Array(vec![
            Value::Array(vec![bulk("1-0"), Value::Nil]),
            Value::Array(vec![bulk("2-0"), Value::Array(Vec::new())]),
            // An older server's answer for an entry deleted before the claim.
            Value::Nil,
        ]);
        let Entries(entries) = Entries::from_redis_value(claimed).expect("a claim");
        let got: Vec<(&str, bool)> = entries
            .iter()
            .map(|e| (e.id.as_str(), e.message.is_some()))
            .collect();
        assert_eq!(got, [("1-0", false), ("2-0", false)]);
    }

    #[test]
    fn a_reply_of_another_shape_is_an_error_that_shows_no_payload() {
        let error = ReadEntries::from_redis_value(Value::Array(vec![bulk("secret payload")]))
            .err()
            .expect("an error");
        assert!(!error.to_string().contains("secret"), "{error}");
    }
}
