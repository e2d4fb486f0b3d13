//! How a received message is shown: its key, attempt, dead-letter reason and headers,
//! then its body (pretty-printed when it is JSON).

use std::fmt::Write;

use bytes::Bytes;
use conveyor::{Delivery, REJECT_REASON_HEADER};

/// Binary values show this many bytes, in hex.
const HEX_SHOWN: usize = 64;

/// `delivery`, numbered `number`, as several lines of text.
pub fn delivery(number: usize, delivery: &Delivery) -> String {
    let mut text = format!("--- message {number}\n");
    if let Some(key) = delivery.partition_key() {
        let _ = writeln!(text, "partition key: {}", printable(key.as_str()));
    }
    let _ = writeln!(text, "attempt: {}", delivery.attempt());
    if let Some(reason) = delivery.headers().get_str(REJECT_REASON_HEADER) {
        let _ = writeln!(text, "dead-letter reason: {}", printable(reason));
    }
    if !delivery.headers().is_empty() {
        text.push_str("headers:\n");
        for (name, value) in delivery.headers().iter() {
            let _ = writeln!(text, "  {}: {}", printable(name), value_text(value));
        }
    }
    let payload = delivery.payload();
    let _ = writeln!(text, "body ({} bytes):", payload.len());
    text.push_str(&body(payload));
    text.push('\n');
    text
}

/// The body: pretty JSON, else text, else the first bytes in hex.
fn body(payload: &Bytes) -> String {
    let json = serde_json::from_slice::<serde_json::Value>(payload);
    if let Some(pretty) = json
        .ok()
        .and_then(|json| serde_json::to_string_pretty(&json).ok())
    {
        return pretty;
    }
    match std::str::from_utf8(payload) {
        Ok(text) => text
            .split('\n')
            .map(printable)
            .collect::<Vec<_>>()
            .join("\n"),
        Err(_) => hex(payload),
    }
}

/// A header value: as text where it is UTF-8 without control characters.
fn value_text(value: &Bytes) -> String {
    match std::str::from_utf8(value) {
        Ok(text) if !text.chars().any(char::is_control) => text.to_string(),
        _ => hex(value),
    }
}

/// `text` safe for the operator's terminal: control characters (an escape sequence, a
/// carriage return) are shown escaped, tabs kept.
fn printable(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() && c != '\t' {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    let shown = bytes.get(..HEX_SHOWN).unwrap_or(bytes);
    let mut text = String::from("<binary> ");
    for byte in shown {
        let _ = write!(text, "{byte:02x}");
    }
    if shown.len() < bytes.len() {
        text.push('…');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_bodies_are_pretty_text_as_is_and_binary_in_hex() {
        assert_eq!(
            body(&Bytes::from_static(br#"{"id":1}"#)),
            "{\n  \"id\": 1\n}"
        );
        assert_eq!(body(&Bytes::from_static(b"plain words")), "plain words");
        assert_eq!(body(&Bytes::from_static(&[0x83, 0xa1])), "<binary> 83a1");
        let long = Bytes::from(vec![0xffu8; 100]);
        assert!(body(&long).ends_with('…'));
    }

    #[test]
    fn control_characters_never_reach_the_terminal() {
        let sneaky = Bytes::from_static(b"line one\n\x1b[2Jline\ttwo\r");
        assert_eq!(body(&sneaky), "line one\n\\u{1b}[2Jline\ttwo\\r");
        assert_eq!(printable("k\x07ey"), "k\\u{7}ey");
    }
}
