//! A message's headers and properties as NATS headers, and back.
//!
//! Every header and property travels as a NATS header of the same name. A value NATS
//! headers cannot carry as it is (bytes that are not UTF-8, a line break, space at either
//! end, which the protocol trims) travels base64-encoded, its name listed in
//! [`BINARY_HEADER`]. The partition key travels in [`PARTITION_KEY_HEADER`], a message id
//! also as `Nats-Msg-Id` (JetStream drops a second message with the same id within the
//! stream's duplicate window), and a delay as the instant it ends ([`NOT_BEFORE_HEADER`]).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_nats::HeaderMap;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use conveyor::{Bytes, Headers, MessageParts, PartitionKey};

/// The header a message's partition key travels in; lanes key by it.
pub const PARTITION_KEY_HEADER: &str = "x-partition-key";

/// The header naming (comma-separated) the headers whose values are base64-encoded.
pub(crate) const BINARY_HEADER: &str = "conveyor-binary";

/// The header a delayed message carries the instant it is due in (milliseconds since the
/// Unix epoch): JetStream 2.9 delays nothing itself, so a consumer that receives it early
/// hands it back to the stream with that much delay.
pub(crate) const NOT_BEFORE_HEADER: &str = "conveyor-not-before";

/// JetStream's deduplication id.
const MSG_ID_HEADER: &str = "Nats-Msg-Id";

/// What NATS headers cannot carry.
#[derive(Debug, thiserror::Error)]
#[error(
    "the header name `{0}` has a character NATS headers cannot carry (a space, `:` or a control)"
)]
pub(crate) struct BadHeaderName(String);

/// The NATS headers of a message to publish.
pub(crate) fn outgoing(parts: &MessageParts) -> Result<HeaderMap, BadHeaderName> {
    let mut map = HeaderMap::new();
    let mut binary: Vec<&str> = Vec::new();
    let texts = parts
        .property_headers()
        .map(|(name, value)| (name, value.as_bytes()));
    let headers = parts
        .headers
        .iter()
        .map(|(name, value)| (name, value.as_ref()));
    for (name, value) in texts.chain(headers) {
        let header: async_nats::HeaderName = name
            .parse()
            .map_err(|_| BadHeaderName(conveyor::kit::bounded(name, 64).into_owned()))?;
        match plain_text(value) {
            Some(text) => map.insert(header, async_nats::HeaderValue::from_lossy(text)),
            None => {
                map.insert(header, STANDARD.encode(value).as_str());
                binary.push(name);
            }
        }
    }
    if !binary.is_empty() {
        map.insert(BINARY_HEADER, binary.join(",").as_str());
    }
    if let Some(key) = &parts.partition_key {
        // A key that is not plain text is refused by the caller (see `check_key`).
        map.insert(
            PARTITION_KEY_HEADER,
            async_nats::HeaderValue::from_lossy(key.as_str()),
        );
    }
    if let Some(id) = parts
        .message_id
        .as_deref()
        .and_then(|id| plain_text(id.as_bytes()))
    {
        map.insert(MSG_ID_HEADER, async_nats::HeaderValue::from_lossy(id));
    }
    if let Some(delay) = parts.delay.filter(|delay| !delay.is_zero()) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let millis = now.saturating_add(delay).as_millis();
        map.insert(NOT_BEFORE_HEADER, millis.to_string().as_str());
    }
    Ok(map)
}

/// Whether a partition key can travel in a header.
pub(crate) fn check_key(key: &PartitionKey) -> Result<(), &'static str> {
    match plain_text(key.as_str().as_bytes()) {
        Some(_) => Ok(()),
        None => Err(
            "a partition key with a line break or space at either end cannot travel in a NATS header",
        ),
    }
}

/// `value` as text NATS carries unchanged, if it is.
fn plain_text(value: &[u8]) -> Option<&str> {
    let text = std::str::from_utf8(value).ok()?;
    let unchanged = text.trim() == text && !text.contains(['\r', '\n']);
    unchanged.then_some(text)
}

/// What a received message's headers say.
pub(crate) struct Incoming {
    pub(crate) headers: Headers,
    pub(crate) key: Option<PartitionKey>,
    /// How long it is still delayed for, if it came early.
    pub(crate) early_by: Option<Duration>,
    /// It was published with a delay ([`NOT_BEFORE_HEADER`]): a delivery before the delay
    /// ended was handed back, and was no attempt.
    pub(crate) delayed: bool,
}

/// The headers of a received message, the transport's own taken out.
pub(crate) fn incoming(map: Option<&HeaderMap>) -> Incoming {
    let mut incoming = Incoming {
        headers: Headers::new(),
        key: None,
        early_by: None,
        delayed: false,
    };
    let Some(map) = map else {
        return incoming;
    };
    // Found by a look along the headers, not `HeaderMap::get`: that makes a header name
    // of the `&str` and hashes it (500 instructions a message more, BENCHMARKS.md).
    let binary: Vec<&str> = map
        .iter()
        .find(|(name, _)| AsRef::<str>::as_ref(name) == BINARY_HEADER)
        .and_then(|(_, values)| values.first())
        .map(|names| names.as_str().split(',').collect())
        .unwrap_or_default();
    for (name, values) in map.iter() {
        let name: &str = name.as_ref();
        let Some(value) = values.last() else { continue };
        if name.eq_ignore_ascii_case(PARTITION_KEY_HEADER) {
            incoming.key = Some(PartitionKey::new(value.as_str()));
        } else if name.eq_ignore_ascii_case(NOT_BEFORE_HEADER) {
            incoming.delayed = true;
            incoming.early_by = early_by(value.as_str());
        } else if name.eq_ignore_ascii_case(BINARY_HEADER) || name.starts_with("Nats-") {
            // The transport's own, and JetStream's.
        } else if binary.contains(&name) {
            match STANDARD.decode(value.as_str()) {
                Ok(bytes) => incoming
                    .headers
                    .insert(name.to_string(), Bytes::from(bytes)),
                Err(_) => incoming.headers.insert(
                    name.to_string(),
                    Bytes::copy_from_slice(value.as_str().as_bytes()),
                ),
            }
        } else {
            incoming.headers.insert(
                name.to_string(),
                Bytes::copy_from_slice(value.as_str().as_bytes()),
            );
        }
    }
    incoming
}

/// How long until the instant `millis` (since the Unix epoch), if it is still ahead.
fn early_by(millis: &str) -> Option<Duration> {
    let due = UNIX_EPOCH.checked_add(Duration::from_millis(millis.parse().ok()?))?;
    due.duration_since(SystemTime::now())
        .ok()
        .filter(|left| !left.is_zero())
}

#[cfg(test)]
mod tests {
    use super::*;
    use conveyor::Message;

    fn round_trip(message: Message) -> Incoming {
        let parts = message.into_parts();
        let map = outgoing(&parts).expect("headers NATS can carry");
        incoming(Some(&map))
    }

    #[test]
    fn text_binary_and_empty_values_come_back_as_they_went() {
        let binary = Bytes::from_static(&[0, 159, 146, 150, 255]);
        let message = Message::builder()
            .header("x-trace", "abc-123")
            .header("x-binary", binary.clone())
            .header("x-empty", "")
            .header("x-padded", " a ")
            .header("x-lines", "a\r\nb")
            .payload("p");
        let got = round_trip(message).headers;
        assert_eq!(got.get_str("x-trace"), Some("abc-123"));
        assert_eq!(got.get("x-binary"), Some(&binary));
        assert_eq!(got.get_str("x-empty"), Some(""));
        assert_eq!(got.get_str("x-padded"), Some(" a "));
        assert_eq!(got.get_str("x-lines"), Some("a\r\nb"));
        assert!(!got.contains(BINARY_HEADER));
    }

    #[test]
    fn properties_travel_as_their_headers_and_the_key_apart() {
        let message = Message::builder()
            .partition_key("k0")
            .message_id("job-1")
            .content_type("application/json")
            .payload("p");
        let parts = message.into_parts();
        let map = outgoing(&parts).expect("headers");
        assert_eq!(map.get(MSG_ID_HEADER).map(|v| v.as_str()), Some("job-1"));
        let got = incoming(Some(&map));
        assert_eq!(got.key.as_ref().map(PartitionKey::as_str), Some("k0"));
        assert_eq!(
            got.headers.get_str(conveyor::MESSAGE_ID_HEADER),
            Some("job-1")
        );
        assert!(!got.headers.contains(PARTITION_KEY_HEADER));
        assert!(!got.headers.contains(MSG_ID_HEADER));
    }

    #[test]
    fn a_delayed_message_is_early_until_its_delay_ends() {
        let message = Message::builder()
            .delay(Duration::from_secs(60))
            .payload("p");
        let incoming = round_trip(message);
        assert!(incoming.delayed);
        assert!(!incoming.headers.contains(NOT_BEFORE_HEADER));
        let early = incoming.early_by.expect("early");
        assert!(early > Duration::from_secs(50) && early <= Duration::from_secs(60));
        assert_eq!(early_by("0"), None);
        assert_eq!(early_by("not a number"), None);
    }

    #[test]
    fn a_header_name_nats_cannot_carry_is_refused() {
        let parts = Message::builder()
            .header("a b", "x")
            .payload("p")
            .into_parts();
        assert!(outgoing(&parts).is_err());
        assert!(check_key(&PartitionKey::new("line\nbreak")).is_err());
        assert!(check_key(&PartitionKey::new("fine")).is_ok());
    }
}
