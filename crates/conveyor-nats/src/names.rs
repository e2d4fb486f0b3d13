//! Queue names: a queue is a JetStream stream of the same name, which takes the one
//! subject of that name too; so a name must be both a stream name and a single subject
//! token.

use crate::error::NatsError;

/// The longest queue name: JetStream stores a stream under a directory of its name.
pub(crate) const MAX_NAME: usize = 255;

/// Checks that `name` can be a stream's name and its subject.
pub(crate) fn check(name: &str) -> Result<(), NatsError> {
    let why = if name.is_empty() {
        Some("it is empty")
    } else if name.len() > MAX_NAME {
        Some("it is longer than 255 bytes")
    } else if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        Some("only ASCII letters, digits, `-` and `_` can name a stream and its subject")
    } else {
        None
    };
    match why {
        Some(why) => Err(NatsError::Name {
            name: conveyor::kit::bounded(name, 64).into_owned(),
            why,
        }),
        None => Ok(()),
    }
}

/// Whether `destination` is a reply inbox (a plain NATS subject no stream takes), which
/// a reply is published to directly.
pub(crate) fn is_inbox(destination: &str) -> bool {
    destination.starts_with("_INBOX.")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_names_take_letters_digits_dashes_and_underscores_only() {
        assert!(check("orders-eu_1").is_ok());
        for bad in ["", "orders.eu", "a b", "a*", "a>", "a/b", "é"] {
            assert!(check(bad).is_err(), "{bad:?}");
        }
        assert!(check(&"a".repeat(256)).is_err());
    }

    #[test]
    fn reply_inboxes_are_told_apart_from_queues() {
        assert!(is_inbox("_INBOX.abc.1"));
        assert!(!is_inbox("orders"));
    }
}
